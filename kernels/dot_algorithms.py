"""Fast MatMul numerics for dot algorithms and indexing maps: f32 BLAS on views.

* :func:`matmul_with_algorithm` — ``a @ b`` as the algorithm says: each operand
  split into its parts (``dot_algorithm.split``), one f32 GEMM per listed part
  pair (products of <= 11-bit significands are exact in f32, so each GEMM is a
  faithful primitive dot accumulated in f32), partial results summed least
  significant first in f32.
* :func:`contract` — the maps' contraction without einsum and without copies
  of transposed or broadcast operands: each operand becomes a strided view
  ``[lead..., rows, cols]`` (``np.transpose`` / ``np.expand_dims`` only) and
  goes through ``np.matmul`` (BLAS); loop dims summed outside the GEMM (the
  batch of BatchReduceMatMul) accumulate into one output tile.

Both compute in f32 and return f32; callers round to the output type.
"""
from __future__ import annotations

import numpy as np

from graph_api import dot_algorithm
from graph_api.indexing_maps import Maps


def matmul_with_algorithm(a, b, algo, product=np.matmul) -> np.ndarray:
    """``product(a, b)`` under ``algo`` (a :class:`DotAlgorithm` or None = plain f32)."""
    if algo is None:
        return np.asarray(product(_f32(a), _f32(b)), dtype=np.float32)
    lhs = dot_algorithm.split(a, algo.lhs_type, algo.lhs_component_count)
    rhs = dot_algorithm.split(b, algo.rhs_type, algo.rhs_component_count)
    acc = None
    for i, j in algo.pairs():  # least significant first
        part = np.asarray(product(lhs[i], rhs[j]), dtype=np.float32)
        acc = part if acc is None else np.add(acc, part, out=acc)
    return acc


def _f32(x):
    x = np.asarray(x)
    return x if x.dtype == np.float32 else x.astype(np.float32)


def _pre_sum(x, own: tuple, other: tuple, out: tuple):
    """Sum ``x`` over the loop dims only it reads (in neither the other operand nor C)."""
    alone = [i for i, d in enumerate(own) if d not in other and d not in out]
    if not alone:
        return x, own
    return x.sum(axis=tuple(alone), dtype=np.float32), tuple(d for d in own if d not in
                                                              [own[i] for i in alone])


def _view(x, own: tuple, order: list) -> np.ndarray:
    """``x`` (dims ``own``) as a view with dims ``order``; dims it lacks get size 1."""
    present = [d for d in order if d in own]
    view = np.transpose(x, [own.index(d) for d in present])
    missing = [i for i, d in enumerate(order) if d not in own]
    return np.expand_dims(view, tuple(missing)) if missing else view


def contract(a, b, maps: Maps) -> np.ndarray:
    """``C[c] = sum A[a] * B[b]`` over the loop dims not in C, in f32 via np.matmul;
    C's dims that neither operand reads are left out (``indexing_maps.broadcast_c``)."""
    a, a_dims = _pre_sum(a, maps.a, maps.b, maps.c)
    b, b_dims = _pre_sum(b, maps.b, maps.a, maps.c)
    out = tuple(d for d in maps.c if d in a_dims + b_dims)
    summed = [d for d in a_dims if d in b_dims and d not in out]  # contracted by both
    rows = [d for d in out if d in a_dims and d not in b_dims]
    cols = [d for d in out if d in b_dims and d not in a_dims]
    shared = [d for d in out if d in a_dims and d in b_dims]  # batch-like
    inner = summed[-1:]  # the GEMM's k; other summed dims (the batch-reduce b) loop outside
    outer = summed[:-1]
    row, col = rows[-1:] or ["<r>"], cols[-1:] or ["<c>"]  # placeholders: size-1 axes
    lead = outer + shared + rows[:-1] + cols[:-1]
    a_view = _view(a, a_dims, lead + row + inner)
    b_view = _view(b, b_dims, lead + inner + col)
    if not inner:  # nothing contracted inside: an outer product (a GEMM with k = 1)
        a_view, b_view = a_view[..., np.newaxis], b_view[..., np.newaxis, :]
    result = _accumulate(a_view, b_view, len(outer)) if outer else np.matmul(a_view, b_view)
    dims = lead[len(outer):] + row + col
    placeholders = tuple(i for i, d in enumerate(dims) if d.startswith("<"))
    if placeholders:
        result = result.squeeze(axis=placeholders)
    dims = [d for d in dims if not d.startswith("<")]
    return np.transpose(result, [dims.index(d) for d in out])


def _accumulate(a_view, b_view, n_outer: int) -> np.ndarray:
    """Sum over the leading ``n_outer`` dims of GEMMs into one tile (batch-reduce)."""
    shape = np.broadcast_shapes(a_view.shape[:n_outer], b_view.shape[:n_outer])
    acc = None
    for index in np.ndindex(shape):
        ai = tuple(i if s > 1 else 0 for i, s in zip(index, a_view.shape[:n_outer]))
        bi = tuple(i if s > 1 else 0 for i, s in zip(index, b_view.shape[:n_outer]))
        tile = np.matmul(a_view[ai], b_view[bi])
        acc = tile.astype(np.float32) if acc is None else np.add(acc, tile, out=acc)
    return acc

"""Numba kernels for sparse tensors: SpMM (CSR, BCSR, 2:4), SpMSpM, conversions.

Every SpMM computes ``out[R, N] = S[R, C] @ D[C, N]`` with ``S`` in a row form
(CSR, block CSR, n:m rows) and ``D`` dense, C-contiguous f32; other
orientations (``D @ S``, transposed operands) are mapped onto it by the plan
(``graph_api.kernels.fused.sparse_plan``).  Only stored entries are multiplied
(x * 0 is skipped, even for NaN/Inf in ``D``; docs/sparse.md).  Sums are f32 in
storage order per output element, strict (no fastmath flags: mul then add, no
reassociation), so an output element is independent of the thread count.  The
MatMul post-op epilogue (``graph_api.kernels.wmatmul._ep_one``) is applied to each finished
output row when ``use_ep``.

Parallel over output rows (row blocks for BCSR): each thread owns its rows, no
atomics.  For wide ``D`` the columns are walked in tiles of :data:`TILE` so that
the slice of ``D`` a row block reads stays in L2.
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (configures numba first)

import numpy as np
from numba import njit, prange

from graph_api.kernels.wmatmul import _ep_one

#: columns of D per tile (64 f32 = 256 bytes a row: a [C, 64] slice of D is 1 MiB at C = 4096)
TILE = 64
#: output rows per parallel task (CSR / n:m)
ROWS = 16


@njit(inline="always", cache=True)
def _epilogue_row(out, r, n0, n1, ops, fpar, ipar, buf):
    for n in range(n0, n1):
        out[r, n] = _ep_one(out[r, n], r, n, ops, fpar, ipar, buf)


@njit(parallel=True, cache=True)
def spmm_csr(indptr, indices, values, D, out, ops, fpar, ipar, buf, use_ep):
    """``out[r, :] = sum_{p in row r} values[p] * D[indices[p], :]`` (then the epilogue)."""
    R, N = out.shape
    nblocks = (R + ROWS - 1) // ROWS
    for blk in prange(nblocks):
        r0, r1 = blk * ROWS, min(R, blk * ROWS + ROWS)
        if N == 1:
            for r in range(r0, r1):
                acc = np.float32(0.0)
                for p in range(indptr[r], indptr[r + 1]):
                    acc += values[p] * D[indices[p], 0]
                out[r, 0] = _ep_one(acc, r, 0, ops, fpar, ipar, buf) if use_ep else acc
            continue
        for n0 in range(0, N, TILE):
            n1 = min(N, n0 + TILE)
            for r in range(r0, r1):
                for n in range(n0, n1):
                    out[r, n] = np.float32(0.0)
                for p in range(indptr[r], indptr[r + 1]):
                    v = values[p]
                    j = indices[p]
                    for n in range(n0, n1):
                        out[r, n] += v * D[j, n]
                if use_ep:
                    _epilogue_row(out, r, n0, n1, ops, fpar, ipar, buf)


@njit(parallel=True, cache=True)
def spmm_bcsr(bptr, bidx, blocks, D, out, ops, fpar, ipar, buf, use_ep):
    """Block CSR: ``out[bi*br + ii, :] += blocks[p, ii, jj] * D[bidx[p]*bc + jj, :]``."""
    R, N = out.shape
    nb, br, bc = blocks.shape
    nbr = R // br
    for bi in prange(nbr):
        for n0 in range(0, N, TILE):
            n1 = min(N, n0 + TILE)
            for ii in range(br):
                for n in range(n0, n1):
                    out[bi * br + ii, n] = np.float32(0.0)
            for p in range(bptr[bi], bptr[bi + 1]):
                c0 = bidx[p] * bc
                for ii in range(br):
                    r = bi * br + ii
                    if N == 1:
                        acc = out[r, 0]
                        for jj in range(bc):
                            acc += blocks[p, ii, jj] * D[c0 + jj, 0]
                        out[r, 0] = acc
                    else:
                        for jj in range(bc):
                            v = blocks[p, ii, jj]
                            for n in range(n0, n1):
                                out[r, n] += v * D[c0 + jj, n]
            if use_ep:
                for ii in range(br):
                    _epilogue_row(out, bi * br + ii, n0, n1, ops, fpar, ipar, buf)


@njit(parallel=True, cache=True)
def spmm_2of4(values, packed, D, out, ops, fpar, ipar, buf, use_ep):
    """2:4 rows: group g of row r holds ``values[r, 2g], values[r, 2g+1]`` at columns
    ``4g + c0, 4g + c1``; ``packed[r, g // 2] >> (4 * (g % 2))`` holds c0 (bits 0-1), c1 (bits 2-3).
    Reads half the weight bytes of the dense matrix plus 2 bits per value."""
    R, N = out.shape
    G = values.shape[1] // 2
    nblocks = (R + ROWS - 1) // ROWS
    for blk in prange(nblocks):
        r0, r1 = blk * ROWS, min(R, blk * ROWS + ROWS)
        if N == 1:
            for r in range(r0, r1):
                acc = np.float32(0.0)
                for g in range(G):
                    b = np.int32(packed[r, g >> 1]) >> ((g & 1) * 4)
                    acc += values[r, 2 * g] * D[4 * g + (b & 3), 0]
                    acc += values[r, 2 * g + 1] * D[4 * g + ((b >> 2) & 3), 0]
                out[r, 0] = _ep_one(acc, r, 0, ops, fpar, ipar, buf) if use_ep else acc
            continue
        for n0 in range(0, N, TILE):
            n1 = min(N, n0 + TILE)
            for r in range(r0, r1):
                for n in range(n0, n1):
                    out[r, n] = np.float32(0.0)
                for g in range(G):
                    b = np.int32(packed[r, g >> 1]) >> ((g & 1) * 4)
                    j0 = 4 * g + (b & 3)
                    j1 = 4 * g + ((b >> 2) & 3)
                    v0 = values[r, 2 * g]
                    v1 = values[r, 2 * g + 1]
                    for n in range(n0, n1):
                        out[r, n] += v0 * D[j0, n]
                    for n in range(n0, n1):
                        out[r, n] += v1 * D[j1, n]
                if use_ep:
                    _epilogue_row(out, r, n0, n1, ops, fpar, ipar, buf)


def pack_2of4(coordinates: np.ndarray, rows: int) -> np.ndarray:
    """2-bit in-block coordinates [rows * G * 2] -> [rows, ceil(G / 2)] bytes (4 bits per group)."""
    c = coordinates.reshape(rows, -1, 2).astype(np.uint8)
    nib = c[:, :, 0] | (c[:, :, 1] << 2)  # [rows, G]
    if nib.shape[1] % 2:
        nib = np.concatenate([nib, np.zeros((rows, 1), np.uint8)], axis=1)
    return np.ascontiguousarray(nib[:, 0::2] | (nib[:, 1::2] << 4))


@njit(parallel=True, cache=True)
def spmspm_csr(ap, ai, av, bp, bi, bv, out):
    """``out[r, :] = sum_{p in row r of A} av[p] * B[ai[p], :]`` over B's stored entries only
    (Gustavson, dense output rows)."""
    R, N = out.shape
    for r in prange(R):
        for n in range(N):
            out[r, n] = np.float32(0.0)
        for p in range(ap[r], ap[r + 1]):
            k = ai[p]
            v = av[p]
            for q in range(bp[k], bp[k + 1]):
                out[r, bi[q]] += v * bv[q]


@njit(cache=True)
def csr_transpose(indptr, indices, ncols):
    """(indptr, indices, permutation) of the transpose: ``values_t = values[perm]``.
    Counting sort: rows of the result come out ordered, as CSR wants."""
    nnz = indices.shape[0]
    R = indptr.shape[0] - 1
    tptr = np.zeros(ncols + 1, np.int32)
    for p in range(nnz):
        tptr[indices[p] + 1] += 1
    for c in range(ncols):
        tptr[c + 1] += tptr[c]
    fill = tptr[:-1].copy()
    tidx = np.empty(nnz, np.int32)
    perm = np.empty(nnz, np.int64)
    for r in range(R):
        for p in range(indptr[r], indptr[r + 1]):
            c = indices[p]
            q = fill[c]
            tidx[q] = r
            perm[q] = p
            fill[c] = q + 1
    return tptr, tidx, perm

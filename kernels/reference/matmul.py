"""MatMul: batched, transposed, 1-D operands, bias, fpmath and accumulation mode.

Formula (per batch index b, numpy-broadcast over the batch dims)::

    dst[b, m, n] = acc(sum_k A[b, m, k] * B[b, k, n]) + bias[b, m, n]

``A``/``B`` are the inputs after ``transpose_a``/``transpose_b`` (swap of the
last two dims, ignored for 1-D inputs) and after the fpmath down-conversion
(``FPMath.round_input``; inputs dequantized from integers in the same
partition use ``round_dequantized_weight``).  A 1-D src acts as ``[1, K]``
and a 1-D weight as ``[K, 1]``; the unit dim is dropped from the result.

The sum is evaluated in float64 (exact for the integer-valued data benchdnn
uses, and within 1 f32 ulp otherwise) and rounded once to the accumulator:

* ``accumulation_mode`` strict, f32, any, relaxed, s32: f32 accumulator (s32
  needs integer inputs, which MatMul never has, so it is an f32 sum here);
* ``f16``: the finished sum is rounded through f16 (a model of f16
  accumulation: one rounding of the total, not one per partial sum).

The bias (f32 of the bias type) is then added in f32 and the result rounded
to the dst type.

Extensions (``graph_api.dot_algorithm``, ``graph_api.indexing_maps``):

* ``algorithm`` replaces the fpmath rounding for this op (the algorithm wins):
  each operand is split into its parts (``dot_algorithm.split``) and the sum
  of the listed part x part products is evaluated in float64, then rounded
  once to the f32 accumulator — an ideal f32 accumulation of exact products;
* ``indexing_maps`` (and BatchReduceMatMul, whose default maps sum over the
  batch) contract by the maps' einsum in float64: dims of the loop domain
  missing from C's map are summed; C is broadcast along dims only it has.
"""
from __future__ import annotations

import numpy as np

from graph_api import dot_algorithm, dtypes, indexing_maps
from graph_api.dtypes import DataType
from graph_api.enums import OpKind

from ._common import f32, finish, round_mm_input


def _as_2d_operands(a, b, transpose_a, transpose_b):
    """Apply transposes and promote 1-D operands; returns (a, b, drop_m, drop_n)."""
    if transpose_a and a.ndim > 1:
        a = np.swapaxes(a, -1, -2)
    if transpose_b and b.ndim > 1:
        b = np.swapaxes(b, -1, -2)
    drop_m, drop_n = a.ndim == 1, b.ndim == 1
    if drop_m:
        a = a[np.newaxis, :]
    if drop_n:
        b = b[:, np.newaxis]
    return a, b, drop_m, drop_n


def accumulate(a, b, mode: str = "strict", algorithm=None, contract=None) -> np.ndarray:
    """``a @ b`` (or ``contract(a, b)``) summed in f64 and rounded to the accumulator, as f32.

    With an ``algorithm`` the operands are its parts and the sum runs over the
    algorithm's part pairs (still one f64 sum, one rounding).
    """
    contract = contract or np.matmul
    if algorithm is None:
        total = contract(a.astype(np.float64), b.astype(np.float64))
    else:
        lhs = dot_algorithm.split(a, algorithm.lhs_type, algorithm.lhs_component_count)
        rhs = dot_algorithm.split(b, algorithm.rhs_type, algorithm.rhs_component_count)
        total = sum(contract(lhs[i].astype(np.float64), rhs[j].astype(np.float64))
                    for i, j in algorithm.pairs())
    acc = np.asarray(total).astype(np.float32)
    if mode == "f16":
        acc = dtypes.round_through(acc, DataType.f16)
    return acc


def _operands(op, inputs, ctx):
    """A and B as f32: rounded by the algorithm's types later when there is one
    (the algorithm wins over fpmath), else by the fpmath mode now."""
    algorithm = dot_algorithm.algorithm_of(op)
    if algorithm is not None:
        return f32(inputs[0]), f32(inputs[1]), algorithm
    return round_mm_input(inputs[0], 0, ctx), round_mm_input(inputs[1], 1, ctx), None


def _with_bias(acc, inputs, out_lt):
    if len(inputs) > 2:
        acc = acc + f32(inputs[2])
    return [finish(np.broadcast_to(acc, out_lt.shape), out_lt)]


def matmul(op, inputs, out_lts, ctx):
    """dst = A @ B (+ bias); see the module docstring for the rounding steps."""
    if "indexing_maps" in op.attrs:
        return matmul_with_maps(op, inputs, out_lts, ctx)
    a, b, algorithm = _operands(op, inputs, ctx)
    a, b, drop_m, drop_n = _as_2d_operands(
        a, b, op.attrs.get("transpose_a", False), op.attrs.get("transpose_b", False))
    acc = accumulate(a, b, op.attrs.get("accumulation_mode", "strict"), algorithm)
    if drop_m:
        acc = acc[..., 0, :]
    if drop_n:
        acc = acc[..., 0]
    return _with_bias(acc, inputs, out_lts[0])


def matmul_with_maps(op, inputs, out_lts, ctx):
    """dst[C map] = sum over the other loop dims of A[A map] * B[B map] (+ bias).

    Also BatchReduceMatMul: its default maps ``(b,m,k) x (b,k,n) -> (m,n)``.
    """
    maps = indexing_maps.maps_of(op) or indexing_maps.default(op.kind.name, True)
    a, b, algorithm = _operands(op, inputs, ctx)
    subscripts = indexing_maps.summed_spec(maps)
    acc = accumulate(a, b, op.attrs.get("accumulation_mode", "strict"), algorithm,
                     lambda x, y: np.einsum(subscripts, x, y))
    acc = indexing_maps.broadcast_c(acc, maps, out_lts[0].shape)
    return _with_bias(acc, inputs, out_lts[0])


MATMUL = {OpKind.MatMul: matmul, OpKind.BatchReduceMatMul: matmul_with_maps}

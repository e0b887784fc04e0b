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
"""
from __future__ import annotations

import numpy as np

from graph_api import dtypes
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


def accumulate(a, b, mode: str = "strict") -> np.ndarray:
    """``a @ b`` summed in f64 and rounded to the accumulator type, as f32."""
    acc = np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
    if mode == "f16":
        acc = dtypes.round_through(acc, DataType.f16)
    return acc


def matmul(op, inputs, out_lts, ctx):
    """dst = A @ B (+ bias); see the module docstring for the rounding steps."""
    a = round_mm_input(inputs[0], 0, ctx)
    b = round_mm_input(inputs[1], 1, ctx)
    a, b, drop_m, drop_n = _as_2d_operands(
        a, b, op.attrs.get("transpose_a", False), op.attrs.get("transpose_b", False))
    acc = accumulate(a, b, op.attrs.get("accumulation_mode", "strict"))
    if drop_m:
        acc = acc[..., 0, :]
    if drop_n:
        acc = acc[..., 0]
    if len(inputs) > 2:
        acc = acc + f32(inputs[2])
    return [finish(np.broadcast_to(acc, out_lts[0].shape), out_lts[0])]


MATMUL = {OpKind.MatMul: matmul}

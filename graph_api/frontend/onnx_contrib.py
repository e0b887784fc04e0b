"""ONNX Runtime's fused ops (domain ``com.microsoft``) as graph_api op chains.

MatMulNBits
-----------
``Y = A @ dequant(B)^T (+ bias)`` with B quantized in blocks of ``block_size`` along K.
It becomes::

    W_int [N, K] (s4/u4/s8/u8), scales [N, K/G] (, zps [N, K/G])
        -> DynamicDequantize(per_group, group_shape [1, G]) -> MatMul(A, ., transpose_b) (+ bias)

which is the weight-compressed pattern ``matmul_compressed`` (int4/int8 weights read
by the decode/prefill kernels).  The packed layout converts once, at load:

* ORT stores B as uint8 ``[N, n_blocks, blob_size]``, ``n_blocks = ceil(K / block)``,
  ``blob_size = block * bits / 8``: row n, block j holds quantized values
  ``k = j * block ...`` packed **low nibble first** for 4 bits (element ``2i`` in bits 0-3,
  ``2i + 1`` in bits 4-7 of byte ``i``), one per byte for 8 bits; values are unsigned.
  graph_api's s4/u4 storage is the same order (two per byte, low nibble first, row-major
  over the logical ``[N, K]`` shape), so for K a multiple of the block the bytes are the
  row-major ``[N, K]`` u4 tensor as they are; a padded last block is cut off.
* ORT's zero points are uint8, packed the same way per row (``ceil(n_blocks * bits / 8)``
  bytes per row), or of A's type with the scales' shape; absent, they are ``2^(bits-1)``.
* Without zero points the weights become signed: ``q - 8`` (s4) / ``q - 128`` (s8), no zps
  (``(q - 8) * s`` is exactly ORT's value).  With uint8 zero points: u4/u8 weights and u4/u8
  zps of the scales' shape.  Float zero points that are not integers, and a non-trivial
  ``g_idx`` (act-order), are dequantized at load into f32 weights (a plain MatMul).
* ``block_size`` must divide K for a group_shape; otherwise the groups shrink to
  ``gcd(K, block)`` with each block's scale repeated (exact).
* ``accuracy_level`` is ignored: the activations stay f32 (ORT's level 0); the graph's
  fpmath mode decides what the kernel may do.

SkipLayerNormalization / SkipSimplifiedLayerNormalization
---------------------------------------------------------
``out = LayerNorm(input + skip [+ bias])`` -> Add [-> Add] -> LayerNorm (RMSNorm); the sum is
the fourth output when asked for.
"""
from __future__ import annotations

import math

import numpy as np

from ..dtypes import DataType as DT
from ..errors import InvalidShape, Unimplemented
from .onnx_ops import _floats, _rms_norm, _target


def unpack_ort_nbits(packed: np.ndarray, rows: int, count: int, bits: int) -> np.ndarray:
    """ORT's packed rows (uint8, ``rows`` rows) -> uint8 values ``[rows, count]``.

    4 bits: low nibble first; 8 bits: one per byte.
    """
    b = np.ascontiguousarray(packed, dtype=np.uint8).reshape(rows, -1)
    if bits == 8:
        return b[:, :count]
    if bits != 4:
        raise Unimplemented(f"MatMulNBits with bits={bits}: only 4 and 8 are supported")
    out = np.empty((rows, b.shape[1] * 2), np.uint8)
    out[:, 0::2] = b & 0xF
    out[:, 1::2] = b >> 4
    return out[:, :count]


def _mat_mul_nbits(ctx):
    if not _floats(ctx, 0):
        raise ctx.fail(Unimplemented, f"A is {ctx.dtype(0)}; only f32/f16/bf16 activations")
    K, N = int(ctx.attr("K")), int(ctx.attr("N"))
    bits, block = int(ctx.attr("bits", 4)), int(ctx.attr("block_size"))
    if bits not in (4, 8):
        raise ctx.fail(Unimplemented, f"bits={bits}; only 4 and 8 map to graph_api weights")
    B, scales = ctx.const(1), ctx.const(2)
    if B is None or scales is None:
        raise ctx.fail(Unimplemented, "B and scales must be initializers (constant weights)")
    n_blocks = (K + block - 1) // block
    blob = block * bits // 8
    if B.dtype != np.uint8 or B.size != N * n_blocks * blob:
        raise ctx.fail(InvalidShape, f"B is {B.dtype} with {B.size} bytes, expected uint8 "
                                     f"[{N}, {n_blocks}, {blob}] for K={K}, N={N}, bits={bits}, "
                                     f"block_size={block}")
    if scales.size != N * n_blocks:
        raise ctx.fail(InvalidShape, f"scales hold {scales.size} values, expected {N} x {n_blocks}")
    a_shape = ctx.shape(0)
    if a_shape is not None and a_shape[-1] not in (-1, K):
        raise ctx.fail(InvalidShape, f"A's last dim is {a_shape[-1]}, the node says K={K}")
    q = unpack_ort_nbits(B, N, K, bits)                       # [N, K] unsigned
    s = scales.reshape(N, n_blocks)
    mid = 1 << (bits - 1)
    zp = ctx.const(3) if ctx.has(3) else None
    if ctx.has(3) and zp is None:
        raise ctx.fail(Unimplemented, "zero_points must be an initializer")
    if zp is not None:
        if zp.dtype == np.uint8:
            zp = unpack_ort_nbits(zp, N, n_blocks, bits).astype(np.int32)
        else:
            zp = zp.reshape(N, n_blocks)
    g_idx = ctx.const(4) if ctx.has(4) else None
    if ctx.has(4) and (g_idx is None or not np.array_equal(g_idx.reshape(-1), np.arange(K) // block)):
        dense = _dequant_dense(q, s, zp, mid, block, K, g_idx)
        return _finish(ctx, ctx.constant(dense, _target(ctx, 0)))
    if zp is not None and zp.dtype.kind == "f":
        if not np.array_equal(zp, np.round(zp)) or zp.min() < 0 or zp.max() >= (1 << bits):
            dense = _dequant_dense(q, s, zp, mid, block, K, None)
            return _finish(ctx, ctx.constant(dense, _target(ctx, 0)))
        zp = zp.astype(np.int32)
    group = block if K % block == 0 else math.gcd(K, block)
    if group != block:  # repeat each block's scale (and zp) over its sub-groups
        reps = block // group
        s = np.repeat(s, reps, axis=1)[:, : K // group]
        zp = None if zp is None else np.repeat(zp, reps, axis=1)[:, : K // group]
    sdt = _target(ctx, 0)
    if zp is None or not np.any(zp != mid):  # symmetric: signed weights, no zero points
        w = ctx.constant(q.astype(np.int16) - mid, DT.s4 if bits == 4 else DT.s8)
        zps = None
    else:
        w = ctx.constant(q, DT.u4 if bits == 4 else DT.u8)
        zps = ctx.constant(zp.astype(np.uint8), DT.u4 if bits == 4 else DT.u8)
    sc = ctx.constant(np.ascontiguousarray(s), sdt)
    args = [w, sc] + ([zps] if zps is not None else [])
    wf = ctx.b.dynamic_dequantize(*args, qtype="per_group", group_shape=[1, group])
    return _finish(ctx, wf)


def _dequant_dense(q, s, zp, mid, block, K, g_idx) -> np.ndarray:
    """f32 ``[N, K]`` weights: ``(q - zp) * scale`` with block ``g_idx[k]`` (or ``k // block``)."""
    idx = np.arange(K) // block if g_idx is None else g_idx.reshape(-1).astype(np.int64)
    scale = s.astype(np.float32)[:, idx]
    zero = np.float32(mid) if zp is None else zp.astype(np.float32)[:, idx]
    return ((q.astype(np.float32) - zero) * scale).astype(np.float32)


def _finish(ctx, w):
    """MatMul(A, W [N, K], transpose_b) with MatMulNBits' optional bias (input 5)."""
    bias = None
    if ctx.has(5):
        c = ctx.const(5)
        bias = ctx.constant(c, _target(ctx, 0)) if c is not None else ctx.value(5)
    x = ctx.value(0)
    y = ctx.b.matmul(x, w, bias, transpose_b=True) if bias is not None else ctx.b.matmul(x, w, transpose_b=True)
    return ctx.out(y)


def _skip_norm(rms: bool):
    def mapper(ctx):
        if not _floats(ctx, 0, 1):
            return False
        outs = list(ctx.node.output)
        if any(o for o in outs[1:3]):
            raise ctx.fail(Unimplemented, "the mean / inv_std_var outputs are not supported")
        eps = float(ctx.attr("epsilon", 1e-12 if not rms else 1e-6))
        dt = _target(ctx, 0, 1)
        total = ctx.b.add(ctx.value(0, dt), ctx.value(1, dt))
        bias_at = 3 if rms else 4
        if ctx.has(bias_at):
            total = ctx.b.add(total, ctx.value(bias_at, dt))
        aux = DT.f32 if dt != DT.bf16 else DT.bf16
        if rms:
            y = ctx.b.rms_norm(total, ctx.value(2, dt), begin_norm_axis=-1, epsilon=eps)
        else:
            width = ctx.shape(2)
            beta = ctx.value(3, aux) if ctx.has(3) else ctx.constant(np.zeros(width, np.float32), aux)
            y = ctx.b.layer_norm(total, ctx.value(2, aux), beta, keep_stats=False, begin_norm_axis=-1,
                                 epsilon=eps)
        ctx.out(y)
        if len(outs) > 3 and outs[3]:
            ctx.imp.produce(outs[3], total)
        return True
    return mapper


MAPPERS = {
    "MatMulNBits": _mat_mul_nbits,
    "SkipLayerNormalization": _skip_norm(False),
    "SkipSimplifiedLayerNormalization": _skip_norm(True),
    "SimplifiedLayerNormalization": _rms_norm,  # ORT registers it in both domains
}

"""Grouped DynamicQuantize / DynamicDequantize (int8 and packed int4).

Formulas (groups of ``G`` consecutive elements along the last axis; oneDNN's
``group_shape [1, .., 1, G]``; per-tensor/per-channel are G = C or a scale
broadcast by the caller)::

    quantize:    q = saturate(round_half_even(x / s + z))
    dequantize:  x = (q - z) * s                      (f32, exact)

Scales and zero points arrive at run time (oneDNN's Dynamic* ops take them as
inputs).  x is f32 or bf16/f16 bits; int4 results are packed two per byte,
low nibble first, in row-major order of the whole tensor.
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401

import numpy as np
from numba import njit, prange

from graph_api.kernels.bits import f32_to_bf16, f32_to_f16_bits, f32_view, load_f32, nib_x

_RANGES = {"s8": (-128, 127), "u8": (0, 255), "s4": (-8, 7), "u4": (0, 15)}


@njit(parallel=True, cache=True)
def _quant(x, kind, R, C, G, sc, zp, has_zp, lo, hi, bits4, out):
    """x flat [R*C] (f32, or bf16/f16 bits as uint16: ``kind`` 0/1/2); sc/zp flat
    [R*C/G]; out the uint8 view of int8/uint8 [R*C] or of the packed bytes: one compiled
    signature per input type, not per (input, output) pair (each pair cost ~2 s CPU
    cold).  (x as a uint16 view too, read through an f32 view where it holds f32, made
    f32 quantization 20-30% slower.)"""
    ng = C // G
    for r in prange(R):
        for c0 in range(0, C, 2 if bits4 else 1):
            v0 = np.int32(0)
            v1 = np.int32(0)
            for e in range(2 if bits4 else 1):
                c = c0 + e
                if c >= C:
                    break  # odd row length: handled by _quant_odd_fix
                i = r * C + c
                gi = r * ng + c // G
                q = load_f32(x, kind, i) / sc[gi]
                if has_zp:  # the zero point is added before rounding (oneDNN, the reference)
                    q += zp[gi]
                q = np.rint(q)
                q = min(max(q, np.float32(lo)), np.float32(hi))
                if e == 0:
                    v0 = np.int32(q)
                else:
                    v1 = np.int32(q)
            if bits4:
                i = r * C + c0
                if i % 2 == 0 and c0 + 1 < C:
                    out[i >> 1] = np.uint8((v0 & 15) | ((v1 & 15) << 4))
            else:
                out[r * C + c0] = np.uint8(v0 & 255)  # an int8 output's two's-complement byte


@njit(cache=True)
def _quant_odd_fix(x, kind, R, C, G, sc, zp, has_zp, lo, hi, out):
    """Packed int4 bytes that straddle rows (odd C): serial, element by element."""
    ng = C // G
    n = R * C
    for i in range(n):
        r = i // C
        c = i % C
        if C % 2 == 0:
            return
        gi = r * ng + c // G
        q = load_f32(x, kind, i) / sc[gi]
        if has_zp:
            q += zp[gi]
        q = np.rint(q)
        q = np.int32(min(max(q, np.float32(lo)), np.float32(hi))) & 15
        b = out[i >> 1]
        if i & 1:
            out[i >> 1] = np.uint8((b & 15) | (q << 4))
        else:
            out[i >> 1] = np.uint8((b & 0xF0) | q)


@njit(parallel=True, cache=True)
def _dequant(q, kind, R, C, G, sc, zp, has_zp, okind, out):
    """q flat uint8 view (of int8 for kind 3, uint8 4, packed s4 5 / u4 6) -> out flat,
    the uint16 view of f32 (``okind`` 0) or bf16/f16 bits (1/2): one compiled signature
    (four cost ~4 s more CPU cold)."""
    ng = C // G
    of = f32_view(out)
    for r in prange(R):
        for c in range(C):
            i = r * C + c
            if kind == 5:
                v = nib_x(q[i >> 1], np.uint8(0x88), (i & 1) == 1) - np.float32(8.0)
            elif kind == 6:
                v = nib_x(q[i >> 1], np.uint8(0), (i & 1) == 1)
            elif kind == 3:
                v = np.float32(np.int8(q[i]))  # the byte as two's complement
            else:
                v = np.float32(q[i])
            gi = r * ng + c // G
            if has_zp:
                v = v - zp[gi]
            v = v * sc[gi]
            if okind == 0:
                of[i] = v
            elif okind == 1:
                out[i] = f32_to_bf16(v)
            else:
                out[i] = f32_to_f16_bits(v)


def _kind_of(x):
    if x.dtype == np.float32:
        return x, 0
    if x.dtype == np.float16:
        return x.view(np.uint16), 2
    if x.dtype.name == "bfloat16" or x.dtype == np.uint16:
        return x.view(np.uint16), 1
    return x.astype(np.float32), 0


def quantize(x, scales, zps=None, *, dtype="s8", group=None, out=None):
    """DynamicQuantize along the last axis with groups of ``group`` (default: C).

    Returns int8/uint8 shaped like ``x`` or, for s4/u4, a flat packed uint8
    buffer of ``ceil(x.size / 2)`` bytes.
    """
    x = np.ascontiguousarray(x)
    C = x.shape[-1]
    R = x.size // C
    G = group or C
    xv, kind = _kind_of(x.reshape(-1))
    sc = np.ascontiguousarray(np.asarray(scales).astype(np.float32)).reshape(-1)
    zp = (np.zeros(1, np.float32) if zps is None
          else np.ascontiguousarray(np.asarray(zps).astype(np.float32)).reshape(-1))
    lo, hi = _RANGES[dtype]
    bits4 = dtype in ("s4", "u4")
    if out is None:
        out = (np.zeros((x.size + 1) // 2, np.uint8) if bits4
               else np.empty(x.shape, np.int8 if dtype == "s8" else np.uint8))
    ob = out.reshape(-1).view(np.uint8)
    _quant(xv, kind, R, C, G, sc, zp, zps is not None, lo, hi, bits4, ob)
    if bits4 and C % 2:
        _quant_odd_fix(xv, kind, R, C, G, sc, zp, zps is not None, lo, hi, ob)
    return out


def dequantize(q, shape, scales, zps=None, *, dtype="s8", group=None, out=None, out_dtype="f32"):
    """DynamicDequantize: ``(q - z) * s`` -> f32 (or bf16/f16 bits) of ``shape``."""
    C = shape[-1]
    n = int(np.prod(shape))
    R = n // C
    G = group or C
    kind = {"s8": 3, "u8": 4, "s4": 5, "u4": 6}[dtype]
    qv = np.asarray(q).reshape(-1).view(np.uint8)
    sc = np.ascontiguousarray(np.asarray(scales).astype(np.float32)).reshape(-1)
    zp = (np.zeros(1, np.float32) if zps is None
          else np.ascontiguousarray(np.asarray(zps).astype(np.float32)).reshape(-1))
    okind = {"f32": 0, "bf16": 1, "f16": 2}[out_dtype]
    if out is None:
        out = np.empty(shape, np.float32 if okind == 0 else np.uint16)
    _dequant(qv, kind, R, C, G, sc, zp, zps is not None, okind, out.reshape(-1).view(np.uint16))
    return out

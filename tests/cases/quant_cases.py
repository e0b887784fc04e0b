"""Quantize, Dequantize, DynamicQuantize and DynamicDequantize cases.

Quantizing cases use power-of-two scales (as benchdnn does) and sources on a
0.125 grid, so ``src / scale`` is exact in f32 and f64 and lands on many
.5 ties: the expected value rounds them with Python's half-to-even ``round``.
Expected values loop over elements, mapping each index to its scale index
(``i // group`` per dim) explicitly.
"""
from __future__ import annotations

import numpy as np

from graph_api import dtypes
from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K

from .records import EXACT, In, OpCase, Out, as_f64, round_half_even

INT_RANGE = {dt: (dtypes.info(DataType[dt]).lowest, dtypes.info(DataType[dt]).highest)
             for dt in ("s8", "u8", "s4", "u4", "s32")}
F8_MAX = {"f8_e4m3": 448.0, "f8_e5m2": float("inf")}


def pow2(shape, seed):
    """Explicit power-of-two scales (a deterministic draw)."""
    return np.random.default_rng(seed).choice([0.25, 0.5, 1.0, 2.0], shape).tolist()


def param_index(idx, param_shape, attrs, src_ndim):
    """Index into the scale/zp array used by source element ``idx``."""
    qtype = attrs.get("qtype", "per_tensor")
    if qtype == "per_group":
        return tuple(i // g for i, g in zip(idx, attrs["group_shape"]))
    if qtype == "per_channel" and int(np.prod(param_shape)) > 1:
        return (idx[attrs.get("axis", 1) % src_ndim],)
    return (0,) * len(param_shape)


def _params(inputs, attrs, static):
    if static:
        scales = np.asarray(attrs["scales"], dtype=np.float64)
        zps = np.asarray(attrs["zps"], dtype=np.float64) if attrs.get("zps") else None
    else:
        scales = as_f64(inputs[1])
        zps = as_f64(inputs[2]) if len(inputs) > 2 else None
    return scales, zps


def _zp(zps, idx, attrs, ndim):
    return 0.0 if zps is None else zps[param_index(idx, zps.shape, attrs, ndim)]


def quantize_expected(dst_dtype, static):
    def expected(inputs, attrs):
        x = as_f64(inputs[0])
        scales, zps = _params(inputs, attrs, static)
        out = np.empty(x.shape, dtype=np.float64 if dst_dtype in F8_MAX else np.int64)
        for idx in np.ndindex(x.shape):
            v = x[idx] / scales[param_index(idx, scales.shape, attrs, x.ndim)] + _zp(zps, idx, attrs, x.ndim)
            if dst_dtype in F8_MAX:
                out[idx] = min(max(v, -F8_MAX[dst_dtype]), F8_MAX[dst_dtype])
            else:
                lo, hi = INT_RANGE[dst_dtype]
                out[idx] = min(max(round_half_even(v), lo), hi)
        return [out]

    return expected


def dequantize_expected(static):
    def expected(inputs, attrs):
        x = as_f64(inputs[0])
        scales, zps = _params(inputs, attrs, static)
        out = np.empty(x.shape)
        for idx in np.ndindex(x.shape):
            scale = scales[param_index(idx, scales.shape, attrs, x.ndim)]
            out[idx] = (x[idx] - _zp(zps, idx, attrs, x.ndim)) * scale
        return [out]

    return expected


def static_cases():
    cases = []
    quant = (  # dst, shape, value range, attrs
        ("s8", (3, 8), (-80, 80), dict(scales=[0.5], zps=[3])),
        ("u8", (2, 3, 4), (-40, 200), dict(qtype="per_channel", axis=1, scales=[0.25, 0.5, 1.0],
                                           zps=[10, 0, 128])),
        ("f8_e4m3", (4, 6), (-300, 300), dict(scales=[0.5])),
        ("f8_e5m2", (2, 5), (-1000, 1000), dict(qtype="per_channel", axis=0, scales=[0.5, 2.0])),
    )
    for dst, shape, (low, high), attrs in quant:
        cases.append(OpCase(f"Quantize_{dst}", K.Quantize, (In(shape, "f32", low, high, 0.125),),
                            (Out(shape, dst),), quantize_expected(dst, True), attrs,
                            seed=4000 + len(cases)))
    dequant = (  # src, shape, attrs
        ("s8", (3, 8), dict(scales=[0.25], zps=[-3])),
        ("u8", (2, 3, 4), dict(qtype="per_channel", axis=1, scales=[0.5, 0.125, 2.0],
                               zps=[128, 0, 7])),
        ("f8_e4m3", (4, 6), dict(scales=[2.0])),
        ("f8_e5m2", (2, 5), dict(qtype="per_channel", axis=0, scales=[0.5, 3.0])),
    )
    for src, shape, attrs in dequant:
        low, high = INT_RANGE.get(src, (-100, 100))
        cases.append(OpCase(f"Dequantize_{src}", K.Dequantize, (In(shape, src, low, high),),
                            (Out(shape, "f32"),), dequantize_expected(True), attrs,
                            seed=4100 + len(cases)))
    return cases


def dynamic_quantize_cases():
    cases = []
    configs = (  # src dtype, shape, scales, zps (shape, dtype, low, high), dst, attrs
        ("f32", (3, 8), In((1,), "f32", values=[0.5]), In((1,), "s32", values=[5]), "u8", {}),
        ("f16", (2, 5), In((1,), "f16", values=[0.25]), In((1,), "u8", values=[100]), "u8", {}),
        ("bf16", (3, 4), In((4,), "bf16", values=[0.25, 0.5, 1.0, 2.0]),
         In((4,), "s8", values=[-3, 0, 2, 9]), "s8", dict(qtype="per_channel", axis=1)),
        ("f16", (4, 8), In((4, 2), "f16", values=pow2((4, 2), 1)), In((4, 2), "s4", -2, 2), "s4",
         dict(qtype="per_group", group_shape=[1, 4])),
        ("f32", (4, 3), In((2, 3), "f32", values=pow2((2, 3), 2)), In((2, 3), "u4", 0, 3), "u4",
         dict(qtype="per_group", group_shape=[2, 1])),
        ("f32", (2, 6), In((1,), "f32", values=[0.25]), None, "s8", {}),
    )
    for src, shape, scales, zps, dst, attrs in configs:
        ins = (In(shape, src, -6, 6, 0.125), scales) + ((zps,) if zps else ())
        cases.append(OpCase(f"DynamicQuantize_{src}_{dst}_{len(cases)}", K.DynamicQuantize, ins,
                            (Out(shape, dst),), quantize_expected(dst, False), attrs,
                            tol=EXACT, seed=4200 + len(cases)))
    return cases


def dynamic_dequantize_cases():
    cases = []
    configs = (  # src dtype, shape, scales dtype/shape, zps (dtype, shape) or None, attrs
        ("s8", (3, 8), ("f32", (1,)), ("s32", (1,)), {}),
        ("u8", (2, 6), ("f16", (6,)), ("s8", (6,)), dict(qtype="per_channel", axis=1)),
        ("u8", (3, 4), ("bf16", (3,)), ("u8", (3,)), dict(qtype="per_channel", axis=0)),
        # compressed-SDPA K stored (N, H, D, S): groups along D
        ("s4", (1, 2, 8, 3), ("f16", (1, 2, 2, 3)), ("s4", (1, 2, 2, 3)),
         dict(qtype="per_group", group_shape=[1, 1, 4, 1])),
        # compressed-SDPA V stored (N, H, S, D): groups along D (last)
        ("u4", (1, 2, 3, 8), ("f32", (1, 2, 3, 2)), ("u4", (1, 2, 3, 2)),
         dict(qtype="per_group", group_shape=[1, 1, 1, 4])),
        # int4 gated-MLP weights: groups of 128 along the last dim, no zero points
        ("s4", (4, 256), ("bf16", (4, 2)), None, dict(qtype="per_group", group_shape=[1, 128])),
    )
    for src, shape, (sdt, sshape), zps, attrs in configs:
        low, high = INT_RANGE[src]
        ins = (In(shape, src, low, high), In(sshape, sdt, 0.01, 0.5))
        if zps:
            zlow, zhigh = INT_RANGE[zps[0]]
            ins += (In(zps[1], zps[0], max(zlow, -4), min(zhigh, 4)),)
        cases.append(OpCase(f"DynamicDequantize_{src}_{sdt}_{len(cases)}", K.DynamicDequantize,
                            ins, (Out(shape, sdt),), dequantize_expected(False), attrs,
                            seed=4300 + len(cases)))
    return cases


def quant_cases():
    return static_cases() + dynamic_quantize_cases() + dynamic_dequantize_cases()

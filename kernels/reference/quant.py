"""Quantize / Dequantize (static, attrs) and DynamicQuantize / DynamicDequantize.

Formulas, evaluated in f32 as oneDNN's reorder does::

    dequantize:  dst = (src - zp) * scale                    (then rounded to dst)
    quantize:    dst = saturate(rne(src / scale + zp))       (integer dst)
                 dst = to_f8(src / scale + zp)               (f8 dst; e4m3 saturates to +-448)

``zp`` is 0 when absent.  The quantize step divides by the scale; oneDNN's
backend multiplies by ``1 / scale`` instead, which can differ by one ulp
before rounding (never for power-of-two scales, which benchdnn uses).

Scale/zero-point granularity (``qtype``): ``per_tensor`` (one value),
``per_channel`` (a 1-D list along ``axis``; a length-1 list is shared) or
``per_group`` (scales/zps of the src rank; element index ``i`` along dim ``d``
uses parameter index ``i // group_shape[d]``).  The schema turns the int4
RFC form (``axis`` list + ``groups``, the number of groups along each listed
dim) into ``group_shape``; should it reach a kernel anyway the group size is
``src.shape[axis[i]] // groups[i]`` (whole dims elsewhere), and with neither
attribute it is ``src.shape[d] // scales.shape[d]``.  Per-group parameters
are applied by reshaping the source to ``(S0, G0, S1, G1, ...)`` so that they
broadcast: no per-element loops.

``mask`` (oneDNN branch lvtao/main/quant-mask, 2026-08; qtype stays per_tensor):
bit ``d`` set means the parameters vary along src dim ``d``; the scales (and zps)
hold one packed dim per set bit, in order (for static ops a flat list in
row-major order).  They broadcast as the src shape with 1 on the other dims:
``mask = 3`` on a [B, H, S, D] src with [B, H] scales is per (batch, head),
``mask = 4`` with [S] scales per token.
"""
from __future__ import annotations

import numpy as np

from graph_api.enums import OpKind

from ._common import along, f32, finish, norm_axis


def _axes(op) -> list[int]:
    """``axis`` as a list (the int4 RFC allows a list of dims)."""
    axis = op.attrs.get("axis", 1)
    return [int(a) for a in axis] if isinstance(axis, (list, tuple)) else [int(axis)]


def group_shape(op, src_shape, scales_shape) -> list[int]:
    """``group_shape`` attr; else the RFC form (``groups[i]`` groups along dim
    ``axis[i]``, whole dims elsewhere); else derived from the shapes."""
    given = op.attrs.get("group_shape")
    if given:
        return [int(g) for g in given]
    groups = op.attrs.get("groups")
    if groups:
        shape = list(src_shape)
        for a, g in zip(_axes(op), groups):
            d = norm_axis(a, len(shape))
            shape[d] = shape[d] // int(g)
        return shape
    return [s // max(c, 1) for s, c in zip(src_shape, scales_shape)]


def _full_rank(param: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    """A 1-D per-group vector as a rank-``ndim`` array varying along ``axis``."""
    if param.ndim == ndim:
        return param
    return along(param, axis, ndim) if param.size > 1 else param.reshape((1,) * ndim)


def _interleave(shape, groups) -> list[int]:
    """(S0, G0, S1, G1, ...) for a tensor of ``shape`` grouped by ``groups``."""
    out = []
    for s, g in zip(shape, groups):
        out += [s // g, g]
    return out


def apply_params(formula, x, scales, zps, op):
    """``formula(x, scale, zp)`` with scale/zp broadcast per ``qtype``.

    ``x``, ``scales`` and ``zps`` are f32 arrays (``zps`` may be None).
    """
    mask = op.attrs.get("mask")
    if mask is not None:
        shape = tuple(n if mask >> d & 1 else 1 for d, n in enumerate(x.shape))
        zps = np.zeros((), np.float32) if zps is None else zps.reshape(shape)
        return formula(x, scales.reshape(shape), zps)
    qtype = op.attrs.get("qtype", "per_tensor")
    axis = norm_axis(_axes(op)[0], max(x.ndim, 1))
    zps = np.zeros((), np.float32) if zps is None else zps
    if qtype == "per_group" or op.attrs.get("group_shape"):
        if scales.ndim != x.ndim and not op.attrs.get("group_shape") and not op.attrs.get("groups"):
            scales = _full_rank(scales, x.ndim, axis)
        groups = group_shape(op, x.shape, scales.shape)
        param_shape = _interleave(x.shape, groups)[0::2]
        xi = x.reshape(_interleave(x.shape, groups))
        si = scales.reshape(_interleave(param_shape, [1] * x.ndim))
        zi = zps.reshape(()) if zps.size == 1 else zps.reshape(si.shape)
        return formula(xi, si, zi).reshape(x.shape)
    if qtype == "per_channel":
        scales = along(scales, axis, x.ndim) if scales.size > 1 else scales.reshape(())
        zps = along(zps, axis, x.ndim) if zps.size > 1 else zps.reshape(())
        return formula(x, scales, zps)
    return formula(x, scales.reshape(()), zps.reshape(()))


def dequant_formula(x, scale, zp):
    """(x - zp) * scale, in f32."""
    return (x - zp) * scale


def quant_formula(x, scale, zp):
    """x / scale + zp, in f32 (rounding and saturation happen in ``finish``)."""
    return x / scale + zp


def _static_params(op):
    scales = np.asarray(op.attrs["scales"], dtype=np.float32)
    zps = op.attrs.get("zps")
    zps = np.asarray(zps, dtype=np.float32) if zps else None
    return scales, zps


def _dynamic_params(inputs):
    zps = f32(inputs[2]) if len(inputs) > 2 else None
    return f32(inputs[1]), zps


def dequantize(op, inputs, out_lts, ctx):
    """Static: dst(f32) = (src - zps) * scales, scales/zps from the attributes."""
    scales, zps = _static_params(op)
    y = apply_params(dequant_formula, f32(inputs[0]), scales, zps, op)
    return [finish(y, out_lts[0])]


def quantize(op, inputs, out_lts, ctx):
    """Static: dst = saturate(rne(src / scales + zps)) (or to_f8(...))."""
    scales, zps = _static_params(op)
    with np.errstate(all="ignore"):
        y = apply_params(quant_formula, f32(inputs[0]), scales, zps, op)
    return [finish(y, out_lts[0])]


def dynamic_dequantize(op, inputs, out_lts, ctx):
    """dst (scales' type) = (src - zps) * scales; scales/zps are inputs 1 and 2."""
    scales, zps = _dynamic_params(inputs)
    y = apply_params(dequant_formula, f32(inputs[0]), scales, zps, op)
    return [finish(y, out_lts[0])]


def dynamic_quantize(op, inputs, out_lts, ctx):
    """dst = saturate(rne(src / scales + zps)); scales/zps are inputs 1 and 2."""
    scales, zps = _dynamic_params(inputs)
    with np.errstate(all="ignore"):
        y = apply_params(quant_formula, f32(inputs[0]), scales, zps, op)
    return [finish(y, out_lts[0])]


QUANT = {
    OpKind.Dequantize: dequantize,
    OpKind.Quantize: quantize,
    OpKind.DynamicDequantize: dynamic_dequantize,
    OpKind.DynamicQuantize: dynamic_quantize,
}

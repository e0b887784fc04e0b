"""Interpolate: nearest and (bi/tri)linear resampling of the spatial dims.

For each spatial dim with input size ``I`` and output size ``O`` (from the
output logical tensor; ``sizes``/``scales`` were resolved by shape
inference) the source coordinate of output index ``o`` is::

    half_pixel:    c = (o + 0.5) * I / O - 0.5
    align_corners: c = o * (I - 1) / (O - 1)   (0 when O == 1)

``nearest`` takes ``src[floor(c + 0.5)]`` (oneDNN's CPU rule
``(o + 0.5) / f`` truncated, f = O / I, computed in f32), clamped to
``[0, I-1]``.  ``linear``, ``bilinear`` and ``trilinear`` all interpolate
linearly along every spatial dim (separably) between ``floor(c)`` and the
next index, with ``c`` clamped to ``[0, I-1]`` -- the same weights as
oneDNN's ``linear_coeffs_t``.
"""
from __future__ import annotations

import numpy as np

from graph_api.enums import OpKind

from ._common import f64, finish, from_ncx, ncx_shape, to_ncx


def source_coords(o_size: int, i_size: int, mode: str) -> np.ndarray:
    """Source coordinate (f32 arithmetic, as oneDNN) of every output index."""
    o = np.arange(o_size, dtype=np.float32)
    if mode == "align_corners":
        if o_size == 1:
            return np.zeros(1, np.float32)
        return o * np.float32((i_size - 1) / (o_size - 1))
    inv = np.float32(1.0) / (np.float32(o_size) / np.float32(i_size))
    return (o + np.float32(0.5)) * inv - np.float32(0.5)


def nearest_index(o_size: int, i_size: int, mode: str) -> np.ndarray:
    """floor(c + 0.5) clamped; for half_pixel evaluated as oneDNN's
    ``(o + 0.5f) * (1 / f)`` so that f32 rounding matches."""
    if mode == "align_corners":
        pos = source_coords(o_size, i_size, mode) + np.float32(0.5)
    else:
        inv = np.float32(1.0) / (np.float32(o_size) / np.float32(i_size))
        pos = (np.arange(o_size, dtype=np.float32) + np.float32(0.5)) * inv
    return np.clip(np.floor(pos).astype(np.int64), 0, i_size - 1)


def _nearest(x, axis, o_size, ctm):
    return np.take(x, nearest_index(o_size, x.shape[axis], ctm), axis=axis)


def _linear(x, axis, o_size, ctm):
    i_size = x.shape[axis]
    c = np.clip(source_coords(o_size, i_size, ctm).astype(np.float64), 0, i_size - 1)
    lo = np.floor(c).astype(np.int64)
    hi = np.minimum(lo + 1, i_size - 1)
    w = (c - lo).reshape([-1 if d == axis else 1 for d in range(x.ndim)])
    return np.take(x, lo, axis=axis) * (1.0 - w) + np.take(x, hi, axis=axis) * w


def interpolate(op, inputs, out_lts, ctx):
    """Resample every spatial dim to the output size (see the module docstring)."""
    fmt = op.attrs.get("data_format", "NXC")
    ctm = op.attrs.get("coordinate_transformation_mode", "half_pixel")
    resample = _nearest if op.attrs.get("mode", "nearest") == "nearest" else _linear
    x = to_ncx(f64(inputs[0]), fmt)
    out_sp = ncx_shape(out_lts[0].shape, fmt)[2:]
    for axis, o_size in enumerate(out_sp, start=2):
        x = resample(x, axis, o_size, ctm)
    return [finish(from_ncx(x, fmt), out_lts[0])]


RESAMPLE = {OpKind.Interpolate: interpolate}

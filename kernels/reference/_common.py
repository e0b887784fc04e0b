"""Helpers shared by the reference kernels: attrs, layouts, output rounding."""
from __future__ import annotations

import numpy as np

from graph_api import dtypes
from graph_api.dtypes import DataType


def finish(values, lt) -> np.ndarray:
    """``values`` rounded to ``lt``'s data type (oneDNN's rounding) and shape.

    Always returns a new array, so an output never aliases an input.
    """
    out = dtypes.convert(values, lt.dtype)
    if lt.shape is not None:
        out = out.reshape(lt.shape)
    return out


def f32(x) -> np.ndarray:
    """Any logical array as float32 (may be the input itself: never mutate)."""
    return dtypes.to_f32(x)


def f64(x) -> np.ndarray:
    """Any logical array as a new float64 array."""
    return np.asarray(x).astype(np.float64)


def logical_type(x) -> DataType:
    """The graph data type of a logical numpy array."""
    return dtypes.from_numpy(np.asarray(x).dtype)


def is_integer(x) -> bool:
    return dtypes.info(logical_type(x)).kind == "int"


def norm_axis(axis: int, ndim: int) -> int:
    """Negative axes count from the end, as everywhere in oneDNN Graph."""
    return axis + ndim if axis < 0 else axis


def channel_axis(data_format: str, ndim: int) -> int:
    """Channel position: 1 for NCX, the last one for NXC (the default)."""
    return 1 if data_format == "NCX" and ndim >= 2 else ndim - 1


def to_ncx(x: np.ndarray, data_format: str) -> np.ndarray:
    """A data tensor viewed as (N, C, spatial...)."""
    return np.moveaxis(x, -1, 1) if data_format == "NXC" else x


def from_ncx(x: np.ndarray, data_format: str) -> np.ndarray:
    """Inverse of :func:`to_ncx`."""
    return np.moveaxis(x, 1, -1) if data_format == "NXC" else x


def ncx_shape(shape, data_format: str) -> tuple:
    shape = tuple(shape)
    return (shape[0], shape[-1]) + shape[1:-1] if data_format == "NXC" else shape


def along(vector: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """A 1-D vector reshaped to broadcast along ``axis`` of an ``ndim`` array."""
    shape = [1] * ndim
    shape[axis] = -1
    return np.reshape(vector, shape)


def spatial_list(op, name: str, nsp: int, default: int) -> list[int]:
    """A per-spatial-dim int list attr; missing or empty gives ``default``s.

    Longer lists (oneDNN's 12-entry defaults) are cut to ``nsp`` entries.
    """
    value = op.attrs.get(name)
    return [int(v) for v in value][:nsp] if value else [default] * nsp


def pads(op, sizes, strides, kernels, dilations, deconv=False) -> tuple[list, list]:
    """``(pads_begin, pads_end)`` from the attrs, honouring ``auto_pad``: the one
    rule shape inference uses too (:func:`graph_api.shapes.conv_pads`)."""
    from graph_api.shapes import conv_pads

    begin, end = conv_pads(op, list(sizes), list(kernels), list(strides), list(dilations), deconv)
    return list(begin), list(end)


def pad_spatial(x: np.ndarray, begin, end, value=0.0) -> np.ndarray:
    """Pad (or crop, for negative pads) the spatial dims of an NCX array."""
    widths = [(0, 0), (0, 0)] + [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)]
    out = np.pad(x, widths, constant_values=value)
    crop = [slice(None), slice(None)]
    for b, e, n in zip(begin, end, out.shape[2:]):
        crop.append(slice(max(-b, 0), n - max(-e, 0)))
    return out[tuple(crop)]


def window(xp: np.ndarray, offsets, strides, out_sizes) -> np.ndarray:
    """The strided (N, C, out...) view of padded ``xp`` at kernel ``offsets``.

    Element ``[n, c, o...]`` is ``xp[n, c, o*stride + offset ...]``.
    """
    index = [slice(None), slice(None)]
    for off, s, o in zip(offsets, strides, out_sizes):
        index.append(slice(off, off + (o - 1) * s + 1, s))
    return xp[tuple(index)]


def round_mm_input(x, index: int, ctx) -> np.ndarray:
    """A MatMul/Conv input as f32 after the fpmath down-conversion.

    Data dequantized from integers in the same partition is rounded only with
    ``apply_to_int``; every other input by its storage type (f32 only).
    """
    if index in ctx.int_inputs:
        return ctx.fpmath.round_dequantized_weight(x)
    return ctx.fpmath.round_input(x, logical_type(x))

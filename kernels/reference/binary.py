"""Binary ops with numpy broadcasting, Select, PReLU and BiasAdd.

oneDNN's binary primitive converts both operands to f32, applies the
operation in f32 and rounds once to the destination type; the float formulas
here do exactly that.  When every operand is an integer (s32 Add/Subtract,
s32 GreaterEqual) the arithmetic is exact in int64 instead, which differs from
oneDNN's f32 path only for magnitudes above 2^24; the result still saturates
to the destination type.
"""
from __future__ import annotations

import numpy as np

from graph_api.enums import OpKind

from ._common import along, channel_axis, f32, finish, is_integer


def _operands(inputs):
    """Both inputs as f32, or as int64 when they are all integers."""
    if all(is_integer(x) for x in inputs):
        return [np.asarray(x).astype(np.int64) for x in inputs]
    return [f32(x) for x in inputs]


def binary(formula):
    """Adapt ``formula(a, b)`` (numpy broadcasting) to the kernel contract."""

    def kernel(op, inputs, out_lts, ctx):
        a, b = _operands(inputs[:2])
        with np.errstate(all="ignore"):
            y = formula(a, b)
        return [finish(np.broadcast_to(y, out_lts[0].shape), out_lts[0])]

    kernel.__name__ = formula.__name__
    kernel.__doc__ = formula.__doc__
    kernel.formula = formula
    return kernel


def add(a, b):
    """dst = a + b"""
    return a + b


def subtract(a, b):
    """dst = a - b"""
    return a - b


def multiply(a, b):
    """dst = a * b"""
    return a * b


def divide(a, b):
    """dst = a / b (IEEE: x/0 = +-inf, 0/0 = NaN)"""
    return a / b


def maximum(a, b):
    """dst = max(a, b) (NaN propagates)"""
    return np.maximum(a, b)


def minimum(a, b):
    """dst = min(a, b) (NaN propagates)"""
    return np.minimum(a, b)


def squared_difference(a, b):
    """dst = (a - b)^2, the difference rounded to f32 before squaring"""
    d = a - b
    return d * d


def greater_equal(a, b):
    """dst = a >= b (boolean)"""
    return a >= b


def select(op, inputs, out_lts, ctx):
    """dst = cond ? src_0 : src_1.

    Two-step broadcast: src_0 and src_1 broadcast to each other (numpy), then
    cond broadcasts one-way to that shape.
    """
    cond, a, b = inputs
    shape = np.broadcast_shapes(np.shape(a), np.shape(b))
    cond = np.broadcast_to(np.asarray(cond, dtype=bool), shape)
    return [finish(np.where(cond, f32(a), f32(b)), out_lts[0])]


def _slope_view(slope, src_ndim, op):
    """PReLU slope broadcast: a 1-D slope goes along the channel axis when
    ``per_channel_broadcast`` (default true, channel from ``data_format``),
    else along the last axis; an n-D slope broadcasts numpy-style."""
    if slope.ndim == 1 and op.attrs.get("per_channel_broadcast", True):
        axis = channel_axis(op.attrs.get("data_format", "NXC"), src_ndim)
        return along(slope, axis, src_ndim) if slope.size > 1 else slope
    return slope


def prelu(op, inputs, out_lts, ctx):
    """dst = src if src >= 0 else slope * src."""
    src, slope = f32(inputs[0]), f32(inputs[1])
    slope = _slope_view(slope, src.ndim, op)
    return [finish(np.where(src >= 0, src, slope * src), out_lts[0])]


def bias_add(op, inputs, out_lts, ctx):
    """dst = src + bias, the 1-D bias along the channel axis (``data_format``,
    default NXC = last axis)."""
    src, bias = f32(inputs[0]), f32(inputs[1])
    axis = channel_axis(op.attrs.get("data_format", "NXC"), src.ndim)
    return [finish(src + along(bias, axis, src.ndim), out_lts[0])]


BINARY = {
    OpKind.Add: binary(add),
    OpKind.Subtract: binary(subtract),
    OpKind.Multiply: binary(multiply),
    OpKind.Divide: binary(divide),
    OpKind.Maximum: binary(maximum),
    OpKind.Minimum: binary(minimum),
    OpKind.SquaredDifference: binary(squared_difference),
    OpKind.GreaterEqual: binary(greater_equal),
    OpKind.Select: select,
    OpKind.PReLU: prelu,
    OpKind.BiasAdd: bias_add,
}

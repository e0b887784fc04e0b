"""Backward (training) ops without windows: element-wise, SoftMax/LogSoftmax,
BiasAdd, PReLU, BatchNorm and LayerNorm gradients.

Element-wise gradients follow oneDNN's ``math_utils.hpp`` ``*_bwd`` formulas
(and their ``*_use_dst`` forms when ``use_dst`` is true, where input 0 is the
forward dst), including their branches at the edges (``clip_v2_bwd`` is 0 at
``min`` and ``max``; ``hardsigmoid_bwd`` is 0 where ``alpha x + beta`` is 0 or
1).  Everything is evaluated in float64 and rounded once to the output type,
as the forward kernels in :mod:`graph_api.kernels.reference.eltwise`.

Normalization gradients use the *given* mean and variance (as oneDNN does; it
never recomputes them)::

    xhat = (x - mean) / sqrt(var + eps)
    dbeta = sum(dy);  dgamma = sum(dy * xhat)          (over the reduced dims)
    dx = gamma / sqrt(var + eps) * (dy - mean(dy) - xhat * mean(dy * xhat))

BatchNorm reduces over every dim but the channel one (``data_format``);
LayerNorm over ``begin_norm_axis..end`` with ``gamma * dy`` in place of ``dy``
inside the bracket (gamma varies along the normalized dims there).
"""
from __future__ import annotations

import math

import numpy as np

from graph_api.enums import OpKind

from ._common import channel_axis, f64, finish, norm_axis
from .eltwise import _erf, sigmoid, soft_plus

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_TANH_FITTING = 0.044715


# ---------------------------------------------------------- element-wise
def abs_bwd(s, dd):
    """dd if s > 0, -dd if s < 0, else 0"""
    return np.where(s > 0, dd, np.where(s < 0, -dd, 0.0))


def clamp_bwd(v, dd, min, max):
    """dd where min < v < max, else 0 (v = src, or dst with use_dst)"""
    return np.where((v > min) & (v < max), dd, 0.0)


def elu_bwd(v, dd, alpha, use_dst=True):
    """src: dd * (s > 0 ? 1 : alpha e^s);  use_dst: dd * (d > 0 ? 1 : d + alpha)"""
    slope = v + alpha if use_dst else alpha * np.exp(v)
    return dd * np.where(v > 0, 1.0, slope)


def gelu_bwd(s, dd, mode="gelu_erf"):
    """gelu_erf: dd/2 (1 + erf(u) + u 2/sqrt(pi) e^(-u^2)), u = s / sqrt 2;
    gelu_tanh: dd/2 (1 + t) (1 + s (1 - t) g'), t = tanh(g),
    g = sqrt(2/pi) s (1 + 0.044715 s^2), g' = sqrt(2/pi) (1 + 3 * 0.044715 s^2)"""
    if mode == "gelu_tanh":
        g = SQRT_2_OVER_PI * s * (1.0 + GELU_TANH_FITTING * s * s)
        dg = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_TANH_FITTING * s * s)
        t = np.tanh(g)
        return dd * 0.5 * (1.0 + t) * (1.0 + s * (1.0 - t) * dg)
    u = s / math.sqrt(2.0)
    return dd * 0.5 * (1.0 + _erf(u) + u * (2.0 / math.sqrt(math.pi)) * np.exp(-u * u))


def hard_sigmoid_bwd(s, dd, alpha, beta):
    """dd * alpha where 0 < alpha s + beta < 1, else 0"""
    v = alpha * s + beta
    return np.where((v > 0) & (v < 1), dd * alpha, 0.0)


def hard_swish_bwd(s, dd):
    """v = s/6 + 1/2: 0 where v <= 0, dd where v >= 1, else dd (s/3 + 1/2)"""
    v = s / 6.0 + 0.5
    return np.where(v <= 0, 0.0, np.where(v >= 1, dd, dd * (s / 3.0 + 0.5)))


def mish_bwd(s, dd):
    """dd (t + s sigmoid(s) (1 - t^2)), t = tanh(softplus(s))"""
    t = np.tanh(soft_plus(s, 1.0))
    return dd * (t + s * sigmoid(s) * (1.0 - t * t))


def relu_bwd(v, dd):
    """dd where v > 0, else dd * 0"""
    return np.where(v > 0, dd, dd * 0.0)


def sigmoid_bwd(v, dd, use_dst=True):
    """dd y (1 - y), y = dst (use_dst) or sigmoid(src)"""
    y = v if use_dst else sigmoid(v)
    return dd * y * (1.0 - y)


def soft_plus_bwd(s, dd, beta=1.0):
    """dd sigmoid(beta s)"""
    return dd * sigmoid(beta * s)


def sqrt_bwd(v, dd, use_dst=True):
    """dd / (2 y), y = dst (use_dst) or sqrt(src)"""
    return dd / (2.0 * (v if use_dst else np.sqrt(v)))


def tanh_bwd(v, dd, use_dst=True):
    """dd (1 - y)(1 + y), y = dst (use_dst) or tanh(src)"""
    y = v if use_dst else np.tanh(v)
    return dd * (1.0 - y) * (1.0 + y)


def eltwise_backward(formula, **attr_defaults):
    """Adapt ``formula(v, dd, **attrs)`` to the reference-kernel contract
    (f32 attributes rounded to f32 first, as oneDNN stores them)."""

    def kernel(op, inputs, out_lts, ctx):
        attrs = {}
        for name, default in attr_defaults.items():
            value = op.attrs.get(name, default)
            attrs[name] = float(np.float32(value)) if isinstance(value, float) else value
        with np.errstate(all="ignore"):
            y = formula(f64(inputs[0]), f64(inputs[1]), **attrs)
        return [finish(y, out_lts[0])]

    kernel.__name__ = formula.__name__
    kernel.__doc__ = formula.__doc__
    kernel.formula = formula
    return kernel


# ---------------------------------------------------------------- softmax
def softmax_backward(op, inputs, out_lts, ctx):
    """diff_src = dst * (dd - sum(dd * dst)) along axis (inputs: diff_dst, dst)."""
    dd, dst = f64(inputs[0]), f64(inputs[1])
    axis = norm_axis(int(op.attrs.get("axis", 1)), dd.ndim)
    return [finish(dst * (dd - (dd * dst).sum(axis=axis, keepdims=True)), out_lts[0])]


def log_softmax_backward(op, inputs, out_lts, ctx):
    """diff_src = dd - exp(dst) * sum(dd) along axis (inputs: diff_dst, dst)."""
    dd, dst = f64(inputs[0]), f64(inputs[1])
    axis = norm_axis(int(op.attrs.get("axis", -1)), dd.ndim)
    with np.errstate(all="ignore"):
        return [finish(dd - np.exp(dst) * dd.sum(axis=axis, keepdims=True), out_lts[0])]


# ------------------------------------------------------- bias and PReLU
def _all_but(ndim: int, axis: int) -> tuple[int, ...]:
    return tuple(i for i in range(ndim) if i != axis)


def bias_add_backward(op, inputs, out_lts, ctx):
    """diff_bias[c] = sum of diff_dst over every dim but the channel one."""
    dd = f64(inputs[0])
    axis = channel_axis(op.attrs.get("data_format", "NXC"), dd.ndim)
    return [finish(dd.sum(axis=_all_but(dd.ndim, axis)), out_lts[0])]


def slope_view_shape(op, slope_shape, src_ndim: int) -> tuple[int, ...]:
    """How the slope broadcasts: a 1-D slope lies along the channel dim of
    ``data_format`` (PReLU's per-channel form); otherwise right-aligned numpy."""
    if len(slope_shape) == 1 and src_ndim >= 2:
        shape = [1] * src_ndim
        shape[channel_axis(op.attrs.get("data_format", "NXC"), src_ndim)] = slope_shape[0]
        return tuple(shape)
    return (1,) * (src_ndim - len(slope_shape)) + tuple(slope_shape)


def prelu_backward(op, inputs, out_lts, ctx):
    """diff_src = dd * (x > 0 ? 1 : slope);
    diff_slope = sum of dd * (x > 0 ? 0 : x) over the dims the slope broadcasts along."""
    x, dd = f64(inputs[0]), f64(inputs[2])
    slope = f64(inputs[1])
    view = slope_view_shape(op, slope.shape, x.ndim)
    s = slope.reshape(view)
    positive = x > 0
    diff_src = np.where(positive, dd, dd * s)
    contrib = np.where(positive, 0.0, dd * x)
    axes = tuple(i for i, (v, d) in enumerate(zip(view, x.shape)) if v == 1 and d != 1)
    diff_slope = contrib.sum(axis=axes, keepdims=True) if axes else contrib
    return [finish(diff_src, out_lts[0]), finish(diff_slope.reshape(slope.shape), out_lts[1])]


# --------------------------------------------------------- normalization
def _norm_grads(x, dd, mean, var, eps, axes, gamma):
    """(dx, dgamma-terms, dbeta-terms) for normalization over ``axes``;
    mean/var broadcast against x, gamma multiplies dd inside the bracket."""
    with np.errstate(all="ignore"):  # a negative variance gives NaN, as oneDNN's sqrtf
        inv = 1.0 / np.sqrt(var + eps)
    xhat = (x - mean) * inv
    gdd = dd * gamma
    dx = inv * (gdd - gdd.mean(axis=axes, keepdims=True)
                - xhat * (gdd * xhat).mean(axis=axes, keepdims=True))
    return dx, dd * xhat, dd


def batch_norm_backward(op, inputs, out_lts, ctx):
    """BatchNormTrainingBackward: see the module docstring (channel per data_format);
    outputs diff_src and, if declared, diff_gamma and diff_beta."""
    x, dd = f64(inputs[0]), f64(inputs[1])
    axis = channel_axis(op.attrs.get("data_format", "NXC"), x.ndim)
    shape = [1] * x.ndim
    shape[axis] = -1
    mean, var = (f64(v).reshape(shape) for v in inputs[2:4])
    gamma = f64(inputs[4]).reshape(shape) if len(inputs) > 4 else 1.0
    eps = float(np.float32(op.attrs["epsilon"]))
    axes = _all_but(x.ndim, axis)
    dx, dgamma, dbeta = _norm_grads(x, dd, mean, var, eps, axes, gamma)
    values = [dx, dgamma.sum(axis=axes), dbeta.sum(axis=axes)]
    return [finish(v, lt) for v, lt in zip(values, out_lts)]


def layer_norm_backward(op, inputs, out_lts, ctx):
    """LayerNormBackward: see the module docstring; mean/variance have the
    leading dims ``src[:begin_norm_axis]``, gamma the normalized ones."""
    x, dd = f64(inputs[0]), f64(inputs[1])
    begin = norm_axis(int(op.attrs.get("begin_norm_axis", -1)), x.ndim)
    axes = tuple(range(begin, x.ndim))
    trail = (1,) * len(axes)
    mean, var = (f64(v).reshape(x.shape[:begin] + trail) for v in inputs[2:4])
    affine = op.attrs.get("use_affine", True) and len(inputs) > 4
    gamma = f64(inputs[4]) if affine else 1.0
    eps = float(np.float32(op.attrs.get("epsilon", 1e-5)))
    dx, dgamma, dbeta = _norm_grads(x, dd, mean, var, eps, axes, gamma)
    lead = tuple(range(begin))
    values = [dx, dgamma.sum(axis=lead), dbeta.sum(axis=lead)]
    return [finish(v, lt) for v, lt in zip(values, out_lts)]


BACKWARD = {
    OpKind.AbsBackward: eltwise_backward(abs_bwd),
    OpKind.ClampBackward: eltwise_backward(clamp_bwd, min=None, max=None),
    OpKind.EluBackward: eltwise_backward(elu_bwd, alpha=None, use_dst=True),
    OpKind.GELUBackward: eltwise_backward(gelu_bwd, mode="gelu_erf"),
    OpKind.HardSigmoidBackward: eltwise_backward(hard_sigmoid_bwd, alpha=None, beta=None),
    OpKind.HardSwishBackward: eltwise_backward(hard_swish_bwd),
    OpKind.MishBackward: eltwise_backward(mish_bwd),
    OpKind.ReLUBackward: eltwise_backward(relu_bwd),
    OpKind.SigmoidBackward: eltwise_backward(sigmoid_bwd, use_dst=True),
    OpKind.SoftPlusBackward: eltwise_backward(soft_plus_bwd, beta=1.0),
    OpKind.SqrtBackward: eltwise_backward(sqrt_bwd, use_dst=True),
    OpKind.TanhBackward: eltwise_backward(tanh_bwd, use_dst=True),
    OpKind.SoftMaxBackward: softmax_backward,
    OpKind.LogSoftmaxBackward: log_softmax_backward,
    OpKind.BiasAddBackward: bias_add_backward,
    OpKind.PReLUBackward: prelu_backward,
    OpKind.BatchNormTrainingBackward: batch_norm_backward,
    OpKind.LayerNormBackward: layer_norm_backward,
}

"""Normalizations: LayerNorm, RMSNorm, BatchNorm (inference, training), GroupNorm.

Statistics are computed in float64 (population variance, as oneDNN):
``mean = sum(x) / N``, ``var = sum((x - mean)^2) / N`` (NaN, 0/0, over no
elements, as oneDNN's division by the empty count).  The normalized
value ``(x - mean) / sqrt(var + eps)`` is also evaluated in f64, then scaled
and shifted, and rounded once to the output type.
"""
from __future__ import annotations

import numpy as np

from graph_api.enums import OpKind

from ._common import along, channel_axis, f64, finish, norm_axis, to_ncx


def _mean(x: np.ndarray, axes) -> np.ndarray:
    """sum / count over ``axes`` (keepdims); 0/0 = NaN over no elements, silently."""
    axes = (axes,) if isinstance(axes, int) else tuple(axes)
    count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    with np.errstate(invalid="ignore", divide="ignore"):
        return x.sum(axis=axes, keepdims=True) / np.float64(count)


def _moments(x: np.ndarray, axes) -> tuple[np.ndarray, np.ndarray]:
    mean = _mean(x, axes)
    var = _mean(np.square(x - mean), axes)
    return mean, var


def _outputs(out_lts, dst, *stats):
    """dst plus however many statistics outputs the op was given."""
    values = (dst,) + stats
    return [finish(v, lt) for v, lt in zip(values, out_lts)]


def layer_norm(op, inputs, out_lts, ctx):
    """dst = gamma * (x - mean) / sqrt(var + eps) + beta over dims
    ``begin_norm_axis..end``; mean/variance outputs have the leading dims."""
    x = f64(inputs[0])
    begin = norm_axis(int(op.attrs.get("begin_norm_axis", -1)), x.ndim)
    axes = tuple(range(begin, x.ndim))
    eps = float(np.float32(op.attrs.get("epsilon", 1e-5)))
    mean, var = _moments(x, axes)
    y = (x - mean) / np.sqrt(var + eps)
    if op.attrs.get("use_affine", True) and len(inputs) >= 3:
        y = y * f64(inputs[1]) + f64(inputs[2])
    return _outputs(out_lts, y, mean, var)


def rms_norm(op, inputs, out_lts, ctx):
    """dst = gamma * x / sqrt(mean(x^2) + eps) over dims ``begin_norm_axis..end``."""
    x = f64(inputs[0])
    begin = norm_axis(int(op.attrs.get("begin_norm_axis", -1)), x.ndim)
    axes = tuple(range(begin, x.ndim))
    eps = float(np.float32(op.attrs.get("epsilon", 1e-5)))
    y = x / np.sqrt(_mean(np.square(x), axes) + eps)
    if len(inputs) >= 2:
        y = y * f64(inputs[1])
    return [finish(y, out_lts[0])]


def _per_channel(op, ndim, *vectors):
    axis = channel_axis(op.attrs.get("data_format", "NXC"), ndim)
    return axis, [along(f64(v), axis, ndim) for v in vectors]


def batch_norm_inference(op, inputs, out_lts, ctx):
    """dst = gamma * (x - mean) / sqrt(variance + eps) + beta, per channel
    (channel axis from ``data_format``, default NXC)."""
    x = f64(inputs[0])
    _, (gamma, beta, mean, var) = _per_channel(op, x.ndim, *inputs[1:5])
    eps = float(np.float32(op.attrs["epsilon"]))
    return [finish(gamma * (x - mean) / np.sqrt(var + eps) + beta, out_lts[0])]


def batch_norm_training(op, inputs, out_lts, ctx):
    """Batch statistics over every axis but the channel one:
    dst = gamma * (x - batch_mean) / sqrt(batch_var + eps) + beta;
    running_X = momentum * X + (1 - momentum) * batch_X (momentum default 0.5,
    as oneDNN's dnnl backend); outputs dst, running_mean, running_variance,
    batch_mean, batch_variance."""
    x = f64(inputs[0])
    axis, (old_mean, old_var) = _per_channel(op, x.ndim, *inputs[1:3])
    axes = tuple(i for i in range(x.ndim) if i != axis)
    mean, var = _moments(x, axes)
    eps = float(np.float32(op.attrs["epsilon"]))
    y = (x - mean) / np.sqrt(var + eps)
    if len(inputs) >= 5:
        _, (gamma, beta) = _per_channel(op, x.ndim, *inputs[3:5])
        y = y * gamma + beta
    m = float(np.float32(op.attrs.get("momentum", 0.5)))
    running_mean = m * old_mean + (1 - m) * mean
    running_var = m * old_var + (1 - m) * var
    return _outputs(out_lts, y, running_mean, running_var, mean, var)


def group_norm(op, inputs, out_lts, ctx):
    """Channels split into ``groups`` contiguous groups; per (n, group):
    mean/var over the group's channels and all spatial positions;
    dst = gamma[c] * (x - mean) / sqrt(var + eps) + beta[c]; stats shape (N, G)."""
    fmt = op.attrs.get("data_format", "NXC")
    x = to_ncx(f64(inputs[0]), fmt)
    groups = int(op.attrs["groups"])
    n, c = x.shape[:2]
    xg = x.reshape((n, groups, x.size // max(n * groups, 1)))  # -1 is ambiguous when n = 0
    mean, var = _moments(xg, 2)
    eps = float(np.float32(op.attrs.get("epsilon", 1e-5)))
    y = ((xg - mean) / np.sqrt(var + eps)).reshape(x.shape)
    if op.attrs.get("use_affine", True) and len(inputs) >= 3:
        y = y * along(f64(inputs[1]), 1, x.ndim) + along(f64(inputs[2]), 1, x.ndim)
    if fmt == "NXC":
        y = np.moveaxis(y, 1, -1)
    return _outputs(out_lts, y, mean[..., 0], var[..., 0])


NORM = {
    OpKind.LayerNorm: layer_norm,
    OpKind.RMSNorm: rms_norm,
    OpKind.BatchNormInference: batch_norm_inference,
    OpKind.BatchNormForwardTraining: batch_norm_training,
    OpKind.GroupNorm: group_norm,
}

"""Lone pooling, Interpolate and BatchNormForwardTraining partitions in f32.

The fused CNN patterns serve these kinds when a post-op follows; a partition of
one such op runs here (single-op plans of :mod:`graph_api.kernels.registry`),
inputs widened to f32, outputs rounded once (:class:`.backward_plan.F32Plan`):

* MaxPool: ``max_k src[y*s - pb + k*d]`` over strided views of the padded
  source (padding -inf); a max is exact, so this equals the reference;
* AvgPool: the f32 sum of the taps divided by the divisor (the in-source count
  with ``exclude_pad`` or ceil rounding, as the reference; else the kernel volume);
* Interpolate: nearest is a gather (exact); linear weights ``c - floor(c)``
  from the reference's f32 source coordinates, then ``x[lo] (1 - w) + x[hi] w``
  in f32 along each spatial dim;
* BatchNormForwardTraining: batch mean and variance with f64 accumulation of
  f32 terms (two passes: mean, then squared deviations), ``dst`` in f32, the
  running statistics ``m X + (1 - m) batch_X`` in f64 on the small vectors.
"""
from __future__ import annotations

import numpy as np

from graph_api.enums import OpKind as K
from graph_api.kernels.reference._common import (channel_axis, from_ncx, ncx_shape, pad_spatial,
                                                to_ncx)
from graph_api.kernels.reference.pool import _geometry as pool_geometry
from graph_api.kernels.reference.pool import _windows
from graph_api.kernels.reference.resample import nearest_index, source_coords

F32 = np.float32


def max_pool(op, lts):
    fmt = op.attrs["data_format"]
    out_sp = ncx_shape(lts[op.outputs[0].id].shape, fmt)[2:]

    def compute(xs):
        src = to_ncx(xs[0], fmt)
        kernel, strides, dilations, begin, end = pool_geometry(op, src, out_sp, dilated=True)
        xp = pad_spatial(src, begin, end, value=-np.inf)
        acc = None
        for view in _windows(xp, kernel, strides, dilations, out_sp):
            acc = view.copy() if acc is None else np.maximum(acc, view, out=acc)
        return [from_ncx(acc, fmt)]

    return compute


def avg_pool(op, lts):
    fmt = op.attrs["data_format"]
    out_sp = ncx_shape(lts[op.outputs[0].id].shape, fmt)[2:]
    exclude = op.attrs["exclude_pad"] or op.attrs.get("rounding_type") == "ceil"

    def compute(xs):
        src = to_ncx(xs[0], fmt)
        kernel, strides, dilations, begin, end = pool_geometry(op, src, out_sp, dilated=False)
        xp = pad_spatial(src, begin, end)
        total = np.zeros(src.shape[:2] + tuple(out_sp), F32)
        for view in _windows(xp, kernel, strides, dilations, out_sp):
            total += view
        if exclude:
            inside = pad_spatial(np.ones((1, 1) + src.shape[2:], F32), begin, end)
            divisor = sum(_windows(inside, kernel, strides, dilations, out_sp))
        else:
            divisor = F32(np.prod(kernel))
        with np.errstate(all="ignore"):
            return [from_ncx(total / divisor, fmt)]

    return compute


def _linear(x, axis, o_size, ctm):
    i_size = x.shape[axis]
    c = np.clip(source_coords(o_size, i_size, ctm).astype(np.float64), 0, i_size - 1)
    lo = np.floor(c).astype(np.int64)
    hi = np.minimum(lo + 1, i_size - 1)
    w = (c - lo).astype(F32).reshape([-1 if d == axis else 1 for d in range(x.ndim)])
    return np.take(x, lo, axis=axis) * (F32(1) - w) + np.take(x, hi, axis=axis) * w


def _nearest(x, axis, o_size, ctm):
    return np.take(x, nearest_index(o_size, x.shape[axis], ctm), axis=axis)


def interpolate(op, lts):
    fmt = op.attrs["data_format"]
    ctm = op.attrs["coordinate_transformation_mode"]
    resample = _nearest if op.attrs["mode"] == "nearest" else _linear
    out_sp = ncx_shape(lts[op.outputs[0].id].shape, fmt)[2:]

    def compute(xs):
        x = to_ncx(xs[0], fmt)
        for axis, o_size in enumerate(out_sp, start=2):
            x = resample(x, axis, o_size, ctm)
        return [from_ncx(x, fmt)]

    return compute


def batch_norm_training(op, lts):
    """Outputs dst, running_mean, running_variance, batch_mean, batch_variance
    (as many as declared); inputs src, mean, variance[, gamma, beta]."""
    ndim = len(lts[op.inputs[0].id].shape)
    axis = channel_axis(op.attrs["data_format"], ndim)
    axes = tuple(i for i in range(ndim) if i != axis)
    shape = [1] * ndim
    shape[axis] = -1
    eps = float(np.float32(op.attrs["epsilon"]))
    m = float(np.float32(op.attrs.get("momentum", 0.5)))  # oneDNN's dnnl backend default, as the reference
    n_out = len(op.outputs)

    def compute(xs):
        x = xs[0]
        count = np.float64(np.prod([x.shape[a] for a in axes]))
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.sum(x, axis=axes, dtype=np.float64, keepdims=True) / count
            dev = x - mean.astype(F32)
            var = np.sum(np.square(dev), axis=axes, dtype=np.float64, keepdims=True) / count
            inv = (1.0 / np.sqrt(var + eps)).astype(F32)
        y = dev * inv
        if len(xs) >= 5:
            y = y * xs[3].reshape(shape) + xs[4].reshape(shape)
        mean, var = mean.reshape(-1), var.reshape(-1)
        running = [m * xs[i].astype(np.float64) + (1 - m) * v for i, v in ((1, mean), (2, var))]
        return [y, *running, mean, var][:n_out]

    return compute


#: op kind -> (kernel name, prepare(op, lts) -> compute(list of f32 arrays))
PREPARE = {
    K.MaxPool: ("numpy_f32_pool", max_pool),
    K.AvgPool: ("numpy_f32_pool", avg_pool),
    K.Interpolate: ("numpy_f32_interpolate", interpolate),
    K.BatchNormForwardTraining: ("numpy_f32_batchnorm_training", batch_norm_training),
}

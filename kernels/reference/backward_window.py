"""Backward (training) ops with windows: Convolution and ConvTranspose
gradients, pooling gradients, InterpolateBackward.

Everything runs on canonical arrays (NCX data, OIX weights, as
:mod:`graph_api.kernels.reference.conv`), sums in float64 rounded once to the output
type.  With ``p = y * s + k * d`` the padded coordinate of output cell ``y``
and kernel tap ``k`` (source index ``p - pads_begin``):

* Convolution: ``dst[y] = sum_k src[p] w[k]``, so
  ``diff_src[p] += diff_dst[y] w[k]`` (scatter) and
  ``diff_w[k] = sum_y src[p] diff_dst[y]`` (gather);
* ConvTranspose is the transposed map: its data gradient is the Convolution
  of diff_dst by the weights (I and O swapped), its weights gradient the
  Convolution weights gradient with the roles of src and diff_dst swapped;
* AvgPool: ``diff_src[p] += diff_dst[y] / divisor[y]`` (divisor as AvgPool);
  MaxPool: ``diff_src[argmax_k src[p]] += diff_dst[y]``, the first maximum in
  kernel order (as oneDNN's reference, which keeps ``s > d`` only);
* Interpolate: the forward op is linear and separable, one matrix ``A`` per
  spatial dim; the gradient applies ``A^T`` along each dim.
"""
from __future__ import annotations

import itertools

import numpy as np

from graph_api.enums import OpKind

from ._common import (f64, finish, from_ncx, ncx_shape, pad_spatial, pads, round_mm_input,
                      spatial_list, to_ncx, window)
from .conv import weights_to_oix
from .resample import nearest_index, source_coords


def _taps(kernel):
    return itertools.product(*(range(k) for k in kernel))


def _size(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _extent(out_sp, strides, kernel, dilations):
    """Padded-coordinate length the windows of ``out_sp`` outputs touch."""
    return [(o - 1) * s + (k - 1) * d + 1 for o, s, k, d in zip(out_sp, strides, kernel, dilations)]


def _scatter(buf, values, offsets, strides, out_sp):
    """buf[..., o*s + offset] += values[..., o] over the spatial dims."""
    index = [slice(None)] * (buf.ndim - len(out_sp))
    for off, s, o in zip(offsets, strides, out_sp):
        index.append(slice(off, off + (o - 1) * s + 1, s))
    buf[tuple(index)] += values


def _padded_buffer(lead, in_sp, begin, extent, dtype=np.float64):
    """Zeros covering the source at ``begin`` and every window; returns the
    buffer and the per-dim slice where the source lies."""
    size = [max(e, b + i) for e, b, i in zip(extent, begin, in_sp)]
    return np.zeros(tuple(lead) + tuple(size), dtype), [slice(b, b + i) for b, i in zip(begin, in_sp)]


def _end_pads(in_sp, begin, extent):
    return [e - i - b for e, i, b in zip(extent, in_sp, begin)]


# -------------------------------------------------------------- conv cores
def conv_forward_core(x, w, groups, strides, dilations, begin, out_sp):
    """(N, C, X) by (O, C/g, K) -> (N, O, out_sp)."""
    n, c = x.shape[:2]
    o, kernel = w.shape[0], list(w.shape[2:])
    icg, ocg = c // groups, o // groups
    extent = _extent(out_sp, strides, kernel, dilations)
    xp = pad_spatial(x, begin, _end_pads(x.shape[2:], begin, extent))
    wg = w.reshape((groups, ocg, icg) + tuple(kernel))
    acc = np.zeros((n, groups, ocg, _size(out_sp)))
    for k in _taps(kernel):
        view = window(xp, [kk * d for kk, d in zip(k, dilations)], strides, out_sp)
        acc += wg[(Ellipsis,) + k] @ view.reshape((n, groups, icg, _size(out_sp)))  # BLAS per (n, g)
    return acc.reshape((n, o) + tuple(out_sp))


def conv_data_core(dy, w, groups, strides, dilations, begin, src_shape):
    """Gradient of :func:`conv_forward_core` w.r.t. x: (N, O, Y) -> src_shape."""
    n, c, in_sp = src_shape[0], src_shape[1], list(src_shape[2:])
    o, kernel, out_sp = w.shape[0], list(w.shape[2:]), list(dy.shape[2:])
    icg, ocg = c // groups, o // groups
    buf, inside = _padded_buffer((n, groups, icg), in_sp, begin,
                                 _extent(out_sp, strides, kernel, dilations))
    wg = w.reshape((groups, ocg, icg) + tuple(kernel))
    dyg = dy.reshape((n, groups, ocg, _size(out_sp)))  # explicit sizes: -1 fails on empty arrays
    for k in _taps(kernel):
        part = np.swapaxes(wg[(Ellipsis,) + k], -1, -2) @ dyg
        _scatter(buf, part.reshape((n, groups, icg) + tuple(out_sp)),
                 [kk * d for kk, d in zip(k, dilations)], strides, out_sp)
    return buf[(Ellipsis,) + tuple(inside)].reshape((n, c) + tuple(in_sp))


def conv_weights_core(x, dy, groups, strides, dilations, begin, kernel):
    """Gradient of :func:`conv_forward_core` w.r.t. w: -> (O, C/g, K)."""
    n, c = x.shape[:2]
    o, out_sp = dy.shape[1], list(dy.shape[2:])
    icg, ocg = c // groups, o // groups
    extent = _extent(out_sp, strides, kernel, dilations)
    xp = pad_spatial(x, begin, _end_pads(x.shape[2:], begin, extent))
    dyg = dy.reshape((n, groups, ocg, _size(out_sp)))
    dw = np.zeros((groups, ocg, icg) + tuple(kernel))
    for k in _taps(kernel):
        view = window(xp, [kk * d for kk, d in zip(k, dilations)], strides, out_sp)
        view = view.reshape((n, groups, icg, _size(out_sp)))
        dw[(Ellipsis,) + k] = (dyg @ np.swapaxes(view, -1, -2)).sum(axis=0)
    return dw.reshape((o, icg) + tuple(kernel))


def oix_to_format(w: np.ndarray, fmt: str) -> np.ndarray:
    """Inverse of :func:`graph_api.kernels.reference.conv.weights_to_oix`."""
    if fmt == "XIO":
        return np.moveaxis(w, (0, 1), (-1, -2))
    if fmt == "XOI":
        return np.moveaxis(w, (0, 1), (-2, -1))
    if fmt == "IOX":
        return np.swapaxes(w, 0, 1)
    return w


# ------------------------------------------------------------ conv kernels
def _geometry(op, nsp):
    return spatial_list(op, "strides", nsp, 1), spatial_list(op, "dilations", nsp, 1)


def _data(x, op, index, ctx):
    return to_ncx(round_mm_input(x, index, ctx), op.attrs.get("data_format", "NXC")).astype(np.float64)


def _weights_format(op) -> str:
    """The schema default: XIO for Convolution*, XOI for ConvTranspose*."""
    return op.attrs.get("weights_format", "XOI" if "Transpose" in op.kind.name else "XIO")


def _weights(x, op, index, ctx):
    return weights_to_oix(round_mm_input(x, index, ctx), _weights_format(op)).astype(np.float64)


def conv_backward_data(op, inputs, out_lts, ctx):
    """diff_src[p - pb] += diff_dst[y] * w[k] over taps (inputs: diff_dst, weights)."""
    fmt = op.attrs.get("data_format", "NXC")
    dy, w = _data(inputs[0], op, 0, ctx), _weights(inputs[1], op, 1, ctx)
    src_shape = ncx_shape(out_lts[0].shape, fmt)
    strides, dilations = _geometry(op, dy.ndim - 2)
    begin, _ = pads(op, src_shape[2:], strides, w.shape[2:], dilations)
    dx = conv_data_core(dy, w, int(op.attrs.get("groups", 1)), strides, dilations, begin, src_shape)
    return [finish(from_ncx(dx, fmt), out_lts[0])]


def conv_backward_weights(op, inputs, out_lts, ctx):
    """diff_w[k] = sum over n, y of src[p - pb] * diff_dst[y] (inputs: src, diff_dst)."""
    x, dy = _data(inputs[0], op, 0, ctx), _data(inputs[1], op, 1, ctx)
    wfmt = _weights_format(op)
    kernel = list(weights_to_oix(np.empty(out_lts[0].shape, np.int8), wfmt).shape[2:])
    strides, dilations = _geometry(op, x.ndim - 2)
    begin, _ = pads(op, x.shape[2:], strides, kernel, dilations)
    dw = conv_weights_core(x, dy, int(op.attrs.get("groups", 1)), strides, dilations, begin, kernel)
    return [finish(oix_to_format(dw, wfmt), out_lts[0])]


def conv_transpose_backward_data(op, inputs, out_lts, ctx):
    """diff_src = Convolution(diff_dst, w with I and O swapped), pads as given."""
    fmt = op.attrs.get("data_format", "NXC")
    dy, w = _data(inputs[0], op, 0, ctx), _weights(inputs[1], op, 1, ctx)
    w_conv = np.swapaxes(w, 0, 1)  # (OCg, IC, K) -> (IC, OCg, K)
    strides, dilations = _geometry(op, dy.ndim - 2)
    begin, _ = pads(op, dy.shape[2:], strides, w.shape[2:], dilations)
    out_sp = ncx_shape(out_lts[0].shape, fmt)[2:]
    dx = conv_forward_core(dy, w_conv, int(op.attrs.get("groups", 1)), strides, dilations, begin, out_sp)
    return [finish(from_ncx(dx, fmt), out_lts[0])]


def conv_transpose_backward_weights(op, inputs, out_lts, ctx):
    """diff_w = the Convolution weights gradient with x = diff_dst and dy = src,
    I and O swapped back (inputs: src, diff_dst)."""
    x, dy = _data(inputs[0], op, 0, ctx), _data(inputs[1], op, 1, ctx)
    wfmt = _weights_format(op)
    kernel = list(weights_to_oix(np.empty(out_lts[0].shape, np.int8), wfmt).shape[2:])
    strides, dilations = _geometry(op, x.ndim - 2)
    begin, _ = pads(op, x.shape[2:], strides, kernel, dilations, deconv=True)
    dw = conv_weights_core(dy, x, int(op.attrs.get("groups", 1)), strides, dilations, begin, kernel)
    return [finish(oix_to_format(np.swapaxes(dw, 0, 1), wfmt), out_lts[0])]


# ---------------------------------------------------------------- pooling
def _pool_geometry(op, in_sp, out_sp, dilated: bool):
    nsp = len(in_sp)
    kernel = [int(k) for k in op.attrs["kernel"]]
    strides = spatial_list(op, "strides", nsp, 1)
    dilations = spatial_list(op, "dilations", nsp, 1) if dilated else [1] * nsp
    begin, _ = pads(op, list(in_sp), strides, kernel, dilations)
    return kernel, strides, dilations, begin, _extent(out_sp, strides, kernel, dilations)


def avg_pool_grad(op, dy, src_shape):
    """AvgPool's gradient of canonical ``dy`` (N, C, out...) to ``src_shape``, in
    ``dy``'s float type (f64 here, f32 in the fast plan)."""
    in_sp, out_sp = list(src_shape[2:]), list(dy.shape[2:])
    kernel, strides, dilations, begin, extent = _pool_geometry(op, in_sp, out_sp, False)
    if op.attrs["exclude_pad"]:
        inside = pad_spatial(np.ones((1, 1) + tuple(in_sp), dy.dtype), begin, _end_pads(in_sp, begin, extent))
        divisor = sum(window(inside, k, strides, out_sp) for k in _taps(kernel))
    else:
        divisor = dy.dtype.type(np.prod(kernel))
    share = dy / divisor
    buf, where = _padded_buffer(src_shape[:2], in_sp, begin, extent, dy.dtype)
    for k in _taps(kernel):
        _scatter(buf, share, list(k), strides, out_sp)
    return buf[(Ellipsis,) + tuple(where)]


def avg_pool_backward(op, inputs, out_lts, ctx):
    """diff_src[p - pb] += diff_dst[y] / divisor[y]; divisor = window cells inside
    the source (exclude_pad) or the kernel volume (inputs: diff_dst[, src_shape])."""
    fmt = op.attrs.get("data_format", "NXC")
    dx = avg_pool_grad(op, to_ncx(f64(inputs[0]), fmt), ncx_shape(out_lts[0].shape, fmt))
    return [finish(from_ncx(dx, fmt), out_lts[0])]


def max_pool_grad(op, x, dy):
    """MaxPool's gradient: canonical ``x`` and ``dy`` of one float type, the result in it."""
    in_sp, out_sp = list(x.shape[2:]), list(dy.shape[2:])
    kernel, strides, dilations, begin, extent = _pool_geometry(op, in_sp, out_sp, True)
    xp = pad_spatial(x, begin, _end_pads(in_sp, begin, extent), value=-np.inf)
    taps = list(_taps(kernel))
    best = np.full(dy.shape, -np.inf, x.dtype)
    arg = np.zeros(dy.shape, np.int64)
    for t, k in enumerate(taps):
        view = window(xp, [kk * d for kk, d in zip(k, dilations)], strides, out_sp)
        better = view > best
        best = np.where(better, view, best)
        arg = np.where(better, t, arg)
    buf, where = _padded_buffer(x.shape[:2], in_sp, begin, extent, dy.dtype)
    zero = dy.dtype.type(0)
    for t, k in enumerate(taps):
        _scatter(buf, np.where(arg == t, dy, zero), [kk * d for kk, d in zip(k, dilations)],
                 strides, out_sp)
    return buf[(Ellipsis,) + tuple(where)]


def max_pool_backward(op, inputs, out_lts, ctx):
    """diff_src[first argmax of the window] += diff_dst[y] (inputs: src, diff_dst)."""
    fmt = op.attrs.get("data_format", "NXC")
    dx = max_pool_grad(op, to_ncx(f64(inputs[0]), fmt), to_ncx(f64(inputs[1]), fmt))
    return [finish(from_ncx(dx, fmt), out_lts[0])]


# ------------------------------------------------------------ interpolate
def interpolation_matrix(o_size: int, i_size: int, mode: str, ctm: str) -> np.ndarray:
    """The (O, I) matrix of Interpolate along one dim (see ``resample.py``)."""
    a = np.zeros((o_size, i_size))
    rows = np.arange(o_size)
    if mode == "nearest":
        a[rows, nearest_index(o_size, i_size, ctm)] = 1.0
        return a
    c = np.clip(source_coords(o_size, i_size, ctm).astype(np.float64), 0, i_size - 1)
    lo = np.floor(c).astype(np.int64)
    hi = np.minimum(lo + 1, i_size - 1)
    np.add.at(a, (rows, lo), 1.0 - (c - lo))
    np.add.at(a, (rows, hi), c - lo)
    return a


def interpolate_grad(op, dy, in_sp):
    """``A^T dy`` along every spatial dim of canonical ``dy``, in its float type."""
    mode, ctm = op.attrs["mode"], op.attrs.get("coordinate_transformation_mode", "half_pixel")
    for axis, i_size in enumerate(in_sp, start=2):
        a = interpolation_matrix(dy.shape[axis], i_size, mode, ctm).astype(dy.dtype)
        dy = np.moveaxis(np.tensordot(a.T, np.moveaxis(dy, axis, 0), axes=1), 0, axis)
    return dy


def interpolate_backward(op, inputs, out_lts, ctx):
    """diff_src = A^T diff_dst along every spatial dim (inputs: src, diff_dst[, sizes])."""
    fmt = op.attrs.get("data_format", "NXC")
    dx = interpolate_grad(op, to_ncx(f64(inputs[1]), fmt), ncx_shape(out_lts[0].shape, fmt)[2:])
    return [finish(from_ncx(dx, fmt), out_lts[0])]


BACKWARD_WINDOW = {
    OpKind.ConvolutionBackwardData: conv_backward_data,
    OpKind.ConvolutionBackwardWeights: conv_backward_weights,
    OpKind.ConvTransposeBackwardData: conv_transpose_backward_data,
    OpKind.ConvTransposeBackwardWeights: conv_transpose_backward_weights,
    OpKind.AvgPoolBackward: avg_pool_backward,
    OpKind.MaxPoolBackward: max_pool_backward,
    OpKind.InterpolateBackward: interpolate_backward,
}

"""Convolution and ConvTranspose (grouped, strided, dilated, padded, any layout).

Layouts: data ``NXC`` (default) or ``NCX``; weights for Convolution ``XIO``
(default) or ``OIX``, for ConvTranspose ``XOI`` (default) or ``IOX`` (``OIX``
is also accepted as the canonical form).  Everything is canonicalized to
NCX data and OIX weights, where for ConvTranspose "O" is the per-group output
channel count and "I" all input channels (PyTorch's ``(IC, OC/g, K...)`` is
IOX), exactly as oneDNN's ``canonicalize``.

Dilation ``d`` is the distance between kernel taps (1 = dense).  Pads come
from ``pads_begin``/``pads_end`` unless ``auto_pad`` is SAME_UPPER,
SAME_LOWER or VALID.  Inputs 0 and 1 are rounded by the fpmath mode first
(see ``matmul.py``); sums run in float64 and are rounded to f32 once; the
bias is added in f32.
"""
from __future__ import annotations

import itertools

import numpy as np

from graph_api.enums import OpKind

from ._common import (along, f32, finish, from_ncx, ncx_shape, pad_spatial, pads,
                      round_mm_input, spatial_list, to_ncx, window)


def weights_to_oix(w: np.ndarray, fmt: str) -> np.ndarray:
    """Weights in any oneDNN format as (O, I, K...)."""
    if fmt == "XIO":
        return np.moveaxis(w, (-1, -2), (0, 1))
    if fmt == "XOI":
        return np.moveaxis(w, (-2, -1), (0, 1))
    if fmt == "IOX":
        return np.swapaxes(w, 0, 1)
    return w  # OIX


def _geometry(op, src_ncx, w_oix, deconv):
    nsp = src_ncx.ndim - 2
    strides = spatial_list(op, "strides", nsp, 1)
    dilations = spatial_list(op, "dilations", nsp, 1)
    kernel = list(w_oix.shape[2:])
    begin, _ = pads(op, list(src_ncx.shape[2:]), strides, kernel, dilations, deconv)
    return strides, dilations, kernel, begin


def _finish_conv(acc_ncx, inputs, op, out_lt):
    """Round the f64 sum to f32, add the bias in f32, back to the data format."""
    acc = acc_ncx.astype(np.float32)
    if len(inputs) > 2:
        acc = acc + along(f32(inputs[2]), 1, acc.ndim)
    return [finish(from_ncx(acc, op.attrs.get("data_format", "NXC")), out_lt)]


def convolution(op, inputs, out_lts, ctx):
    """dst[n, g*OCg + o, y...] = sum_{c, k} src[n, g*ICg + c, y*s - pb + k*d] * w[g*OCg + o, c, k]
    (+ bias[g*OCg + o]), zero outside the source."""
    fmt = op.attrs.get("data_format", "NXC")
    src = to_ncx(round_mm_input(inputs[0], 0, ctx), fmt).astype(np.float64)
    w = weights_to_oix(round_mm_input(inputs[1], 1, ctx), op.attrs.get("weights_format", "XIO"))
    groups = int(op.attrs.get("groups", 1))
    strides, dilations, kernel, begin = _geometry(op, src, w, deconv=False)
    n, oc = ncx_shape(out_lts[0].shape, fmt)[:2]
    out_sp = ncx_shape(out_lts[0].shape, fmt)[2:]
    end = [(o - 1) * s + (k - 1) * d + 1 - i - b
           for o, s, k, d, i, b in zip(out_sp, strides, kernel, dilations, src.shape[2:], begin)]
    xp = pad_spatial(src, begin, end)
    icg, ocg = src.shape[1] // groups, oc // groups
    wg = w.astype(np.float64).reshape((groups, ocg, icg) + tuple(kernel))
    acc = np.zeros((n, groups, ocg) + tuple(out_sp))
    for k in itertools.product(*(range(kk) for kk in kernel)):
        offsets = [kk * d for kk, d in zip(k, dilations)]
        view = window(xp, offsets, strides, out_sp)
        view = view.reshape((n, groups, icg) + tuple(out_sp))
        acc += np.einsum("ngc...,goc->ngo...", view, wg[(Ellipsis,) + k])
    return _finish_conv(acc.reshape((n, oc) + tuple(out_sp)), inputs, op, out_lts[0])


def conv_transpose(op, inputs, out_lts, ctx):
    """dst[n, g*OCg + o, y...] = sum over (c, k, x) with x*s + k*d - pb = y of
    src[n, g*ICg + c, x...] * w[o, g*ICg + c, k]  (w canonical (OCg, IC, K...))
    (+ bias[g*OCg + o]); output_padding only adds bias-only cells at the end."""
    fmt = op.attrs.get("data_format", "NXC")
    src = to_ncx(round_mm_input(inputs[0], 0, ctx), fmt).astype(np.float64)
    w = weights_to_oix(round_mm_input(inputs[1], 1, ctx), op.attrs.get("weights_format", "XOI"))
    groups = int(op.attrs.get("groups", 1))
    strides, dilations, kernel, begin = _geometry(op, src, w, deconv=True)
    n, oc = ncx_shape(out_lts[0].shape, fmt)[:2]
    out_sp = ncx_shape(out_lts[0].shape, fmt)[2:]
    in_sp = src.shape[2:]
    ocg, icg = w.shape[0], src.shape[1] // groups
    # (OCg, IC, K) -> (g, OCg, ICg, K): input channel g*ICg + c belongs to group g
    wg = np.swapaxes(w.astype(np.float64).reshape((ocg, groups, icg) + tuple(kernel)), 0, 1)
    xs = src.reshape((n, groups, icg) + tuple(in_sp))
    full = [max((i - 1) * s + (k - 1) * d + 1, b + o)
            for i, s, k, d, b, o in zip(in_sp, strides, kernel, dilations, begin, out_sp)]
    shift = [max(-b, 0) for b in begin]  # negative pads_begin: output starts before 0
    buf = np.zeros((n, groups, ocg) + tuple(f + sh for f, sh in zip(full, shift)))
    for k in itertools.product(*(range(kk) for kk in kernel)):
        index = [slice(None)] * 3
        for kk, d, s, i, sh in zip(k, dilations, strides, in_sp, shift):
            start = kk * d + sh
            index.append(slice(start, start + (i - 1) * s + 1, s))
        buf[tuple(index)] += np.einsum("ngc...,goc->ngo...", xs, wg[(Ellipsis,) + k])
    crop = [slice(None)] * 3 + [slice(b + sh, b + sh + o) for b, sh, o in zip(begin, shift, out_sp)]
    acc = buf[tuple(crop)].reshape((n, oc) + tuple(out_sp))
    return _finish_conv(acc, inputs, op, out_lts[0])


CONV = {OpKind.Convolution: convolution, OpKind.ConvTranspose: conv_transpose}

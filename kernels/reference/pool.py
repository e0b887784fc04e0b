"""MaxPool and AvgPool (NXC default / NCX, dilations, auto_pad, rounding_type).

The output spatial size comes from the output logical tensor (floor or ceil
``rounding_type`` was applied by shape inference).  Windows reaching past
``pads_end`` -- the extra cells of ceil mode -- read padding.

AvgPool divisor: with ``exclude_pad`` the number of window cells inside the
source; otherwise the kernel volume.  As oneDNN's dnnl backend (which emulates
ceil mode with extra end padding and then switches to the exclude-padding
algorithm), ``rounding_type="ceil"`` always divides by the in-source count,
even when ``exclude_pad`` is false.
"""
from __future__ import annotations

import itertools

import numpy as np

from graph_api.enums import OpKind

from ._common import (f64, finish, from_ncx, ncx_shape, pad_spatial, pads, spatial_list,
                      to_ncx, window)


def _geometry(op, src_ncx, out_sp, dilated: bool):
    nsp = src_ncx.ndim - 2
    kernel = [int(k) for k in op.attrs["kernel"]]
    strides = spatial_list(op, "strides", nsp, 1)
    dilations = spatial_list(op, "dilations", nsp, 1) if dilated else [1] * nsp
    begin, _ = pads(op, list(src_ncx.shape[2:]), strides, kernel, dilations)
    # end padding that makes the last window fit exactly (covers ceil mode)
    end = [(o - 1) * s + (k - 1) * d + 1 - i - b
           for o, s, k, d, i, b in zip(out_sp, strides, kernel, dilations, src_ncx.shape[2:], begin)]
    return kernel, strides, dilations, begin, end


def _windows(xp, kernel, strides, dilations, out_sp):
    """Yield the strided view of every kernel tap."""
    for k in itertools.product(*(range(kk) for kk in kernel)):
        yield window(xp, [kk * d for kk, d in zip(k, dilations)], strides, out_sp)


def max_pool(op, inputs, out_lts, ctx):
    """dst[n, c, y...] = max_k src[n, c, y*s - pb + k*d]  (padding = -inf)."""
    fmt = op.attrs.get("data_format", "NXC")
    src = to_ncx(f64(inputs[0]), fmt)
    out_sp = ncx_shape(out_lts[0].shape, fmt)[2:]
    kernel, strides, dilations, begin, end = _geometry(op, src, out_sp, dilated=True)
    xp = pad_spatial(src, begin, end, value=-np.inf)
    acc = None
    for view in _windows(xp, kernel, strides, dilations, out_sp):
        acc = view.copy() if acc is None else np.maximum(acc, view)
    return [finish(from_ncx(acc, fmt), out_lts[0])]


def avg_pool(op, inputs, out_lts, ctx):
    """dst[n, c, y...] = sum_k src[n, c, y*s - pb + k] / divisor  (padding = 0);
    divisor = cells inside src (exclude_pad or ceil mode) or prod(kernel)."""
    fmt = op.attrs.get("data_format", "NXC")
    src = to_ncx(f64(inputs[0]), fmt)
    out_sp = ncx_shape(out_lts[0].shape, fmt)[2:]
    kernel, strides, dilations, begin, end = _geometry(op, src, out_sp, dilated=False)
    xp = pad_spatial(src, begin, end)
    inside = pad_spatial(np.ones((1, 1) + src.shape[2:]), begin, end)
    total = np.zeros(src.shape[:2] + tuple(out_sp))
    count = np.zeros((1, 1) + tuple(out_sp))
    for view, mask in zip(_windows(xp, kernel, strides, dilations, out_sp),
                          _windows(inside, kernel, strides, dilations, out_sp)):
        total += view
        count += mask
    exclude = op.attrs.get("exclude_pad", False) or op.attrs.get("rounding_type") == "ceil"
    divisor = count if exclude else float(np.prod(kernel))
    with np.errstate(all="ignore"):
        return [finish(from_ncx(total / divisor, fmt), out_lts[0])]


POOL = {OpKind.MaxPool: max_pool, OpKind.AvgPool: avg_pool}

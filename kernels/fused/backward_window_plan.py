"""Windowed backward op kinds in f32: Convolution/ConvTranspose data and weights
gradients on im2col/col2im and f32 BLAS, pooling and Interpolate gradients.

All work on canonical arrays (N, C, spatial...) and canonical weights
(O, I/g, K... for Convolution; OCg, IC, K... for ConvTranspose), image by image
so one image's columns stay in cache.  With the forward Convolution
``dst[o, y] = sum_{c, k} w[o, c, k] src[c, y*s + k*d - pb]``:

* ConvolutionBackwardData is that map's transpose, a ConvTranspose of
  diff_dst with the same geometry: per group ``cols = w^T diff_dst`` (BLAS,
  ``[ICg * K, P]``), then each tap's column block is added at
  ``y*s + k*d - pb`` (col2im, :func:`graph_api.kernels.convolution.conv.deconv_col2im`);
* ConvolutionBackwardWeights: ``diff_w[g] = sum_n diff_dst[n, g] cols[n, g]^T``
  with ``cols`` the im2col matrix of ``src[n]`` (one BLAS call per image,
  summed in f32 over images);
* ConvTransposeBackwardData is the Convolution of diff_dst by the weights with
  I and O swapped (im2col + BLAS); ConvTransposeBackwardWeights the
  Convolution weights gradient with src and diff_dst exchanged, I and O swapped back.

Convolution inputs go through the fpmath down-conversion as the reference's
(``round_mm_input``).  Pooling and Interpolate run the reference's canonical
cores (``avg_pool_grad``, ``max_pool_grad``, ``interpolate_grad``) on f32
arrays: strided numpy, one pass per kernel tap (or per spatial dim).
"""
from __future__ import annotations

import numpy as np

from graph_api.enums import OpKind as K
from graph_api.kernels.convolution import conv as cv
from graph_api.kernels.reference._common import from_ncx, ncx_shape, pads, spatial_list, to_ncx
from graph_api.kernels.reference.backward_window import (avg_pool_grad, interpolate_grad,
                                                        max_pool_grad, oix_to_format)
from graph_api.kernels.reference.conv import weights_to_oix

F32 = np.float32


def _canonical_weights_shape(shape, fmt) -> tuple:
    return weights_to_oix(np.empty(shape, np.uint8), fmt).shape


def _geometry(op, in_shape, out_shape, kernel, deconv_pads=False) -> cv.Geometry:
    """A forward Convolution's geometry from canonical ``in_shape`` to ``out_shape``
    (pads by the op's attrs and auto_pad; end pads so the last window fits exactly)."""
    nsp = len(in_shape) - 2
    strides = spatial_list(op, "strides", nsp, 1)
    dilations = spatial_list(op, "dilations", nsp, 1)
    begin, _ = pads(op, list(in_shape[2:] if not deconv_pads else out_shape[2:]), strides, kernel,
                    dilations, deconv_pads)
    end = [(o - 1) * s + (k - 1) * d + 1 - i - b for o, s, k, d, i, b in
           zip(out_shape[2:], strides, kernel, dilations, in_shape[2:], begin)]
    return cv.Geometry(in_shape[1], out_shape[1], op.attrs["groups"], tuple(in_shape[2:]),
                       tuple(out_shape[2:]), tuple(kernel), tuple(strides), tuple(dilations),
                       tuple(begin), tuple(end))


def conv_forward(x, w_oix, geo: cv.Geometry):
    """Convolution of canonical f32 ``x`` by canonical ``w_oix`` (im2col + BLAS)."""
    w2 = np.ascontiguousarray(w_oix.reshape(geo.groups, geo.out_channels // geo.groups, -1), F32)
    y = np.empty((x.shape[0], geo.out_channels, geo.positions), F32)
    buf = None
    for n in range(x.shape[0]):
        cols = cv.im2col(cv.pad_image(x[n], geo), geo, buf)
        buf = None if geo.pointwise else cols
        y[n] = cv.conv_gemm(cols, w2)
    return y.reshape((x.shape[0], geo.out_channels) + geo.out_spatial)


def conv_data_grad(dy, w_oix, geo: cv.Geometry):
    """diff_src of the Convolution ``geo`` (src -> dst) from canonical ``dy``: col2im."""
    deconv = cv.Geometry(geo.out_channels, geo.in_channels, geo.groups, geo.out_spatial,
                         geo.in_spatial, geo.kernel, geo.strides, geo.dilations, geo.pads_begin,
                         geo.pads_end, deconv=True)
    wt = cv.deconv_weights(np.swapaxes(w_oix, 0, 1), geo.groups)  # (ICg, O, K) is ConvTranspose's (OCg, IC, K)
    dx = np.empty((dy.shape[0], geo.in_channels, int(np.prod(geo.in_spatial))), F32)
    for n in range(dy.shape[0]):
        dx[n] = cv.deconv_col2im(np.ascontiguousarray(dy[n]), wt, deconv)
    return dx.reshape((dy.shape[0], geo.in_channels) + geo.in_spatial)


def conv_weights_grad(x, dy, geo: cv.Geometry):
    """diff_w (O, ICg, K...) of the Convolution ``geo`` from canonical src and diff_dst."""
    G, ocg = geo.groups, geo.out_channels // geo.groups
    dw = np.zeros((G, ocg, geo.reduction), F32)
    buf = None
    for n in range(x.shape[0]):
        cols = cv.im2col(cv.pad_image(x[n], geo), geo, buf)
        buf = None if geo.pointwise else cols
        dw += np.matmul(dy[n].reshape(G, ocg, geo.positions), np.swapaxes(cols, 1, 2))
    return dw.reshape((geo.out_channels, geo.in_channels // G) + geo.kernel)


# --------------------------------------------------------- per op kind
def conv_backward_data(op, lts):
    """inputs diff_dst, weights -> diff_src (module docstring)."""
    fmt, wfmt = op.attrs["data_format"], op.attrs["weights_format"]
    dy_shape = ncx_shape(lts[op.inputs[0].id].shape, fmt)
    src_shape = ncx_shape(lts[op.outputs[0].id].shape, fmt)
    kernel = list(_canonical_weights_shape(lts[op.inputs[1].id].shape, wfmt)[2:])
    geo = _geometry(op, src_shape, dy_shape, kernel)

    def compute(xs):
        dy, w = to_ncx(xs[0], fmt), weights_to_oix(xs[1], wfmt)
        return [from_ncx(conv_data_grad(dy, w, geo), fmt)]

    return compute


def conv_backward_weights(op, lts):
    """inputs src, diff_dst -> diff_weights."""
    fmt, wfmt = op.attrs["data_format"], op.attrs["weights_format"]
    x_shape, dy_shape = (ncx_shape(lts[lt.id].shape, fmt) for lt in op.inputs[:2])
    kernel = list(_canonical_weights_shape(lts[op.outputs[0].id].shape, wfmt)[2:])
    geo = _geometry(op, x_shape, dy_shape, kernel)

    def compute(xs):
        dw = conv_weights_grad(to_ncx(xs[0], fmt), to_ncx(xs[1], fmt), geo)
        return [oix_to_format(dw, wfmt)]

    return compute


def conv_transpose_backward_data(op, lts):
    """inputs diff_dst, weights -> diff_src: the Convolution of diff_dst by w with I, O swapped."""
    fmt, wfmt = op.attrs["data_format"], op.attrs["weights_format"]
    dy_shape = ncx_shape(lts[op.inputs[0].id].shape, fmt)
    src_shape = ncx_shape(lts[op.outputs[0].id].shape, fmt)
    kernel = list(_canonical_weights_shape(lts[op.inputs[1].id].shape, wfmt)[2:])
    geo = _geometry(op, dy_shape, src_shape, kernel)

    def compute(xs):
        w_conv = np.swapaxes(weights_to_oix(xs[1], wfmt), 0, 1)  # (OCg, IC, K) -> (IC, OCg, K)
        return [from_ncx(conv_forward(to_ncx(xs[0], fmt), w_conv, geo), fmt)]

    return compute


def conv_transpose_backward_weights(op, lts):
    """inputs src, diff_dst -> diff_weights: the Convolution weights gradient of
    diff_dst -> src, I and O swapped back."""
    fmt, wfmt = op.attrs["data_format"], op.attrs["weights_format"]
    x_shape, dy_shape = (ncx_shape(lts[lt.id].shape, fmt) for lt in op.inputs[:2])
    kernel = list(_canonical_weights_shape(lts[op.outputs[0].id].shape, wfmt)[2:])
    geo = _geometry(op, dy_shape, x_shape, kernel, deconv_pads=True)

    def compute(xs):
        dw = conv_weights_grad(to_ncx(xs[1], fmt), to_ncx(xs[0], fmt), geo)
        return [oix_to_format(np.swapaxes(dw, 0, 1), wfmt)]

    return compute


def avg_pool(op, lts):
    """input diff_dst -> diff_src (reference core on f32)."""
    fmt = op.attrs["data_format"]
    src_shape = ncx_shape(lts[op.outputs[0].id].shape, fmt)
    return lambda xs: [from_ncx(avg_pool_grad(op, to_ncx(xs[0], fmt), src_shape), fmt)]


def max_pool(op, lts):
    """inputs src, diff_dst -> diff_src (reference core on f32)."""
    fmt = op.attrs["data_format"]
    return lambda xs: [from_ncx(max_pool_grad(op, to_ncx(xs[0], fmt), to_ncx(xs[1], fmt)), fmt)]


def interpolate(op, lts):
    """inputs src, diff_dst -> diff_src (reference core on f32)."""
    fmt = op.attrs["data_format"]
    in_sp = ncx_shape(lts[op.outputs[0].id].shape, fmt)[2:]
    return lambda xs: [from_ncx(interpolate_grad(op, to_ncx(xs[1], fmt), in_sp), fmt)]


#: op kind -> (kernel name, prepare(op, lts) -> compute(list of f32 arrays))
PREPARE = {
    K.ConvolutionBackwardData: ("f32_col2im_blas", conv_backward_data),
    K.ConvolutionBackwardWeights: ("f32_im2col_blas", conv_backward_weights),
    K.ConvTransposeBackwardData: ("f32_im2col_blas", conv_transpose_backward_data),
    K.ConvTransposeBackwardWeights: ("f32_im2col_blas", conv_transpose_backward_weights),
    K.AvgPoolBackward: ("numpy_f32_pool_bwd", avg_pool),
    K.MaxPoolBackward: ("numpy_f32_pool_bwd", max_pool),
    K.InterpolateBackward: ("numpy_f32_interpolate_bwd", interpolate),
}

#: input ports rounded by the fpmath mode (the reference's ``round_mm_input``)
ROUNDED_INPUTS = {K.ConvolutionBackwardData: (0, 1), K.ConvolutionBackwardWeights: (0, 1),
                  K.ConvTransposeBackwardData: (0, 1), K.ConvTransposeBackwardWeights: (0, 1)}

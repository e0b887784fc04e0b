"""Convolution cores for the fused CNN plans: im2col + f32 BLAS, direct depthwise,
exact integer accumulation.  One image at a time, channels first ([C, spatial...]),
so an image's output block stays in L2 while the post-op chain runs on it.

Geometry follows ``kernels/reference/conv.py`` (same pads, strides, dilations,
groups); weights arrive canonical ``(O, I/g, K...)``.

* :func:`im2col` gathers ``cols[g, (c, k...), p] = xp[g*ICg + c, p*s - pb + k*d]``
  into a reusable buffer; a 1x1, stride-1, unpadded convolution needs no copy.
* :func:`conv_gemm`: ``y[g*OCg + o, p] = sum_j w2[g, o, j] * cols[g, j, p]`` with
  numpy's f32 matmul (OpenBLAS).
* :func:`conv_depthwise`: ``y[c, p] = sum_k w[c, k] * xp[c, p*s - pb + k*d]``
  accumulated in f32 tap by tap (<= 49 terms: no BLAS needed).
* :func:`int_gemm`: integer operands held exactly in f32, the reduction split
  into chunks short enough that every partial sum stays below 2^24 (exact in
  f32), the chunks summed in f64 (exact below 2^53).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

#: integers up to this magnitude are exact in f32
F32_EXACT = 2 ** 24


@dataclass(frozen=True)
class Geometry:
    """One convolution's shape facts (channels-first, per image)."""

    in_channels: int
    out_channels: int
    groups: int
    in_spatial: tuple
    out_spatial: tuple
    kernel: tuple
    strides: tuple
    dilations: tuple
    pads_begin: tuple
    pads_end: tuple
    deconv: bool = False  # ConvTranspose: in/out roles of the spatial formula swap

    @property
    def positions(self) -> int:
        return int(np.prod(self.out_spatial))

    @property
    def reduction(self) -> int:
        """Terms per output value: ICg * prod(kernel)."""
        return self.in_channels // self.groups * int(np.prod(self.kernel))

    @property
    def pointwise(self) -> bool:
        """1x1, stride 1, no padding: the image itself is the column matrix."""
        return (all(k == 1 for k in self.kernel) and all(s == 1 for s in self.strides)
                and not any(self.pads_begin) and not any(self.pads_end))

    @property
    def depthwise(self) -> bool:
        return self.groups == self.in_channels == self.out_channels and not self.deconv


def pad_image(x: np.ndarray, geo: Geometry, value=0.0) -> np.ndarray:
    """``x`` [C, spatial...] padded (or cropped, for negative pads) by the geometry."""
    if not any(geo.pads_begin) and not any(geo.pads_end):
        return x
    widths = [(0, 0)] + [(max(b, 0), max(e, 0)) for b, e in zip(geo.pads_begin, geo.pads_end)]
    out = np.pad(x, widths, constant_values=value)
    crop = [slice(None)] + [slice(max(-b, 0), n - max(-e, 0))
                            for b, e, n in zip(geo.pads_begin, geo.pads_end, out.shape[1:])]
    return out[tuple(crop)]


def taps(geo: Geometry):
    """Every kernel position with its strided view index into a padded image."""
    for k in itertools.product(*(range(kk) for kk in geo.kernel)):
        index = [slice(None)]
        for kk, d, s, o in zip(k, geo.dilations, geo.strides, geo.out_spatial):
            start = kk * d
            index.append(slice(start, start + (o - 1) * s + 1, s))
        yield k, tuple(index)


def im2col(xp: np.ndarray, geo: Geometry, buf: np.ndarray | None = None) -> np.ndarray:
    """Columns ``[G, ICg * prod(K), P]`` of a padded image ``xp`` [IC, spatial...]."""
    G = geo.groups
    icg = geo.in_channels // G
    if geo.pointwise:
        return xp.reshape(G, icg, geo.positions)
    nk = int(np.prod(geo.kernel))
    shape = (G, icg, nk) + tuple(geo.out_spatial)
    if buf is None or buf.size != int(np.prod(shape)) or buf.dtype != xp.dtype:
        buf = np.empty(shape, xp.dtype)
    cols = buf.reshape(shape)  # a view: buf is contiguous (a previous result of this function)
    for t, (_, index) in enumerate(taps(geo)):
        cols[:, :, t] = xp[index].reshape((G, icg) + tuple(geo.out_spatial))
    return cols.reshape(G, icg * nk, geo.positions)


def conv_gemm(cols: np.ndarray, w2: np.ndarray) -> np.ndarray:
    """``[OC, P]`` = per group ``w2[g] @ cols[g]`` (f32 BLAS)."""
    y = np.matmul(w2, cols)
    return y.reshape(y.shape[0] * y.shape[1], y.shape[-1])  # explicit: -1 fails on empty arrays


def conv_depthwise(xp: np.ndarray, wk: np.ndarray, geo: Geometry) -> np.ndarray:
    """Depthwise ``[C, P]``: ``wk`` is ``[C, prod(K)]``; f32 accumulation tap by tap."""
    acc = np.zeros((geo.in_channels,) + tuple(geo.out_spatial), np.float32)
    wshape = (-1,) + (1,) * len(geo.out_spatial)
    for t, (_, index) in enumerate(taps(geo)):
        acc += wk[:, t].reshape(wshape) * xp[index]
    return acc.reshape(geo.in_channels, geo.positions)


def exact_chunk(x_range: float, w_range: float) -> int:
    """Longest reduction whose partial sums of integer products stay exact in f32."""
    return max(1, int(F32_EXACT // max(x_range * w_range, 1.0)))


def int_gemm(cols: np.ndarray, w2: np.ndarray, chunk: int) -> np.ndarray:
    """Exact ``sum_j w2[g, o, j] * cols[g, j, p]`` of integer-valued f32 operands, as f64."""
    J = cols.shape[1]
    if J <= chunk:
        return conv_gemm(cols, w2).astype(np.float64)
    acc = None
    for j0 in range(0, J, chunk):
        part = np.matmul(w2[:, :, j0:j0 + chunk], cols[:, j0:j0 + chunk]).astype(np.float64)
        acc = part if acc is None else acc + part
    return acc.reshape(-1, acc.shape[-1])


def deconv_weights(w_oix: np.ndarray, groups: int) -> np.ndarray:
    """ConvTranspose weights canonical ``(OCg, IC, K...)`` as ``[G, OCg * prod(K), ICg]``."""
    ocg, ic = w_oix.shape[:2]
    nk = int(np.prod(w_oix.shape[2:]))
    w = w_oix.reshape(ocg, groups, ic // groups, nk)
    return np.ascontiguousarray(w.transpose(1, 0, 3, 2).reshape(groups, ocg * nk, ic // groups))


def deconv_col2im(x_img: np.ndarray, wt: np.ndarray, geo: Geometry, exact_chunk_: int | None = None):
    """ConvTranspose of one image ``x_img`` [IC, in spatial...] as ``[OC, P]``.

    ``cols[g, (o, k), x] = sum_c wt[g, (o, k), c] * x[g*ICg + c, x]`` (BLAS), then each
    tap's columns are added at ``y = x*s + k*d - pb`` (col2im).  With
    ``exact_chunk_`` the operands are integers and everything is summed exactly
    (chunked f32 products, f64 accumulation)."""
    G = geo.groups
    icg = geo.in_channels // G
    ocg = geo.out_channels // G
    nk = int(np.prod(geo.kernel))
    xg = x_img.reshape(G, icg, -1)
    if exact_chunk_ is None:
        cols = np.matmul(wt, xg)
        acc_dtype = np.float32
    else:
        cols = int_gemm(xg, wt, exact_chunk_).reshape(G, ocg * nk, -1)
        acc_dtype = np.float64
    cols = cols.reshape((G, ocg, nk) + tuple(geo.in_spatial))
    full = [max((i - 1) * s + (k - 1) * d + 1, b + o) for i, s, k, d, b, o in
            zip(geo.in_spatial, geo.strides, geo.kernel, geo.dilations, geo.pads_begin, geo.out_spatial)]
    shift = [max(-b, 0) for b in geo.pads_begin]
    buf = np.zeros((G, ocg) + tuple(f + sh for f, sh in zip(full, shift)), acc_dtype)
    for t, k in enumerate(itertools.product(*(range(kk) for kk in geo.kernel))):
        index = [slice(None), slice(None)]
        for kk, d, s, i, sh in zip(k, geo.dilations, geo.strides, geo.in_spatial, shift):
            start = kk * d + sh
            index.append(slice(start, start + (i - 1) * s + 1, s))
        buf[tuple(index)] += cols[:, :, t]
    crop = [slice(None), slice(None)] + [slice(b + sh, b + sh + o) for b, sh, o in
                                         zip(geo.pads_begin, shift, geo.out_spatial)]
    return buf[tuple(crop)].reshape(geo.out_channels, geo.positions)

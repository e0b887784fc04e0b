"""Numba kernels of the fast 2-D convolution path (``kernels/convolution/conv_plan.py``).

One image at a time, channels first (``[C, H, W]`` views; NXC data arrives as a
strided view and is read through its strides):

* :func:`im2col_2d` gathers ``cols[(c, i, j), (y, x)] = x[c, y*sh - ph + i*dh,
  x*sw - pw + j*dw] - zp`` as f32, zero where the window leaves the image, in
  one parallel pass (padding, the integer zero point and the conversion to f32
  included; no padded copy of the image).
* :func:`im2col_packed_2d`: the same columns of 8-bit data as bytes, written
  straight into the int8 GEMM's packed B panels (``kernels/igemm.py``);
  :func:`im2col_pairs_2d`: as int16 pairs in the AVX2 int8 GEMM's panels
  (``kernels/convolution/igemm16.py``).
* :func:`depthwise_2d`: ``y[c, p] = sum_t w[c, t] * (x[c, ...] - zp)`` in f32,
  taps in kernel order (the order of ``graph_api.kernels.convolution.conv.conv_depthwise``),
  vectorised along the output row.
* :func:`conv_bands`: a whole convolution of one image (columns, single-threaded
  sgemm, epilogue) as one parallel pass over bands of output rows.
* :func:`epilogue`: the GEMM's ``[OC, P]`` result (f32, the exact f64 integer
  sums of ``conv.int_gemm``, or the exact int32 sums of ``igemm``) -> optional per-channel int8 scale (in f64, then one
  rounding to f32) -> bias -> the post-op program -> stored into the destination
  (f32, or u8/s8 after a Quantize: NaN -> 0, round half to even, saturate, as
  ``graph_api.dtypes.convert``).  Each step is one vectorised loop over an
  L1-resident piece of a channel row, so the whole chain costs one read and one
  write of the output (:func:`conv_bands` runs the same row program, :func:`_ep_row`).

Every step computes in f32 exactly as the reference op does (binary ops, ReLU,
Clamp and the Quantize formula ``x / scale + zp`` are single f32 operations, so
the reference's f64 evaluation rounds to the same f32 value).  No fastmath:
divisions stay divisions.
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401

import math

import numpy as np
from numba import njit, prange

from graph_api.kernels.igemm import NR
from graph_api.kernels.convolution.igemm16 import NR as NR16
from graph_api.kernels.openblas import sgemm
from graph_api.kernels.store import _finite

# ---- post-op program codes (a step is (code, operand source, f32 a, f32 b)): the
# codes of the one post-op table
from graph_api.postops import (ADD, CLAMP, DIV, MAX, MIN, MUL, QUANTIZE, RDIV, RELU,  # noqa: E402
                               RSUB, SUB)
#: operand sources of binary steps: a scalar (a), per-channel row (chan[i, c]),
#: the full-shape operand (dequantized with (fscale, fzp) when it is an integer array)
SCALAR, CHANNEL, FULL = 0, 1, 2

_PIECE = 512  # row piece kept in registers/L1 while the program runs over it


@njit(inline="always", cache=True)
def _inside(ow, sw, off, width):
    """Output columns ``[x0, x1)`` whose input column ``q*sw + off`` lies in ``[0, width)``."""
    x0 = 0
    while x0 < ow and x0 * sw + off < 0:
        x0 += 1
    x1 = ow
    while x1 > x0 and (x1 - 1) * sw + off >= width:
        x1 -= 1
    return x0, x1


# Loops below index 1-D slices from 0 with the loop variable: Numba's negative-index
# wraparound then folds away and LLVM sees unit-stride loads it can vectorise.
@njit(cache=True)
def _im2col_row(x, zp, r, kh, kw, sh, sw, dh, dw, ph, pw, y0, y1, ow, row):
    """Row ``r = (c, i, j)`` of the columns for output rows ``[y0, y1)``: ``row[(y - y0)*ow
    + q] = x[c, y*sh - ph + i*dh, q*sw - pw + j*dw] - zp`` (0 outside the image)."""
    C, H, W = x.shape
    c = r // (kh * kw)
    i = (r // kw) % kh
    j = r % kw
    off = j * dw - pw
    x0, x1 = _inside(ow, sw, off, W)
    for y in range(y0, y1):
        iy = y * sh - ph + i * dh
        dst = row[(y - y0) * ow:(y - y0 + 1) * ow]
        if iy < 0 or iy >= H:
            dst[:] = 0
            continue
        dst[:x0] = 0
        dst[x1:] = 0
        mid = dst[x0:x1]
        if sw == 1:
            src = x[c, iy, x0 + off:x1 + off]
            for q in range(x1 - x0):
                mid[q] = np.float32(src[q]) - zp
        else:
            src = x[c, iy, x0 * sw + off:(x1 - 1) * sw + off + 1:sw]
            for q in range(x1 - x0):
                mid[q] = np.float32(src[q]) - zp


@njit(parallel=True, cache=True)
def im2col_2d(x, zp, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow, cols):
    """``cols`` [C*kh*kw, oh*ow] f32 from image ``x`` [C, H, W] (any dtype, any strides)."""
    C = x.shape[0]
    for r in prange(C * kh * kw):
        # int64 row and first output row: prange's unsigned index or a literal 0 would
        # compile a second signature of _im2col_row (the band kernel calls it too)
        _im2col_row(x, zp, np.int64(r), kh, kw, sh, sw, dh, dw, ph, pw, np.int64(0), oh, ow, cols[r])


@njit(inline="always", cache=True)
def _interleave(rows, kk, k4, P, out32):
    """The four gathered rows ``rows`` [4, P] of B -> the 32-bit words of group ``kk`` in every panel."""
    r0, r1, r2, r3 = rows[0], rows[1], rows[2], rows[3]
    for p in range((P + NR - 1) // NR):
        n0 = p * NR
        nn = min(NR, P - n0)
        o = out32[(p * k4 + kk) * NR:(p * k4 + kk + 1) * NR]
        a0, a1, a2, a3 = r0[n0:n0 + nn], r1[n0:n0 + nn], r2[n0:n0 + nn], r3[n0:n0 + nn]
        for q in range(nn):
            o[q] = np.uint32(a0[q]) | (np.uint32(a1[q]) << np.uint32(8)) \
                | (np.uint32(a2[q]) << np.uint32(16)) | (np.uint32(a3[q]) << np.uint32(24))
        for q in range(nn, NR):
            o[q] = 0


@njit(parallel=True, cache=True)
def im2col_packed_2d(x, shift, pad, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow, k4, out32):
    """The im2col columns of 8-bit image ``x`` [C, H, W] (any strides) written
    straight into :class:`graph_api.kernels.igemm.PackedB`'s panel layout:
    ``out32[(p*k4 + kk)*NR + j]`` holds bytes ``t = 0..3`` of
    ``cols[4*kk + t, p*NR + j] + shift`` (``shift`` 128 turns s8 data into the
    u8 operand ``vpdpbusd`` wants, 0 for u8), ``pad`` (the zero point plus
    ``shift``) where the window leaves the image, zeros past K and P.

    One pass over the image instead of an im2col then a pack.  A task is one
    group of four rows of B: they are gathered whole (unit-stride runs along
    the output rows, as :func:`im2col_2d`) into a small byte buffer, then
    interleaved into the 32-bit words of every panel."""
    C, H, W = x.shape
    K = C * kh * kw
    P = oh * ow
    for kk in prange(k4):
        rows = np.empty((4, P), np.uint8)
        for t in range(4):
            r = 4 * kk + t
            dst = rows[t]
            if r >= K:
                dst[:] = 0
                continue
            c = r // (kh * kw)
            i = (r // kw) % kh
            j = r % kw
            off = j * dw - pw
            x0, x1 = _inside(ow, sw, off, W)
            for y in range(oh):
                iy = y * sh - ph + i * dh
                d = dst[y * ow:(y + 1) * ow]
                if iy < 0 or iy >= H:
                    d[:] = pad
                    continue
                d[:x0] = pad
                d[x1:] = pad
                m = d[x0:x1]
                if sw == 1:
                    src = x[c, iy, x0 + off:x1 + off]
                else:
                    src = x[c, iy, x0 * sw + off:(x1 - 1) * sw + off + 1:sw]
                for q in range(x1 - x0):
                    m[q] = np.uint8((np.int32(src[q]) + shift) & 255)
        _interleave(rows, kk, k4, P, out32)


@njit(cache=True)
def _flat_window(r, H, W, kh, kw, dh, dw, ph, pw, oh):
    """Where row ``r`` of B reads the image at stride 1 and ``ow == W`` (the flat
    gatherers): its channel ``c``; the output rows ``[ya, yb)`` whose input row lies
    inside; the flat input index ``s0`` of output position ``ya * W``; the run ``[qa, qb)``
    of positions from there that one copy reads inside the image; and the output
    columns ``[x0, x1)`` whose input column lies inside (the rest are padding)."""
    c = r // (kh * kw)
    i = (r // kw) % kh
    j = r % kw
    off = j * dw - pw
    x0, x1 = _inside(W, 1, off, W)
    ya = min(oh, max(0, ph - i * dh))
    yb = max(ya, min(oh, H + ph - i * dh))
    s0 = (ya - ph + i * dh) * W + off
    qa = max(0, -s0)
    qb = min((yb - ya) * W, H * W - s0)
    return c, ya, yb, s0, qa, qb, x0, x1


@njit(parallel=True, cache=True)
def im2col_packed_2d_flat(x2, H, W, shift, pad, kh, kw, dh, dw, ph, pw, oh, k4, out32):
    """:func:`im2col_packed_2d` for stride 1 and ``ow == W`` (1x1 without padding,
    "same"-padded kxk), ``x2`` the image as C-contiguous [C, H*W]: an output
    position ``y*W + q`` then reads input ``(y - ph + i*dh)*W + q + j*dw - pw``,
    so each row of B is one long copy (runs of ``ow`` bytes cost more in slicing
    than in copying) and the few columns the window leaves are set to the pad
    byte afterwards."""
    C = x2.shape[0]
    K = C * kh * kw
    ow = W
    P = oh * ow
    for kk in prange(k4):
        rows = np.empty((4, P), np.uint8)
        for t in range(4):
            r = 4 * kk + t
            dst = rows[t]
            if r >= K:
                dst[:] = 0
                continue
            c, ya, yb, s0, qa, qb, x0, x1 = _flat_window(np.int64(r), H, W, kh, kw, dh, dw, ph, pw, oh)
            dst[:ya * ow] = pad
            dst[yb * ow:] = pad
            if qa < qb:
                m = dst[ya * ow + qa:ya * ow + qb]
                src = x2[c, s0 + qa:s0 + qb]
                for q in range(qb - qa):
                    m[q] = np.uint8((np.int32(src[q]) + shift) & 255)
            for y in range(ya, yb):  # the columns outside the image (also the ends the copy skipped)
                for q in range(x0):
                    dst[y * ow + q] = pad
                for q in range(x1, ow):
                    dst[y * ow + q] = pad
        _interleave(rows, kk, k4, P, out32)


@njit(parallel=True, cache=True)
def im2col_pairs_2d(x, zp, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow, k2, out32):
    """The im2col columns of 8-bit image ``x`` [C, H, W] (any strides) less the zero
    point, as the int16 pairs of :mod:`graph_api.kernels.convolution.igemm16`'s panels:
    ``out32[(p*k2 + kk)*NR16 + j]`` holds ``cols[2*kk, p*NR16 + j]`` in its low and
    ``cols[2*kk + 1, p*NR16 + j]`` in its high 16 bits (``x - zp``, within [-255, 255]
    for 8-bit data and zero point; 0 where the window leaves the image and past K and P).

    A task is one pair of rows of B, gathered whole by :func:`_im2col_row` (the f32
    columns' gatherer: integers below 2^24, exact) then interleaved into every panel."""
    C = x.shape[0]
    K = C * kh * kw
    P = oh * ow
    for kk in prange(k2):
        rows = np.zeros((2, P), np.float32)
        for t in range(2):
            r = np.int64(2 * kk + t)
            if r < K:
                _im2col_row(x, zp, r, kh, kw, sh, sw, dh, dw, ph, pw, np.int64(0), oh, ow, rows[t])
        r0, r1 = rows[0], rows[1]
        for p in range((P + NR16 - 1) // NR16):
            n0 = p * NR16
            nn = min(NR16, P - n0)
            o = out32[(p * k2 + kk) * NR16:(p * k2 + kk + 1) * NR16]
            a0, a1 = r0[n0:n0 + nn], r1[n0:n0 + nn]
            for q in range(nn):
                o[q] = (np.uint32(np.int32(a0[q])) & np.uint32(0xFFFF)) | (np.uint32(np.int32(a1[q])) << np.uint32(16))
            for q in range(nn, NR16):
                o[q] = 0


@njit(inline="always", cache=True)
def _interleave_pairs(r0, r1, kk, k2, P, out32):
    """Rows ``2*kk`` and ``2*kk + 1`` of B (int16 [P] each) -> the 32-bit words of pair ``kk``
    in every igemm16 panel (``r0`` in the low half), zeros past P."""
    for p in range((P + NR16 - 1) // NR16):
        n0 = p * NR16
        nn = min(NR16, P - n0)
        o = out32[(p * k2 + kk) * NR16:(p * k2 + kk + 1) * NR16]
        a0, a1 = r0[n0:n0 + nn], r1[n0:n0 + nn]
        for q in range(nn):
            o[q] = np.uint32(np.uint16(a0[q])) | (np.uint32(np.uint16(a1[q])) << np.uint32(16))
        for q in range(nn, NR16):
            o[q] = 0


@njit(parallel=True, cache=True)
def im2col_pairs_2d_flat(x2, H, W, zp, kh, kw, dh, dw, ph, pw, oh, k2, out32):
    """:func:`im2col_pairs_2d` for stride 1 and ``ow == W`` (1x1 without padding,
    "same"-padded kxk), ``x2`` the image as C-contiguous [C, H*W] and ``zp`` an int:
    each row of B is one long copy less the zero point (as :func:`im2col_packed_2d_flat`),
    into int16, the positions the window leaves set to 0 afterwards, then interleaved."""
    C = x2.shape[0]
    K = C * kh * kw
    ow = W
    P = oh * ow
    for kk in prange(k2):
        rows = np.empty((2, P), np.int16)
        for t in range(2):
            r = 2 * kk + t
            dst = rows[t]
            if r >= K:
                dst[:] = 0
                continue
            c, ya, yb, s0, qa, qb, x0, x1 = _flat_window(np.int64(r), H, W, kh, kw, dh, dw, ph, pw, oh)
            dst[:ya * ow] = 0
            dst[yb * ow:] = 0
            if qa < qb:
                m = dst[ya * ow + qa:ya * ow + qb]
                src = x2[c, s0 + qa:s0 + qb]
                for q in range(qb - qa):
                    m[q] = np.int16(np.int32(src[q]) - zp)
            for y in range(ya, yb):  # the columns outside the image (also the ends the copy skipped)
                for q in range(x0):
                    dst[y * ow + q] = 0
                for q in range(x1, ow):
                    dst[y * ow + q] = 0
        _interleave_pairs(rows[0], rows[1], kk, k2, P, out32)


@njit(parallel=True, cache=True)
def depthwise_2d(x, zp, w, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow, out):
    """``out`` [C, oh*ow] f32: per channel, taps in kernel order, each window
    position outside the image contributing nothing (the zero padding)."""
    C, H, W = x.shape
    if sh == 1 and sw == 1 and ph >= 0 and pw >= 0:
        _depthwise_unit_stride(x, zp, w, kh, kw, dh, dw, ph, pw, oh, ow, out)
        return
    for c in prange(C):
        acc = np.empty(ow, np.float32)
        xf = np.empty(W, np.float32)
        for y in range(oh):
            acc[:] = 0
            for i in range(kh):
                iy = y * sh - ph + i * dh
                if iy < 0 or iy >= H:
                    continue
                src = x[c, iy]
                for q in range(W):
                    xf[q] = np.float32(src[q]) - zp
                for j in range(kw):
                    wt = w[c, i * kw + j]
                    off = j * dw - pw
                    x0, x1 = _inside(ow, sw, off, W)
                    a = acc[x0:x1]
                    xs = xf[x0 * sw + off:(x1 - 1) * sw + off + 1:sw]
                    for q in range(x1 - x0):
                        a[q] += wt * xs[q]
            dst = out[c, y * ow:(y + 1) * ow]
            for q in range(ow):
                dst[q] = acc[q]


@njit(parallel=True, cache=True)
def _depthwise_unit_stride(x, zp, w, kh, kw, dh, dw, ph, pw, oh, ow, out):
    """Stride 1: each channel padded once into a row-major plane of width ``Wp``;
    every tap is then one long unit-stride loop over ``oh * Wp`` positions (the
    ``Wp - ow`` extra columns of each row are computed and dropped)."""
    C, H, W = x.shape
    Wp = max(W + pw, (ow - 1) + (kw - 1) * dw + 1)
    Hp = max(H + ph, (oh - 1) + (kh - 1) * dh + 1) + 1  # + 1 row: the last taps read past the end
    L = oh * Wp
    for c in prange(C):
        xp = np.zeros(Hp * Wp, np.float32)
        for iy in range(H):
            src = x[c, iy]
            dst = xp[(iy + ph) * Wp + pw:(iy + ph) * Wp + pw + W]
            for q in range(W):
                dst[q] = np.float32(src[q]) - zp
        acc = np.zeros(L, np.float32)
        for i in range(kh):
            for j in range(kw):
                wt = w[c, i * kw + j]
                start = i * dh * Wp + j * dw
                xs = xp[start:start + L]
                for q in range(L):
                    acc[q] += wt * xs[q]
        for y in range(oh):
            dst = out[c, y * ow:(y + 1) * ow]
            src = acc[y * Wp:y * Wp + ow]
            for q in range(ow):
                dst[q] = src[q]


@njit(inline="always", cache=True)
def _fdiv(a, b):
    """IEEE ``a / b`` in f32 (Numba's default error model raises on a zero divisor)."""
    if b != 0:
        return a / b
    if a != a or a == 0:
        return np.float32(np.nan)
    return np.float32(math.copysign(np.inf, a) * math.copysign(1.0, b))


@njit(inline="always", cache=True)
def _max(v, o):  # NaN from either side, as numpy's maximum
    return v if (v > o or v != v) else o


@njit(inline="always", cache=True)
def _min(v, o):
    return v if (v < o or v != v) else o


@njit(parallel=True, cache=True)
def epilogue(y, scale, bias, codes, srcs, fpar, chan, full, fscale, fzp, out, is_int, lo, hi):
    """``out[c, p] = store(program(f32(y[c, p] * scale[c]) + bias[c]))``.

    ``scale`` / ``bias`` of length 0 are skipped; ``full`` is the full-shape
    operand ``[C, P]`` (any dtype: an integer one is dequantized as
    ``(v - fzp) * fscale`` in f32, the Dequantize formula; a [1, 1] placeholder
    when the program has no full-shape step); ``is_int``: ``out`` holds integers
    in ``[lo, hi]``."""
    C, P = y.shape
    for c in prange(C):
        vb = np.empty(_PIECE, np.float32)
        ob = np.empty(_PIECE, np.float32)
        tb = np.empty(_PIECE, np.float32)
        fr = full[c] if full.shape[0] == C and full.shape[1] == P else full[0, :0]
        # int64 channel: prange's unsigned index compiled a second _ep_row (~3.5 s cold each)
        _ep_row(y[c], np.int64(c), scale, bias, codes, srcs, fpar, chan, fr, fscale, fzp, out[c], is_int, lo, hi,
                vb, ob, tb)


@njit(cache=True)
def _ep_row(yr, c, scale, bias, codes, srcs, fpar, chan, fr, fscale, fzp, dst_row, is_int, lo, hi, vb, ob, tb):
    """:func:`epilogue` on one piece of channel ``c``'s row: ``yr`` -> ``dst_row``
    (``fr``: the full-shape operand's matching piece), in L1-sized pieces through
    the work buffers ``vb``, ``ob``, ``tb`` (``_PIECE`` floats each).  A compiled
    function of its own: called once per row, by :func:`epilogue` and :func:`conv_bands`."""
    P = yr.shape[0]
    has_scale = scale.shape[0] > 0
    has_bias = bias.shape[0] > 0
    full_int = fscale != np.float32(1.0) or fzp != np.float32(0.0)
    zero = np.float32(0.0)
    for p0 in range(0, P, _PIECE):
        n = min(P - p0, _PIECE)
        v = vb[:n]
        o = ob[:n]
        t = tb[:n]
        yp = yr[p0:p0 + n]
        if has_scale:
            s = scale[c]
            for q in range(n):
                v[q] = np.float32(yp[q] * s)
        else:
            for q in range(n):
                v[q] = np.float32(yp[q])
        if has_bias:
            b = bias[c]
            for q in range(n):
                v[q] += b
        for i in range(codes.shape[0]):
            code = codes[i]
            a = fpar[i, 0]
            if code == RELU:  # as a product with the comparison (see kernels/store.py:
                # ``x if x > 0 else x * 0`` became a masked store, microcoded on AMD)
                for q in range(n):
                    x = v[q]
                    v[q] = x * np.float32(x > zero)
                continue
            if code == CLAMP:  # NaN becomes the min (oneDNN's clip)
                bb = fpar[i, 1]
                for q in range(n):
                    w = v[q] if v[q] > a else a
                    v[q] = w if w < bb else bb
                continue
            if code == QUANTIZE:  # x / scale + zp in f32; rounding happens at the store
                s = chan[i, c]
                for q in range(n):
                    v[q] = v[q] / s + a
                continue
            src = srcs[i]
            if src == FULL:
                fp = fr[p0:p0 + n]
                if full_int:
                    for q in range(n):
                        o[q] = (np.float32(fp[q]) - fzp) * fscale
                else:
                    for q in range(n):
                        o[q] = np.float32(fp[q])
            else:
                r = a if src == SCALAR else chan[i, c]
                for q in range(n):
                    o[q] = r
            if code == ADD:
                for q in range(n):
                    v[q] = v[q] + o[q]
            elif code == SUB:
                for q in range(n):
                    v[q] = v[q] - o[q]
            elif code == RSUB:
                for q in range(n):
                    v[q] = o[q] - v[q]
            elif code == MUL:
                for q in range(n):
                    v[q] = v[q] * o[q]
            elif code == DIV:
                for q in range(n):
                    v[q] = _fdiv(v[q], o[q])
            elif code == RDIV:
                for q in range(n):
                    v[q] = _fdiv(o[q], v[q])
            elif code == MAX:  # into a third buffer: a select that keeps an operand
                # in place compiled to a masked store (microcoded on AMD)
                for q in range(n):
                    t[q] = _max(v[q], o[q])
                v, t = t, v
            elif code == MIN:
                for q in range(n):
                    t[q] = _min(v[q], o[q])
                v, t = t, v
        dst = dst_row[p0:p0 + n]
        if is_int:
            for q in range(n):
                w = v[q]
                w = zero if w != w else w
                w = lo if w < lo else (hi if w > hi else w)
                dst[q] = np.rint(w)
        else:
            for q in range(n):
                dst[q] = v[q]


@njit(cache=True)
def _im2col_rows(x, zp, kh, kw, sh, sw, dh, dw, ph, pw, y0, y1, ow, cols):
    """:func:`im2col_2d` for output rows ``[y0, y1)`` only: ``cols`` (flat) holds
    ``[C*kh*kw, (y1 - y0)*ow]`` row-major."""
    n = (y1 - y0) * ow
    for r in range(x.shape[0] * kh * kw):
        _im2col_row(x, zp, r, kh, kw, sh, sw, dh, dw, ph, pw, y0, y1, ow, cols[r * n:(r + 1) * n])


@njit(cache=True)
def _shifted_rows(x, zp, kw, dw, ph, pw, r0, nrows, wp, xj):
    """The stride-1 columns of :func:`conv_bands` (``SHIFTED``): ``xj`` (flat) holds
    ``[C*kw, nrows*wp]`` row-major, ``xj[(c, j), t] = xp[c, r0 + t // wp, t % wp + j*dw]``
    with ``xp`` the image less ``zp``, zero-padded by ``ph`` rows and ``pw`` columns and
    cut to ``wp`` columns (zero where a shifted row leaves them): the im2col rows of a
    1 x kw kernel at stride 1 over output rows ``[r0, r0 + nrows)``, ``wp`` wide."""
    L = nrows * wp
    one = np.int64(1)  # int64, not literals: one signature of _im2col_row
    for r in range(x.shape[0] * kw):
        _im2col_row(x, zp, r, one, kw, one, one, one, dw, ph, pw, r0, r0 + nrows, wp, xj[r * L:(r + 1) * L])


#: conv_bands' ways to its GEMM operand B: the image in place (1x1), im2col, shifted rows (stride 1)
IN_PLACE, IM2COL, SHIFTED = 0, 1, 2


@njit(parallel=True, cache=True)
def conv_bands(fn, mode, x, xflat, zp, w, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow, rows, wp, cols, ybuf,
               scale, bias, codes, srcs, fpar, chan, full, fscale, fzp, out, is_int, lo, hi, bad):
    """One image's convolution and epilogue, band by band of ``rows`` output rows,
    each band a task that runs all its steps while its data is in L2 (``out`` is
    ``[OC, oh*ow]``; a band has ``n = (y1 - y0)*ow`` positions starting at ``p0``):

    * ``IN_PLACE`` (a 1x1 stride-1 unpadded f32 image, C-contiguous, ``xflat``):
      ``y = w @ xflat[:, p0:p0 + n]``, B read in place (row stride ``oh*ow``);
    * ``IM2COL``: the band's columns gathered by :func:`_im2col_rows` into its piece
      of ``cols`` (``[K, n]``), ``y = w @ cols``;
    * ``SHIFTED`` (stride 1): output position ``(y, q)`` seen at ``y*wp + q`` in rows of
      ``wp`` columns, tap ``(i, j)`` reads the padded image at that position plus
      ``i*dh*wp + j*dw``.  The band's rows, shifted by ``j*dw`` for each ``j``, are
      gathered once (:func:`_shifted_rows`, ``kw`` copies of the image instead of
      im2col's ``kh*kw``) and each kernel row ``i`` is one GEMM on them at column
      offset ``i*dh*wp``, summed into ``y`` (``w`` here is ``[kh*OC, C*kw]``: kernel
      row ``i``'s weights in rows ``i*OC..``); the ``wp - ow`` extra columns of each
      row are then dropped (``y`` packed to ``[OC, n]`` in place);
    * GEMMs by single-threaded ``cblas_sgemm`` at ``fn`` (the caller holds OpenBLAS at
      one thread) into the band's piece of ``ybuf``;
    * :func:`_ep_row` per channel from ``y`` into ``out[c, p0:p0 + n]``.

    A band whose ``y`` holds an inf or a NaN gets ``bad[band] = 1`` and no epilogue
    (the caller redoes it with float64 sums, as the reference).  Splitting the
    image, not the batch, keeps both cores busy at batch 1; one parallel region
    per convolution instead of three (im2col, GEMM, epilogue)."""
    OC = out.shape[0]
    K = w.shape[1]
    P = oh * ow
    ysize = OC * rows * max(ow, wp)
    for bi in prange(bad.shape[0]):
        y0 = bi * rows
        y1 = min(oh, y0 + rows)
        n = (y1 - y0) * ow
        p0 = y0 * ow
        yb = ybuf[bi * ysize:(bi + 1) * ysize]
        csize = cols.shape[0] // bad.shape[0]
        if mode == IN_PLACE:
            sgemm(fn, OC, n, K, w, 0, K, xflat, p0, P, np.float32(0.0), yb, 0, n)
        elif mode == IM2COL:
            cb = cols[bi * csize:bi * csize + K * n]
            _im2col_rows(x, zp, kh, kw, sh, sw, dh, dw, ph, pw, y0, y1, ow, cb)
            sgemm(fn, OC, n, K, w, 0, K, cb, 0, n, np.float32(0.0), yb, 0, n)
        else:
            nrows = y1 - y0 + (kh - 1) * dh
            L = nrows * wp
            xj = cols[bi * csize:bi * csize + K * L]
            _shifted_rows(x, zp, kw, dw, ph, pw, y0, nrows, wp, xj)
            nw = (y1 - y0) * wp
            for i in range(kh):
                sgemm(fn, OC, nw, K, w, i * OC * K, K, xj, i * dh * wp, L,
                      np.float32(0.0 if i == 0 else 1.0), yb, 0, nw)
            for c in range(OC):  # drop the extra columns; the target never passes the source
                for r in range(y1 - y0):
                    src = yb[c * nw + r * wp:c * nw + r * wp + ow]
                    dst = yb[c * n + r * ow:c * n + r * ow + ow]
                    for q in range(ow):
                        dst[q] = src[q]
        if not _finite(yb, 0, OC * n):
            bad[bi] = 1
            continue
        bad[bi] = 0
        vb = np.empty(_PIECE, np.float32)
        ob = np.empty(_PIECE, np.float32)
        tb = np.empty(_PIECE, np.float32)
        has_full = full.shape[0] == OC and full.shape[1] == P
        for c in range(OC):
            fr = full[c, p0:p0 + n] if has_full else full[0, :0]
            _ep_row(yb[c * n:(c + 1) * n], c, scale, bias, codes, srcs, fpar, chan, fr, fscale, fzp,
                    out[c, p0:p0 + n], is_int, lo, hi, vb, ob, tb)

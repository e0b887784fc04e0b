"""The int8 kernels of the fast convolution path (kernels/convolution/conv_fast.py): the columns
gathered straight into the int8 GEMMs' packed B (igemm's bytes, igemm16's int16 pairs), and
the convolution's int8 GEMM, against the GEMMs' own packing and int64 numpy, bit for bit
(integers: no tolerance)."""
from __future__ import annotations

import numpy as np
import pytest

from graph_api.kernels.convolution import conv_fast as cf
from graph_api.kernels import igemm
from graph_api.kernels.convolution import igemm16

RNG = np.random.default_rng(11)


def _cols(x, zp, k, stride, dilation, pad):
    """int64 im2col of [C, H, W] with zero point ``zp`` in the padding: [C*k*k, oh*ow]."""
    C, H, W = x.shape
    oh = (H + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    ow = (W + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    xp = np.pad(x.astype(np.int64), ((0, 0), (pad, pad), (pad, pad)), constant_values=zp)
    cols = np.empty((C, k, k, oh, ow), np.int64)
    for i in range(k):
        for j in range(k):
            cols[:, i, j] = xp[:, i * dilation:i * dilation + (oh - 1) * stride + 1:stride,
                               j * dilation:j * dilation + (ow - 1) * stride + 1:stride]
    return cols.reshape(C * k * k, oh * ow), oh, ow


# ragged on purpose: K = C*k*k not a multiple of 4, P = oh*ow not a multiple of the 64-column panel
@pytest.mark.parametrize("dtype,zp", [(np.uint8, 3), (np.int8, -5), (np.uint8, 255), (np.int8, 127)])
@pytest.mark.parametrize("C,H,W,k,stride,dilation,pad", [
    (3, 9, 11, 3, 1, 1, 1), (5, 13, 10, 3, 2, 1, 1), (2, 12, 12, 3, 1, 2, 2), (7, 9, 9, 1, 1, 1, 0),
    (6, 17, 15, 5, 2, 1, 2), (4, 10, 9, 5, 1, 1, 2), (3, 6, 70, 3, 1, 3, 3), (2, 3, 5, 5, 1, 1, 2)])
def test_packed_im2col_equals_igemm_packing_of_the_columns(dtype, zp, C, H, W, k, stride, dilation, pad):
    lo, hi = (0, 255) if dtype == np.uint8 else (-128, 127)
    x = RNG.integers(lo, hi + 1, (C, H, W)).astype(dtype)
    cols, oh, ow = _cols(x, zp, k, stride, dilation, pad)
    want = igemm.PackedB(cols.astype(dtype), np.int8)  # B for s8 weights: u8, s8 data shifted by 128
    got = np.empty_like(want.panels)
    shift = 128 if dtype == np.int8 else 0
    cf.im2col_packed_2d(x, shift, np.uint8(zp + shift), k, k, stride, stride, dilation, dilation, pad, pad,
                        oh, ow, want.k4, got.view(np.uint32))
    np.testing.assert_array_equal(got, want.panels)
    if stride == 1 and ow == W:  # the one-copy-per-row form for C-contiguous images
        got[:] = 0
        cf.im2col_packed_2d_flat(x.reshape(C, H * W), H, W, shift, np.uint8(zp + shift), k, k, dilation,
                                 dilation, pad, pad, oh, want.k4, got.view(np.uint32))
        np.testing.assert_array_equal(got, want.panels)
    # channels-last data arrives as a strided view
    x_nxc = np.ascontiguousarray(x.transpose(1, 2, 0)).transpose(2, 0, 1)
    got[:] = 0
    cf.im2col_packed_2d(x_nxc, shift, np.uint8(zp + shift), k, k, stride, stride, dilation, dilation, pad, pad,
                        oh, ow, want.k4, got.view(np.uint32))
    np.testing.assert_array_equal(got, want.panels)


@pytest.mark.parametrize("vnni", [True, False])
@pytest.mark.parametrize("M,K,P", [(1, 1, 1), (7, 27, 70), (100, 300, 130), (97, 1153, 64)])
def test_int8_gemm_on_packed_columns_subtracts_the_zero_point_exactly(monkeypatch, vnni, M, K, P):
    """M past the 96-row block and not a multiple of 6, K past the 256-byte K block, P ragged;
    extreme operands (the largest products and sums)."""
    if vnni and not igemm.HAVE_VNNI:
        pytest.skip("no AVX-512 VNNI on this CPU")
    monkeypatch.setattr(igemm, "HAVE_VNNI", vnni)
    w = np.where(RNG.random((M, K)) < 0.5, -128, 127).astype(np.int8)
    x = np.where(RNG.random((K, 1, P)) < 0.5, 0, 255).astype(np.uint8)  # a 1x1 "image" [K, 1, P]
    zp = 7
    k4 = -(-K // 4)
    bp = np.empty(-(-P // igemm.NR) * k4 * igemm.NR * 4, np.uint8)
    cf.im2col_packed_2d(x, 0, np.uint8(zp), 1, 1, 1, 1, 1, 1, 0, 0, 1, P, k4, bp.view(np.uint32))
    rowsum = np.zeros(M, np.int32)
    ap = igemm._pack_a(w, k4, rowsum, True)
    got = np.empty((M, P), np.int32)
    # the convolution's form of igemm's driver: no column term, the zero point in every column
    igemm.driver(True)(ap, M, bp, k4, np.zeros(P, np.int32), np.full(P, zp, np.int32), rowsum, False, got)
    want = w.astype(np.int64) @ (x[:, 0].astype(np.int64) - zp)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype,zp", [(np.uint8, 3), (np.int8, -5), (np.uint8, 300), (np.int8, 127)])
@pytest.mark.parametrize("C,H,W,k,stride,dilation,pad", [
    (3, 9, 11, 3, 1, 1, 1), (5, 13, 10, 3, 2, 1, 1), (2, 12, 12, 3, 1, 2, 2), (7, 9, 9, 1, 1, 1, 0),
    (6, 17, 15, 5, 2, 1, 2), (4, 10, 9, 5, 1, 1, 2), (3, 6, 70, 3, 1, 3, 3), (2, 3, 5, 5, 1, 1, 2)])
def test_pair_im2col_equals_igemm16_packing_of_the_columns(dtype, zp, C, H, W, k, stride, dilation, pad):
    """The columns less the zero point (0 in the padding), K odd or even, P ragged
    against the 16-column panel; a zero point outside the data range (300) included."""
    lo, hi = (0, 255) if dtype == np.uint8 else (-128, 127)
    x = RNG.integers(lo, hi + 1, (C, H, W)).astype(dtype)
    cols, oh, ow = _cols(x, zp, k, stride, dilation, pad)
    want = igemm16.pack_b(cols - zp).view(np.uint32)
    k2 = -(-cols.shape[0] // 2)
    got = np.full_like(want, 0xDEADBEEF)
    cf.im2col_pairs_2d(x, np.float32(zp), k, k, stride, stride, dilation, dilation, pad, pad, oh, ow, k2, got)
    np.testing.assert_array_equal(got, want)
    if stride == 1 and ow == W:  # the one-copy-per-row form for C-contiguous images
        got[:] = 0xDEADBEEF
        cf.im2col_pairs_2d_flat(x.reshape(C, H * W), H, W, zp, k, k, dilation, dilation, pad, pad, oh, k2, got)
        np.testing.assert_array_equal(got, want)
    x_nxc = np.ascontiguousarray(x.transpose(1, 2, 0)).transpose(2, 0, 1)  # channels last: strided
    got[:] = 0xDEADBEEF
    cf.im2col_pairs_2d(x_nxc, np.float32(zp), k, k, stride, stride, dilation, dilation, pad, pad, oh, ow, k2, got)
    np.testing.assert_array_equal(got, want)


def test_epilogue_rows_take_the_int8_scale_type():
    """Float convolutions pass the int8 ones' read-only float64 scale type (empty) to the
    epilogue kernels, so ``epilogue`` / ``conv_bands`` and the ``_ep_row`` they call compile
    one scale type: values exactly ``relu(y + bias)`` in f32 (one f32 add and a product
    with 0 or 1: no rounding beyond numpy's own f32 add), and every ``epilogue``
    signature so far has that scale type.  (``_ep_row`` is also called with an int64
    channel, not prange's unsigned index: not observable here, since a callee loaded
    with its caller from the disk cache records no signature.)"""
    from numba import types

    from graph_api.kernels.convolution.conv_plan import _NO_SCALE

    C, P = 3, 1100  # P over two of _ep_row's 512-float pieces
    y = RNG.standard_normal((C, P)).astype(np.float32)
    bias = RNG.standard_normal(C).astype(np.float32)
    out = np.empty((C, P), np.float32)
    codes = np.array([cf.RELU], np.int32)
    cf.epilogue(y, _NO_SCALE, bias, codes, np.zeros(1, np.int32), np.zeros((1, 2), np.float32),
                np.zeros((1, C), np.float32), np.zeros((1, 1), np.float32), np.float32(1.0), np.float32(0.0),
                out, False, np.float32(0.0), np.float32(0.0))
    np.testing.assert_array_equal(out, np.maximum(y + bias[:, None], np.float32(0.0)))
    assert {sig[1] for sig in cf.epilogue.signatures} == {types.Array(types.float64, 1, "C", readonly=True)}

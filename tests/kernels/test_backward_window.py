"""Backward kernels with windows (Convolution/ConvTranspose data and weights
gradients, pooling, Interpolate), checked against the *forward* reference kernels.

Convolution, ConvTranspose, AvgPool and Interpolate are linear, so their
gradients are their adjoints: ``<fwd(x), dy> == <x, bwd_data(dy)>`` for every
x and dy, and for the weights ``<conv(x, w), dy> == <w, bwd_weights(x, dy)>``.
Checked with integer data (|v| <= 3), every product and sum is exact in f32
and f64, so both sides must agree exactly (up to f64 summation order: rtol
1e-12).  MaxPool is checked by finite differences away from ties.
"""
from __future__ import annotations

import numpy as np
import pytest

from graph_api.enums import OpKind
from graph_api.opset import OP_SCHEMAS
from graph_api.kernels.reference.backward_window import interpolation_matrix

from .test_backward import make_op, numeric_vjp, run64

EXACT = dict(rtol=1e-12, atol=1e-9)


def ints(rng, shape):
    return rng.integers(-3, 4, shape).astype(np.float64)


def inferred(op):
    return OP_SCHEMAS[op.kind].infer_shapes(op, [lt.shape for lt in op.inputs])


# ------------------------------------------------------------- convolution
#: (src shape, weights shape, attrs): NCX/NXC, OIX/XIO, groups, strides, dilations, pads, auto_pad
CONV = {
    "ncx-oix-stride2-pad": ((2, 4, 7, 6), (6, 4, 3, 3),
                            dict(strides=[2, 2], pads_begin=[1, 0], pads_end=[1, 2], dilations=[1, 1],
                                 data_format="NCX", weights_format="OIX")),
    "nxc-xio-groups-dilated": ((1, 7, 8, 4), (2, 3, 2, 6),
                               dict(strides=[1, 2], pads_begin=[0, 1], pads_end=[2, 0],
                                    dilations=[2, 1], groups=2)),
    "3d-unused-tail": ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2),
                       dict(strides=[2, 3, 2], pads_begin=[0, 0, 0], pads_end=[0, 0, 0],
                            dilations=[1, 1, 1], data_format="NCX", weights_format="OIX")),
    "1d-same-upper": ((2, 3, 9), (2, 3, 4),
                      dict(strides=[2], pads_begin=[0], pads_end=[0], dilations=[1],
                           auto_pad="SAME_UPPER", data_format="NCX", weights_format="OIX")),
}


@pytest.mark.parametrize("name", list(CONV))
def test_convolution_gradients_are_the_adjoints_of_the_forward_reference(name):
    src_shape, w_shape, attrs = CONV[name]
    fwd = make_op(OpKind.Convolution, [src_shape, w_shape], [None], **attrs)
    dst_shape = inferred(fwd)[0]
    fwd = make_op(OpKind.Convolution, [src_shape, w_shape], [dst_shape], **attrs)
    rng = np.random.default_rng(0)
    x, w, dy = ints(rng, src_shape), ints(rng, w_shape), ints(rng, dst_shape)
    y = run64(fwd, [x, w])[0]
    data = make_op(OpKind.ConvolutionBackwardData, [dst_shape, w_shape], [src_shape],
                   dst_shape=list(src_shape), **attrs)
    assert inferred(data)[0] == tuple(src_shape)
    weights = make_op(OpKind.ConvolutionBackwardWeights, [src_shape, dst_shape], [w_shape],
                      weights_shape=list(w_shape), **attrs)
    assert inferred(weights)[0] == tuple(w_shape)
    dx = run64(data, [dy, w])[0]
    dw = run64(weights, [x, dy])[0]
    assert dx.shape == x.shape and dw.shape == w.shape
    np.testing.assert_allclose(np.vdot(x, dx), np.vdot(y, dy), **EXACT)
    np.testing.assert_allclose(np.vdot(w, dw), np.vdot(y, dy), **EXACT)
    # adjointness for every x needs it per element: one basis vector per src cell
    for flat in rng.choice(x.size, 5, replace=False):
        e = np.zeros(x.size)
        e[flat] = 1
        ye = run64(fwd, [e.reshape(x.shape), w])[0]
        assert dx.reshape(-1)[flat] == pytest.approx(np.vdot(ye, dy), abs=1e-9)


#: (src shape, weights shape, attrs) of the forward ConvTranspose
DECONV = {
    "ncx-iox-stride2": ((1, 4, 5, 6), (4, 3, 3, 3),
                        dict(strides=[2, 2], pads_begin=[1, 0], pads_end=[0, 1], dilations=[1, 1],
                             data_format="NCX", weights_format="IOX")),
    "nxc-xoi-groups-dilated": ((2, 4, 5, 6), (2, 3, 3, 6),
                               dict(strides=[1, 2], pads_begin=[0, 1], pads_end=[1, 0],
                                    dilations=[2, 1], groups=2)),
    "big-end-pad-like-deconv_bwd": ((1, 3, 9, 9), (3, 4, 3, 3),
                                    dict(strides=[2, 2], pads_begin=[0, 0], pads_end=[7, 7],
                                         dilations=[1, 1], data_format="NCX",
                                         weights_format="IOX")),
}


@pytest.mark.parametrize("name", list(DECONV))
def test_conv_transpose_gradients_are_the_adjoints_of_the_forward_reference(name):
    src_shape, w_shape, attrs = DECONV[name]
    fwd = make_op(OpKind.ConvTranspose, [src_shape, w_shape], [None], **attrs)
    dst_shape = inferred(fwd)[0]
    fwd = make_op(OpKind.ConvTranspose, [src_shape, w_shape], [dst_shape], **attrs)
    rng = np.random.default_rng(1)
    x, w, dy = ints(rng, src_shape), ints(rng, w_shape), ints(rng, dst_shape)
    y = run64(fwd, [x, w])[0]
    data = make_op(OpKind.ConvTransposeBackwardData, [dst_shape, w_shape], [None], **attrs)
    assert inferred(data)[0] == tuple(src_shape)
    data = make_op(OpKind.ConvTransposeBackwardData, [dst_shape, w_shape], [src_shape], **attrs)
    weights = make_op(OpKind.ConvTransposeBackwardWeights, [src_shape, dst_shape], [w_shape],
                      weights_shape=list(w_shape), **attrs)
    np.testing.assert_allclose(np.vdot(x, run64(data, [dy, w])[0]), np.vdot(y, dy), **EXACT)
    np.testing.assert_allclose(np.vdot(w, run64(weights, [x, dy])[0]), np.vdot(y, dy), **EXACT)


def test_weights_gradient_is_per_element_the_finite_difference():
    """Beyond the inner product: each weight's gradient (the forward is linear
    in w, so the difference with h = 1 is exact)."""
    src_shape, w_shape, attrs = CONV["nxc-xio-groups-dilated"]
    fwd = make_op(OpKind.Convolution, [src_shape, w_shape], [None], **attrs)
    dst_shape = inferred(fwd)[0]
    fwd = make_op(OpKind.Convolution, [src_shape, w_shape], [dst_shape], **attrs)
    rng = np.random.default_rng(2)
    x, w, dy = ints(rng, src_shape), ints(rng, w_shape), ints(rng, dst_shape)
    weights = make_op(OpKind.ConvolutionBackwardWeights, [src_shape, dst_shape], [w_shape],
                      weights_shape=list(w_shape), **attrs)
    want = numeric_vjp(lambda a: run64(fwd, a)[0], [x, w], 1, dy, h=1.0)
    np.testing.assert_allclose(run64(weights, [x, dy])[0], want, **EXACT)


# ---------------------------------------------------------------- pooling
POOL = {
    "ncx-pad-exclude": ((2, 3, 7, 6), dict(kernel=[3, 2], strides=[2, 2], pads_begin=[1, 0],
                                           pads_end=[1, 1], exclude_pad=True, data_format="NCX")),
    "nxc-pad-include": ((1, 6, 5, 2), dict(kernel=[2, 3], strides=[1, 2], pads_begin=[0, 1],
                                           pads_end=[1, 1], exclude_pad=False)),
    "3d-overlap": ((1, 2, 4, 5, 3), dict(kernel=[2, 3, 2], strides=[1, 2, 1], pads_begin=[0, 1, 0],
                                         pads_end=[0, 1, 1], exclude_pad=True, data_format="NCX")),
}


@pytest.mark.parametrize("name", list(POOL))
def test_avg_pool_gradient_is_the_adjoint_of_avg_pool(name):
    src_shape, attrs = POOL[name]
    fwd = make_op(OpKind.AvgPool, [src_shape], [None], **attrs)
    dst_shape = inferred(fwd)[0]
    fwd = make_op(OpKind.AvgPool, [src_shape], [dst_shape], **attrs)
    bwd = make_op(OpKind.AvgPoolBackward, [dst_shape], [src_shape], src_shape=list(src_shape),
                  **attrs)
    assert inferred(bwd)[0] == tuple(src_shape)
    rng = np.random.default_rng(3)
    dy = ints(rng, dst_shape)
    dx = run64(bwd, [dy])[0]
    for flat in range(int(np.prod(src_shape))):  # every column of the forward map
        e = np.zeros(int(np.prod(src_shape)))
        e[flat] = 1
        assert dx.reshape(-1)[flat] == pytest.approx(
            np.vdot(run64(fwd, [e.reshape(src_shape)])[0], dy), abs=1e-12)


@pytest.mark.parametrize("name", list(POOL))
def test_max_pool_gradient_is_the_finite_difference_of_max_pool(name):
    """Distinct values 1 apart: a perturbation h = 0.25 never changes a window's
    argmax, and MaxPool is linear in the winning value, so the difference is exact."""
    src_shape, attrs = POOL[name]
    attrs = {k: v for k, v in attrs.items() if k != "exclude_pad"}
    fwd = make_op(OpKind.MaxPool, [src_shape], [None], **attrs)
    dst_shape = inferred(fwd)[0]
    fwd = make_op(OpKind.MaxPool, [src_shape], [dst_shape], **attrs)
    bwd = make_op(OpKind.MaxPoolBackward, [src_shape, dst_shape], [src_shape], **attrs)
    rng = np.random.default_rng(4)
    x = rng.permutation(int(np.prod(src_shape))).reshape(src_shape).astype(np.float64)
    dy = ints(rng, dst_shape)
    want = numeric_vjp(lambda a: run64(fwd, a)[0], [x], 0, dy, h=0.25)
    np.testing.assert_allclose(run64(bwd, [x, dy])[0], want, **EXACT)


def test_max_pool_ties_go_to_the_first_maximum_in_kernel_order():
    x = np.ones((1, 1, 2, 2))
    op = make_op(OpKind.MaxPoolBackward, [(1, 1, 2, 2), (1, 1, 1, 1)], [(1, 1, 2, 2)],
                 kernel=[2, 2], strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0],
                 data_format="NCX")
    np.testing.assert_array_equal(run64(op, [x, np.full((1, 1, 1, 1), 5.0)])[0],
                                  [[[[5, 0], [0, 0]]]])


def test_negative_pads_end_pooling_reads_only_the_cells_its_windows_reach():
    """As oneDNN's avgpool_3d_chain_fusion.json: pads_end=-1 drops the last row."""
    attrs = dict(kernel=[2], strides=[2], pads_begin=[1], pads_end=[-1], exclude_pad=True,
                 data_format="NCX")
    fwd = make_op(OpKind.AvgPool, [(1, 1, 6)], [None], **attrs)
    assert inferred(fwd)[0] == (1, 1, 3)
    fwd = make_op(OpKind.AvgPool, [(1, 1, 6)], [(1, 1, 3)], **attrs)
    x = np.array([[[1.0, 2, 4, 8, 16, 32]]])
    # windows: [pad, 1], [2, 4], [8, 16]; 32 is never read
    np.testing.assert_array_equal(run64(fwd, [x])[0], [[[1, 3, 12]]])


# ------------------------------------------------------------ interpolate
INTERP = [
    ("nearest", "half_pixel", (1, 2, 5, 4), dict(sizes=[7, 9])),
    ("linear", "half_pixel", (2, 1, 6, 5), dict(scales=[1.5, 0.5])),
    ("bilinear", "align_corners", (1, 2, 3, 4), dict(sizes=[5, 7])),
    ("trilinear", "half_pixel", (1, 1, 3, 4, 2), dict(sizes=[5, 3, 4])),
]


@pytest.mark.parametrize("mode,ctm,src_shape,size", INTERP, ids=[c[0] for c in INTERP])
def test_interpolate_gradient_is_the_adjoint_of_interpolate(mode, ctm, src_shape, size):
    attrs = dict(mode=mode, coordinate_transformation_mode=ctm, data_format="NCX", **size)
    fwd = make_op(OpKind.Interpolate, [src_shape], [None], **attrs)
    dst_shape = inferred(fwd)[0]
    fwd = make_op(OpKind.Interpolate, [src_shape], [dst_shape], **attrs)
    bwd = make_op(OpKind.InterpolateBackward, [src_shape, dst_shape], [src_shape], **attrs)
    rng = np.random.default_rng(5)
    dy = rng.normal(size=dst_shape)
    dx = run64(bwd, [np.zeros(src_shape), dy])[0]
    for flat in range(int(np.prod(src_shape))):
        e = np.zeros(int(np.prod(src_shape)))
        e[flat] = 1
        # the forward's weights come from f32 coordinates: its output is exact in f64
        assert dx.reshape(-1)[flat] == pytest.approx(
            np.vdot(run64(fwd, [e.reshape(src_shape)])[0], dy), rel=1e-12, abs=1e-12)


def test_interpolation_rows_sum_to_one():
    for mode in ("nearest", "linear"):
        for ctm in ("half_pixel", "align_corners"):
            a = interpolation_matrix(7, 4, mode, ctm)
            np.testing.assert_allclose(a.sum(axis=1), 1.0, rtol=1e-15)


# ---------------------------------------------------------------- schema
def test_shape_attrs_are_required_when_their_input_is_absent():
    from graph_api.errors import InvalidGraphOp

    with pytest.raises(InvalidGraphOp, match="dst_shape must be given"):
        make_op(OpKind.ConvolutionBackwardData, [(1, 2, 3, 3), (2, 2, 1, 1)], [None],
                strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1])
    with pytest.raises(InvalidGraphOp, match="src_shape must be given"):
        make_op(OpKind.AvgPoolBackward, [(1, 2, 3, 3)], [None], kernel=[1, 1], strides=[1, 1],
                pads_begin=[0, 0], pads_end=[0, 0], exclude_pad=True)


def test_diff_dst_that_the_forward_op_cannot_give_is_an_invalid_shape():
    from graph_api.errors import InvalidShape

    op = make_op(OpKind.MaxPoolBackward, [(1, 4, 4, 2), (1, 3, 3, 2)], [None], kernel=[2, 2],
                 strides=[2, 2], pads_begin=[0, 0], pads_end=[0, 0])
    with pytest.raises(InvalidShape, match="diff_dst"):
        inferred(op)


def test_interpolate_backward_takes_the_diff_dst_sizes_as_given():
    """oneDNN infers diff_src = src and its resampling reads the factors from the
    sizes: diff_dst 21 for src 17 under scales 1.235294 (whose floor gives 20) is
    the gradient of the Interpolate to 21 (benchdnn's harness runs such cases)."""
    from graph_api.errors import InvalidShape

    attrs = dict(mode="linear", coordinate_transformation_mode="half_pixel", data_format="NCX")
    by_scales = make_op(OpKind.InterpolateBackward, [(1, 2, 17), (1, 2, 21)], [(1, 2, 17)],
                        scales=[1.235294], **attrs)
    by_sizes = make_op(OpKind.InterpolateBackward, [(1, 2, 17), (1, 2, 21)], [(1, 2, 17)],
                       sizes=[21], **attrs)
    assert inferred(by_scales)[0] == (1, 2, 17)
    dy = np.random.default_rng(6).normal(size=(1, 2, 21))
    src = np.zeros((1, 2, 17))
    np.testing.assert_array_equal(run64(by_scales, [src, dy])[0], run64(by_sizes, [src, dy])[0])
    with pytest.raises(InvalidShape, match="batch and channel"):
        inferred(make_op(OpKind.InterpolateBackward, [(1, 2, 17), (1, 3, 21)], [None], sizes=[21], **attrs))


def test_use_affine_layer_norm_backward_needs_three_outputs():
    from graph_api.errors import InvalidGraphOp

    with pytest.raises(InvalidGraphOp, match="use_affine=true needs 3 outputs"):
        make_op(OpKind.LayerNormBackward, [(2, 3)] * 2 + [(2,)] * 2, [(2, 3)])


def test_a_1d_prelu_slope_must_match_the_channels():
    from graph_api.errors import InvalidShape

    op = make_op(OpKind.PReLUBackward, [(2, 3, 4), (4,), (2, 3, 4)], [None, None],
                 data_format="NCX")
    with pytest.raises(InvalidShape, match="3 src channels"):
        inferred(op)


@pytest.mark.parametrize("kind,ins,attrs,phrase", [
    (OpKind.SoftMaxBackward, [(2, 3), (2, 3)], {"axis": 2}, "out of range"),
    (OpKind.ConvolutionBackwardData, [(1, 3, 4, 4), (3, 2, 1, 1)],
     dict(strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1], groups=2,
          dst_shape=[1, 4, 4, 4], data_format="NCX", weights_format="OIX"), "groups=2"),
    (OpKind.ConvTransposeBackwardData, [(1, 4, 4, 4), (3, 2, 1, 1)],
     dict(strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1], groups=2,
          data_format="NCX", weights_format="IOX"), "groups=2"),
])
def test_inconsistent_shapes_fail_before_any_kernel(kind, ins, attrs, phrase):
    from graph_api.errors import InvalidShape

    with pytest.raises(InvalidShape, match=phrase):
        inferred(make_op(kind, ins, [None], **attrs))

"""Backward reference kernels without windows, checked against central finite
differences of the *forward* reference kernels run in float64, and against
closed forms where oneDNN's formula has one (use_dst forms, edges).

Kernels run with float64 output logical tensors, so no f32 rounding enters:
the finite difference ``(f(x + h) - f(x - h)) / 2h`` with ``h = 1e-5`` has a
truncation error ~h^2 |f'''| / 6 ~ 1e-10 and a cancellation error
~1e-16 / h ~ 1e-11 on O(1) values, hence ``rtol=1e-6, atol=1e-8`` (loose
against both, tight against any wrong formula).  Sample points stay 1e-2
away from kinks (|x| at 0, clamp bounds, ...), where no derivative exists.
"""
from __future__ import annotations

import numpy as np
import pytest

from graph_api.dtypes import DataType
from graph_api.enums import OpKind
from graph_api.logical_tensor import LogicalTensor
from graph_api.op import Op
from graph_api.opset import OP_SCHEMAS
from graph_api.schema import verify_op
from graph_api.kernels.reference import REFERENCE, RefContext

H = 1e-5
RTOL, ATOL = 1e-6, 1e-8
CTX = RefContext()


def make_op(kind, in_shapes, out_shapes, **attrs) -> Op:
    """A verified f32 op (defaults written by the schema)."""
    ins = [LogicalTensor(i, DataType.f32, s) for i, s in enumerate(in_shapes)]
    outs = [LogicalTensor(100 + i, DataType.f32, s) for i, s in enumerate(out_shapes)]
    op = Op(1, kind, ins, outs, attrs=attrs)
    verify_op(op, OP_SCHEMAS)
    return op


def run64(op, inputs):
    """The op's reference kernel with float64 outputs (no rounding)."""
    out_lts = [LogicalTensor(lt.id, DataType.f64, lt.shape) for lt in op.outputs]
    return REFERENCE[op.kind](op, [np.asarray(x, np.float64) for x in inputs], out_lts, CTX)


def numeric_vjp(fn, args, index, dd, h=H):
    """d/d args[index] of sum(dd * fn(args)) by central differences, element by element."""
    x = np.array(args[index], np.float64)
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        plus, minus = x.copy(), x.copy()
        plus[i] += h
        minus[i] -= h
        f_plus = fn(args[:index] + [plus] + args[index + 1:])
        f_minus = fn(args[:index] + [minus] + args[index + 1:])
        grad[i] = np.sum(dd * (f_plus - f_minus)) / (2 * h)
    return grad


def away_from(x, *kinks, margin=1e-2):
    """x with points within ``margin`` of a kink pushed 2 margins away."""
    x = np.array(x, np.float64)
    for k in kinks:
        near = np.abs(x - k) < margin
        x[near] = k + 2 * margin * np.where(x[near] >= k, 1, -1)
    return x


# ------------------------------------------------------------ element-wise
SHAPE = (3, 7)
#: backward kind: (forward kind, attrs, kinks, sample range, ops with a use_dst form)
ELTWISE = {
    OpKind.AbsBackward: (OpKind.Abs, {}, (0.0,), (-3, 3)),
    OpKind.ClampBackward: (OpKind.Clamp, {"min": -0.5, "max": 1.5}, (-0.5, 1.5), (-3, 3)),
    OpKind.EluBackward: (OpKind.Elu, {"alpha": 0.7}, (0.0,), (-3, 3)),
    OpKind.GELUBackward: (OpKind.GELU, {"mode": "gelu_erf"}, (), (-4, 4)),
    OpKind.HardSigmoidBackward: (OpKind.HardSigmoid, {"alpha": 0.25, "beta": 0.5}, (-2.0, 2.0),
                                 (-4, 4)),
    OpKind.HardSwishBackward: (OpKind.HardSwish, {}, (-3.0, 3.0), (-5, 5)),
    OpKind.MishBackward: (OpKind.Mish, {}, (), (-5, 5)),
    OpKind.ReLUBackward: (OpKind.ReLU, {}, (0.0,), (-3, 3)),
    OpKind.SigmoidBackward: (OpKind.Sigmoid, {}, (), (-6, 6)),
    OpKind.SoftPlusBackward: (OpKind.SoftPlus, {"beta": 1.5}, (), (-4, 4)),
    OpKind.SqrtBackward: (OpKind.Sqrt, {}, (), (0.1, 4)),
    OpKind.TanhBackward: (OpKind.Tanh, {}, (), (-3, 3)),
}
USE_DST = {OpKind.ClampBackward, OpKind.EluBackward, OpKind.ReLUBackward, OpKind.SigmoidBackward,
           OpKind.SqrtBackward, OpKind.TanhBackward}


def _eltwise_case(kind, seed=0):
    fwd_kind, attrs, kinks, (lo, hi) = ELTWISE[kind]
    rng = np.random.default_rng(seed)
    x = away_from(rng.uniform(lo, hi, SHAPE), *kinks)
    dd = rng.uniform(-2, 2, SHAPE)
    fwd = make_op(fwd_kind, [SHAPE], [SHAPE], **attrs)
    return fwd, attrs, x, dd


@pytest.mark.parametrize("kind", list(ELTWISE), ids=lambda k: k.name)
def test_eltwise_gradient_is_the_finite_difference_of_the_forward_op(kind):
    fwd, attrs, x, dd = _eltwise_case(kind)
    extra = {"use_dst": False} if kind in USE_DST else {}
    bwd = make_op(kind, [SHAPE, SHAPE], [SHAPE], **attrs, **extra)
    got = run64(bwd, [x, dd])[0]
    want = numeric_vjp(lambda a: run64(fwd, a)[0], [x], 0, dd)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("kind", sorted(USE_DST), ids=lambda k: k.name)
def test_use_dst_form_given_the_forward_dst_is_the_same_gradient(kind):
    fwd, attrs, x, dd = _eltwise_case(kind, seed=1)
    dst = run64(fwd, [x])[0]
    from_src = run64(make_op(kind, [SHAPE, SHAPE], [SHAPE], **attrs, use_dst=False), [x, dd])[0]
    from_dst = run64(make_op(kind, [SHAPE, SHAPE], [SHAPE], **attrs), [dst, dd])[0]
    # the same value reached by another formula: ~1e-15 relative in f64
    np.testing.assert_allclose(from_dst, from_src, rtol=1e-12, atol=1e-14)


def test_gelu_tanh_gradient_is_the_finite_difference():
    rng = np.random.default_rng(2)
    x, dd = rng.uniform(-4, 4, SHAPE), rng.uniform(-1, 1, SHAPE)
    fwd = make_op(OpKind.GELU, [SHAPE], [SHAPE], mode="gelu_tanh")
    bwd = make_op(OpKind.GELUBackward, [SHAPE, SHAPE], [SHAPE], mode="gelu_tanh")
    want = numeric_vjp(lambda a: run64(fwd, a)[0], [x], 0, dd)
    np.testing.assert_allclose(run64(bwd, [x, dd])[0], want, rtol=RTOL, atol=ATOL)


def test_edges_follow_onednn_branches():
    """At the kinks oneDNN picks a side: clip_v2_bwd and relu_bwd give 0 at the
    bound, abs_bwd 0 at 0, hardsigmoid_bwd 0 where alpha x + beta is 0 or 1,
    hardswish_bwd 0 at -3 and dd at 3."""
    dd = np.array([2.0, 2.0, 2.0])
    x = np.array([-1.0, 0.0, 1.0])
    cases = [
        (OpKind.ClampBackward, {"min": -1.0, "max": 1.0, "use_dst": False}, x, [0, 2, 0]),
        (OpKind.ReLUBackward, {"use_dst": False}, x, [0, 0, 2]),
        (OpKind.AbsBackward, {}, x, [-2, 0, 2]),
        (OpKind.HardSigmoidBackward, {"alpha": 0.5, "beta": 0.5}, x, [0, 1, 0]),
        (OpKind.HardSwishBackward, {}, np.array([-3.0, 0.0, 3.0]), [0, 1, 2]),
    ]
    for kind, attrs, src, want in cases:
        op = make_op(kind, [(3,), (3,)], [(3,)], **attrs)
        np.testing.assert_array_equal(run64(op, [src, dd])[0], want, err_msg=kind.name)


def test_f32_output_is_the_f64_result_rounded_once():
    fwd, attrs, x, dd = _eltwise_case(OpKind.MishBackward, seed=3)
    op = make_op(OpKind.MishBackward, [SHAPE, SHAPE], [SHAPE])
    got = REFERENCE[op.kind](op, [x.astype(np.float32), dd.astype(np.float32)], op.outputs, CTX)[0]
    want = run64(op, [x.astype(np.float32), dd.astype(np.float32)])[0].astype(np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------------- softmax
@pytest.mark.parametrize("kind,fwd_kind,axis", [(OpKind.SoftMaxBackward, OpKind.SoftMax, 1),
                                                (OpKind.SoftMaxBackward, OpKind.SoftMax, -1),
                                                (OpKind.LogSoftmaxBackward, OpKind.LogSoftmax, 0)])
def test_softmax_gradients_are_finite_differences(kind, fwd_kind, axis):
    shape = (2, 5, 3)
    rng = np.random.default_rng(4)
    x, dd = rng.normal(size=shape), rng.normal(size=shape)
    fwd = make_op(fwd_kind, [shape], [shape], axis=axis)
    dst = run64(fwd, [x])[0]
    bwd = make_op(kind, [shape, shape], [shape], axis=axis)
    want = numeric_vjp(lambda a: run64(fwd, a)[0], [x], 0, dd)
    np.testing.assert_allclose(run64(bwd, [dd, dst])[0], want, rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------ bias, PReLU
@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_bias_add_gradient_sums_all_but_the_channel_dim(fmt):
    shape = (2, 3, 4, 5)
    c = 3 if fmt == "NCX" else 5
    dd = np.random.default_rng(5).normal(size=shape)
    op = make_op(OpKind.BiasAddBackward, [shape], [(c,)], data_format=fmt)
    fwd = make_op(OpKind.BiasAdd, [shape, (c,)], [shape], data_format=fmt)
    want = numeric_vjp(lambda a: run64(fwd, a)[0], [np.zeros(shape), np.zeros(c)], 1, dd)
    np.testing.assert_allclose(run64(op, [dd])[0], want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("slope_shape,fmt", [((3,), "NCX"), ((4,), "NXC"), ((1, 1, 1, 1), "NCX"),
                                             ((2, 3, 1, 4), "NCX")])
def test_prelu_gradients_are_finite_differences(slope_shape, fmt):
    """The forward kernel computes in f32, so the data are multiples of 1/16
    and h = 1/64: every perturbed value and product is exact in f32, and the
    op is linear on each side of 0 (|x| >= 1/8 > h), so the difference is exact."""
    shape = (2, 3, 5, 4)
    rng = np.random.default_rng(6)
    x = rng.integers(1, 33, shape) / 16.0 * rng.choice([-1, 1], shape)
    slope, dd = rng.integers(1, 16, slope_shape) / 16.0, rng.normal(size=shape)
    # forward PReLU: a 1-D slope is per channel (per_channel_broadcast), as the backward op reads it
    fwd = make_op(OpKind.PReLU, [shape, slope_shape], [shape], data_format=fmt)
    bwd = make_op(OpKind.PReLUBackward, [shape, slope_shape, shape], [shape, slope_shape],
                  data_format=fmt)
    diff_src, diff_slope = run64(bwd, [x, slope, dd])
    f = lambda a: run64(fwd, a)[0]  # noqa: E731
    h = 1.0 / 64
    np.testing.assert_allclose(diff_src, numeric_vjp(f, [x, slope], 0, dd, h), rtol=1e-12)
    np.testing.assert_allclose(diff_slope, numeric_vjp(f, [x, slope], 1, dd, h), rtol=1e-12)


# ----------------------------------------------------------- normalization
@pytest.mark.parametrize("fmt,gamma", [("NCX", True), ("NXC", True), ("NCX", False)])
def test_batch_norm_gradients_are_finite_differences_of_training_forward(fmt, gamma):
    """With the batch statistics as mean/variance, diff_src is the full
    derivative of BatchNormForwardTraining (whose statistics depend on src)."""
    shape = (2, 3, 4, 2) if fmt == "NCX" else (2, 4, 2, 3)
    c, eps = 3, 1e-3
    rng = np.random.default_rng(7)
    x, dd = rng.normal(size=shape), rng.normal(size=shape)
    g, b = rng.uniform(0.5, 1.5, c), rng.normal(size=c)
    fwd = make_op(OpKind.BatchNormForwardTraining, [shape, (c,), (c,), (c,), (c,)],
                  [shape, (c,), (c,), (c,), (c,)], epsilon=eps, data_format=fmt)
    mean, var = run64(fwd, [x, np.zeros(c), np.ones(c), g, b])[3:5]
    aux_in = [(c,)] * (3 if gamma else 2)
    bwd = make_op(OpKind.BatchNormTrainingBackward, [shape, shape] + aux_in,
                  [shape] + ([(c,), (c,)] if gamma else []), epsilon=eps, data_format=fmt)
    got = run64(bwd, [x, dd, mean, var] + ([g] if gamma else []))
    gg = g if gamma else np.ones(c)
    full = lambda a: run64(fwd, [a[0], np.zeros(c), np.ones(c), a[1], a[2]])[0]  # noqa: E731
    np.testing.assert_allclose(got[0], numeric_vjp(full, [x, gg, b], 0, dd), rtol=RTOL, atol=ATOL)
    if gamma:
        np.testing.assert_allclose(got[1], numeric_vjp(full, [x, g, b], 1, dd), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(got[2], numeric_vjp(full, [x, g, b], 2, dd), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("begin_norm_axis,affine", [(-1, True), (1, True), (-1, False)])
def test_layer_norm_gradients_are_finite_differences(begin_norm_axis, affine):
    shape = (2, 3, 4)
    rng = np.random.default_rng(8)
    x, dd = rng.normal(size=shape), rng.normal(size=shape)
    bna = begin_norm_axis % 3
    norm_shape, stat_shape = shape[bna:], shape[:bna]
    g, b = rng.uniform(0.5, 1.5, norm_shape), rng.normal(size=norm_shape)
    fwd = make_op(OpKind.LayerNorm, [shape, norm_shape, norm_shape], [shape, stat_shape, stat_shape],
                  begin_norm_axis=begin_norm_axis, epsilon=1e-3)
    _, mean, var = run64(fwd, [x, g, b])
    aux = [norm_shape, norm_shape] if affine else []
    bwd = make_op(OpKind.LayerNormBackward, [shape, shape, stat_shape, stat_shape] + aux,
                  [shape] + aux, begin_norm_axis=begin_norm_axis, epsilon=1e-3, use_affine=affine)
    got = run64(bwd, [x, dd, mean, var] + ([g, b] if affine else []))
    gg = g if affine else np.ones(norm_shape)
    full = lambda a: run64(fwd, a)[0]  # noqa: E731
    np.testing.assert_allclose(got[0], numeric_vjp(full, [x, gg, b], 0, dd), rtol=RTOL, atol=ATOL)
    if affine:
        np.testing.assert_allclose(got[1], numeric_vjp(full, [x, g, b], 1, dd), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(got[2], numeric_vjp(full, [x, g, b], 2, dd), rtol=RTOL, atol=ATOL)


def test_kernels_never_modify_their_inputs():
    shape = (2, 3, 4)
    rng = np.random.default_rng(9)
    inputs = [rng.normal(size=shape).astype(np.float32) for _ in range(2)] + \
             [rng.uniform(0.5, 1, (2, 3)).astype(np.float32) for _ in range(2)]
    before = [x.copy() for x in inputs]
    op = make_op(OpKind.LayerNormBackward, [shape, shape, (2, 3), (2, 3)], [shape], use_affine=False)
    REFERENCE[op.kind](op, inputs, op.outputs, CTX)
    assert all(x.tobytes() == y.tobytes() for x, y in zip(inputs, before))


def test_filled_backward_graphs_give_finite_gradients():
    """Variances and SqrtBackward inputs are filled positive, so a check run
    compares numbers, not NaN with NaN."""
    from graph_api.cli import execute, prepare
    from tests.conformance_files import ROOT

    report = execute(prepare(ROOT / "pattern/f32/bn_bwd_relu_bwd_fusion.json"), check=True)
    assert report.ok and len(report.checks) == 3
    assert all(np.isfinite(report.run.outputs[c.tid]).all() for c in report.checks)

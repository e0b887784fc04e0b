"""The f32 plans of the backward op kinds (kernels/fused/backward_plan.py,
backward_window_plan.py) against the float64 reference.

Each case is a one-op graph run twice: on its fast plan (which must be chosen)
and on the composed reference plan (``settings.reference``), which computes in
float64 and rounds once.  The reference itself is checked against finite
differences and adjoints of the forward kernels (test_backward*.py), and the
Convolution gradients here run a different algorithm (im2col/col2im BLAS,
not the reference's per-tap sums), so a wrong index or formula shows.

Tolerance: :func:`graph_api.check.compare`, ``|got - ref| <= rtol (|ref| + max|ref|)``.
f32: rtol 2e-5.  The f32 plans round each elementwise step (a few 6e-8 ulps)
and sum up to a few hundred terms in f32 BLAS order (sqrt(n) ulps of the term
magnitude, ~1e-6 of max|ref|); the max|ref| term covers the cancelling sums
of the norm and softmax gradients.  bf16 (and f16): the plans round once to the type,
so they differ from the reference by at most one ulp of it (bf16: 2^-8 relative)
where the f32 value sits by a rounding boundary; compare allows 4 ulps.
"""
from __future__ import annotations

import numpy as np
import pytest

import graph_api as ga
from graph_api import dtypes
from graph_api.check import compare
from graph_api.config import settings
from graph_api.enums import OpKind as K

from ..patterns.builder import G, dt
from .test_backward import ELTWISE, away_from, make_op
from .test_backward_window import CONV, DECONV, INTERP, POOL, inferred

DTYPES = [dt.f32, dt.bf16, dt.f16]
#: where the statistics vectors share the data's type: their T2 is f32 or bf16 only
NORM_DTYPES = [dt.f32, dt.bf16]


def _run(graph, feeds):
    run = ga.run_graph(graph, feeds)
    return run, {tid: run.outputs[tid] for tid in graph.output_ids}


def check_against_reference(kind, inputs, out_shapes, attrs, dtype, plan_prefix=""):
    """One ``kind`` op on ``inputs`` (f64 arrays rounded to ``dtype``; integer
    arrays are s32 shape inputs): its fast plan must match the reference."""
    def make():
        g = G()
        ins = [g.input(np.shape(x), dtype if np.asarray(x).dtype.kind == "f" else dt.s32)
               for x in inputs]
        outs = [g.tensor(s, dtype) for s in out_shapes]
        g.graph.add_op(ga.Op(0, kind, ins, outs, attrs=attrs))
        return g.done()

    graph = make()
    feeds = {tid: (dtypes.convert(x, dtype) if np.asarray(x).dtype.kind == "f" else x)
             for tid, x in zip(sorted(graph.input_ids), inputs)}
    compare_fast_and_reference(make, feeds, plan_prefix, dtype)


def compare_fast_and_reference(make, feeds, prefix, dtype):
    """``make()``'s graph (a new one each call: compiled plans stay with a graph)
    on its fast plan named ``prefix...`` and on the reference plan."""
    graph = make()
    run, got = _run(graph, feeds)
    plans = [p.compiled.plan for p in run.partitions]
    assert len(plans) == 1 and plans[0].name != "reference", getattr(plans[0], "fallback_reason", "")
    assert plans[0].name.startswith(prefix), plans[0].name
    old = settings.reference
    settings.reference = True
    try:
        _, want = _run(make(), feeds)
    finally:
        settings.reference = old
    for tid in got:
        out_dt = graph.tensors[tid].dtype
        verdict = compare(want[tid], got[tid], out_dt)
        assert verdict.ok, f"{graph.ops} output {tid}: {verdict.message}"


# ------------------------------------------------------------ element-wise
SHAPE = (4, 33)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("kind", list(ELTWISE), ids=lambda k: k.name)
def test_eltwise_gradient(kind, dtype):
    _, attrs, kinks, (lo, hi) = ELTWISE[kind]
    rng = np.random.default_rng(11)
    # away from the kinks by more than a bf16 ulp, so both plans take the same branch
    v = away_from(rng.uniform(lo, hi, SHAPE), *kinks, margin=5e-2)
    dd = rng.uniform(-2, 2, SHAPE)
    check_against_reference(kind, [v, dd], [SHAPE], attrs, dtype, "numpy_f32_eltwise_bwd")


@pytest.mark.parametrize("kind", [K.EluBackward, K.SigmoidBackward, K.TanhBackward, K.SqrtBackward])
def test_eltwise_gradient_from_src(kind):
    _, attrs, kinks, (lo, hi) = ELTWISE[kind]
    rng = np.random.default_rng(12)
    v, dd = away_from(rng.uniform(lo, hi, SHAPE), *kinks), rng.uniform(-2, 2, SHAPE)
    check_against_reference(kind, [v, dd], [SHAPE], {**attrs, "use_dst": False}, dt.f32)


def test_gelu_tanh_gradient():
    rng = np.random.default_rng(13)
    check_against_reference(K.GELUBackward, [rng.uniform(-4, 4, SHAPE), rng.normal(size=SHAPE)],
                            [SHAPE], {"mode": "gelu_tanh"}, dt.f32)


# ----------------------------------------------------------------- softmax
def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("kind,axis", [(K.SoftMaxBackward, 1), (K.SoftMaxBackward, -1),
                                       (K.LogSoftmaxBackward, -1), (K.LogSoftmaxBackward, 0)])
def test_softmax_gradients(kind, axis, dtype):
    shape = (3, 20, 17)
    rng = np.random.default_rng(14)
    dst = _softmax(rng.normal(size=shape) * 2, axis)
    if kind == K.LogSoftmaxBackward:
        dst = np.log(dst)
    check_against_reference(kind, [rng.normal(size=shape), dst], [shape], {"axis": axis}, dtype,
                            "numpy_f32_softmax_bwd")


# ------------------------------------------------------------ bias, PReLU
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_bias_add_gradient(fmt, dtype):
    shape = (4, 6, 9, 10)
    c = shape[1] if fmt == "NCX" else shape[-1]
    dd = np.random.default_rng(15).normal(size=shape)
    check_against_reference(K.BiasAddBackward, [dd], [(c,)], {"data_format": fmt}, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("slope_shape,fmt", [((3,), "NCX"), ((4,), "NXC"), ((2, 3, 1, 4), "NCX")])
def test_prelu_gradients(slope_shape, fmt, dtype):
    shape = (2, 3, 5, 4)
    rng = np.random.default_rng(16)
    x, slope, dd = rng.normal(size=shape), rng.uniform(0, 1, slope_shape), rng.normal(size=shape)
    check_against_reference(K.PReLUBackward, [x, slope, dd], [shape, slope_shape],
                            {"data_format": fmt}, dtype, "numpy_f32_prelu_bwd")


# ----------------------------------------------------------- normalization
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("fmt,gamma", [("NCX", True), ("NXC", True), ("NCX", False)])
def test_batch_norm_gradients(fmt, gamma, dtype):
    shape = (4, 5, 6, 7) if fmt == "NCX" else (4, 6, 7, 5)
    c = 5
    rng = np.random.default_rng(17)
    x = rng.normal(size=shape) * 2 + 1
    axes = (0, 2, 3) if fmt == "NCX" else (0, 1, 2)
    mean, var = dtypes.to_f32(dtypes.convert(x, dtype)).mean(axis=axes), x.var(axis=axes)
    aux = [mean.astype(np.float64), var] + ([rng.uniform(0.5, 1.5, c)] if gamma else [])
    # mean, variance, gamma are f32 (oneDNN's usual form)
    def make():
        g = G()
        ins = [g.input(shape, dtype), g.input(shape, dtype)] + [g.input((c,)) for _ in aux]
        outs = [g.tensor(shape, dtype)] + ([g.tensor((c,)), g.tensor((c,))] if gamma else [])
        g.graph.add_op(ga.Op(0, K.BatchNormTrainingBackward, ins, outs,
                             attrs={"epsilon": 1e-3, "data_format": fmt}))
        return g.done()

    arrays = [dtypes.convert(x, dtype), dtypes.convert(rng.normal(size=shape), dtype)] + \
        [a.astype(np.float32) for a in aux]
    compare_fast_and_reference(make, dict(enumerate(arrays)), "numpy_f32_norm_bwd", dtype)


@pytest.mark.parametrize("dtype", NORM_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("begin_norm_axis,affine", [(-1, True), (1, True), (-1, False)])
def test_layer_norm_gradients(begin_norm_axis, affine, dtype):
    shape = (3, 4, 40)
    rng = np.random.default_rng(18)
    bna = begin_norm_axis % 3
    norm_shape, stat_shape = shape[bna:], shape[:bna]
    x = rng.normal(size=shape)
    axes = tuple(range(bna, 3))
    mean, var = x.mean(axis=axes), x.var(axis=axes)
    aux = [rng.uniform(0.5, 1.5, norm_shape), rng.normal(size=norm_shape)] if affine else []
    outs = [shape] + ([norm_shape, norm_shape] if affine else [])
    check_against_reference(K.LayerNormBackward, [x, rng.normal(size=shape), mean, var] + aux, outs,
                            {"begin_norm_axis": begin_norm_axis, "use_affine": affine, "epsilon": 1e-3},
                            dtype, "numpy_f32_norm_bwd")


# ------------------------------------------------------------- convolution
def _fwd_dst_shape(kind, src_shape, w_shape, attrs):
    return inferred(make_op(kind, [src_shape, w_shape], [None], **attrs))[0]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(CONV))
def test_convolution_gradients(name, dtype):
    src_shape, w_shape, attrs = CONV[name]
    dst_shape = _fwd_dst_shape(K.Convolution, src_shape, w_shape, attrs)
    rng = np.random.default_rng(19)
    x, w, dy = rng.normal(size=src_shape), rng.normal(size=w_shape), rng.normal(size=dst_shape)
    check_against_reference(K.ConvolutionBackwardData, [dy, w], [src_shape],
                            {**attrs, "dst_shape": list(src_shape)}, dtype, "f32_col2im_blas")
    check_against_reference(K.ConvolutionBackwardWeights, [x, dy], [w_shape],
                            {**attrs, "weights_shape": list(w_shape)}, dtype, "f32_im2col_blas")


def test_convolution_gradients_with_shape_inputs():
    src_shape, w_shape, attrs = CONV["ncx-oix-stride2-pad"]
    dst_shape = _fwd_dst_shape(K.Convolution, src_shape, w_shape, attrs)
    rng = np.random.default_rng(20)
    x, w, dy = rng.normal(size=src_shape), rng.normal(size=w_shape), rng.normal(size=dst_shape)
    check_against_reference(K.ConvolutionBackwardData, [dy, w, np.array(src_shape, np.int32)],
                            [src_shape], attrs, dt.f32)
    check_against_reference(K.ConvolutionBackwardWeights, [x, dy, np.array(w_shape, np.int32)],
                            [w_shape], attrs, dt.f32)


def test_convolution_gradients_under_bf16_fpmath():
    """fpmath bf16 rounds the f32 inputs as the reference's round_mm_input does."""
    src_shape, w_shape, attrs = CONV["nxc-xio-groups-dilated"]
    dst_shape = _fwd_dst_shape(K.Convolution, src_shape, w_shape, attrs)
    rng = np.random.default_rng(21)
    def make():
        g = G(fpmath="bf16")
        g.op(K.ConvolutionBackwardData, g.input(dst_shape), g.input(w_shape), shape=src_shape,
             attrs={**attrs, "dst_shape": list(src_shape)})
        return g.done()

    feeds = {0: rng.normal(size=dst_shape).astype(np.float32),
             1: rng.normal(size=w_shape).astype(np.float32)}
    compare_fast_and_reference(make, feeds, "f32_col2im_blas", dt.f32)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(DECONV))
def test_conv_transpose_gradients(name, dtype):
    src_shape, w_shape, attrs = DECONV[name]
    dst_shape = _fwd_dst_shape(K.ConvTranspose, src_shape, w_shape, attrs)
    rng = np.random.default_rng(22)
    x, w, dy = rng.normal(size=src_shape), rng.normal(size=w_shape), rng.normal(size=dst_shape)
    check_against_reference(K.ConvTransposeBackwardData, [dy, w], [src_shape], attrs, dtype,
                            "f32_im2col_blas")
    check_against_reference(K.ConvTransposeBackwardWeights, [x, dy], [w_shape],
                            {**attrs, "weights_shape": list(w_shape)}, dtype, "f32_im2col_blas")


# ------------------------------------------------------ pooling, resample
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(POOL))
def test_pooling_gradients(name, dtype):
    src_shape, attrs = POOL[name]
    rng = np.random.default_rng(23)
    dst_shape = inferred(make_op(K.AvgPool, [src_shape], [None], **attrs))[0]
    check_against_reference(K.AvgPoolBackward, [rng.normal(size=dst_shape)], [src_shape],
                            {**attrs, "src_shape": list(src_shape)}, dtype, "numpy_f32_pool_bwd")
    attrs = {k: v for k, v in attrs.items() if k != "exclude_pad"}
    # distinct values: no ties, so the argmax is the same in f32 and f64
    x = rng.permutation(int(np.prod(src_shape))).reshape(src_shape) / 8.0
    check_against_reference(K.MaxPoolBackward, [x, rng.normal(size=dst_shape)], [src_shape], attrs,
                            dtype, "numpy_f32_pool_bwd")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("mode,ctm,src_shape,size", INTERP, ids=[c[0] for c in INTERP])
def test_interpolate_gradient(mode, ctm, src_shape, size, dtype):
    attrs = dict(mode=mode, coordinate_transformation_mode=ctm, data_format="NCX", **size)
    dst_shape = inferred(make_op(K.Interpolate, [src_shape], [None], **attrs))[0]
    rng = np.random.default_rng(24)
    check_against_reference(K.InterpolateBackward, [np.zeros(src_shape), rng.normal(size=dst_shape)],
                            [src_shape], attrs, dtype, "numpy_f32_interpolate_bwd")


def test_every_backward_kind_has_a_fast_plan():
    from graph_api.kernels.fused import backward_plan, backward_window_plan

    kinds = {k for k in ga.OpKind if "Backward" in k.name}
    assert kinds == set(backward_plan.PREPARE) | set(backward_window_plan.PREPARE)


# ------------------------------------------------------- fused pattern
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_batchnorm_bwd_relu_bwd_runs_fused_on_f32(dtype):
    shape, c = (4, 6, 5, 5), 6
    rng = np.random.default_rng(25)

    def make():
        g = G()
        y, dy = g.input(shape, dtype), g.input(shape, dtype)
        stats = [g.input((c,)) for _ in range(3)]
        r = g.op(K.ReLUBackward, y, dy)
        g.op(K.BatchNormTrainingBackward, r, dy, *stats, outputs=3, dtypes=[dtype, dt.f32, dt.f32],
             attrs={"epsilon": 1e-5, "data_format": "NCX"})
        return g.done()

    (part,) = make().get_partitions()
    assert part.get_kind() == "batchnorm_bwd_relu_bwd"
    feeds = {0: dtypes.convert(rng.normal(size=shape), dtype),
             1: dtypes.convert(rng.normal(size=shape), dtype),
             2: rng.normal(size=c).astype(np.float32) * 0.1,
             3: rng.uniform(0.5, 2, c).astype(np.float32),
             4: rng.uniform(0.5, 1.5, c).astype(np.float32)}
    compare_fast_and_reference(make, feeds, "f32_backward_chain", dtype)

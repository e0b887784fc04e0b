"""The Convolution fast plan (kernels/convolution/conv_plan.py, kernels/convolution/conv.py) against an
independent float64 numpy convolution and exact integer arithmetic."""
import itertools

import numpy as np
import pytest

import graph_api as ga
from graph_api.check import compare
from graph_api.fill import fill_inputs
from graph_api.kernels.convolution import conv as cv

from ..patterns import cnn_graphs as cg
from ..patterns.builder import K, dt

RNG = np.random.default_rng(7)


def direct_conv(x, w, stride=1, pad=0, dilation=1, groups=1):
    """float64 NCHW x (N, C, H, W), OIHW w: the textbook sum, tap by tap."""
    n, c, h, wd = x.shape
    oc, icg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - (kh - 1) * dilation - 1) // stride + 1
    ow = (wd + 2 * pad - (kw - 1) * dilation - 1) // stride + 1
    out = np.zeros((n, oc, oh, ow))
    ocg = oc // groups
    for g_, i, j in itertools.product(range(groups), range(kh), range(kw)):
        patch = xp[:, g_ * icg:(g_ + 1) * icg, i * dilation:i * dilation + (oh - 1) * stride + 1:stride,
                   j * dilation:j * dilation + (ow - 1) * stride + 1:stride]
        out[:, g_ * ocg:(g_ + 1) * ocg] += np.einsum("nchw,oc->nohw", patch, w[g_ * ocg:(g_ + 1) * ocg, :, i, j])
    return out


def _run(graph, feeds):
    run = ga.run_graph(graph, feeds)
    assert [r.compiled.plan.name for r in run.partitions] == ["conv_im2col_blas"]
    return {tid: run.outputs[tid] for tid in graph.output_ids}


def _inputs(graph):
    """Graph input ids in creation order (the factories create x, w, b, ... in order)."""
    return sorted(graph.input_ids)


def _reference_run(graph, feeds):
    """The graph's ops one by one on the numpy reference kernels (``kernels/reference``:
    float64 sums, nothing shared with ConvPlan).  The debug policy alone is no reference
    here: its lone Convolution partition runs ConvPlan too."""
    from graph_api.config import settings
    saved = settings.reference
    settings.reference = True
    try:
        run = ga.run_graph(graph, feeds, ga.PartitionPolicy.debug)
    finally:
        settings.reference = saved
    assert {r.compiled.plan.name for r in run.partitions} == {"reference"}
    return run


# f32 sums of up to 72 terms of magnitude ~1 in BLAS order: the scale-aware f32 rule
# of graph_api.check (2e-5 of max|y|) is ~100x the expected error (sqrt(72) * 6e-8)
@pytest.mark.parametrize("fmt,stride,dilation,groups", [("NCX", 1, 1, 1), ("NXC", 2, 1, 1),
                                                        ("NCX", 1, 2, 2), ("NXC", 2, 2, 4)])
def test_float_conv_bias_relu_matches_the_direct_sum(fmt, stride, dilation, groups):
    graph = cg.conv(fmt=fmt, wfmt="OIX" if fmt == "NCX" else "XIO", stride=stride, dilation=dilation,
                    pad=dilation, groups=groups, post=("relu",))
    xi, wi, bi = _inputs(graph)
    x = RNG.standard_normal(graph.tensors[xi].shape).astype(np.float32)
    w = RNG.standard_normal(graph.tensors[wi].shape).astype(np.float32)
    b = RNG.standard_normal(cg.C).astype(np.float32)
    got = next(iter(_run(graph, {xi: x, wi: w, bi: b}).values()))
    xn = x if fmt == "NCX" else x.transpose(0, 3, 1, 2)
    wo = w if fmt == "NCX" else w.transpose(3, 2, 0, 1)
    want = direct_conv(xn.astype(np.float64), wo.astype(np.float64), stride, dilation, dilation, groups)
    want = np.maximum(want + b.reshape(1, -1, 1, 1), 0)
    if fmt == "NXC":
        want = want.transpose(0, 2, 3, 1)
    verdict = compare(want, got, dt.f32)
    assert verdict.ok, verdict.message


def test_batchnorm_is_folded_into_the_weights_exactly_enough():
    graph = cg.conv(bias="op", bn=True, post=())
    ids = _inputs(graph)
    feeds = {i: RNG.standard_normal(graph.tensors[i].shape).astype(np.float32) for i in ids}
    var_id = ids[-1]
    feeds[var_id] = RNG.uniform(0.5, 2.0, cg.C).astype(np.float32)  # a real variance
    x, w, b, gamma, beta, mean, var = (feeds[i].astype(np.float64) for i in ids)
    y = direct_conv(x, w, pad=1) + b.reshape(1, -1, 1, 1)
    c = lambda v: v.reshape(1, -1, 1, 1)  # noqa: E731
    want = c(gamma) * (y - c(mean)) / np.sqrt(c(var) + np.float32(1e-3)) + c(beta)
    got = next(iter(_run(graph, feeds).values()))
    # folding changes one f32 rounding per weight: a few ulps of max|y|, inside the rule
    verdict = compare(want, got, dt.f32)
    assert verdict.ok, verdict.message


def test_depthwise_after_1x1_matches_two_direct_convolutions():
    graph = cg.conv_depthwise(post=("relu",), dw_post=())
    x_id, w1, b1, w2, b2 = _inputs(graph)
    feeds = {i: RNG.standard_normal(graph.tensors[i].shape).astype(np.float32) for i in _inputs(graph)}
    f = {i: v.astype(np.float64) for i, v in feeds.items()}
    y = np.maximum(direct_conv(f[x_id], f[w1]) + f[b1].reshape(1, -1, 1, 1), 0)
    want = direct_conv(y, f[w2], stride=2, pad=1, groups=cg.C) + f[b2].reshape(1, -1, 1, 1)
    got = next(iter(_run(graph, feeds).values()))
    verdict = compare(want, got, dt.f32)
    assert verdict.ok, verdict.message


def test_int8_conv_accumulates_exactly_then_scales_once():
    graph = cg.quantized_conv(src_dt=dt.u8, src_zp=3, per_channel=True, bias=False, post=(),
                              quant_out=False)
    x_id, w_id = _inputs(graph)
    x = RNG.integers(0, 256, graph.tensors[x_id].shape).astype(np.uint8)
    w = RNG.integers(-128, 128, graph.tensors[w_id].shape).astype(np.int8)
    got = next(iter(_run(graph, {x_id: x, w_id: w}).values()))
    acc = direct_conv(x.astype(np.int64) - 3, w.astype(np.int64), pad=1)  # exact in f64 (< 2^53)
    scales = np.array([0.5 * (1 + i % 3) for i in range(cg.C)]) * 0.25
    want = (acc * scales.reshape(1, -1, 1, 1)).astype(np.float32)
    # one rounding of an exactly scaled integer sum: equal to f32 rounding of the exact value
    np.testing.assert_array_equal(got, want)


#: the int8 GEMM a test asks for -> (igemm.HAVE_VNNI, igemm16.HAVE_AVX2, the plan's gemm path)
INT8_GEMMS = {"vnni": (True, True, "int8_vnni_gemm"), "pairs": (False, True, "int8_pairs_gemm"),
              "f32": (False, False, "f32_blas_exact")}


@pytest.fixture(params=sorted(INT8_GEMMS))
def int8_gemm(request, monkeypatch):
    """Runs a test on each int8 convolution GEMM this CPU can run; returns its path name."""
    from graph_api.kernels import igemm
    from graph_api.kernels.convolution import igemm16
    vnni, avx2, path = INT8_GEMMS[request.param]
    if vnni and not igemm.HAVE_VNNI or avx2 and not igemm16.HAVE_AVX2:
        pytest.skip(f"this CPU cannot run the {request.param} int8 GEMM")
    monkeypatch.setattr(igemm, "HAVE_VNNI", vnni)
    monkeypatch.setattr(igemm16, "HAVE_AVX2", avx2)
    return path


@pytest.mark.parametrize("fmt,src_dt,zp", [("NCX", dt.u8, 3), ("NXC", dt.u8, 0), ("NCX", dt.s8, -5),
                                           ("NXC", dt.s8, 127)])
def test_int8_conv_runs_on_the_int8_gemm_exactly(int8_gemm, fmt, src_dt, zp):
    """The 8-bit columns go straight to the VNNI int8 GEMM, or less the zero point into
    the AVX2 int16-pair GEMM, or (neither) the exact f32 BLAS products: exact sums,
    scaled once in f64 then rounded to f32 (equal to the exact value's rounding)."""
    graph = cg.quantized_conv(fmt=fmt, src_dt=src_dt, src_zp=zp, per_channel=True, bias=False, post=(),
                              quant_out=False)
    x_id, w_id = _inputs(graph)
    lo, hi = (0, 255) if src_dt == dt.u8 else (-128, 127)
    x = RNG.integers(lo, hi + 1, graph.tensors[x_id].shape).astype(np.uint8 if src_dt == dt.u8 else np.int8)
    w = RNG.integers(-128, 128, graph.tensors[w_id].shape).astype(np.int8)
    run = ga.run_graph(graph, {x_id: x, w_id: w})
    (path,) = run.partitions[0].compiled.plan.gemm_paths
    assert path == int8_gemm
    got = run.outputs[next(iter(graph.output_ids))]
    to_nchw = (lambda a: a.transpose(0, 3, 1, 2)) if fmt == "NXC" else (lambda a: a)
    w_oihw = w.transpose(3, 2, 0, 1) if fmt == "NXC" else w  # XIO -> OIX
    acc = direct_conv(to_nchw(x).astype(np.int64) - zp, w_oihw.astype(np.int64), pad=1)  # exact in f64
    scales = np.array([0.5 * (1 + i % 3) for i in range(cg.C)]) * 0.25
    np.testing.assert_array_equal(to_nchw(got), (acc * scales.reshape(1, -1, 1, 1)).astype(np.float32))


@pytest.mark.parametrize("zp", [300, -7])
def test_int8_conv_with_a_zero_point_outside_the_data_range_stays_exact(int8_gemm, zp):
    """The VNNI GEMM's padding holds the zero point as a data byte: a zero point no u8
    can hold leaves it (for the int16-pair GEMM, whose columns hold ``x - zp``, where
    AVX2 runs, else the f32 BLAS path: exact, |x - zp| * sum|w| < 2^24 here), same results."""
    graph = cg.quantized_conv(src_dt=dt.u8, src_zp=zp, per_channel=True, bias=False, post=(), quant_out=False)
    x_id, w_id = _inputs(graph)
    x = RNG.integers(0, 256, graph.tensors[x_id].shape).astype(np.uint8)
    w = RNG.integers(-128, 128, graph.tensors[w_id].shape).astype(np.int8)
    run = ga.run_graph(graph, {x_id: x, w_id: w})
    from graph_api.kernels.convolution import igemm16
    want_path = "int8_pairs_gemm" if igemm16.HAVE_AVX2 else "f32_blas_exact"
    assert run.partitions[0].compiled.plan.gemm_paths == (want_path,)
    acc = direct_conv(x.astype(np.int64) - zp, w.astype(np.int64), pad=1)
    scales = np.array([0.5 * (1 + i % 3) for i in range(cg.C)]) * 0.25
    got = run.outputs[next(iter(graph.output_ids))]
    np.testing.assert_array_equal(got, (acc * scales.reshape(1, -1, 1, 1)).astype(np.float32))


def test_conv_clamp_block_shortcut_equals_the_reference_bit_for_bit():
    """Clamp on f32 blocks (a shortcut past its f64 reference kernel) selects values only."""
    graph = cg.conv(post=("clamp",))
    feeds = fill_inputs(graph, 5)
    fused = ga.run_graph(graph, feeds)
    assert [r.compiled.plan.name for r in fused.partitions] == ["conv_im2col_blas"]
    conv_only = ga.run_graph(cg.conv(post=()), feeds)
    y = next(iter(conv_only.outputs[t] for t in cg.conv(post=()).output_ids))
    want = np.where(y > -1.0, y, np.float32(-1.0))
    want = np.where(want < 2.0, want, np.float32(2.0))
    assert (want == -1.0).any() and (want == 2.0).any()
    np.testing.assert_array_equal(next(iter(fused.outputs[t] for t in graph.output_ids)), want)


# ow = 14, 16, 28: whole 16-column panels cost at most 8/7 of the work, so the shifted rows
# serve (wp = 16 or 32, and for ow = 16 a row width past the 16 kept columns); dilation,
# a 5x5 kernel, padding wider than the kernel's reach, channels last, s8 data
@pytest.mark.parametrize("fmt,src,hw,k,pad,dilation,zp", [
    ("NCX", np.uint8, 14, 3, 1, 1, 3), ("NCX", np.uint8, 16, 3, 2, 2, 255), ("NXC", np.int8, 30, 3, 0, 1, -5),
    ("NCX", np.int8, 14, 5, 2, 1, 127), ("NXC", np.uint8, 14, 3, 3, 2, 0)])
def test_int8_conv_on_the_pair_gemm_shifted_rows_is_exact(monkeypatch, fmt, src, hw, k, pad, dilation, zp):
    """Stride-1 kxk on the AVX2 int16-pair GEMM reading the image rows shifted by each kernel
    column once per kernel row: exact integer sums (int64 direct sum), scaled once."""
    from graph_api.kernels import igemm
    from graph_api.kernels.convolution import igemm16
    if not igemm16.HAVE_AVX2:
        pytest.skip("no AVX2 on this CPU")
    monkeypatch.setattr(igemm, "HAVE_VNNI", False)
    c = 6
    g = cg.G()
    x_shape = (2, c, hw, hw) if fmt == "NCX" else (2, hw, hw, c)
    x8 = g.input(x_shape, dt.u8 if src == np.uint8 else dt.s8)
    x = g.op(K.Dequantize, x8, dtype=dt.f32, attrs=cg._qattrs((0.25,), (zp,)))
    wfmt = "OIX" if fmt == "NCX" else "XIO"
    w_shape = (c, c, k, k) if fmt == "NCX" else (k, k, c, c)
    scales = [0.5 * (1 + i % 3) for i in range(c)]
    w = g.op(K.Dequantize, g.tensor(w_shape, dt.s8, cg.CONST), dtype=dt.f32,
             attrs=cg._qattrs(scales, [0] * c, "per_channel", 0 if fmt == "NCX" else 3))
    g.op(K.ReLU, g.op(K.Convolution, x, w, attrs=cg.conv_attrs(fmt, pad=pad, wfmt=wfmt, dilation=dilation)))
    graph = g.done()
    x_id, w_id = _inputs(graph)
    lo, hi = (0, 255) if src == np.uint8 else (-128, 127)
    xv = RNG.integers(lo, hi + 1, x_shape).astype(src)
    wv = RNG.integers(-128, 128, w_shape).astype(np.int8)
    run = ga.run_graph(graph, {x_id: xv, w_id: wv})
    assert run.partitions[0].compiled.plan.gemm_paths == ("int8_pairs_gemm_shifted",)
    to_nchw = (lambda a: a.transpose(0, 3, 1, 2)) if fmt == "NXC" else (lambda a: a)
    w_oihw = wv.transpose(3, 2, 0, 1) if fmt == "NXC" else wv
    acc = direct_conv(to_nchw(xv).astype(np.int64) - zp, w_oihw.astype(np.int64), pad=pad, dilation=dilation)
    sc = np.float64(np.float32(0.25)) * np.array(scales, np.float32).astype(np.float64)
    # ReLU of the f32 rounding of the exactly scaled sums: bit for bit
    want = np.maximum((acc * sc.reshape(1, -1, 1, 1)).astype(np.float32), 0)
    np.testing.assert_array_equal(to_nchw(run.outputs[graph.output_ids[0]]), want)


def test_int8_depthwise_conv_on_the_tap_kernel_is_exact():
    """9 taps of |(x - zp) w| <= 252 * 128: every f32 partial sum is an exact integer."""
    graph = cg.quantized_conv(src_dt=dt.u8, src_zp=3, per_channel=True, bias=False, post=(),
                              quant_out=False, groups=cg.C)
    x_id, w_id = _inputs(graph)
    x = RNG.integers(0, 256, graph.tensors[x_id].shape).astype(np.uint8)
    w = RNG.integers(-128, 128, graph.tensors[w_id].shape).astype(np.int8)
    got = next(iter(_run(graph, {x_id: x, w_id: w}).values()))
    acc = direct_conv(x.astype(np.int64) - 3, w.astype(np.int64), pad=1, groups=cg.C)
    scales = np.array([0.5 * (1 + i % 3) for i in range(cg.C)]) * 0.25
    np.testing.assert_array_equal(got, (acc * scales.reshape(1, -1, 1, 1)).astype(np.float32))


def test_exact_integer_gemm_splits_long_reductions():
    J = 5000  # > exact_chunk(255, 128) = 514: several chunks
    cols = RNG.integers(-255, 256, (1, J, 7)).astype(np.float32)
    w2 = RNG.integers(-128, 128, (1, 3, J)).astype(np.float32)
    chunk = cv.exact_chunk(255, 128)
    assert chunk == 514
    got = cv.int_gemm(cols, w2, chunk)
    want = (w2[0].astype(np.int64) @ cols[0].astype(np.int64)).astype(np.float64)
    np.testing.assert_array_equal(got, want)
    # a single f32 BLAS call over all 5000 terms is not exact (partial sums pass 2^24)
    assert cv.exact_chunk(255, 255) == 258


def test_int8_conv_with_quantize_matches_the_reference_within_one():
    graph = cg.quantized_conv(residual=True, post=("relu",))
    feeds = fill_inputs(graph, 3)
    fused = ga.run_graph(graph, feeds)
    assert [r.compiled.plan.name for r in fused.partitions] == ["conv_im2col_blas"]
    ref = _reference_run(graph, feeds)
    for tid in graph.output_ids:
        verdict = compare(ref.outputs[tid], fused.outputs[tid], graph.tensors[tid].dtype)
        assert verdict.ok, verdict.message


def test_fpmath_bf16_rounds_f32_inputs_like_the_reference():
    graph = cg.conv(post=(), fpmath="bf16")
    feeds = fill_inputs(graph, 1)
    fused = ga.run_graph(graph, feeds)
    ref = _reference_run(graph, feeds)
    tid = graph.output_ids[0]
    # identical bf16-rounded inputs, f32 sums: the f32 rule, not the bf16 one, must hold
    verdict = compare(ref.outputs[tid], fused.outputs[tid], dt.f32)
    assert verdict.ok, verdict.message


def test_constant_weights_are_prepared_once_and_variable_weights_every_time():
    for prop in (ga.PropertyType.constant, ga.PropertyType.variable):
        g = cg.G()
        x = g.input((1, 4, 5, 5))
        w = g.tensor((4, 4, 3, 3), dt.f32, prop)
        g.op(K.Convolution, x, w, attrs=cg.conv_attrs())
        graph = g.done()
        part = graph.get_partitions()[0]
        xv = RNG.standard_normal((1, 4, 5, 5)).astype(np.float32)
        wv = RNG.standard_normal((4, 4, 3, 3)).astype(np.float32)
        # a lone Convolution is a single-op partition: compile the conv pattern's plan directly
        from graph_api.kernels.convolution.conv_plan import build
        from graph_api.kernels.plan import CompileRequest
        request = CompileRequest("conv_post_ops", part.ops, dict(graph.tensors), [0, 1], [2],
                                 graph.fpmath, {})
        plan = build(request)
        keys = {1: wv} if prop == ga.PropertyType.constant else {}
        first = plan.run_arrays({0: xv, 1: wv}, keys)[2]
        wv *= 2  # new values in the same constant buffer are not seen (oneDNN's rule)
        second = plan.run_arrays({0: xv, 1: wv}, keys)[2]
        np.testing.assert_allclose(second, first if prop == ga.PropertyType.constant else 2 * first,
                                   rtol=1e-6, atol=1e-5)


def direct_deconv(x, w_iohw, stride, pad, dilation, groups, out_hw):
    """float64 transposed convolution by scattering: out[.., y*s + k*d - p] += x * w,
    w as PyTorch's (IC, OC/g, KH, KW)."""
    n, ic, h, wd = x.shape
    _, ocg, kh, kw = w_iohw.shape
    icg = ic // groups
    big = np.zeros((n, ocg * groups, (h - 1) * stride + (kh - 1) * dilation + 1 + out_hw,
                    (wd - 1) * stride + (kw - 1) * dilation + 1 + out_hw))
    for g_, i, j in itertools.product(range(groups), range(kh), range(kw)):
        contrib = np.einsum("nchw,co->nohw", x[:, g_ * icg:(g_ + 1) * icg], w_iohw[g_ * icg:(g_ + 1) * icg, :, i, j])
        big[:, g_ * ocg:(g_ + 1) * ocg, i * dilation:i * dilation + (h - 1) * stride + 1:stride,
            j * dilation:j * dilation + (wd - 1) * stride + 1:stride] += contrib
    return big[:, :, pad:pad + out_hw, pad:pad + out_hw]


@pytest.mark.parametrize("stride,pad,dilation,groups,out_pad", [(1, 1, 1, 1, 0), (2, 1, 1, 2, 1),
                                                                (2, 0, 2, 4, 0)])
def test_conv_transpose_matches_the_direct_scatter(stride, pad, dilation, groups, out_pad):
    g = cg.G()
    x = g.input((2, 8, 5, 5))
    w = g.tensor((8, 8 // groups, 3, 3), dt.f32, cg.CONST)
    b = g.tensor((8,), dt.f32, cg.CONST)
    y = g.op(K.ConvTranspose, x, w, b, attrs={
        "strides": [stride] * 2, "pads_begin": [pad] * 2, "pads_end": [pad] * 2,
        "dilations": [dilation] * 2, "groups": groups, "data_format": "NCX", "weights_format": "IOX",
        "output_padding": [out_pad] * 2})
    g.op(K.ReLU, y)
    graph = g.done()
    feeds = {i: RNG.standard_normal(graph.tensors[i].shape).astype(np.float32) for i in (0, 1, 2)}
    out = _run(graph, feeds)[graph.output_ids[0]]
    out_hw = out.shape[-1]
    f = {i: v.astype(np.float64) for i, v in feeds.items()}
    want = direct_deconv(f[0], f[1], stride, pad, dilation, groups, out_hw)
    want = np.maximum(want + f[2].reshape(1, -1, 1, 1), 0)
    verdict = compare(want, out, dt.f32)
    assert verdict.ok, verdict.message


def test_int8_conv_transpose_accumulates_exactly():
    graph = cg.quantized_conv(kind=K.ConvTranspose, src_dt=dt.s8, src_zp=2, per_channel=False, bias=False,
                              post=(), quant_out=False)
    x_id, w_id = _inputs(graph)
    x = RNG.integers(-128, 128, graph.tensors[x_id].shape).astype(np.int8)
    w = RNG.integers(-128, 128, graph.tensors[w_id].shape).astype(np.int8)
    got = next(iter(_run(graph, {x_id: x, w_id: w}).values()))
    acc = direct_deconv(x.astype(np.int64) - 2, w.astype(np.int64), 1, 1, 1, 1, cg.HW)
    want = (acc * (np.float64(np.float32(0.25)) * np.float64(np.float32(0.75)))).astype(np.float32)
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------- the fast 2-D path
def _fast_vs_reference(graph, feeds, rule_dtype=None):
    """The fused run must take the fast 2-D path and match the reference ops run one by one
    (:func:`_reference_run`)."""
    fused = ga.run_graph(graph, feeds)
    plans = [r.compiled.plan for r in fused.partitions]
    assert [p.name for p in plans] == ["conv_im2col_blas"] and plans[0].fast is not None
    ref = _reference_run(graph, feeds)
    for tid in graph.output_ids:
        verdict = compare(ref.outputs[tid], fused.outputs[tid], rule_dtype or graph.tensors[tid].dtype)
        assert verdict.ok, verdict.message
    return fused


# f32: the conv's f32 sums against the reference's f64 sums (graph_api.check's f32 rule:
# a few ulps of max|y|); the post-ops are single f32 operations, rounded as the reference rounds
@pytest.mark.parametrize("fmt,k,stride,post", [
    ("NCX", 1, 1, ("add", "relu")), ("NCX", 3, 1, ("maximum", "add", "clamp")),
    ("NXC", 3, 2, ("subtract", "multiply", "relu")), ("NXC", 1, 1, ("minimum", "divide")),
    ("NCX", 3, 2, ("multiply", "subtract"))])
def test_fast_path_post_op_chains_match_the_reference(fmt, k, stride, post):
    graph = cg.conv(fmt=fmt, wfmt="OIX" if fmt == "NCX" else "XIO", k=k, stride=stride, pad=k // 2, post=post)
    feeds = fill_inputs(graph, 11)
    _fast_vs_reference(graph, feeds)


@pytest.mark.parametrize("fmt,k,dilation,pad", [("NCX", 3, 2, 1), ("NXC", 3, 2, 2), ("NCX", 5, 1, 1)])
def test_fast_path_stride_one_shifted_rows_match_the_direct_sum(fmt, k, dilation, pad):
    """Stride 1 runs conv_bands' shifted rows: dilated taps, padding narrower or wider than
    the kernel's reach (outputs smaller than the input), channels last read through strides.
    Against the float64 direct sum (the debug policy's lone Convolution runs this plan too)."""
    wfmt = "OIX" if fmt == "NCX" else "XIO"
    graph = cg.conv(fmt=fmt, wfmt=wfmt, k=k, pad=pad, dilation=dilation, post=("relu",))
    xi, wi, bi = _inputs(graph)
    x = RNG.standard_normal(graph.tensors[xi].shape).astype(np.float32)
    w = RNG.standard_normal(graph.tensors[wi].shape).astype(np.float32)
    b = RNG.standard_normal(cg.C).astype(np.float32)
    run = ga.run_graph(graph, {xi: x, wi: w, bi: b})
    plan = run.partitions[0].compiled.plan
    assert plan.fast is not None and plan.gemm_paths == ("f32_blas",)
    xn = x if fmt == "NCX" else x.transpose(0, 3, 1, 2)
    wo = w if fmt == "NCX" else w.transpose(3, 2, 0, 1)
    want = direct_conv(xn.astype(np.float64), wo.astype(np.float64), 1, pad, dilation)
    want = np.maximum(want + b.reshape(1, -1, 1, 1), 0)
    if fmt == "NXC":
        want = want.transpose(0, 2, 3, 1)
    # f32 sums of <= 200 O(1) terms: the f32 rule, as test_float_conv_bias_relu_matches_the_direct_sum
    verdict = compare(want, run.outputs[graph.output_ids[0]], dt.f32)
    assert verdict.ok, verdict.message


def test_fast_path_folds_batchnorm_and_runs_the_fused_depthwise_stage():
    graph = cg.conv(bias="op", bn=True, post=("relu",))
    _fast_vs_reference(graph, fill_inputs(graph, 4))
    graph = cg.conv_depthwise(post=("clamp",), dw_post=("add", "relu"))
    _fast_vs_reference(graph, fill_inputs(graph, 5))


@pytest.mark.parametrize("fmt,groups,residual", [("NCX", 1, True), ("NXC", 1, True), ("NCX", cg.C, False),
                                                 ("NXC", 1, False)])
def test_fast_int8_path_with_residual_dequantize_and_quantize_matches_the_reference(fmt, groups, residual):
    """Exact integer sums scaled once, f32 post-ops, Quantize rounding half to even: equal to the
    reference up to one u8 step where an f32 value sits on a rounding boundary."""
    graph = cg.quantized_conv(fmt=fmt, groups=groups, residual=residual, post=("relu",))
    feeds = fill_inputs(graph, 6)
    fused = _fast_vs_reference(graph, feeds)
    if residual:  # the residual's Dequantize is read inside the epilogue, not run as a step
        plan = fused.partitions[0].compiled.plan
        assert not any(op.kind == K.Dequantize for _, op, _, _ in plan.pre_steps)


def test_exact_reduction_bound_uses_the_weights_absolute_sums():
    from graph_api.kernels.convolution.conv_plan import _exact_reduction
    int8 = {"x_range": 255, "chunk": cv.exact_chunk(255, 128)}
    small = np.full((1, 4, 576), 100.0, np.float32)  # 255 * 57600 < 2^24: one GEMM is exact
    assert _exact_reduction(small, int8) == 576
    big = np.full((1, 4, 576), 127.0, np.float32)  # 255 * 73152 > 2^24: chunks
    assert _exact_reduction(big, int8) == 514
    # and the one-GEMM case really is exact: worst-case operands at the bound
    cols = np.full((1, 576, 5), 255.0, np.float32)
    got = np.matmul(small[0], cols[0]).astype(np.float64)
    assert (got == 576 * 100 * 255).all()


# ---------------------------------------------------------------- the bound form (ConvPlan.bind)
def _bottleneck(n, c=16, mid=8, hw=12, fmt="NCX"):
    """A ResNet bottleneck: 1x1 + bias + ReLU, 3x3 + bias + ReLU, 1x1 + bias + residual Add + ReLU."""
    g = cg.G()
    x = g.input(cg._shape(fmt, c, hw, n))
    wfmt = "OIX" if fmt == "NCX" else "XIO"
    h = x
    for oc, icg, k in ((mid, c, 1), (mid, mid, 3), (c, mid, 1)):
        h = g.op(K.Convolution, h, cg._weights(g, oc, icg, k, wfmt), g.tensor((oc,), dt.f32, cg.CONST),
                 attrs=cg.conv_attrs(fmt, pad=k // 2, wfmt=wfmt))
        if oc == c:
            h = g.op(K.Add, h, x)
        h = g.op(K.ReLU, h)
    return g.done()


def _bottleneck_reference(graph, feeds, fmt="NCX"):
    """float64: the three convolutions by the direct sum, the residual, the ReLUs."""
    ids = sorted(graph.input_ids)
    f = {i: feeds[i].astype(np.float64) for i in ids}
    to_nchw = (lambda a: a.transpose(0, 3, 1, 2)) if fmt == "NXC" else (lambda a: a)
    to_oihw = (lambda a: a.transpose(3, 2, 0, 1)) if fmt == "NXC" else (lambda a: a)
    x = h = to_nchw(f[ids[0]])
    for layer in range(3):
        w, b = f[ids[1 + 2 * layer]], f[ids[2 + 2 * layer]]
        k = w.shape[-1] if fmt == "NCX" else w.shape[0]
        h = direct_conv(h, to_oihw(w), pad=k // 2) + b.reshape(1, -1, 1, 1)
        h = np.maximum(h + x if layer == 2 else h, 0)
    return h.transpose(0, 2, 3, 1) if fmt == "NXC" else h


@pytest.mark.parametrize("n,fmt", [(1, "NCX"), (3, "NCX"), (2, "NXC")])
def test_bound_bottleneck_equals_execute_reads_new_values_and_rebinds(n, fmt):
    """A compiled graph's calls run each convolution partition bound (ConvPlan.bind: the
    band kernel's argument lists made once): bit for bit the per-call execute path, the
    float64 reference within the f32 rule; values changed in place are read, another
    array is bound again."""
    graph = _bottleneck(n, fmt=fmt)
    ids = sorted(graph.input_ids)
    feeds = {i: RNG.standard_normal(graph.tensors[i].shape).astype(np.float32) for i in ids}
    y_id = graph.output_ids[0]
    compiled = ga.compile_graph(graph, feeds)
    out = compiled(feeds)[y_id].copy()
    runners = compiled._runners[1]
    assert len(runners) == 3 and not [r for r in runners if hasattr(r, "per_call_work")]
    compiled.run(feeds)  # every step through CompiledPartition.execute
    np.testing.assert_array_equal(out, compiled.produced[y_id].numpy())
    # f32 sums of <= 72 O(1) terms through three layers (the scale-aware f32 rule, as above)
    verdict = compare(_bottleneck_reference(graph, feeds, fmt), out, dt.f32)
    assert verdict.ok, verdict.message
    feeds[ids[0]] *= -0.5  # the same array, new values: the bound steps read them
    got = compiled(feeds)[y_id]
    assert compiled._runners[1] is runners
    verdict = compare(_bottleneck_reference(graph, feeds, fmt), got, dt.f32)
    assert verdict.ok, verdict.message
    other = dict(feeds)
    other[ids[0]] = np.ascontiguousarray(feeds[ids[0]][::-1])  # another array: bound again
    got = compiled(other)[y_id]
    assert compiled._runners[1] is not runners
    verdict = compare(_bottleneck_reference(graph, other, fmt), got, dt.f32)
    assert verdict.ok, verdict.message


def test_bound_int8_conv_with_residual_and_quantize_equals_execute():
    """The int8 form (exact sums, the residual's Dequantize and the Quantize in the epilogue)
    bound: bit for bit the execute path, which the reference comparison above covers."""
    graph = cg.quantized_conv(residual=True, post=("relu",))
    feeds = fill_inputs(graph, 3)
    y_id = graph.output_ids[0]
    compiled = ga.compile_graph(graph, feeds)
    out = compiled(feeds)[y_id].copy()
    assert not [r for r in compiled._runners[1] if hasattr(r, "per_call_work")]
    compiled.run(feeds)
    np.testing.assert_array_equal(out, compiled.produced[y_id].numpy())
    x_id = min(graph.input_ids)
    feeds[x_id][...] = 255 - feeds[x_id]  # new values in place
    want = ga.run_graph(graph, feeds).outputs[y_id]  # execute on the new values
    np.testing.assert_array_equal(compiled(feeds)[y_id], want)


def test_variable_weights_are_not_bound():
    """Weights that may change between calls are prepared per call: no bound form."""
    g = cg.G()
    x = g.input((1, 4, 6, 6))
    w = g.tensor((4, 4, 3, 3), dt.f32)
    g.op(K.ReLU, g.op(K.Convolution, x, w, attrs=cg.conv_attrs()))
    graph = g.done()
    feeds = {i: RNG.standard_normal(graph.tensors[i].shape).astype(np.float32) for i in sorted(graph.input_ids)}
    compiled = ga.compile_graph(graph, feeds)
    first = compiled(feeds)[graph.output_ids[0]].copy()
    assert [getattr(r, "per_call_work", "bound") for r in compiled._runners[1]] == ["plan"]
    feeds[1] *= 2.0  # read again: ReLU(2 conv) = 2 ReLU(conv), exactly (scaling by 2 is exact)
    np.testing.assert_array_equal(compiled(feeds)[graph.output_ids[0]], 2 * first)


@pytest.mark.parametrize("k", [1, 3])
def test_band_whose_f32_sums_overflow_is_redone_in_float64(k):
    """f32 partial sums 3e38 + 3e38 overflow where the float64 sum (3e38 + 3e38 - 3e38)
    is finite: that band is redone with float64 sums rounded once, as the reference;
    the other bands keep their BLAS sums.  1x1 reads the image in place, 3x3 (only the
    centre tap non-zero) the shifted rows."""
    g = cg.G()
    x = g.input((1, 3, 8, 8))
    w = g.tensor((2, 3, k, k), dt.f32, cg.CONST)
    g.op(K.Convolution, x, w, attrs=cg.conv_attrs(pad=k // 2))
    graph = g.done()
    xv = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    xv[0, :, 7, 5] = (3e38, 3e38, -3e38)  # in the last band (rows are split across threads)
    wv = np.zeros((2, 3, k, k), np.float32)
    wv[0, :, k // 2, k // 2] = 1.0
    wv[1, :, k // 2, k // 2] = (0.5, 0.25, 0.125)
    from graph_api.kernels.convolution.conv_plan import build
    from graph_api.kernels.plan import CompileRequest
    request = CompileRequest("conv_post_ops", graph.get_partitions()[0].ops, dict(graph.tensors), [0, 1], [2],
                             graph.fpmath, {})
    got = build(request).run_arrays({0: xv, 1: wv}, {1: wv})[2]
    want = direct_conv(xv.astype(np.float64), wv.astype(np.float64), pad=k // 2).astype(np.float32)
    assert np.isfinite(want).all() and want[0, 0, 7, 5] == np.float32(3e38)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)

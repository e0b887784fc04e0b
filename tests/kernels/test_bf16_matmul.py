"""The bf16 x bf16 -> f32 product on the host's unit (kernels/bf16_matmul.py: AMX
``tdpbf16ps`` or AVX512_BF16 ``vdpbf16ps``) and the MatMul plans that run on it.

Both units multiply bf16 values exactly and sum in f32 (in their own order, subnormals
flushed): each result is within ``K * 2**-24 * sum |a b|`` (+ 2**-126 per flushed term)
of the float64 sum of the same bf16 products.  The bound is asserted tight enough to
catch a wrong tile or a missing step (below 1e-3 of the largest result).  The GEMM tests
run every unit the host can execute; the plan tests run the host's unit (CI runs them
once more with a lower ISA forced, so an AMX host runs the AVX512_BF16 plans too).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api.config import settings
from graph_api.kernels import bf16_matmul
from graph_api.kernels.isa import ISA

UNIT = bf16_matmul.UNIT
needs_unit = pytest.mark.skipif(UNIT is None, reason="needs a bf16 unit, AMX-BF16 or AVX512_BF16 (this target: "
                                + ISA.describe() + ")")
UNITS = [pytest.param("amx_bf16", marks=pytest.mark.skipif(not ISA.amx_bf16, reason="needs AMX-BF16")),
         pytest.param("avx512_bf16", marks=pytest.mark.skipif(not ISA.avx512_bf16, reason="needs AVX512_BF16"))]
PLAN = f"{UNIT}_matmul_epilogue"


def _gemm(unit):
    """The unit's GEMM (the same contract and packed layouts)."""
    if unit == "amx_bf16":
        from graph_api.kernels import amx

        return amx.gemm
    from graph_api.kernels import dpbf16_gemm

    return dpbf16_gemm.gemm


def _bf16(x):
    return x.astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("M,Kd,N", [(1, 32, 32), (16, 32, 16), (33, 70, 45), (70, 1100, 97), (300, 64, 40),
                                   (600, 300, 70)])
def test_gemm_within_the_f32_bound_of_the_float64_sum(unit, M, Kd, N):
    """Odd shapes (edge blocks), K over one K chunk (sums kept between chunks), M over
    one row chunk (two, 600 rows)."""
    from graph_api.kernels import amx

    rng = np.random.default_rng(M * 7 + N)
    a = rng.standard_normal((M, Kd)).astype(np.float32)
    b = rng.standard_normal((Kd, N)).astype(np.float32)
    c = np.full((M, N), np.nan, np.float32)
    _gemm(unit)(amx.pack_a(a), amx.pack_b(amx.bf16_bits(b)), c, Kd)
    a64, b64 = _bf16(a).astype(np.float64), _bf16(b).astype(np.float64)
    exact = a64 @ b64
    bound = Kd * 2.0 ** -24 * (np.abs(a64) @ np.abs(b64)) + Kd * 2.0 ** -126
    assert np.all(np.abs(c - exact) <= bound)
    assert bound.max() < 1e-3 * np.abs(exact).max()


@pytest.mark.parametrize("unit", UNITS)
def test_gemm_uses_the_bf16_values_not_the_f32_ones(unit):
    """A is rounded to bf16 by the packing: the product equals the rounded operands' one."""
    from graph_api.kernels import amx

    a = np.full((16, 32), 1 + 2 ** -12, np.float32)  # rounds to 1.0 in bf16
    b = np.ones((32, 16), np.float32)
    c = np.empty((16, 16), np.float32)
    _gemm(unit)(amx.pack_a(a), amx.pack_b(amx.bf16_bits(b)), c, 32)
    assert np.all(c == 32.0)


def _linear(M, Kd, N, mode, const=True, dtype=dt.f32, post=K.ReLU):
    g = ga.Graph(ga.EngineKind.cpu, ga.FPMathMode[mode])
    prop = ga.PropertyType.constant if const else ga.PropertyType.variable
    x = ga.LogicalTensor(0, dtype, [2, M, Kd])
    w = ga.LogicalTensor(1, dtype, [N, Kd], property=prop)
    bias = ga.LogicalTensor(2, dtype, [N])
    y = ga.LogicalTensor(3, dtype, [2, M, N])
    z = ga.LogicalTensor(4, dtype, [2, M, N])
    g.add_op(ga.Op(0, K.MatMul, [x, w, bias], [y], attrs={"transpose_b": True}))
    g.add_op(ga.Op(1, post, [y], [z]))
    g.finalize()
    rng = np.random.default_rng(M + Kd + N)
    npdt = ga.dtypes.numpy_dtype(dtype)
    feeds = {0: rng.standard_normal((2, M, Kd)).astype(npdt), 1: rng.standard_normal((N, Kd)).astype(npdt),
             2: rng.standard_normal(N).astype(npdt)}
    return g, feeds


def _run(graph, feeds, reference=False):
    old = settings.reference
    settings.reference = reference
    try:
        return ga.run_graph(graph, feeds)
    finally:
        settings.reference = old


@needs_unit
@pytest.mark.parametrize("mode", ["bf16", "any"])
@pytest.mark.parametrize("const", [True, False], ids=["const_w", "var_w"])
def test_fpmath_bf16_linear_layer_runs_on_the_unit_and_matches_the_reference(mode, const):
    """Under bf16 the reference rounds both operands to bf16 and sums in float64: the
    unit's plan multiplies the same bf16 values, so only the f32 summation differs."""
    g, feeds = _linear(37, 200, 70, mode, const)
    got = _run(g, feeds)
    assert [r.compiled.plan.name for r in got.partitions] == [PLAN]
    ref = _run(g, feeds, reference=True).outputs[4]
    x64 = _bf16(feeds[0]).astype(np.float64)
    w64 = _bf16(feeds[1]).astype(np.float64)
    bound = 200 * 2.0 ** -24 * (np.abs(x64) @ np.abs(w64).T) + 2.0 ** -23 * np.abs(ref)
    assert np.all(np.abs(got.outputs[4] - ref) <= bound)
    again = _run(g, feeds).outputs[4]  # the packed constant weights are reused
    assert np.array_equal(again, got.outputs[4])


@needs_unit
def test_strict_f32_stays_on_blas():
    g, feeds = _linear(37, 200, 70, "strict")
    assert [r.compiled.plan.name for r in _run(g, feeds).partitions] == ["blas_matmul_epilogue"]


@needs_unit
def test_bf16_typed_graph_runs_on_the_unit_in_every_mode():
    """bf16 tensors are bf16 values in every mode (no rounding is implied)."""
    g, feeds = _linear(20, 64, 48, "strict", dtype=dt.bf16)
    got = _run(g, feeds)
    assert [r.compiled.plan.name for r in got.partitions] == [PLAN]
    ref = _run(g, feeds, reference=True).outputs[4].astype(np.float64)
    # one bf16 rounding of the output apart at most (the f32 sums differ by < 2**-20)
    assert np.all(np.abs(got.outputs[4].astype(np.float64) - ref) <= 2.0 ** -7 * np.abs(ref) + 1e-6)


@needs_unit
def test_rows_whose_f32_sums_overflow_are_redone_in_float64():
    """Products near f32's range: the f32 sum overflows part-way where the float64 sum
    (the reference's) ends finite; those rows are redone in float64, rounded once."""
    g, feeds = _linear(3, 64, 32, "bf16", post=K.Abs)
    x = feeds[0]
    x[0, 0, :] = 0
    x[0, 0, 0], x[0, 0, 1] = 2.0 ** 64, -(2.0 ** 64)
    w = feeds[1]
    w[:, 0], w[:, 1] = 2.0 ** 64, 2.0 ** 64  # 2**128 - 2**128: overflows in f32, 0 in float64
    got = _run(g, feeds).outputs[4]
    ref = _run(g, feeds, reference=True).outputs[4]
    assert np.all(np.isfinite(got[0, 0])) and np.array_equal(got[0, 0], ref[0, 0])


@needs_unit
def test_gated_mlp_with_bf16_operands_runs_its_products_on_the_unit(monkeypatch):
    """The gated MLP's dense linear layers (bf16 tensors: bf16 operands in every mode)
    multiply on the bf16 unit; the result is the reference's within bf16's tolerance."""
    from graph_api.check import compare
    from tests.patterns import graphs

    calls = []
    real = bf16_matmul.gemm
    monkeypatch.setattr(bf16_matmul, "gemm", lambda *a, **k: (calls.append(a[2].shape), real(*a, **k))[1])
    graph = graphs.gated_mlp(dtype=dt.bf16, m=40, k=64, n=96)
    rng = np.random.default_rng(5)
    feeds = {tid: (rng.standard_normal(lt.shape) * 0.5).astype(ml_dtypes.bfloat16)
             for tid, lt in graph.tensors.items() if tid in graph.input_ids}
    got = _run(graph, feeds)
    assert [r.partition.get_kind() for r in got.partitions] == ["gated_mlp"]
    assert calls[-3:] == [(40, 96), (40, 96), (40, 64)], calls  # gate, up and down (after the compile's warm-up run)
    ref = _run(graph, feeds, reference=True)
    for tid in graph.output_ids:
        verdict = compare(ref.outputs[tid], got.outputs[tid], graph.tensors[tid].dtype, graph.fpmath)
        assert verdict.ok, verdict.message

"""Static int8/u8 MatMul on the exact integer GEMM (kernels/fused/qmatmul_plan.py).

Two independent checks:

* Without a Quantize tail and without post-ops the plan's f32 output is
  ``f32(exact_integer_sum * src_scale * wei_scale[n])`` (+ the bias in f32):
  computed here with Python integers (int64), it must match bit for bit —
  that is what "exact integer GEMM" promises, on the int8 (VNNI) GEMM and
  on every K-chunking path of the BLAS one.
* With post-ops and a Quantize tail the result is compared with the numpy
  reference (``GRAPH_API_REFERENCE``): the reference sums the f32-rounded
  dequantized values in f64, so the f32 value before requantization differs
  by at most ~2**-24 relative per term; a quantized output may therefore be
  off by one where the value lies that close to a .5 boundary, which is rare:
  at most 1% of the outputs, never more than one.
"""
from __future__ import annotations

import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import constant_cache
from graph_api import OpKind as K
from graph_api.config import settings
from tests.patterns.builder import G

CONST = ga.PropertyType.constant
CONSTANTS = constant_cache.CACHE


def _qattrs(scales, zps, axis=1):
    qtype = "per_tensor" if len(scales) == 1 else "per_channel"
    zps = list(zps) * len(scales) if len(zps) == 1 else zps  # one zero point per scale
    return {"qtype": qtype, "axis": axis, "scales": [float(s) for s in scales],
            "zps": [int(z) for z in zps]}


def _graph(src_dt, wei_dt, m, k, n, *, src_zp=0, wei_zps=(0,), wei_scales=(0.25,), batch=(),
           transpose_b=False, bias=True, post=(), quant=None, wei_quant=False, wei_const=True):
    """Dequantize(src), Dequantize(W) -> MatMul [+ bias] -> post-ops -> [Quantize]."""
    g = G()
    src = g.input(batch + (m, k), src_dt)
    x = g.op(K.Dequantize, src, dtype=dt.f32, attrs=_qattrs([0.5], [src_zp], axis=len(batch) + 1))
    wshape = (n, k) if transpose_b else (k, n)
    naxis = 0 if transpose_b else 1
    if wei_quant:
        wf = g.input(wshape, dt.f32, CONST)
        w_int = g.op(K.Quantize, wf, dtype=wei_dt, attrs=_qattrs(wei_scales, wei_zps, naxis))
        feeds_w = wf
    else:
        w_int = feeds_w = g.input(wshape, wei_dt, CONST if wei_const else ga.PropertyType.variable)
    w = g.op(K.Dequantize, w_int, dtype=dt.f32, attrs=_qattrs(wei_scales, wei_zps, naxis))
    ins = [x, w]
    b = g.input((n,), dt.f32, CONST) if bias else None
    if bias:
        ins.append(b)
    y = g.op(K.MatMul, *ins, attrs={"transpose_b": transpose_b})
    for p in post:
        if p == "relu":
            y = g.op(K.ReLU, y)
        elif p == "gelu":
            y = g.op(K.GELU, y)
        elif p == "add":
            y = g.op(K.Add, y, g.input(batch + (m, n)))
    if quant is not None:
        qdt, qs, qz = quant
        g.op(K.Quantize, y, dtype=qdt, attrs=_qattrs(qs, qz, axis=len(batch) + 1))
    return g.done(), src, feeds_w, b


def _feeds(graph, src_dt, wei_dt, seed, wei_quant=False):
    rng = np.random.default_rng(seed)
    feeds = {}
    for lt in graph.get_input_ports():
        if lt.dtype in (dt.u8, dt.s8):  # the full integer range
            lo, hi = (0, 256) if lt.dtype == dt.u8 else (-128, 128)
            feeds[lt.id] = rng.integers(lo, hi, lt.shape).astype(np.uint8 if lt.dtype == dt.u8 else np.int8)
        else:
            feeds[lt.id] = (rng.standard_normal(lt.shape) * (40 if wei_quant else 1)).astype(np.float32)
    return feeds


def _run(graph, feeds, reference=False):
    old = settings.reference
    settings.reference = reference
    try:
        run = ga.run_graph(graph, feeds)
    finally:
        settings.reference = old
    (out_id,) = graph.output_ids
    return run, np.array(run.outputs[out_id])


CASES = {
    # id: (src dtype, wei dtype, m, k, n, keyword arguments)
    "u8s8_zp": (dt.u8, dt.s8, 5, 24, 12, dict(src_zp=128)),
    "s8s8": (dt.s8, dt.s8, 4, 32, 8, {}),
    "u8u8_zps": (dt.u8, dt.u8, 3, 16, 8, dict(src_zp=7, wei_zps=(100,))),
    "per_channel_wei": (dt.u8, dt.s8, 6, 40, 10, dict(src_zp=3, wei_scales=tuple(0.01 * (i + 1) for i in range(10)))),
    "per_channel_zps_tb": (dt.s8, dt.u8, 4, 20, 6, dict(wei_zps=tuple(range(120, 126)),
                                                        wei_scales=tuple(0.1 + 0.01 * i for i in range(6)),
                                                        transpose_b=True)),
    "batched_src": (dt.u8, dt.s8, 7, 24, 8, dict(src_zp=9, batch=(2, 3))),
    "k_chunks": (dt.u8, dt.s8, 3, 1100, 5, dict(src_zp=200)),  # 2**24/(200*128) = 655: 2 chunks
    "k_f64": (dt.u8, dt.u8, 2, 1400, 3, dict(src_zp=255, wei_zps=(0,))),  # 2**24/255**2 = 258: f64 GEMM
    # a variable weight: its bound comes from the type (255 * 128), 514 terms per chunk
    "variable_wei_chunks": (dt.u8, dt.s8, 3, 600, 4, dict(src_zp=0, wei_const=False)),
    # 34000 * 255 * 255 > 2**31: beyond the int8 GEMM's int32 sums, the f64 GEMM runs
    "k_beyond_int32": (dt.u8, dt.u8, 2, 34000, 3, dict(src_zp=0, wei_zps=(0,))),
}
#: the cases the int8 GEMM (kernels/igemm.py) does not serve: the f32/f64 BLAS path runs
BLAS_PATH = {"k_beyond_int32"}


@pytest.mark.parametrize("name", CASES)
def test_integer_sum_is_exact(name):
    src_dt, wei_dt, m, k, n, kw = CASES[name]
    graph, src, w, b = _graph(src_dt, wei_dt, m, k, n, **kw)
    feeds = _feeds(graph, src_dt, wei_dt, 1)
    run, got = _run(graph, feeds)
    plan = run.partitions[0].compiled.plan
    assert plan.name == "int_gemm_epilogue"
    from graph_api.kernels import igemm  # without VNNI every case takes the exact f32/f64 BLAS path

    assert (plan.int8_zb is None) == (name in BLAS_PATH or not igemm.HAVE_VNNI)
    a = feeds[src.id].astype(np.int64) - kw.get("src_zp", 0)
    wz = np.asarray(kw.get("wei_zps", (0,)), np.int64)
    wq = feeds[w.id].astype(np.int64)
    wi = wq - (wz[:, None] if kw.get("transpose_b") and wz.size > 1 else wz)
    wi = wi.T if kw.get("transpose_b") else wi
    exact = np.matmul(a, wi)  # int64: exact
    scale = np.float64(np.float32(0.5)) * np.asarray(kw.get("wei_scales", (0.25,)), np.float32).astype(np.float64)
    want = (exact * scale).astype(np.float32) + feeds[b.id]
    assert got.dtype == np.float32 and np.array_equal(got, want)


#: output scales ~ 3 standard deviations of the f32 result over the integer range
#: (sum of K products of ~74-sized centred integers times the scales), so few saturate
QUANT_CASES = {
    "u8_out_zp_relu": (dt.u8, dt.s8, dict(src_zp=128, post=("relu",), quant=(dt.u8, [40.0], [10]))),
    "s8_out_gelu_add": (dt.u8, dt.s8, dict(src_zp=5, post=("gelu", "add"), quant=(dt.s8, [100.0], [0]))),
    "per_channel_out": (dt.s8, dt.s8, dict(wei_scales=tuple(0.01 * (i + 1) for i in range(16)),
                                           quant=(dt.s8, [4.5 * (i + 1) for i in range(16)], [0] * 16))),
    "wei_quant": (dt.u8, dt.s8, dict(src_zp=1, wei_quant=True, wei_scales=(0.5,), quant=(dt.u8, [240.0], [128]))),
    "no_bias_k_chunks": (dt.u8, dt.s8, dict(src_zp=128, bias=False, post=("relu",), quant=(dt.u8, [210.0], [0]))),
}


@pytest.mark.parametrize("name", QUANT_CASES)
def test_requantized_output_matches_the_reference(name):
    src_dt, wei_dt, kw = QUANT_CASES[name]
    k = 700 if "chunks" in name else 48
    graph, *_ = _graph(src_dt, wei_dt, 9, k, 16, **kw)
    feeds = _feeds(graph, src_dt, wei_dt, 2, wei_quant=kw.get("wei_quant", False))
    run, got = _run(graph, feeds)
    assert run.partitions[0].compiled.plan.name == "int_gemm_epilogue"
    _, want = _run(graph, feeds, reference=True)
    assert got.dtype == want.dtype == np.dtype(np.uint8 if kw["quant"][0] == dt.u8 else np.int8)
    diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
    assert diff.max() <= 1 and np.count_nonzero(diff) <= 0.01 * diff.size
    assert len(np.unique(want)) > 10  # the outputs are not all saturated


def test_typecast_between_dequantize_and_matmul_is_refused():
    """x8x8x_tc: bf16-rounded dequantized values are not integers times one scale."""
    from tests.patterns import graphs

    graph = graphs.quantized_matmul(bf16=True)
    run = ga.run_graph(graph, _feeds(graph, dt.u8, dt.s8, 3))
    # bf16 operands after the TypeCasts: the bf16 unit's plan where the host has one, else f32 BLAS
    assert run.partitions[0].compiled.plan.name.startswith(("blas_matmul_epilogue", "amx_bf16_matmul_epilogue",
                                                            "avx512_bf16_matmul_epilogue"))


def test_constant_weight_is_prepared_once_and_follows_a_new_buffer():
    graph, src, w, b = _graph(dt.u8, dt.s8, 4, 16, 8, src_zp=3)
    feeds = _feeds(graph, dt.u8, dt.s8, 4)
    plan = ga.run_graph(graph, feeds).partitions[0].compiled.plan
    first = CONSTANTS.entries_of(plan.wei)
    assert first
    assert ga.run_graph(graph, feeds).partitions[0].compiled.plan is plan  # the compiled-partition cache
    assert all(a is b for (_, a), (_, b) in zip(CONSTANTS.entries_of(plan.wei), first))  # not prepared again
    feeds2 = dict(feeds)
    feeds2[w.id] = (-feeds[w.id].astype(np.int16)).clip(-128, 127).astype(np.int8)
    _, got = _run(graph, feeds2)
    # the new buffer has its own entry; the first weight's entry is not touched
    assert len(CONSTANTS.entries_of(plan.wei)) == 2 * len(first)
    _, want = _run(graph, feeds2, reference=True)
    # f32 outputs: the reference's f64 sum of f32-rounded products vs the exact sum, ~2**-24 relative
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())

"""SDPA partitions on the Numba attention plan (kernels/sdpa/plan.py).

Each graph runs fused and unfused (debug policy, reference ops); outputs must
agree under graph_api.check's rule for the graph's fpmath (f32 strict: the
strict rule), and the fused partition must have taken ``numba_sdpa`` — or,
for the cases the plan refuses, the reference plan with the expected reason.
"""
from pathlib import Path

import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api import fill
from graph_api.check import compare
from graph_api.kernels.sdpa import plan as sdpa_plan

HS = ga.PropertyType.host_scalar
NAME = lambda d: d.name  # noqa: E731  (test ids)
INT_RANGE = {dt.s4: (-8, 7), dt.u4: (0, 15), dt.s8: (-128, 127), dt.u8: (0, 255)}
MHA = Path(__file__).resolve().parents[1] / "data" / "onednn-graphs" / "complex_fusion" / "mha"


class Builder:
    """Op-by-op graph construction with random feeds (fixed seed)."""

    def __init__(self, fpmath="strict", apply_to_int=False, seed=3):
        self.g = ga.Graph(ga.EngineKind.cpu, fpmath, apply_to_int)
        self.next_t, self.next_op, self.feeds = 100, 0, {}
        self.rng = np.random.default_rng(seed)

    def lt(self, dtype, shape, strides=None, prop=ga.PropertyType.variable):
        self.next_t += 1
        return ga.LogicalTensor(self.next_t, dtype, shape, strides, property=prop)

    def input(self, dtype, shape, values=None, strides=None, prop=ga.PropertyType.variable):
        lt = self.lt(dtype, shape, strides, prop)
        if values is None:
            values = self.rng.standard_normal(shape)
        self.feeds[lt.id] = ga.dtypes.convert(np.asarray(values), dtype)
        return lt

    def scalar(self, value, dtype=dt.f32, host=True):
        if host:
            return self.input(dtype, (), np.asarray(value), prop=HS)
        return self.input(dtype, [1], np.full(1, value))

    def op(self, kind, inputs, out_dtype, out_shape, n_out=1, **attrs):
        self.next_op += 1
        outs = [self.lt(out_dtype, out_shape)]
        if n_out == 2:
            outs.append(self.lt(dt.f32, tuple(out_shape[:-1]) + (1,)))
        self.g.add_op(ga.Op(self.next_op, kind, inputs, outs, attrs=attrs))
        return outs[0] if n_out == 1 else outs

    def compressed(self, wdt, shape, d_axis, group=32, zps=False, strides=None, scale_dt=dt.f32):
        """DynamicDequantize of int data of logical ``shape`` grouped along ``d_axis``."""
        lo, hi = INT_RANGE[wdt]
        data = self.input(wdt, shape, self.rng.integers(lo, hi + 1, shape), strides)
        gs = [1] * len(shape)
        gs[d_axis] = group
        s_shape = tuple(n // g for n, g in zip(shape, gs))
        ins = [data, self.input(scale_dt, s_shape, self.rng.uniform(0.02, 0.06, s_shape))]
        if zps:
            zp = self.rng.integers(max(lo, 0), min(hi, 15) + 1, s_shape)
            ins.append(self.input(wdt, s_shape, zp))
        return self.op(K.DynamicDequantize, ins, scale_dt, shape, qtype="per_group", group_shape=gs)


def attention(b, *, dtype=dt.f32, B=1, Hq=4, Hkv=None, Sq=4, S=40, D=32, five_d=False,
              scale="mul", scale_host=True, mask=None, k_int=None, v_int=None, k_store="sd",
              zps=False, group=32, out=None, softmax_dt=None, sm_mode="inf_as_zero", stats=False,
              softcap=False, dropout=False):
    """Q K^T -> [scale] -> [masks] -> SoftMax -> @ V -> [transpose + reshape].

    ``k_store``: "sd" K [.., S, D] with transpose_b; "ds" K [.., D, S] dense;
    "ds_strided" K [.., D, S] stored [.., S, D] (the conformance int4 layout).
    ``mask``: None, "add", "causal_tl", "causal_br", "select", "pre_select".
    """
    Hkv = Hkv or Hq
    lead_q = (B, Hkv, Hq // Hkv) if five_d else (B, Hq)
    lead_k = (B, Hkv, 1) if five_d else (B, Hkv)
    r = len(lead_q) + 2
    q = b.input(dtype, lead_q + (Sq, D))
    k_shape = lead_k + ((S, D) if k_store == "sd" else (D, S))
    k_strides = None
    if k_store == "ds_strided":
        dense = ga.logical_tensor.dense_strides(lead_k + (S, D))
        k_strides = dense[:-2] + (1, D)
    if k_int:
        k = b.compressed(k_int, k_shape, -1 if k_store == "sd" else -2, group, zps, k_strides)
        if dtype != dt.f32:
            k = b.op(K.TypeCast, [k], dtype, k_shape)
    else:
        k = b.input(dtype, k_shape, strides=k_strides)
    scores_shape = lead_q + (Sq, S)
    x = b.op(K.MatMul, [q, k], dt.f32, scores_shape, transpose_b=k_store == "sd")
    if mask == "pre_select":
        keep = np.tril(np.ones((Sq, S), bool), S - Sq)
        cond = b.input(dt.boolean, (1,) * (r - 2) + (Sq, S), keep.reshape((1,) * (r - 2) + (Sq, S)))
        x = b.op(K.Select, [cond, x, b.scalar(-np.inf, host=False)], dt.f32, scores_shape)
    if scale:
        value = 1 / np.sqrt(D) if scale == "mul" else np.sqrt(D)
        sc = b.scalar(value, host=scale_host)
        x = b.op(K.Multiply if scale == "mul" else K.Divide, [x, sc], dt.f32, scores_shape)
    if softcap:
        t = b.op(K.Tanh, [x], dt.f32, scores_shape)
        x = b.op(K.Multiply, [t, b.scalar(2.0, host=False)], dt.f32, scores_shape)
    if mask in ("causal_tl", "causal_br"):
        row = b.op(K.GenIndex, [x], dt.s32, scores_shape, axis=-2)
        col = b.op(K.GenIndex, [x], dt.s32, scores_shape, axis=-1)
        if mask == "causal_br":
            row = b.op(K.Add, [row, b.scalar(S, dt.s32)], dt.s32, scores_shape)
            row = b.op(K.Subtract, [row, b.scalar(Sq, dt.s32)], dt.s32, scores_shape)
        ge = b.op(K.GreaterEqual, [row, col], dt.boolean, scores_shape)
        x = b.op(K.Select, [ge, x, b.scalar(-np.inf, host=False)], dt.f32, scores_shape)
    if mask == "add":
        m_shape = (B,) + (1,) * (r - 3) + (Sq, S)
        values = b.rng.standard_normal(m_shape)
        values[b.rng.random(m_shape) < 0.2] = -np.inf
        values[..., :1] = 0.0  # no row fully masked
        x = b.op(K.Add, [x, b.input(dt.f32, m_shape, values)], dt.f32, scores_shape)
    if mask == "select":
        c_shape = (1,) * (r - 1) + (S,)
        cond = b.input(dt.boolean, c_shape, np.broadcast_to(np.arange(S) < S - 3, c_shape))
        x = b.op(K.Select, [cond, x, b.scalar(-np.inf, host=False)], dt.f32, scores_shape)
    sm_dt = softmax_dt or dtype
    p = b.op(K.SoftMax, [x], sm_dt, scores_shape, n_out=2 if stats else 1, axis=-1, mode=sm_mode)
    if stats:
        p = p[0]
    if dropout:
        p = b.op(K.Dropout, [p, b.scalar(7, dt.s64), b.scalar(1, dt.s64), b.scalar(0.5)], sm_dt, scores_shape)
    if sm_dt != dtype:
        p = b.op(K.TypeCast, [p], dtype, scores_shape)
    v_shape = lead_k + (S, D)
    if v_int:
        v = b.compressed(v_int, v_shape, -1, group, zps)
        if dtype != dt.f32:
            v = b.op(K.TypeCast, [v], dtype, v_shape)
    else:
        v = b.input(dtype, v_shape)
    o_shape = lead_q + (Sq, D)
    o = b.op(K.MatMul, [p, v], dtype, o_shape)
    if out:
        o = b.op(K.StaticTranspose, [o], dtype, (B, Sq, Hq, D), order=[0, 2, 1, 3])
        o = b.op(K.StaticReshape, [o], dtype, (B, Sq, Hq * D), shape=[B, Sq, Hq * D], special_zero=False)
    return o


def run(b, expect="numba_sdpa"):
    """Fused vs debug; returns the fused GraphRun."""
    b.g.finalize()
    fused = ga.run_graph(b.g, b.feeds)
    names = [r.compiled.plan.name for r in fused.partitions if r.partition.pattern_name]
    assert names == [expect], names
    debug = ga.run_graph(b.g, b.feeds, policy=ga.PartitionPolicy.debug)
    for tid in b.g.output_ids:
        verdict = compare(debug.outputs[tid], fused.outputs[tid], b.g.tensors[tid].dtype, b.g.fpmath)
        assert verdict.ok, verdict.message
    return fused


def refusal(b) -> str:
    """The reason the plan gives for the graph's one fused partition."""
    b.g.finalize()
    fused = ga.run_graph(b.g, b.feeds)
    (compiled,) = [r.compiled for r in fused.partitions if r.partition.pattern_name]
    assert compiled.plan.name.startswith("per_op_fast")  # unfused: each op on its fast plan
    reason = sdpa_plan.build(compiled.request)
    assert isinstance(reason, str)
    return reason


# ---------------------------------------------------------------- plain SDPA
@pytest.mark.parametrize("dtype", [dt.f32, dt.bf16, dt.f16], ids=NAME)
@pytest.mark.parametrize("scale,host", [("mul", True), ("div", False)])
def test_plain_sdpa_dtypes_and_scales(dtype, scale, host):
    b = Builder()
    attention(b, dtype=dtype, scale=scale, scale_host=host, mask="add")
    run(b)


@pytest.mark.parametrize("scale,host", [("div", True), ("mul", False), (None, False)])
def test_f32_scale_forms_and_no_scale(scale, host):
    b = Builder()
    attention(b, scale=scale, scale_host=host, Sq=3, S=19)
    run(b)


@pytest.mark.parametrize("mask", ["causal_tl", "causal_br"])
@pytest.mark.parametrize("sq,s", [(7, 7), (5, 37), (9, 5), (64, 64)])
def test_implicit_causal_mask(mask, sq, s):
    b = Builder()
    attention(b, mask=mask, Sq=sq, S=s, Hq=2)
    run(b)


def test_causal_alignment_matches_the_kernel_flag():
    """bottom_right with s_kv - s_q == S - Sq uses the kernel flag; top-left too."""
    for mask, flag in (("causal_tl", "top_left"), ("causal_br", "bottom_right")):
        b = Builder()
        attention(b, mask=mask, Sq=3, S=11, Hq=2)
        b.g.finalize()
        (part,) = [p for p in b.g.get_partitions() if p.pattern_name]
        cp = ga.run_graph(b.g, b.feeds).partitions[0].compiled
        core = cp.plan.core.core
        inputs = {tid: ga.Tensor(cp.lts[tid], None, b.feeds[tid]) if cp.lts[tid].property != HS
                  else ga.make_scalar_tensor(cp.lts[tid], b.feeds[tid]) for tid in cp.request.input_ids}
        _, causal, _ = core._masks(inputs, 1.0)
        assert causal == flag


@pytest.mark.parametrize("mask", ["select", "pre_select"])
def test_boolean_masks_as_additive_masks(mask):
    b = Builder()
    attention(b, mask=mask, Sq=6, S=21, scale="div")
    run(b)


def test_output_transpose_and_reshape():
    b = Builder()
    attention(b, out=True, mask="add", Sq=5, S=33)
    run(b)


def test_decode_and_prefill_shapes():
    for sq, s in ((1, 300), (64, 96)):
        b = Builder()
        attention(b, Sq=sq, S=s, D=64, Hq=2, mask="add")
        run(b)


# ---------------------------------------------------------------- GQA / MQA
@pytest.mark.parametrize("dtype", [dt.f32, dt.bf16], ids=NAME)
def test_5d_gqa(dtype):
    b = Builder()
    attention(b, dtype=dtype, five_d=True, Hq=4, Hkv=2, Sq=3, S=50, mask="add")
    run(b)


def test_4d_mqa_and_5d_mqa():
    b = Builder()
    attention(b, Hq=4, Hkv=1, Sq=2, S=45)
    run(b)
    b = Builder()
    attention(b, five_d=True, Hq=4, Hkv=1, Sq=1, S=45, mask="causal_br")
    run(b)


def test_kv_broadcast_over_batch_and_heads():
    b = Builder()
    q, k, v = b.input(dt.f32, (2, 3, 4, 16)), b.input(dt.f32, (1, 1, 9, 16)), b.input(dt.f32, (1, 1, 9, 16))
    x = b.op(K.MatMul, [q, k], dt.f32, (2, 3, 4, 9), transpose_b=True)
    p = b.op(K.SoftMax, [x], dt.f32, (2, 3, 4, 9), axis=-1)
    b.op(K.MatMul, [p, v], dt.f32, (2, 3, 4, 16))
    run(b)


def test_4d_gqa_written_with_reshapes():
    b = Builder()
    B, hq, hkv, S, D = 2, 4, 2, 24, 16
    rep = hq // hkv
    q = b.op(K.StaticReshape, [b.input(dt.f32, (B, hq, S, D))], dt.f32, (B, hkv, rep, S, D),
             shape=[B, hkv, rep, S, D], special_zero=False)
    k = b.op(K.StaticReshape, [b.input(dt.f32, (B, hkv, S, D))], dt.f32, (B, hkv, 1, S, D),
             shape=[B, hkv, 1, S, D], special_zero=False)
    x = b.op(K.MatMul, [q, k], dt.f32, (B, hkv, rep, S, S), transpose_b=True)
    x = b.op(K.Multiply, [x, b.scalar(0.25, host=False)], dt.f32, (B, hkv, rep, S, S))
    m = b.op(K.StaticReshape, [b.input(dt.f32, (B, 1, S, S))], dt.f32, (B, 1, 1, S, S),
             shape=[B, 1, 1, S, S], special_zero=False)
    x = b.op(K.Add, [x, m], dt.f32, (B, hkv, rep, S, S))
    p = b.op(K.SoftMax, [x], dt.f32, (B, hkv, rep, S, S), axis=-1)
    v = b.op(K.StaticReshape, [b.input(dt.f32, (B, hkv, S, D))], dt.f32, (B, hkv, 1, S, D),
             shape=[B, hkv, 1, S, D], special_zero=False)
    o = b.op(K.MatMul, [p, v], dt.f32, (B, hkv, rep, S, D))
    b.op(K.StaticReshape, [o], dt.f32, (B, hq, S, D), shape=[B, hq, S, D], special_zero=False)
    b.g.finalize()
    assert [p.get_kind() for p in b.g.get_partitions()] == ["sdpa_gqa"]
    run(b)


# ---------------------------------------------------------------- compressed K / V
@pytest.mark.parametrize("wdt,zps", [(dt.s4, False), (dt.u4, True), (dt.s8, False), (dt.u8, True)],
                         ids=["s4", "u4-zps", "s8", "u8-zps"])
@pytest.mark.parametrize("k_store", ["sd", "ds", "ds_strided"])
def test_compressed_kv_kinds_and_k_layouts(wdt, zps, k_store):
    b = Builder()
    attention(b, k_int=wdt, v_int=wdt, zps=zps, k_store=k_store, Sq=2, S=70, D=64, Hq=2, mask="add")
    run(b)


@pytest.mark.parametrize("sq", [1, 64])
def test_compressed_gqa_decode_and_prefill(sq):
    b = Builder()
    attention(b, five_d=True, Hq=4, Hkv=2, Sq=sq, S=96, D=64, k_int=dt.u4, v_int=dt.u4, zps=True,
              k_store="ds_strided", mask="causal_br")
    run(b)


def test_compressed_k_only_and_v_only():
    for k_int, v_int in ((dt.s8, None), (None, dt.s4)):
        b = Builder()
        attention(b, dtype=dt.f16, k_int=k_int, v_int=v_int, Sq=4, S=64, D=64, Hq=2, mask="add")
        run(b)


@pytest.mark.parametrize("dtype", [dt.bf16, dt.f16], ids=NAME)
def test_compressed_kv_half_precision_with_casts(dtype):
    b = Builder()
    attention(b, dtype=dtype, k_int=dt.s4, v_int=dt.u4, zps=True, k_store="ds_strided",
              Sq=3, S=64, D=32, Hq=2, mask="add")
    run(b)


# ---------------------------------------------------------------- fpmath
@pytest.mark.parametrize("mode,apply,fast", [("strict", False, True), ("bf16", True, True),
                                             ("bf16", False, True), ("tf32", True, True),
                                             ("f16", True, False)])
def test_fpmath_modes_on_a_bf16_graph_with_int_kv(mode, apply, fast):
    """bf16 Q; int K/V dequantized in f32 then cast to bf16 (the kernel rounds them,
    rnd=bf16).  The mode adds the apply_to_int rounding of the dequantized values: a
    no-op after the bf16 cast, a second rounding under f16 (refused)."""
    b = Builder(mode, apply)
    attention(b, dtype=dt.bf16, k_int=dt.s4, v_int=dt.u4, zps=True, k_store="ds_strided",
              Sq=4, S=64, D=64, Hq=2, mask="add")
    if fast:
        run(b)
    else:
        assert "rounded twice" in refusal(b)


@pytest.mark.parametrize("mode", ["bf16", "f16", "tf32"])
def test_f32_probabilities_under_a_rounding_mode_take_the_reference(mode):
    b = Builder(mode, True)
    attention(b, k_int=dt.s4, v_int=dt.s4, Sq=2, S=64, D=64, Hq=2)
    assert "rounds the f32 probabilities" in refusal(b)
    b = Builder(mode, True)
    attention(b, k_int=dt.s4, v_int=dt.s4, Sq=2, S=64, D=64, Hq=2)
    run(b, expect="per_op_fast")


def test_bf16_mode_without_apply_to_int_is_refused_for_int_kv():
    b = Builder("bf16", False)
    attention(b, k_int=dt.s4, v_int=dt.s4, Sq=2, S=64, D=64, Hq=2)
    assert "different fpmath roundings" in refusal(b)


# ---------------------------------------------------------------- SoftMax modes and masked rows
@pytest.mark.parametrize("mode", ["inf_as_zero", "none"])
def test_fully_masked_rows(mode):
    b = Builder()
    o = attention(b, Sq=4, S=20, Hq=2, sm_mode=mode, mask="add")
    mask_id = next(op.inputs[1].id for op in b.g.get_ops() if op.kind == K.Add)
    b.feeds[mask_id][:, :, 1, :] = -np.inf
    fused = run(b)
    rows = fused.outputs[o.id][:, :, 1, :]
    assert np.all(rows == 0) if mode == "inf_as_zero" else np.all(np.isnan(rows))


def test_a_finite_select_fill_runs_the_reference_at_execute(monkeypatch):
    from graph_api.config import settings

    b = Builder()
    o = attention(b, mask="select", Sq=3, S=16)
    fill_id = [op for op in b.g.get_ops() if op.kind == K.Select][0].inputs[2].id
    b.feeds[fill_id] = np.full(1, -5.0, np.float32)
    fused = run(b)
    monkeypatch.setattr(settings, "reference", True)  # the unfused ops on the reference plan
    debug = ga.run_graph(b.g, b.feeds, policy=ga.PartitionPolicy.debug)
    assert np.array_equal(fused.outputs[o.id], debug.outputs[o.id])


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("knob,reason", [
    (dict(softcap=True), "soft-capping"),
    (dict(dropout=True, softmax_dt=dt.f32, dtype=dt.bf16), "Dropout"),
    (dict(softmax_dt=dt.bf16), "coarser than the f32 output"),
])
def test_refused_partitions_run_unfused(knob, reason):
    b = Builder()
    attention(b, Sq=2, S=16, **knob)
    assert reason in refusal(b)


def test_refusals_still_match_the_unfused_ops():
    b = Builder()
    attention(b, Sq=2, S=16, softcap=True)
    run(b, expect="per_op_fast")


def test_non_scalar_scale_is_refused():
    b = Builder()
    q, k, v = b.input(dt.f32, (1, 2, 4, 16)), b.input(dt.f32, (1, 2, 8, 16)), b.input(dt.f32, (1, 2, 8, 16))
    x = b.op(K.MatMul, [q, k], dt.f32, (1, 2, 4, 8), transpose_b=True)
    x = b.op(K.Multiply, [x, b.input(dt.f32, (1, 2, 1, 1))], dt.f32, (1, 2, 4, 8))
    p = b.op(K.SoftMax, [x], dt.f32, (1, 2, 4, 8), axis=-1)
    b.op(K.MatMul, [p, v], dt.f32, (1, 2, 4, 16))
    assert "one value" in refusal(b)


# ---------------------------------------------------------------- conformance file
def test_conformance_int4_kv_file():
    path = MHA / "sdpa-compressed-kv-int4-gs32.json"
    assert path.exists(), f"{path}: the conformance graphs are test data of the repository"
    g = ga.load(path)
    feeds = fill.fill_inputs(g, fill.SEED)
    fused = ga.run_graph(g, feeds)
    assert [r.compiled.plan.name for r in fused.partitions] == ["numba_sdpa"]
    expected = fill.reference_arrays(g, feeds)
    for tid in g.output_ids:
        verdict = compare(expected[tid], fused.outputs[tid], g.tensors[tid].dtype, g.fpmath)
        assert verdict.ok, verdict.message


"""SDPA family members on the attention kernel (kernels/sdpa/plan.py).

* Training forward: SoftMax's stats output (``max + ln(sum exp(s - max))``) from the
  kernel's row max and sum, against the unfused reference (graph_api.check rule)
  and a float64 formula with an error bound.
"""
import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api.check import compare
from graph_api.config import settings

from .test_fused_sdpa import Builder, attention
from .test_fused_sdpa import run as run_vs_single_ops


def run(b, expect="numba_sdpa"):
    """The fused partition against the unfused fast single-op plans and against the
    composed reference (graph_api.check's rule on every output); the fused GraphRun."""
    fused = run_vs_single_ops(b, expect)
    old = settings.reference
    settings.reference = True
    try:
        ref = ga.run_graph(b.g, b.feeds, policy=ga.PartitionPolicy.debug)
    finally:
        settings.reference = old
    for tid in b.g.output_ids:
        verdict = compare(ref.outputs[tid], fused.outputs[tid], b.g.tensors[tid].dtype, b.g.fpmath)
        assert verdict.ok, verdict.message
    return fused


def _softmax_op(b):
    (op,) = [op for op in b.g.get_ops() if op.kind == K.SoftMax]
    return op


def _stats_f64(b, D, scale=None, mask_id=None):
    """Exact stats of an ``attention(k_store="sd")`` graph from its f32 feeds, and the
    bound of the kernel's error: each f32 score is within (D + 2) eps of its terms'
    magnitude (D FMAs, the scale, the mask add) and logsumexp moves by at most the
    largest score error; the f32 sum of exp32 values (<= 2 ulp each) over S terms adds
    (S + 4) eps to ln(sum); the f32 result one more rounding."""
    mm = [op for op in b.g.get_ops() if op.kind == K.MatMul][0]
    q = b.feeds[mm.inputs[0].id].astype(np.float64)
    k = b.feeds[mm.inputs[1].id].astype(np.float64)
    s = q @ np.swapaxes(k, -1, -2)
    terms = np.abs(q) @ np.swapaxes(np.abs(k), -1, -2)
    if scale is not None:
        s, terms = s * scale, terms * abs(scale)
    if mask_id is not None:
        mask = b.feeds[mask_id].astype(np.float64)
        s = s + mask
        terms = terms + np.where(np.isfinite(mask), np.abs(mask), 0)
    eps = 2.0 ** -24
    with np.errstate(invalid="ignore", divide="ignore"):
        m = s.max(axis=-1, keepdims=True)
        exact = m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True))
    bound = (D + 2) * eps * terms.max(axis=-1, keepdims=True) + (s.shape[-1] + 4) * eps \
        + 2 * eps * np.abs(exact)
    return exact, bound


@pytest.mark.parametrize("sq,s,d,dtype", [
    (40, 64, 32, dt.f32),   # the f32 prefill kernel (sdpa.prefill)
    (3, 300, 32, dt.f32),   # decode-sized: the tiled kernel, KV split over items
    (20, 70, 24, dt.f32),   # D not a multiple of 16: the scalar kernel
    (12, 50, 32, dt.bf16),  # bf16 Q/K/V: the tiled kernel
], ids=["prefill", "split", "scalar", "bf16"])
def test_training_forward_stats(sq, s, d, dtype):
    b = Builder()
    attention(b, dtype=dtype, Sq=sq, S=s, D=d, mask="add", stats=True, Hq=2)
    fused = run(b)  # every output (attention and stats) against the reference
    stats_id = _softmax_op(b).outputs[1].id
    got = fused.outputs[stats_id]
    assert got.shape == (1, 2, sq, 1) and got.dtype == np.float32
    if dtype == dt.f32:
        mask_id = [op for op in b.g.get_ops() if op.kind == K.Add][0].inputs[1].id
        exact, bound = _stats_f64(b, d, scale=1 / np.sqrt(d), mask_id=mask_id)
        assert np.all(np.abs(got - exact) <= bound)


@pytest.mark.parametrize("mode", ["inf_as_zero", "none"])
@pytest.mark.parametrize("sq", [12, 3])  # prefill kernel / tiled kernel
def test_stats_of_rows_the_causal_mask_hides(mode, sq):
    """Bottom-right causal with more queries than keys: the first rows see no key;
    their stats are -inf (inf_as_zero) or NaN (none), as the reference gives."""
    b = Builder()
    attention(b, Sq=sq, S=sq - 2, D=32, Hq=2, mask="causal_br", stats=True, sm_mode=mode)
    fused = run(b)
    got = fused.outputs[_softmax_op(b).outputs[1].id][0, 0, :, 0]
    dead = got[:2]
    assert np.all(np.isneginf(dead)) if mode == "inf_as_zero" else np.all(np.isnan(dead))
    assert np.all(np.isfinite(got[2:]))


def test_stats_of_5d_gqa_and_compressed_kv_decode():
    b = Builder()
    attention(b, five_d=True, Hq=4, Hkv=2, Sq=2, S=64, D=32, mask="causal_br", stats=True)
    run(b)
    b = Builder()
    attention(b, Sq=2, S=96, D=64, k_int=dt.u8, v_int=dt.s8, zps=True, stats=True)
    run(b)  # the int8 decode kernel has no stats: the tiled kernel runs


def test_stats_with_half_precision_scores_are_refused():
    b = Builder()
    q, k, v = (b.input(dt.bf16, (1, 2, 4, 16)), b.input(dt.bf16, (1, 2, 8, 16)),
               b.input(dt.bf16, (1, 2, 8, 16)))
    x = b.op(K.MatMul, [q, k], dt.bf16, (1, 2, 4, 8), transpose_b=True)
    p, _ = b.op(K.SoftMax, [x], dt.bf16, (1, 2, 4, 8), n_out=2, axis=-1)
    b.op(K.MatMul, [p, v], dt.bf16, (1, 2, 4, 16))
    from .test_fused_sdpa import refusal
    assert "before the f32 stats" in refusal(b)


# ---------------------------------------------------------------- JAX MHA
def jax_mha(b, *, B=2, H=3, Sq=20, S=48, D=32, v_transposed=True, dtype=dt.f32):
    """oneDNN's float_sdp_jax form: O^T = V^T (softmax(Q K / scale + mask))^T, then
    [B, H, D, Sq] -> transpose [0, 3, 1, 2] -> reshape [B, Sq, H, D]."""
    q = b.input(dtype, (B, H, Sq, D))
    k = b.input(dtype, (B, H, D, S))
    x = b.op(K.MatMul, [q, k], dt.f32, (B, H, Sq, S))
    x = b.op(K.Divide, [x, b.scalar(np.sqrt(D), host=False)], dt.f32, (B, H, Sq, S))
    mask = b.rng.standard_normal((B, 1, 1, S))
    mask[..., -3:] = -np.inf
    x = b.op(K.Add, [x, b.input(dt.f32, (B, 1, 1, S), mask)], dt.f32, (B, H, Sq, S))
    p = b.op(K.SoftMax, [x], dtype, (B, H, Sq, S), axis=3)
    p = b.op(K.StaticTranspose, [p], dtype, (B, H, S, Sq), order=[0, 1, 3, 2])
    p = b.op(K.Reorder, [p], dtype, (B, H, S, Sq))
    if v_transposed:
        o = b.op(K.MatMul, [b.input(dtype, (B, H, D, S)), p], dtype, (B, H, D, Sq))
    else:
        o = b.op(K.MatMul, [b.input(dtype, (B, H, S, D)), p], dtype, (B, H, D, Sq), transpose_a=True)
    o = b.op(K.StaticTranspose, [o], dtype, (B, Sq, H, D), order=[0, 3, 1, 2])
    return b.op(K.StaticReshape, [o], dtype, (B, Sq, H, D), shape=[B, Sq, H, D], special_zero=False)


@pytest.mark.parametrize("v_transposed", [True, False], ids=["vT", "v_transpose_a"])
@pytest.mark.parametrize("sq,dtype", [(20, dt.f32), (3, dt.f32), (20, dt.bf16)], ids=["prefill", "decode", "bf16"])
def test_jax_mha_on_the_attention_kernel(sq, dtype, v_transposed):
    b = Builder()
    out = jax_mha(b, Sq=sq, dtype=dtype, v_transposed=v_transposed)
    fused = run(b)
    assert [r.partition.get_kind() for r in fused.partitions] == ["sdpa_jax"]
    if dtype == dt.f32:  # float64 attention, bounded by the f32 rule's scale-aware 2e-5
        ops = b.g.get_ops()
        q, k = (b.feeds[t.id].astype(np.float64) for t in ops[0].inputs)
        mask = b.feeds[ops[2].inputs[1].id].astype(np.float64)
        vt = b.feeds[ops[6].inputs[0].id].astype(np.float64)
        v = np.swapaxes(vt, -1, -2) if v_transposed else vt
        s = q @ k / np.sqrt(q.shape[-1]) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        o = (p / p.sum(-1, keepdims=True)) @ v
        want = o.transpose(0, 2, 1, 3)
        got = fused.outputs[out.id]
        assert np.all(np.abs(got - want) <= 2e-5 * (np.abs(want) + np.abs(want).max()))


def test_mqa_jax_stays_unfused():
    """graphs.jax_mqa normalises the probabilities over one axis (SoftMax axis 3) and
    contracts pv_matmul over the other (the rows of the transposed+reshaped P): not
    the kernel's softmax(s) v, so no attention plan is registered for it."""
    from tests.patterns import graphs

    g = graphs.jax_mqa()
    (part,) = [p for p in g.get_partitions() if p.is_supported()]
    assert part.get_kind() == "mqa_jax"
    from graph_api.fill import fill_inputs

    run_ = ga.run_graph(g, fill_inputs(g, 0), partitions=[part])
    assert run_.partitions[0].compiled.plan.name.startswith("per_op")


# ---------------------------------------------------------------- static-quantized SDPA
def quantized_sdpa(b, *, B=2, H=2, Sq=40, S=48, D=32, qdt=dt.u8, zp=0, p_scale=1 / 64,
                   mask="add", final_quant=True, v_identity=False, bf16=False):
    """x8_sdpa: Dequantize(Q, K, V) -> f32 attention with Quantize -> Dequantize of the
    probabilities -> [transpose + Reorder] -> [Quantize].  Q/K/V per-tensor scale 0.125,
    zero point ``zp`` (none for f8); ``v_identity``: V = I (S = D) so the output is the
    dequantized quantized probabilities themselves; ``bf16``: the int8-bf16 form (Q/K/V,
    scores, SoftMax and P·V in bf16, TypeCasts around the probability quantization and
    before the final Quantize)."""
    cdt = dt.bf16 if bf16 else dt.f32
    f8 = qdt in (dt.f8_e4m3, dt.f8_e5m2)
    lo, hi = (0, 255) if qdt == dt.u8 else (-128, 127)

    def qattrs(scale, z):
        return dict(qtype="per_tensor", axis=1, scales=[scale]) if f8 else \
            dict(qtype="per_tensor", axis=1, scales=[scale], zps=[z])

    def deq(shape, values=None):
        if values is None and f8:
            values = b.rng.uniform(-24, 24, shape)
        elif values is None:
            values = b.rng.integers(max(lo, zp - 24), min(hi, zp + 24) + 1, shape)
        x = b.input(qdt, shape, values)
        x = b.op(K.Dequantize, [x], dt.f32, shape, **qattrs(0.125, zp))
        return b.op(K.TypeCast, [x], dt.bf16, shape) if bf16 else x

    q, k = deq((B, H, Sq, D)), deq((B, H, S, D))
    x = b.op(K.MatMul, [q, k], cdt, (B, H, Sq, S), transpose_b=True)
    if mask == "gpt":  # Select before the scale, -inf fill (the int8 GPT form)
        keep = np.tril(np.ones((Sq, S), bool), S - Sq).reshape(1, 1, Sq, S)
        x = b.op(K.Select, [b.input(dt.boolean, (1, 1, Sq, S), keep), x,
                            b.input(cdt, (1,), np.full(1, -np.inf))], cdt, (B, H, Sq, S))
    x = b.op(K.Divide, [x, b.scalar(np.sqrt(D), host=False)], cdt, (B, H, Sq, S))
    if mask == "add":
        m = np.zeros((B, 1, 1, S))
        m[..., S - 5:] = -np.inf
        m[..., :S - 5] = b.rng.standard_normal((B, 1, 1, S - 5))
        x = b.op(K.Add, [x, b.input(cdt, (B, 1, 1, S), m)], cdt, (B, H, Sq, S))
    p = b.op(K.SoftMax, [x], cdt, (B, H, Sq, S), axis=-1)
    if bf16:
        p = b.op(K.TypeCast, [p], dt.f32, (B, H, Sq, S))
    p = b.op(K.Quantize, [p], qdt, (B, H, Sq, S), **qattrs(p_scale, zp))
    p = b.op(K.Dequantize, [p], dt.f32, (B, H, Sq, S), **qattrs(p_scale, zp))
    if bf16:
        p = b.op(K.TypeCast, [p], dt.bf16, (B, H, Sq, S))
    if v_identity:
        v = deq((B, H, S, D), np.broadcast_to(zp + 8 * np.eye(S, D, dtype=np.int64), (B, H, S, D)))
    else:
        v = deq((B, H, S, D))
    o = b.op(K.MatMul, [p, v], cdt, (B, H, Sq, D))
    o = b.op(K.StaticTranspose, [o], cdt, (B, Sq, H, D), order=[0, 2, 1, 3])
    o = b.op(K.Reorder, [o], cdt, (B, Sq, H, D))
    if bf16:
        o = b.op(K.TypeCast, [o], dt.f32, (B, Sq, H, D))
    if final_quant:
        o = b.op(K.Quantize, [o], qdt, (B, Sq, H, D), **qattrs(0.0625, zp))
    return o


@pytest.mark.parametrize("qdt,zp", [(dt.u8, 128), (dt.s8, 0), (dt.s8, -3), (dt.f8_e4m3, 0), (dt.f8_e5m2, 0)],
                         ids=["u8zp", "s8", "s8zp", "e4m3", "e5m2"])
@pytest.mark.parametrize("mask", ["add", "gpt"])
@pytest.mark.parametrize("sq", [40, 1], ids=["prefill", "decode"])
@pytest.mark.parametrize("bf16", [False, True], ids=["f32", "int8_bf16"])
def test_quantized_sdpa_on_the_attention_kernel(qdt, zp, mask, sq, bf16):
    b = Builder()
    out = quantized_sdpa(b, Sq=sq, qdt=qdt, zp=zp, mask=mask, bf16=bf16)
    fused = run(b, expect="numba_sdpa_quantized")  # graph_api.check: integers within one unit
    ref = _reference(b)
    got, want = (r.outputs[out.id].astype(np.float64) for r in (fused, ref))
    # one unit where an f32 value lies within summation-order distance of a rounding
    # boundary (the kernel sums the f32 scores and P V in another order than the reference;
    # int8-bf16: also a bf16 score, probability or output next to a bf16 boundary)
    assert (got == want).mean() > 0.99 and len(np.unique(want)) > 3


def _reference(b):
    old = settings.reference
    settings.reference = True
    try:
        return ga.run_graph(b.g, b.feeds, policy=ga.PartitionPolicy.debug)
    finally:
        settings.reference = old


@pytest.mark.parametrize("qdt,zp,p_scale", [(dt.u8, 0, 1 / 255), (dt.s8, -100, 1 / 200), (dt.u8, 3, 0.25),
                                            (dt.f8_e4m3, 0, 1 / 256), (dt.f8_e5m2, 0, 0.25)])
def test_quantized_probabilities_are_the_references(qdt, zp, p_scale):
    """V = identity (8 * 0.125 = 1): the f32 output is the dequantized quantized
    probabilities.  They equal the reference's bit for bit except where the reference's
    ``p / scale + zp`` lies within 1e-4 (relative) of a rounding boundary (the kernel's
    f32 softmax differs from the reference's f64 one by a few ulps), and there by one
    step of the type."""
    b = Builder(seed=5)
    out = quantized_sdpa(b, S=32, D=32, qdt=qdt, zp=zp, p_scale=p_scale, final_quant=False,
                         v_identity=True)
    fused = run(b, expect="numba_sdpa_quantized")
    got = fused.outputs[out.id].astype(np.float64)
    want = _reference(b).outputs[out.id].astype(np.float64)
    # the reference's probabilities in float64, to find the boundary cases
    ops = b.g.get_ops()
    q = (b.feeds[ops[0].inputs[0].id].astype(np.float64) - zp) * 0.125
    k = (b.feeds[ops[1].inputs[0].id].astype(np.float64) - zp) * 0.125
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(32)
    mask = [op for op in ops if op.kind == K.Add][0].inputs[1].id
    s = s + b.feeds[mask]
    e = np.exp(s - s.max(-1, keepdims=True))
    t = (e / e.sum(-1, keepdims=True)) / p_scale + zp
    if qdt in (dt.f8_e4m3, dt.f8_e5m2):  # the boundaries: midpoints of neighbouring f8 values
        f8 = ga.dtypes.numpy_dtype(qdt)
        vals = np.unique(np.arange(256, dtype=np.uint8).view(f8).astype(np.float64))
        vals = vals[np.isfinite(vals)]
        mids = (vals[1:] + vals[:-1]) / 2
        gap = np.abs(t[..., None] - mids).min(-1)
        near = gap <= 1e-4 * np.abs(t)
        step = np.diff(vals).max() * p_scale
    else:
        near = np.abs(t - np.floor(t) - 0.5) < 1e-4
        step = p_scale
    near = near.transpose(0, 2, 1, 3)  # the output is [B, Sq, H, D = S]
    differ = got != want
    assert not (differ & ~near).any()
    assert np.all(np.abs(got - want)[differ] <= step * 1.0000001)
    assert len(np.unique(want)) > 3


@pytest.mark.parametrize("apply_to_int", [False, True])
def test_quantized_sdpa_under_an_fpmath_mode(apply_to_int):
    """docs/fpmath.md: the MatMul operands all come from Dequantize, so fpmath bf16
    rounds them only with apply_to_int; without it the kernel runs, with it the
    plan refuses (each op on its fast plan)."""
    b = Builder(fpmath="bf16", apply_to_int=apply_to_int)
    quantized_sdpa(b, Sq=24, S=40)
    if apply_to_int:
        run_vs_single_ops(b, expect="per_op_fast")
    else:
        run(b, expect="numba_sdpa_quantized")


@pytest.mark.parametrize("knob,reason", [
    (dict(qdt=dt.f8_e4m3, p_scale=1 / 1024), "may leave the f8_e4m3 range"),
])
def test_quantized_forms_the_kernel_refuses(knob, reason):
    from graph_api.kernels.sdpa import plan as sdpa_plan

    b = Builder()
    quantized_sdpa(b, Sq=4, S=16, **knob)
    fused = run_vs_single_ops(b, expect="per_op_fast")
    (compiled,) = [r.compiled for r in fused.partitions]
    assert reason in sdpa_plan.build(compiled.request)


def test_f8_rounding_matches_ml_dtypes():
    """prefill._round_f8 against ml_dtypes' f32 -> f8 conversion (what the
    reference Quantize uses), on random values and every midpoint (the ties)."""
    from graph_api.kernels.numba_setup import numba  # noqa: F401
    import ml_dtypes
    from numba import njit

    from graph_api.kernels.sdpa.prefill import _round_f8

    @njit
    def rounded(x, shift, tiny, quantum):
        out = np.empty_like(x)
        for i in range(x.size):
            out[i] = _round_f8(x[i], np.uint32(shift), tiny, quantum)
        return out

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-5, 5, 20000), rng.uniform(-0.02, 0.02, 20000),
                        2.0 ** rng.uniform(-20, 8, 20000)])
    for f8, mbits, emin, limit in [(ml_dtypes.float8_e4m3fn, 3, -6, 440), (ml_dtypes.float8_e5m2, 2, -14, 57000)]:
        vals = np.unique(np.arange(256, dtype=np.uint8).view(f8).astype(np.float64))
        vals = vals[np.isfinite(vals)]
        xs = np.concatenate([x, (vals[1:] + vals[:-1]) / 2]).astype(np.float32)
        xs = xs[np.abs(xs) < limit]
        got = rounded(xs, 23 - mbits, np.float32(2.0 ** emin), np.float32(2.0 ** (emin - mbits)))
        assert np.array_equal(got, xs.astype(f8).astype(np.float32))


@pytest.mark.parametrize("qdt,zp,p_scale", [(dt.u8, 0, 1 / 255), (dt.s8, 5, 1 / 64)])
def test_int8_bf16_probabilities_match_the_reference(qdt, zp, p_scale):
    """The int8-bf16 form with V = identity: the output is the bf16 dequantized quantized
    probabilities.  The kernel rounds scores, SoftMax output and dequantized
    probabilities to bf16 where the reference does; it sums the f32 scores in another
    order than the reference's float64 MatMul, so a score (or a probability) within
    that distance of a bf16 boundary may round the other way: at most one probability
    step, and rarely (< 1% of the values; measured 0 here)."""
    b = Builder(seed=7)
    out = quantized_sdpa(b, S=32, D=32, qdt=qdt, zp=zp, p_scale=p_scale, final_quant=False,
                         v_identity=True, bf16=True)
    fused = run(b, expect="numba_sdpa_quantized")
    got, want = (r.outputs[out.id].astype(np.float64) for r in (fused, _reference(b)))
    differ = got != want
    assert differ.mean() < 0.01 and len(np.unique(want)) > 3
    assert np.all(np.abs(got - want)[differ] <= p_scale * 1.01)

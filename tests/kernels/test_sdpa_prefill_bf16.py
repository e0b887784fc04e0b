"""The bf16 attention prefill on the bf16 unit (kernels/sdpa/prefill_bf16.py) vs a float64
formula, and the SDPA partitions that run it.

Error bound per output element (bf16 Q/K/V: the kernel's products are exact):
  * the probabilities enter ``P V`` rounded to bf16: <= 2**-8 relative each (8 significant
    bits), so ``2**-8 * sum_j p_j |v_j|`` (the reference's bf16 SoftMax output rounds as much);
  * f32 score sums of D exact products: ``|ds| <= D * 2**-24 * sum_d |q_d k_d| * scale``,
    which moves each probability by at most ``2 |ds|`` relative (exp32's 2 ulp are
    inside the margin);
  * f32 sums of S products in ``P V`` and of the exponentials: ``2 * S * 2**-24`` relative.
A wrong mask, row, head or panel is an O(1) error, far above it.
"""
import ml_dtypes
import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api.config import settings
from graph_api.kernels import sdpa as SD
from graph_api.kernels.isa import ISA
from graph_api.kernels.sdpa import prefill_bf16

pytestmark = pytest.mark.skipif(not prefill_bf16.AVAILABLE, reason="needs AVX512_BF16 (this target: "
                                + ISA.describe() + ")")
BF16 = ml_dtypes.bfloat16

CASES = [  # B, Hq, Hkv, Sq, S, D
    (2, 4, 4, 64, 64, 32),    # the BERT shape (smaller batch)
    (1, 4, 2, 37, 70, 64),    # GQA, query block tail, S not a multiple of 32
    (1, 2, 1, 40, 130, 128),  # MQA, several score panels
    (1, 2, 2, 100, 33, 32),   # more queries than keys
]


def _formula(q, k, v, scale, mask, causal):
    """(float64 attention of the bf16 values, the bound of the module docstring)."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, 1), np.repeat(v, rep, 1)
    Sq, S, D = q.shape[2], k.shape[2], q.shape[3]
    s = q @ k.swapaxes(-1, -2) * scale
    if mask is not None:
        s = s + mask
    if causal:
        off = S - Sq if causal == "bottom_right" else 0
        s = np.where(np.arange(S)[None] <= np.arange(Sq)[:, None] + off, s, -np.inf)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
    ds = D * 2.0 ** -24 * (np.abs(q) @ np.abs(k).swapaxes(-1, -2)).max(-1, keepdims=True) * abs(scale)
    bound = (2.0 ** -8 + 2 * ds + 2 * S * 2.0 ** -24) * (p @ np.abs(v)) + 1e-30
    return p @ v, bound


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mask_shape", [None, "b11s", "bhqs"])
@pytest.mark.parametrize("causal", [None, "top_left", "bottom_right"])
def test_prefill_matches_float64(case, mask_shape, causal):
    B, Hq, Hkv, Sq, S, D = case
    rng = np.random.default_rng(abs(hash(case + (mask_shape, causal))) % 2**32)
    q = rng.standard_normal((B, Hq, Sq, D)).astype(BF16)
    k = rng.standard_normal((B, Hkv, S, D)).astype(BF16)
    v = rng.standard_normal((B, Hkv, S, D)).astype(BF16)
    mask = {None: None, "b11s": (B, 1, 1, S), "bhqs": (B, Hq, Sq, S)}[mask_shape]
    if mask is not None:
        mask = rng.standard_normal(mask).astype(np.float32)
        mask[..., -S // 8:] = -1e4  # BERT's padding
    assert prefill_bf16.usable(D, S, Sq)
    K, V = SD.KV(k, "bf16", k.shape), SD.KV(v, "bf16", v.shape)
    for scale, mode in ((0.125, "mul"), (np.sqrt(D), "div")):
        o = SD.sdpa(q, K, V, scale=scale, scale_mode=mode, mask=mask, causal=causal, bf16_probs=True)
        want, bound = _formula(q, k, v, scale if mode == "mul" else 1 / scale, mask, causal)
        live = np.isfinite(want)  # bottom_right with Sq > S hides whole rows: NaN in both
        assert np.array_equal(live, np.isfinite(o)), (scale, mode)
        assert np.all(np.abs(o[live] - want[live]) <= bound[live]), (scale, mode)


def test_probabilities_round_to_bf16_only_when_the_graph_does():
    """Without ``bf16_probs`` the same operands run the f32 kernel (f32 probabilities):
    its result is closer to the float64 one than the bf16 bound allows the unit's."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 64, 64)).astype(BF16) for _ in range(3))
    K, V = SD.KV(k, "bf16", k.shape), SD.KV(v, "bf16", v.shape)
    want, _ = _formula(q, k, v, 0.125, None, None)
    f32 = SD.sdpa(q, K, V, scale=0.125)
    unit = SD.sdpa(q, K, V, scale=0.125, bf16_probs=True)
    assert np.abs(f32 - want).max() < 1e-5 < np.abs(unit - want).max()


def _sdpa_graph(B, H, S, D, dtype=dt.bf16, mode="strict"):
    """oneDNN's SDPA (scale Multiply, causal mask added, SoftMax, all tensors ``dtype``)."""
    g = ga.Graph(ga.EngineKind.cpu, ga.FPMathMode[mode])
    lt, K_ = ga.LogicalTensor, ga.OpKind
    shp = [B, H, S, D]
    q, k, v = lt(0, dtype, shp), lt(1, dtype, shp), lt(2, dtype, shp)
    scale, mask = lt(3, dtype, [1]), lt(4, dtype, [1, 1, S, S])
    s1, s2, s3, p, o = (lt(i, dtype, [B, H, S, S] if i < 9 else shp) for i in (5, 6, 7, 8, 9))
    g.add_op(ga.Op(0, K_.MatMul, [q, k], [s1], attrs={"transpose_b": True}))
    g.add_op(ga.Op(1, K_.Multiply, [s1, scale], [s2]))
    g.add_op(ga.Op(2, K_.Add, [s2, mask], [s3]))
    g.add_op(ga.Op(3, K_.SoftMax, [s3], [p], attrs={"axis": -1}))
    g.add_op(ga.Op(4, K_.MatMul, [p, v], [o]))
    g.finalize()
    return g


@pytest.mark.parametrize("dtype,mode", [(dt.bf16, "strict"), (dt.f32, "bf16")], ids=["bf16_graph", "f32_under_bf16"])
def test_sdpa_partition_runs_the_unit_kernel_within_the_check_tolerance(dtype, mode, monkeypatch):
    """A bf16 graph (its SoftMax output is bf16) and an f32 graph under fpmath bf16 (the
    mode rounds Q, K, V and the probabilities entering the MatMuls): both run the unit
    kernel, within the check's tolerance of the reference under the graph's mode."""
    from graph_api.check import compare

    calls = []
    real = prefill_bf16.prefill_items
    monkeypatch.setattr(prefill_bf16, "prefill_items",
                        lambda *a: (calls.append(1), real(*a))[1])
    B, H, S, D = 1, 4, 96, 64
    g = _sdpa_graph(B, H, S, D, dtype, mode)
    rng = np.random.default_rng(1)
    npdt = ga.dtypes.numpy_dtype(dtype)
    causal = np.triu(np.full((S, S), -np.inf, np.float32), 1)[None, None]
    feeds = {0: rng.standard_normal((B, H, S, D)).astype(npdt), 1: rng.standard_normal((B, H, S, D)).astype(npdt),
             2: rng.standard_normal((B, H, S, D)).astype(npdt), 3: np.array([D ** -0.5], npdt),
             4: causal.astype(npdt)}
    got = ga.run_graph(g, feeds)
    assert [r.partition.get_kind() for r in got.partitions] == ["sdpa"], got.partitions
    assert [r.compiled.plan.name for r in got.partitions] == ["numba_sdpa"]
    assert calls, "the bf16 unit kernel did not run"
    old = settings.reference
    settings.reference = True
    try:
        ref = ga.run_graph(g, feeds)
    finally:
        settings.reference = old
    verdict = compare(ref.outputs[9], got.outputs[9], dtype, g.fpmath)
    assert verdict.ok, verdict.message

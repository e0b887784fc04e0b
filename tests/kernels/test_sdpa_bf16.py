"""Compressed SDPA decode under fpmath bf16 (``vdpbf16ps``) vs float64 attention.

Reference: float64 attention on the bf16-rounded query and the exactly
dequantized K/V ((n - z) * s).  The kernel's error bound (derived in the
``graph_api.kernels.sdpa.decode_bf16`` docstring), per output element (r, d):

* ``2^-8 * sum_s P[s] |v[s, d]|``: each probability times V scale is rounded to
  bf16 once (relative error <= 2^-8, the bf16 unit roundoff);
* ``2 max|v| * ds``: a score error ds moves the softmax weights by ~ds relative;
  ds <= scale * sum_g s_g[s] * 70 u * (off + 15 + max z) * sum_{d in g} |q_d|
  (u = 2^-24; per group ~32 f32 sums plus the Q_g sum and two FMAs on values up to
  that size; ``off`` the int4 encoding offset, <= 24 for K);
* ``130 u (ntiles * max|v| + (ovl + 15 + max z) * max sv)``: the f32 P.V sums of
  each tile (128 roundings on values up to the running output plus the offset
  term; ``ovl`` <= 136 the V low-nibble offset), and ``1e-6 max|v|`` for the merge.

A wrong scale group, a lost zero point or a misplaced nibble moves results by a
whole quantization step or more, far outside this bound.
"""
import ml_dtypes
import numpy as np
import pytest

from graph_api.kernels import sdpa as SD
from graph_api.kernels.sdpa import decode_bf16 as SB
from graph_api.kernels.bits import RND_BF16

from .test_fast_sdpa import pack4

U = 2.0 ** -24
needs_bf16 = pytest.mark.skipif(not SB.HAVE_BF16, reason="CPU without AVX512_BF16")


def bf16(x):
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def kv_operand(kind, B, H, S, D, G, transposed, zps, rng):
    """(KV, dequantized logical [B, H, S, D] float64, scales [B, H, S, D/G], zps or 0)."""
    lo, hi = {"s4": (-8, 7), "u4": (0, 15), "s8": (-128, 127), "u8": (0, 255)}[kind]
    n = rng.integers(lo, hi + 1, size=(B, H, S, D))
    s = (rng.random((B, H, S, D // G)) * 0.1 + 0.05).astype(np.float32)
    z = rng.integers(lo, hi + 1, size=s.shape).astype(np.float32) if zps else None
    deq = (n - (0 if z is None else np.repeat(z, G, -1))) * np.repeat(s, G, -1).astype(np.float64)
    store = lambda a: np.ascontiguousarray(a.transpose(0, 1, 3, 2)) if transposed else a  # noqa: E731
    data = pack4(store(n)) if kind in ("s4", "u4") else store(n).astype(np.int8 if kind == "s8" else np.uint8)
    kv = SD.KV(data, kind, (B, H, S, D), transposed, G, store(s), None if z is None else store(z))
    return kv, deq, s, (0 if z is None else z)


def reference(q, kd, vd, scale, mask, causal):
    """float64 attention -> (out, normalized probabilities P)."""
    B, Hq, Sq, D = q.shape
    rep = Hq // kd.shape[1]
    S = kd.shape[2]
    k, v = np.repeat(kd, rep, 1), np.repeat(vd, rep, 1)
    s = q.astype(np.float64) @ k.transpose(0, 1, 3, 2) * scale
    if mask is not None:
        s = s + mask
    if causal:
        s = np.where(np.arange(S)[None] > np.arange(Sq)[:, None] + (S - Sq), -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p @ v, p


def bound(q, kd, vd, ks, kz, vs, vz, G, P, scale, kind):
    """The error bound of the module docstring, per output element."""
    B, Hq, Sq, D = q.shape
    Hkv, S = kd.shape[1], kd.shape[2]
    rep = Hq // Hkv
    four = kind in ("s4", "u4")
    zmax = float(np.max(np.abs(kz))) if np.ndim(kz) else 0.0
    vzmax = float(np.max(np.abs(vz))) if np.ndim(vz) else 0.0
    vmax = float(np.max(np.abs(vd)))
    absv = np.repeat(np.abs(vd), rep, 1)
    qg = np.abs(q.astype(np.float64)).reshape(B, Hq, Sq, D // G, G).sum(-1)       # sum_{d in g} |q|
    sk = np.repeat(ks.astype(np.float64), rep, 1)                                # [B, Hq, S, ng]
    ds = scale * np.einsum("bhig,bhsg->bhis", qg, sk) * 70 * U * ((24 if four else 0) + 15 + zmax)
    score_term = 2 * vmax * ds.max(-1, keepdims=True)
    ntiles = -(-S // SB.DT)
    tile_term = 130 * U * (ntiles * vmax + ((136 if four else 0) + 15 + vzmax) * float(vs.max()))
    return 2.0 ** -8 * (P @ absv) + score_term + tile_term + 1e-6 * vmax


CASES = [  # B, Hq, Hkv, Sq, S, D, G, mask, causal, splits
    (1, 8, 2, 1, 256, 128, 32, False, None, None),     # GQA decode, whole tiles
    (1, 4, 1, 2, 200, 64, 32, True, None, 3),          # MQA, 2 query rows, ragged S, mask, splits
    (2, 6, 2, 3, 390, 64, 32, False, "bottom_right", None),  # batch 2, causal, 3 rows
    (1, 3, 3, 1, 130, 128, 64, True, None, 2),         # MHA (1-row blocks), one position past a tile
    (1, 4, 2, 1, 62, 64, 32, False, None, None),       # shorter than a tile
]


@needs_bf16
@pytest.mark.parametrize("kind", ["s4", "u4", "s8", "u8"])
@pytest.mark.parametrize("case", CASES)
def test_bf16_decode_against_float64(kind, case, monkeypatch):
    B, Hq, Hkv, Sq, S, D, G, use_mask, causal, splits = case
    rng = np.random.default_rng(abs(hash((kind,) + case[:7])) % 2**32)
    zps = kind[0] == "u" or S == 390  # zero points for u4/u8 and one signed case
    K, kd, ks, kz = kv_operand(kind, B, Hkv, S, D, G, True, zps, rng)
    V, vd, vs, vz = kv_operand(kind, B, Hkv, S, D, G, False, zps, rng)
    q = rng.standard_normal((B, Hq, Sq, D)).astype(np.float32)
    mask = rng.standard_normal((1, Hq, Sq, S)).astype(np.float32) if use_mask else None
    calls = []
    real = SB.dec_items
    monkeypatch.setattr(SB, "dec_items", lambda *a: (calls.append(1), real(*a)))
    o = SD.sdpa(q, K, V, scale=0.125, mask=mask, causal=causal, rnd=RND_BF16, kv_splits=splits,
                bf16_dot=True)
    assert calls, "the bf16 decode kernel did not run"
    r, P = reference(bf16(q), kd, vd, 0.125, mask, causal)
    tol = bound(bf16(q), kd, vd, ks, kz, vs, vz, G, P, 0.125, kind)
    err = np.abs(o - r)
    assert np.all(err <= tol), (float(err.max()), float(tol.min()))
    # the bound is not vacuous: it sits well below one bf16 step of max|v| in most places
    assert float(np.median(tol)) < 2.0 ** -7 * float(np.max(np.abs(vd)))


@needs_bf16
def test_scale_division_and_bf16_output():
    rng = np.random.default_rng(5)
    K, kd, ks, kz = kv_operand("u4", 1, 2, 256, 64, 32, True, True, rng)
    V, vd, vs, vz = kv_operand("u4", 1, 2, 256, 64, 32, False, True, rng)
    q = rng.standard_normal((1, 8, 1, 64)).astype(np.float32)
    o = SD.sdpa(q, K, V, scale=8.0, scale_mode="div", rnd=RND_BF16, bf16_dot=True)
    r, P = reference(bf16(q), kd, vd, 1 / 8.0, None, None)
    assert np.all(np.abs(o - r) <= bound(bf16(q), kd, vd, ks, kz, vs, vz, 32, P, 1 / 8.0, "u4"))
    ob = SD.sdpa(q, K, V, scale=8.0, scale_mode="div", rnd=RND_BF16, bf16_dot=True, out_dtype="bf16")
    assert np.array_equal(ob, o.astype(ml_dtypes.bfloat16).view(np.uint16))
    mask = np.zeros((1, 8, 1, 256), np.float32)
    mask[0, 3] = -np.inf  # a row masked everywhere is 0/0 = NaN, as in the f32 kernels
    om = SD.sdpa(q, K, V, scale=8.0, scale_mode="div", mask=mask, rnd=RND_BF16, bf16_dot=True, kv_splits=2)
    assert np.isnan(om[0, 3]).all() and not np.isnan(np.delete(om, 3, axis=1)).any()
    assert np.array_equal(np.delete(om, 3, axis=1), np.delete(SD.sdpa(
        q, K, V, scale=8.0, scale_mode="div", rnd=RND_BF16, bf16_dot=True, kv_splits=2), 3, axis=1))


@pytest.mark.parametrize("kind", ["s4", "u8"])
def test_without_avx512_bf16_the_inputs_are_rounded(kind, monkeypatch):
    """The other path (no AVX512_BF16, or ``bf16_dot`` off): Q and the dequantized K/V
    rounded to bf16, f32 arithmetic: float64 on those rounded values, 1e-5 relative
    (the f32 kernels' bound, tests/kernels/test_fast_sdpa.py)."""
    monkeypatch.setattr(SB, "HAVE_BF16", False)
    monkeypatch.setattr(SB, "dec_items", None)  # must not be reached
    rng = np.random.default_rng(7)
    K, kd, _, _ = kv_operand(kind, 1, 2, 200, 64, 32, True, kind == "u8", rng)
    V, vd, _, _ = kv_operand(kind, 1, 2, 200, 64, 32, False, kind == "u8", rng)
    q = rng.standard_normal((1, 8, 1, 64)).astype(np.float32)
    o = SD.sdpa(q, K, V, scale=0.125, rnd=RND_BF16, bf16_dot=True)
    r, _ = reference(bf16(q), bf16(kd), bf16(vd), 0.125, None, None)
    assert np.max(np.abs(o - r)) <= 1e-5 * np.max(np.abs(r))


@needs_bf16
@pytest.mark.parametrize("k_int", ["s4", "u8"])
def test_graph_under_fpmath_bf16_takes_the_bf16_kernel(k_int, monkeypatch):
    """A GQA decode graph (bf16 Q, int K/V with zero points, K stored [D, S], additive
    mask) under fpmath bf16 + apply_to_int runs this kernel from the SDPA plan and agrees with the debug
    (reference) run under graph_api.check's bf16 rule."""
    from graph_api.dtypes import DataType as dt

    from .test_fused_sdpa import Builder, attention, run

    calls = []
    real = SB.dec_items
    monkeypatch.setattr(SB, "dec_items", lambda *a: (calls.append(1), real(*a)))
    b = Builder("bf16", True)
    attention(b, dtype=dt.bf16, five_d=True, Hq=8, Hkv=2, Sq=1, S=256, D=64, k_int=dt[k_int],
              v_int=dt[k_int], zps=True, k_store="ds", mask="add")
    run(b)
    assert calls, "the plan did not run the bf16 decode kernel"

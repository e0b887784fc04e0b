"""Fast SDPA kernels (plain and int4/int8 K/V) vs a float64 formula.

The reference dequantizes K/V in f32 exactly as the kernel does ((q - z) * s),
then computes attention in float64.  Kernel error: f32 dot products of D terms
(<= D u |q||k|), exp32 (<= 2 ulp), the online-softmax rescaling (a few ulp per
tile) and sums of S terms: with |scores| = O(1) the result error is below
(D + S/T + 16) * u relative to max |out|; we assert 1e-5 relative, well above
that bound for these sizes (D <= 64, S <= 300 -> ~1e-7..1e-6) and far below
any real bug (the int4 quantization error itself is ~1e-1).
"""
import ml_dtypes
import numpy as np
import pytest

from graph_api.kernels import sdpa as SD
from graph_api.kernels import threads
from graph_api.kernels.sdpa import attention, decode_avx2, decode_avx512, merge, operands, widen


def pack4(q):
    f = (np.asarray(q).reshape(-1).astype(np.int16) & 15).astype(np.uint8)
    if f.size % 2:
        f = np.concatenate([f, np.zeros(1, np.uint8)])
    return (f[0::2] | (f[1::2] << 4)).astype(np.uint8)


def quant(x, G, kind, rng):
    sh = x.shape
    D = sh[-1]
    lo, hi = {"s4": (-8, 7), "u4": (0, 15), "s8": (-128, 127), "u8": (0, 255)}[kind]
    q = rng.integers(lo, hi + 1, size=sh)
    s = (rng.random(sh[:-1] + (D // G,)) * 0.1 + 0.05).astype(np.float32)
    z = rng.integers(lo, hi + 1, size=s.shape).astype(np.float32) if kind[0] == "u" else None
    zz = 0 if z is None else np.repeat(z, G, -1)
    deq = ((q - zz) * np.repeat(s, G, -1)).astype(np.float32)
    return q, s, z, deq


def make(kind, x, G, transposed, rng):
    """KV operand for logical x [B,H,S,D] -> (KV, f32 dense values it holds)."""
    if kind in ("f32", "bf16", "f16"):
        xs = x.transpose(0, 1, 3, 2).copy() if transposed else x
        if kind == "f32":
            return SD.KV(xs, "f32", x.shape, transposed), x
        dt = ml_dtypes.bfloat16 if kind == "bf16" else np.float16
        stored = xs.astype(dt)
        return SD.KV(stored.view(np.uint16), kind, x.shape, transposed), \
            x.astype(dt).astype(np.float32)
    q, s, z, deq = quant(x, G, kind, rng)
    if transposed:
        q, s = q.transpose(0, 1, 3, 2), s.transpose(0, 1, 3, 2)
        z = None if z is None else z.transpose(0, 1, 3, 2)
    data = pack4(q) if kind in ("s4", "u4") else q.astype(np.int8 if kind == "s8" else np.uint8)
    return SD.KV(data, kind, x.shape, transposed, G, np.ascontiguousarray(s),
                 None if z is None else np.ascontiguousarray(z)), deq


def ref(q, k, v, scale, mask, causal):
    B, Hq, Sq, D = q.shape
    rep = Hq // k.shape[1]
    S = k.shape[2]
    kk = np.repeat(k, rep, 1).astype(np.float64)
    vv = np.repeat(v, rep, 1).astype(np.float64)
    s = q.astype(np.float64) @ kk.transpose(0, 1, 3, 2) * scale
    if mask is not None:
        s = s + mask
    if causal:
        off = S - Sq if causal == "bottom_right" else 0
        s = np.where(np.arange(S)[None] > np.arange(Sq)[:, None] + off, -np.inf, s)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(-1, keepdims=True)) @ vv


CASES = [  # B, Hq, Hkv, Sq, S, D, G
    (1, 4, 2, 1, 200, 64, 32),   # GQA decode, S not a multiple of the tile
    (2, 4, 1, 3, 130, 32, 32),   # MQA, batch 2, 3 query rows
    (1, 2, 2, 37, 70, 32, 16),   # prefill-ish, query tile tail
    (1, 3, 3, 1, 1, 64, 32),     # length-1 KV
    (1, 2, 1, 1, 301, 32, 32),   # odd S (int4 K transposed: generic path)
]


@pytest.mark.parametrize("kind", ["s4", "u4", "s8", "u8", "f32", "bf16", "f16"])
@pytest.mark.parametrize("case", CASES)
def test_sdpa_kv_kinds(kind, case):
    B, Hq, Hkv, Sq, S, D, G = case
    rng = np.random.default_rng(abs(hash((kind,) + case)) % 2**32)
    x = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    y = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    q = rng.standard_normal((B, Hq, Sq, D)).astype(np.float32)
    for tr, causal, use_mask in ((True, None, True), (False, "bottom_right", False),
                                 (True, "top_left" if Sq <= S else None, False)):
        K, kd = make(kind, x, G, tr, rng)
        V, vd = make(kind, y, G, False, rng)
        mask = rng.standard_normal((1, 1, Sq, S)).astype(np.float32) if use_mask else None
        o = SD.sdpa(q, K, V, scale=0.125, mask=mask, causal=causal)
        r = ref(q, kd, vd, 0.125, mask, causal)
        assert np.max(np.abs(o - r)) <= 1e-5 * np.max(np.abs(r)), (tr, causal)


@pytest.mark.parametrize("kind", ["s4", "u4", "s8", "u8"])
@pytest.mark.parametrize("transposed", [True, False])
def test_widen_ints_is_the_f32_dequantization(kind, transposed):
    """``_widen_ints`` (the prefill's one-time K/V dequantization) gives ``(n - z) * s``
    evaluated in f32, exactly, as [S, D] rows; S odd, so a K stored [D, S] has int4 rows
    that start mid-byte; a range of (batch, head) pairs that starts past the first."""
    B, H, S, D, G = 2, 3, 67, 32, 16
    rng = np.random.default_rng(abs(hash((kind, transposed))) % 2**32)
    x = rng.standard_normal((B, H, S, D)).astype(np.float32)
    K, _ = make(kind, x, G, transposed, rng)
    stored = K.data  # the stored integers, back from the packed layout:
    if kind in ("s4", "u4"):
        nib = np.stack([stored & 15, stored >> 4], -1).reshape(-1)[:B * H * S * D].astype(np.int64)
        if kind == "s4":
            nib = np.where(nib >= 8, nib - 16, nib)
        n = nib.reshape((B, H, D, S) if transposed else (B, H, S, D))
    else:
        n = stored.astype(np.int64)
    sc, zp = K.scales, K.zps
    if transposed:
        n, sc = n.swapaxes(-1, -2), sc.swapaxes(-1, -2)
        zp = None if zp is None else zp.swapaxes(-1, -2)
    want = n.astype(np.float32)
    if zp is not None:
        want = want - np.repeat(zp, G, -1).astype(np.float32)
    want = want * np.repeat(sc, G, -1).astype(np.float32)
    got = widen.widen(K, 1, B * H, (1, B * H - 1, S, D))  # pairs 1 .. 5 of 6
    assert not got.transposed and got.data.dtype == np.float32
    assert np.array_equal(got.data, want.reshape(B * H, S, D)[1:].reshape(1, B * H - 1, S, D))


@pytest.mark.parametrize("kind", ["s4", "u8", "bf16"])
def test_widened_prefill_chunks_stats_and_bf16_out(kind, monkeypatch):
    """Prefill with compressed or bf16 K/V runs the f32 prefill kernel on K/V widened once
    per call (:func:`attention._widened_prefill`), in chunks of at most ``WIDEN_BYTES``: whole,
    a batch at a time and a KV head at a time give the same bits (outputs and stats),
    per-head masks and GQA included; the result meets the module's 1e-5 bound against
    float64; a bf16 output is the f32 result rounded to nearest even."""
    B, Hq, Hkv, Sq, S, D, G = 2, 6, 3, 40, 67, 32, 16
    rng = np.random.default_rng({"s4": 1, "u8": 2, "bf16": 3}[kind])
    x = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    y = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    q = rng.standard_normal((B, Hq, Sq, D)).astype(np.float32)
    K, kd = make(kind, x, G, kind != "bf16", rng)
    V, vd = make(kind, y, G, False, rng)
    mask = rng.standard_normal((B, Hq, Sq, S)).astype(np.float32)
    head = 2 * S * D * 4  # the f32 bytes of one KV head's K and V
    runs = []
    for cap in (attention.WIDEN_BYTES, Hkv * head, head):  # whole, per batch, per KV head
        monkeypatch.setattr(attention, "WIDEN_BYTES", cap)
        stats = np.empty((B, Hq, Sq), np.float32)
        runs.append((SD.sdpa(q, K, V, mask=mask, causal="top_left", stats=stats), stats))
    for o, st in runs[1:]:
        assert np.array_equal(o, runs[0][0]) and np.array_equal(st, runs[0][1])
    r = ref(q, kd, vd, 1 / np.sqrt(D), mask, "top_left")
    assert np.max(np.abs(runs[0][0] - r)) <= 1e-5 * np.max(np.abs(r))
    ob = SD.sdpa(q, K, V, mask=mask, causal="top_left", out_dtype="bf16")
    assert np.array_equal(ob, runs[0][0].astype(ml_dtypes.bfloat16).view(np.uint16))


@pytest.mark.parametrize("okind", [1, 2])
@pytest.mark.parametrize("contiguous", [True, False])
def test_store_out_rounds_to_nearest_even_as_ml_dtypes_and_numpy(okind, contiguous):
    """The kernels' bf16/f16 output store (``_store_out``, one compiled pass) gives the
    bits of ml_dtypes' bf16 and numpy's f16 rounding (nearest even; overflow to inf;
    subnormals; NaN stays NaN), into a fresh, a C-contiguous or a strided ``out``."""
    rng = np.random.default_rng(okind)
    res = (rng.standard_normal((2, 3, 5, 32)) * np.exp2(rng.integers(-30, 30, (2, 3, 5, 32)))).astype(np.float32)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 65519.0, 65520.0, 1e-7, -3e-8, 6e-5,
                        1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 3.4e38, 1e-40], np.float32)
    res.reshape(-1)[:special.size] = special
    want = (res.astype(ml_dtypes.bfloat16) if okind == 1 else res.astype(np.float16)).view(np.uint16)
    nan = np.isnan(res)
    if contiguous:
        out = merge.store_out(res, okind, None)
    else:
        out = np.zeros((2, 3, 5, 64), np.uint16)[..., ::2]
        assert merge.store_out(res, okind, out) is out
    assert out.dtype == np.uint16 and out.shape == res.shape
    wide = (out.astype(np.uint32) << 16).view(np.float32) if okind == 1 else out.view(np.float16)
    assert np.isnan(wide[nan]).all()
    assert np.array_equal(out[~nan], want[~nan])


@pytest.mark.parametrize("qdt", ["bf16", "f16"])
def test_low_precision_q_div_scale_splits_and_out(qdt):
    rng = np.random.default_rng(1)
    B, Hq, Hkv, Sq, S, D, G = 1, 8, 2, 2, 260, 64, 32
    x = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    y = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    dt = ml_dtypes.bfloat16 if qdt == "bf16" else np.float16
    q = rng.standard_normal((B, Hq, Sq, D)).astype(dt)
    K, kd = make("s4", x, G, True, rng)
    V, vd = make("u4", y, G, False, rng)
    mask = rng.standard_normal((B, Hq, Sq, S)).astype(np.float32)
    r = ref(q.astype(np.float32), kd, vd, 1 / 8.0, mask, None)
    for splits in (1, 3, 7):
        o = SD.sdpa(q, K, V, scale=8.0, scale_mode="div", mask=mask, kv_splits=splits)
        assert np.max(np.abs(o - r)) <= 1e-5 * np.max(np.abs(r))
    ob = SD.sdpa(q, K, V, scale=8.0, scale_mode="div", mask=mask, out_dtype="bf16")
    expect = r.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.int32)
    assert np.max(np.abs(ob.astype(np.int32) - expect)) <= 1


def test_fully_masked_rows_and_rounding_mode():
    rng = np.random.default_rng(2)
    B, Hq, Hkv, Sq, S, D = 1, 2, 1, 4, 40, 32
    q = rng.standard_normal((B, Hq, Sq, D)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    # bf16 fpmath on f32 inputs: reference rounds q, k, v to bf16 first
    rb = lambda a: a.astype(ml_dtypes.bfloat16).astype(np.float32)
    o = SD.sdpa(q, SD.KV(k, "f32", k.shape), SD.KV(v, "f32", v.shape), rnd=1)
    r = ref(rb(q), rb(k), rb(v), 1 / np.sqrt(D), None, None)
    assert np.max(np.abs(o - r)) <= 1e-5 * np.max(np.abs(r))


# ---------------------------------------------------------------- compressed decode kernel
# int4/int8 K stored [D, S] and V [S, D], Sq <= 8, D % 64 == 0: the decode kernel
# (``_dec_items``) folds the scales into the products: per group it sums q * n over
# G stored integers n, subtracts z * sum(q) and multiplies by the scale.  Error: the
# f32 sums see terms |q n| up to (max|n| / typical |n - z|) ~ 8x larger than the
# dequantized products, so the score error is a few times G * u * sum|q k| ~ 1e-6
# relative for these sizes; the softmax, the split merge (one f32 exp and division
# per split) and the PV sums add (S/DT + nsplit + 16) ulp.  1e-5 relative to
# max |out| keeps ~3x margin over the worst seen (3.3e-6, u8 with zero points)
# while any indexing or merge bug gives errors of order 1.
DECODE_CASES = [  # B, Hq, Hkv, Sq, S, D, G
    (1, 8, 2, 1, 1000, 128, 32),   # GQA rep 4 (one 4-row block), tail tile of 104
    (1, 6, 1, 2, 520, 64, 64),     # MQA rep 6 x 2 queries = 12 rows: 4-row blocks only
    (2, 6, 2, 1, 260, 128, 128),   # rep 3: three 1-row blocks, G = D (one group)
    (1, 4, 4, 3, 384, 64, 32),     # MHA with 3 query rows, S a multiple of the tile
]


@pytest.mark.parametrize("kind", ["s4", "u4", "s8", "u8"])
@pytest.mark.parametrize("case", DECODE_CASES)
def test_decode_kernel_gqa_groups_and_split_merge(kind, case):
    """Every query head of a group reads its KV head (rows differ per head), and any
    split of the KV length merges (log-sum-exp) to the same attention."""
    B, Hq, Hkv, Sq, S, D, G = case
    rng = np.random.default_rng(abs(hash((kind, "dec") + case)) % 2**32)
    x = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    y = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    q = rng.standard_normal((B, Hq, Sq, D)).astype(np.float32)
    K, kd = make(kind, x, G, True, rng)
    V, vd = make(kind, y, G, False, rng)
    assert attention._decode_ok(SD.KINDS[kind], SD.KINDS[kind], 1, G, G, True, True, D, S, Sq, 0)
    mask = rng.standard_normal((B, 1, Sq, S)).astype(np.float32)
    for splits, causal, m in ((1, None, mask), (2, "bottom_right", None), (3, None, None),
                              (7, "bottom_right", mask)):
        o = SD.sdpa(q, K, V, scale=0.09, mask=m, causal=causal, kv_splits=splits)
        r = ref(q, kd, vd, 0.09, m, causal)
        assert np.max(np.abs(o - r)) <= 1e-5 * np.max(np.abs(r)), (splits, causal)


def _decode_tile_operands(kind, G, zs, nrow, rng, D=128):
    """One full decode tile (DT positions) of int4/int8 K [D, DT] and V [DT, D] for the
    step kernels, as ``_dec_items`` lays them out."""
    T = operands.DT
    four = kind in ("s4", "u4")
    n = D * T
    if four:
        kb = rng.integers(0, 256, n // 2, dtype=np.uint8).view(np.uint16)
        vb = rng.integers(0, 256, n // 2, dtype=np.uint8).view(np.uint16)
    else:
        dt8 = np.int8 if kind == "s8" else np.uint8
        kb = rng.integers(-128 if kind == "s8" else 0, 128 if kind == "s8" else 256, n).astype(dt8)
        vb = rng.integers(-128 if kind == "s8" else 0, 128 if kind == "s8" else 256, n).astype(dt8)
    ng = D // G
    Rp = (nrow + 3) // 4 * 4
    perm = np.empty(T, np.int64)
    for t in range(T):
        c, v, j = t // 64, (t % 64) // 16, t % 16
        perm[t] = 64 * c + (2 * (16 * (v >> 1) + j) + (v & 1) if four else 16 * v + j)
    return dict(kb=kb, vb=vb, ksc=rng.random(ng * T, dtype=np.float32) + 0.5,
                kzp=(rng.integers(0, 16, ng * T).astype(np.float32) if zs else np.zeros(ng * T, np.float32)),
                qb=rng.standard_normal(Rp * D).astype(np.float32),
                qsum=rng.standard_normal(Rp * ng).astype(np.float32),
                W=rng.standard_normal(Rp * ng * T).astype(np.float32),
                zc=rng.standard_normal(Rp * ng).astype(np.float32),
                acc=rng.standard_normal(Rp * D).astype(np.float32),
                alpha=rng.random(Rp, dtype=np.float32), perm=perm, sgn=int(kind in ("s4", "s8")), ng=ng)


@pytest.mark.parametrize("kind,G,zs", [("s4", 32, 0), ("u4", 32, 1), ("u4", 64, 0), ("s8", 16, 0), ("u8", 32, 1)])
def test_decode_step_forms_identical(kind, G, zs):
    """The AVX2 forms of the decode steps (one vector of 16 per pass, from staged tiles
    holding c * n with q and the weights divided by c) sum the same products in the same
    order as the AVX-512 forms (4 vectors per pass, stored bytes): bit-identical score and
    accumulator tiles, 4-row and 1-row, whichever the target runs."""
    rng = np.random.default_rng(abs(hash((kind, G, zs))) % 2**32)
    D, T = 128, operands.DT
    a = _decode_tile_operands(kind, G, zs, 5, rng, D)
    rs = T // 2 if kind in ("s4", "u4") else T
    # positions >= nt (100: a tail tile) have weight 0, as _dweights makes them (the AVX2
    # P V step reads row nt - 1 there instead of skipping: 0 * n adds nothing)
    W = a["W"].reshape(-1, a["ng"], T).copy()
    W[:, :, a["perm"] >= 100] = 0
    a["W"] = W.reshape(-1)
    outs = []
    # the AVX-512 forms read the stored bytes
    sc = np.zeros(8 * T, np.float32)
    acc = a["acc"].copy()
    for c in range(T // 64):
        decode_avx512.scores_4rows(a["kb"], 0, rs, a["sgn"], a["ksc"], 0, T, a["kzp"], zs, G, D, a["qb"], a["qsum"], 0, sc, c)
        decode_avx512.scores_1row(a["kb"], 0, rs, a["sgn"], a["ksc"], 0, T, a["kzp"], zs, G, D, a["qb"], a["qsum"], 4, sc, c)
    decode_avx512.pv_4rows(a["vb"], 0, a["sgn"], G, D, a["perm"], 100, a["W"], a["zc"], acc, a["alpha"], 0)  # nt < DT
    decode_avx512.pv_1row(a["vb"], 0, a["sgn"], G, D, a["perm"], 100, a["W"], a["zc"], acc, a["alpha"], 4)
    outs.append((sc, acc))
    # the AVX2 forms read tiles staged as c * n (c a power of two; q and W divided by c)
    four = kind in ("s4", "u4")
    sl, sr, msk, cst = decode_avx2.stage_params(kind)
    sdt = np.uint8 if kind == "u8" else np.int8
    kst8, vst8 = np.zeros(D * 64, sdt), np.zeros(T * 64, sdt)  # a chunk of 64 positions / head dims
    qb, W = a["qb"] / np.float32(cst), a["W"] / np.float32(cst)
    sc = np.zeros(8 * T, np.float32)
    acc = a["acc"].copy()
    for c in range(T // 64):
        decode_avx2.stage_k(kst8, a["kb"], 0, rs, D, sl, sr, msk, c, 0)
        decode_avx2.scores_4rows_staged(kst8, four, a["ksc"], 0, T, a["kzp"], zs, G, D, qb, a["qsum"], 0, sc, c)
        decode_avx2.scores_1row_staged(kst8, four, a["ksc"], 0, T, a["kzp"], zs, G, D, qb, a["qsum"], 4, sc, c)
    for h in range(D // 64):
        decode_avx2.stage_v(vst8, a["vb"], 0, a["perm"], 100, D, sl, sr, msk, h, False)
        decode_avx2.pv_4rows_staged(vst8, four, G, D, W, a["zc"], acc, a["alpha"], 0, h)
        decode_avx2.pv_1row_staged(vst8, four, G, D, W, a["zc"], acc, a["alpha"], 4, h)
    outs.append((sc, acc))
    assert np.isfinite(outs[0][0][:5 * T]).all() and np.any(outs[0][0][:5 * T] != 0)
    assert np.array_equal(outs[0][0], outs[1][0])
    assert np.array_equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("kind", ["u4", "u8"])
@pytest.mark.parametrize("zp_on", ["k", "v"])
def test_decode_kernel_zero_points_on_one_operand(kind, zp_on):
    """Unsigned K/V where only one operand has zero points: the other takes the kernel's
    no-zero-point branch (scales only) while this one folds z * sum(q) / z * sum(p s).
    Full tiles and a tail (S = 600), 4-row and 1-row blocks (rep 5).  Bound: the
    1e-5 relative bound of the cases above (same sums, same lengths)."""
    B, Hq, Hkv, Sq, S, D, G = 1, 10, 2, 1, 600, 128, 32
    rng = np.random.default_rng(11 if zp_on == "k" else 12)
    x = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    y = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    q = rng.standard_normal((B, Hq, Sq, D)).astype(np.float32)
    K, kd = make(kind, x, G, True, rng)
    V, vd = make(kind, y, G, False, rng)
    # the operand that loses its zero points holds n * s = dequantized + z * s (float64)
    if zp_on == "k":
        vd = vd + np.repeat(V.zps.astype(np.float64) * V.scales, G, -1)
        V.zps = None
    else:  # K is stored [D, S]: scales and zero points [B, H, D/G, S]
        kd = kd + np.repeat(K.zps.astype(np.float64) * K.scales, G, -2).swapaxes(-1, -2)
        K.zps = None
    for splits in (1, 3):
        o = SD.sdpa(q, K, V, scale=0.09, kv_splits=splits)
        r = ref(q, kd, vd, 0.09, None, None)
        assert np.max(np.abs(o - r)) <= 1e-5 * np.max(np.abs(r)), splits


def test_decode_kernel_masked_split_and_bf16_out():
    """A split whose positions are all masked has weight 0 in the merge; a row masked
    everywhere is NaN (0/0) as in the general kernel; bf16 output rounds the f32 result."""
    rng = np.random.default_rng(5)
    B, Hq, Hkv, Sq, S, D, G = 1, 4, 1, 2, 512, 64, 32
    x = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    y = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    q = rng.standard_normal((B, Hq, Sq, D)).astype(np.float32)
    K, kd = make("s4", x, G, True, rng)
    V, vd = make("s4", y, G, False, rng)
    mask = np.zeros((1, 1, Sq, S), np.float32)
    mask[..., 200:] = -np.inf   # splits 2..4 of 4 see only -inf
    mask[:, :, 1, :] = -np.inf  # query row 1 sees nothing
    r = ref(q[:, :, :1], kd, vd, 1 / np.sqrt(D), mask[:, :, :1], None)
    for splits in (1, 4):  # 1: the one-split merge (acc / l, no log-sum-exp); o of 4 kept
        o = SD.sdpa(q, K, V, mask=mask, kv_splits=splits)
        assert np.max(np.abs(o[:, :, :1] - r)) <= 1e-5 * np.max(np.abs(r)), splits
        assert np.isnan(o[:, :, 1]).all(), splits
    ob = SD.sdpa(q[:, :, :1], K, V, mask=mask[:, :, :1], kv_splits=4, out_dtype="bf16")
    expect = o[:, :, :1].astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(ob, expect)


def test_decode_kernel_concurrent_callers_get_the_single_thread_result():
    """Kernels run on a shared Python thread pool: calls from several threads at once
    return exactly (bitwise) what one caller gets (fixed split, fixed merge order)."""
    import threading
    rng = np.random.default_rng(6)
    B, Hq, Hkv, Sq, S, D, G = 1, 8, 2, 1, 2048, 64, 32  # above SMALL_WORK: uses the pool
    assert 2 * Hq * S * D >= threads.SMALL_WORK
    jobs = []
    for kind in ("s4", "s8"):
        x = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
        K, _ = make(kind, x, G, True, rng)
        V, _ = make(kind, x[..., ::-1].copy(), G, False, rng)
        q = rng.standard_normal((B, Hq, Sq, D)).astype(np.float32)
        jobs.append((q, K, V, SD.sdpa(q, K, V, kv_splits=3)))
    mismatches = []

    def run(i):
        q, K, V, want = jobs[i % 2]
        for _ in range(20):
            if not np.array_equal(SD.sdpa(q, K, V, kv_splits=3), want):
                mismatches.append(i)

    callers = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert not mismatches


def test_widen_half_bits_exactly_every_value():
    """_widen_half gives numpy's (ml_dtypes') exact widening of every one of the 65536
    bf16 and f16 bit patterns (NaNs as NaNs), from a strided view, keeping the shape."""
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).reshape(256, 256)
    strided = h[:, ::2]
    for kind, dt in ((1, ml_dtypes.bfloat16), (2, np.float16)):
        got = widen.widen_half(strided, kind)
        assert got.dtype == np.float32 and got.shape == strided.shape
        assert np.array_equal(got, strided.view(dt).astype(np.float32), equal_nan=True)

"""Fast weight-compressed MatMul kernels vs an independent float64 formula.

Tolerance: the kernel sums each group sequentially in f32 with FMAs (G terms),
subtracts the zero-point term, then adds K/G scaled group sums sequentially.
Each rounding contributes at most u = 2**-24 relative to a partial sum bounded
by sum |x| (|u_q| + |z'|) |s|, so |y - y64| <= (G + K/G + 4) * u * B with
B = |x| @ ((|u_q| + |z'|) |s|) elementwise, where the kernels read s4 as the
unsigned ``u_q = q + 8`` with zero point ``z' = z + 8`` (the natural-layout
kernels and the interleaved layout's AVX2 kernels; the lookup kernels sum ``q``
itself, a smaller bound); for the other kinds ``|q| + |z| + 8`` (as before this
s4 rule).  The prefill path uses BLAS sgemm (any order): K instead
of G + K/G.  With fpmath rounding the reference rounds the same inputs first.
"""
import ml_dtypes
import numpy as np
import pytest

from graph_api.kernels.weight_compressed import wmatmul as W
from graph_api.kernels.bits import RND_BF16, RND_F16, RND_NONE, RND_TF32

U = 2.0 ** -24
RANGES = {"s4": (-8, 7), "u4": (0, 15), "s8": (-128, 127), "u8": (0, 255)}


def pack4(q):
    f = (np.asarray(q).reshape(-1).astype(np.int16) & 15).astype(np.uint8)
    if f.size % 2:
        f = np.concatenate([f, np.zeros(1, np.uint8)])
    return (f[0::2] | (f[1::2] << 4)).astype(np.uint8)


def make(kind, K, N, G, trans, zp, rng):
    lo, hi = RANGES[kind]
    q = rng.integers(lo, hi + 1, size=(K, N))
    sc = (rng.random((K // G, N)) + 0.5).astype(np.float32)
    z = rng.integers(lo, hi + 1, size=(K // G, N)) if zp else None
    stored = q.T if trans else q
    w = pack4(stored) if kind in ("s4", "u4") else stored.astype(np.int8 if kind == "s8" else np.uint8)
    scu = np.ascontiguousarray(sc.T) if trans else sc
    zu = None if z is None else (np.ascontiguousarray(z.T) if trans else z)
    return q, sc, z, w, scu, zu


def ref(x64, q, sc, z, G, kind, rnd_w=None):
    s = np.repeat(sc, G, 0).astype(np.float64)
    zz = 0 if z is None else np.repeat(z, G, 0)
    w = ((q - zz) * s).astype(np.float32)  # the reference dequantizes in f32
    if rnd_w is not None:
        w = rnd_w(w)
    # s4: |u_q| + |z'| (derivation above); other kinds as before, |q| + |z| with 8 to spare
    wa = (np.abs(q + 8) + np.abs(zz + 8) if kind == "s4" else np.abs(q) + 8 + np.abs(zz)) * s
    return x64 @ w.astype(np.float64), np.abs(x64) @ wa


def check(y, r, bound, terms):
    assert np.all(np.abs(y.astype(np.float64) - r) <= (terms + 4) * U * bound + 1e-30), \
        np.max(np.abs(y - r) / bound)


SHAPES = [(1, 256, 256, 32), (1, 128, 384, 128), (3, 128, 130, 64), (7, 64, 127, 32),
          (33, 128, 256, 128), (1, 64, 1, 64), (2, 96, 3, 32)]


@pytest.mark.parametrize("kind", ["s4", "u4", "s8", "u8"])
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("M,K,N,G", SHAPES)
@pytest.mark.parametrize("dense", [True, False])
def test_wmatmul_direct_and_prepared(monkeypatch, kind, trans, M, K, N, G, dense):
    """``dense``: prefills of prepared weights multiply their dense f32 copy
    (:func:`W.dense_copy`), else the int4 chunks / int8 panels; both sum in f32
    by sgemm (or one FMA per product in k order): K terms."""
    if not dense:
        monkeypatch.setattr(W, "DENSE_COPY_BYTES", 0)
    rng = np.random.default_rng(hash((kind, trans, M, K, N, G)) % 2**32)
    for zp in ((False, True) if kind[0] == "u" else (False,)):
        q, sc, z, w, scu, zu = make(kind, K, N, G, trans, zp, rng)
        x = rng.standard_normal((M, K)).astype(np.float32)
        spec = W.WeightSpec(kind, K, N, G, trans)
        r, b = ref(x.astype(np.float64), q, sc, z, G, kind)
        terms = K if M > W.DECODE_MAX_M else G + K // G
        check(W.wmatmul(x, w, spec, scu, zu), r, b, terms)
        pw = W.prepare(w, spec, scu, zu)
        check(W.wmatmul(x, None, spec, prepared=pw), r, b, terms)


@pytest.mark.parametrize("act", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("M", [1, 33])
def test_activation_dtypes(act, M):
    rng = np.random.default_rng(5)
    K, N, G = 128, 256, 32
    q, sc, z, w, scu, zu = make("s4", K, N, G, True, False, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    xin = {"f32": x, "bf16": x.astype(ml_dtypes.bfloat16), "f16": x.astype(np.float16)}[act]
    spec = W.WeightSpec("s4", K, N, G, True)
    r, b = ref(xin.astype(np.float64), q, sc, z, G, "s4")
    terms = K if M > 8 else G + K // G
    check(W.wmatmul(xin, w, spec, scu), r, b, terms)
    check(W.wmatmul(xin.view(np.uint16) if act != "f32" else x, w, spec, scu,
                    act_dtype=act if act != "f32" else None), r, b, terms)


def _round(code):
    if code == RND_BF16:
        return lambda a: a.astype(ml_dtypes.bfloat16).astype(np.float32)
    if code == RND_F16:
        return lambda a: a.astype(np.float16).astype(np.float32)
    if code == RND_TF32:
        from graph_api.dtypes import round_to_tf32
        return round_to_tf32
    return None


@pytest.mark.parametrize("rnd", [RND_NONE, RND_BF16, RND_F16, RND_TF32])
@pytest.mark.parametrize("apply_to_int", [False, True])
@pytest.mark.parametrize("M", [1, 9])
def test_fpmath_roundings(rnd, apply_to_int, M):
    rng = np.random.default_rng(7)
    K, N, G = 128, 128, 32
    q, sc, z, w, scu, zu = make("u4", K, N, G, False, True, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    rx = _round(rnd)
    x64 = (rx(x) if rx else x).astype(np.float64)
    r, b = ref(x64, q, sc, z, G, "u4", rx if apply_to_int else None)
    y = W.wmatmul(x, w, W.WeightSpec("u4", K, N, G, False), scu, zu, rnd_x=rnd,
                  rnd_w=rnd if apply_to_int else 0)
    terms = K if (M > 8 or (apply_to_int and rnd)) else G + K // G
    check(y, r, b, terms)


def test_epilogue_chain_and_bf16_out():
    rng = np.random.default_rng(3)
    M, K, N, G = 3, 128, 256, 32
    q, sc, z, w, scu, zu = make("s4", K, N, G, True, False, rng)
    x = rng.standard_normal((M, K)).astype(np.float32) * 0.05
    bias = rng.standard_normal(N).astype(np.float32)
    full = rng.standard_normal((M, N)).astype(np.float32)
    col = rng.standard_normal((M, 1)).astype(np.float32)
    r, _ = ref(x.astype(np.float64), q, sc, z, G, "s4")
    import math
    erf = np.vectorize(math.erf)
    sig = lambda v: 1 / (1 + np.exp(-v))
    chains = [
        ([("bias", bias), ("relu", None)], lambda v: np.maximum(v + bias, 0)),
        ([("mul", full), ("gelu_erf", None)], lambda v: 0.5 * (v * full) * (1 + erf(v * full / np.sqrt(2)))),
        ([("gelu_tanh", None), ("sub", col)],
         lambda v: 0.5 * v * (1 + np.tanh(0.7978845608028654 * (v + 0.044715 * v ** 3))) - col),
        ([("sigmoid", None), ("div", 2.0)], lambda v: sig(v) / 2),
        ([("silu", None), ("clamp", (-0.1, 0.2))], lambda v: np.clip(v * sig(v), -0.1, 0.2)),
        ([("tanh", None), ("add", full), ("max", 0.5)], lambda v: np.maximum(np.tanh(v) + full, 0.5)),
    ]
    pw = W.prepare(w, W.WeightSpec("s4", K, N, G, True), scu)
    for ops, f in chains:
        y = W.wmatmul(x, None, pw.spec, prepared=pw, post_ops=ops)
        np.testing.assert_allclose(y, f(r), rtol=2e-5, atol=2e-6)
    yb = W.wmatmul(x, None, pw.spec, prepared=pw, post_ops=[("bias", bias)], out_dtype="bf16")
    expect = (r + bias).astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.max(np.abs(yb.astype(np.int32) - expect.astype(np.int32))) <= 1  # f32 vs f64 then RNE


def test_ksplit_small_n_and_preallocated_out():
    rng = np.random.default_rng(11)
    M, K, N, G = 1, 1024, 128, 32  # one block -> K is split across threads
    q, sc, z, w, scu, zu = make("s4", K, N, G, False, False, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    out = np.empty((M, N), np.float32)
    y = W.wmatmul(x, w, W.WeightSpec("s4", K, N, G, False), scu, out=out)
    assert y is out
    r, b = ref(x.astype(np.float64), q, sc, z, G, "s4")
    check(y, r, b, G + K // G + 8)


def test_dynamic_quantize_epilogue():
    rng = np.random.default_rng(13)
    M, K, N, G = 2, 64, 128, 32
    q, sc, z, w, scu, zu = make("s4", K, N, G, True, False, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    spec = W.WeightSpec("s4", K, N, G, True)
    y = W.wmatmul(x, w, spec, scu)
    qs = np.full((M, N // 64), 4.0, np.float32)
    got = W.wmatmul(x, w, spec, scu, quantize_out=("s8", qs, None, 64))
    np.testing.assert_array_equal(got, np.clip(np.rint(y / 4.0), -128, 127).astype(np.int8))


@pytest.mark.parametrize("kind", ["s4", "u4", "u8"])
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("M", [1, 4, 33])
def test_groups_along_n(kind, trans, M):
    """Scales [K/G, N/G_N] (oneDNN group_shape [G, G_N]); same bound as above:
    the per-column scale is constant inside each K group, so the kernels'
    summation order (and so the bound) is the one for groups along K only."""
    rng = np.random.default_rng(hash((kind, trans, M)) % 2**32)
    K, N, G, Gn = 128, 256, 32, 64
    lo, hi = RANGES[kind]
    q = rng.integers(lo, hi + 1, size=(K, N))
    scn = (rng.random((K // G, N // Gn)) + 0.5).astype(np.float32)
    zn = rng.integers(lo, hi + 1, size=(K // G, N // Gn)) if kind[0] == "u" else None
    sc = np.repeat(scn, Gn, axis=1)
    z = None if zn is None else np.repeat(zn, Gn, axis=1)
    stored = q.T if trans else q
    w = pack4(stored) if kind in ("s4", "u4") else stored.astype(np.uint8)
    scu = np.ascontiguousarray(scn.T) if trans else scn
    zu = None if zn is None else (np.ascontiguousarray(zn.T) if trans else zn)
    x = rng.standard_normal((M, K)).astype(np.float32)
    spec = W.WeightSpec(kind, K, N, G, trans, Gn)
    r, b = ref(x.astype(np.float64), q, sc, z, G, kind)
    terms = K if M > W.DECODE_MAX_M else G + K // G
    check(W.wmatmul(x, w, spec, scu, zu), r, b, terms)
    check(W.wmatmul(x, None, spec, prepared=W.prepare(w, spec, scu, zu)), r, b, terms)


@pytest.mark.parametrize("kind,zp", [("s4", False), ("u4", True), ("s8", False)])
@pytest.mark.parametrize("M", [1, 3])
def test_decode_writes_sums_in_place(monkeypatch, kind, zp, M):
    """One K split, no post-op, a C-contiguous f32 out: the decode kernels write their
    sums into ``out`` (no partials buffer, no finish pass) -- every element (out starts
    as NaN), the same values as through the partials and finish (a strided out), and
    within the bound above."""
    monkeypatch.setattr(W, "_ksplits", lambda nblk, ng: 1)
    rng = np.random.default_rng(hash((kind, zp, M)) % 2**32)
    K, N, G = 256, 384, 64
    q, sc, z, w, scu, zu = make(kind, K, N, G, True, zp, rng)
    spec = W.WeightSpec(kind, K, N, G, True)
    pw = W.prepare(w, spec, scu, zu)
    x = rng.standard_normal((M, K)).astype(np.float32)
    out = np.full((M, N), np.nan, np.float32)
    assert W.wmatmul(x, None, spec, prepared=pw, out=out) is out
    strided = np.full((M, 2 * N), np.nan, np.float32)[:, ::2]
    W.wmatmul(x, None, spec, prepared=pw, out=strided)
    np.testing.assert_array_equal(out, strided)
    r, b = ref(x.astype(np.float64), q, sc, z, G, kind)
    check(out, r, b, G + K // G)
    if kind in ("s4", "u4"):  # the user's natural [K, N] int4 buffer, read in place
        q, sc, z, w, scu, zu = make(kind, K, N, G, False, zp, rng)
        spec = W.WeightSpec(kind, K, N, G, False)
        out[:] = np.nan
        assert W.wmatmul(x, w, spec, scu, zu, out=out) is out
        W.wmatmul(x, w, spec, scu, zu, out=strided)
        np.testing.assert_array_equal(out, strided)
        r, b = ref(x.astype(np.float64), q, sc, z, G, kind)
        check(out, r, b, G + K // G)


@pytest.mark.parametrize("kind,zp", [("s4", False), ("u4", True), ("s4", True)])
@pytest.mark.parametrize("M,K,N,G", [(9, 640, 1024, 32), (40, 384, 1000, 128), (17, 128, 130, 64)])
@pytest.mark.parametrize("blas", [False, True])
def test_prefill_chunks_ragged(monkeypatch, kind, zp, M, K, N, G, blas):
    """The chunked prefill of prepared int4 weights: work items of 256 columns
    and K steps of 48 rows (640 and 384 are not multiples of 48), N = 1000 and
    130 ragged (the last block's padding columns are computed into a scratch
    tile and not stored), M not a multiple of 4.  The Numba tile product and
    sgemm both sum in f32: K terms."""
    monkeypatch.setattr(W, "PREFILL_GEOMETRY", ((1 << 62, 256, 48, blas),))
    monkeypatch.setattr(W, "DENSE_COPY_BYTES", 0)  # the chunks, not the dense copy
    rng = np.random.default_rng(hash((kind, zp, M, K, N)) % 2**32)
    q, sc, z, w, scu, zu = make(kind, K, N, G, True, zp, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    spec = W.WeightSpec(kind, K, N, G, True)
    r, b = ref(x.astype(np.float64), q, sc, z, G, kind)
    pw = W.prepare(w, spec, scu, zu)
    out = np.full((M, N), np.nan, np.float32)
    assert W.wmatmul(x, None, spec, prepared=pw, out=out) is out
    check(out, r, b, K)


@pytest.mark.parametrize("rnd", [RND_BF16, RND_F16])
@pytest.mark.parametrize("dense", [False, True])
def test_prefill_chunks_fpmath_weight_rounding(monkeypatch, rnd, dense):
    """fpmath with apply_to_int on prepared weights: the dequantized f32 weight
    is rounded (bf16/f16) before the f32 GEMM, as the reference does (in the
    chunks' tiles, or once in the dense copy)."""
    if not dense:
        monkeypatch.setattr(W, "DENSE_COPY_BYTES", 0)
    rng = np.random.default_rng(12)
    M, K, N, G = 24, 256, 384, 32
    q, sc, z, w, scu, zu = make("u4", K, N, G, True, True, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    rx = _round(rnd)
    spec = W.WeightSpec("u4", K, N, G, True)
    r, b = ref(rx(x).astype(np.float64), q, sc, z, G, "u4", rx)
    y = W.wmatmul(x, None, spec, prepared=W.prepare(w, spec, scu, zu), rnd_x=rnd, rnd_w=rnd)
    check(y, r, b, K)


@pytest.mark.parametrize("dense", [False, True])
def test_prefill_chunks_epilogue_bf16_out_and_threads(monkeypatch, dense):
    """Post-ops and bf16 output go through a per-thread f32 tile (or the dense
    copy's row tiles); two Python threads calling at once (each call runs its own
    worker threads; with ``dense`` the first calls race to make the copy) get the
    same answers as one at a time."""
    import threading
    if not dense:
        monkeypatch.setattr(W, "DENSE_COPY_BYTES", 0)
    rng = np.random.default_rng(13)
    M, K, N, G = 33, 256, 640, 64
    q, sc, z, w, scu, zu = make("s4", K, N, G, True, False, rng)
    spec = W.WeightSpec("s4", K, N, G, True)
    pw = W.prepare(w, spec, scu)
    bias = rng.standard_normal(N).astype(np.float32)
    xs = [rng.standard_normal((M, K)).astype(np.float32) for _ in range(4)]
    refs = [ref(x.astype(np.float64), q, sc, z, G, "s4") for x in xs]
    got = [None] * 4

    def call(i):
        got[i] = W.wmatmul(xs[i], None, spec, prepared=pw, post_ops=[("bias", bias), ("relu", None)])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for y, (r, b) in zip(got, refs):
        # relu is 1-Lipschitz and the bias addition rounds once more (|r + bias| <= b + |bias|)
        assert np.all(np.abs(y - np.maximum(r + bias, 0)) <= (K + 5) * U * (b + np.abs(bias)))
    yb = W.wmatmul(xs[0], None, spec, prepared=pw, post_ops=[("bias", bias)], out_dtype="bf16")
    expect = (refs[0][0] + bias).astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.max(np.abs(yb.astype(np.int32) - expect.astype(np.int32))) <= 1  # f32 vs f64 then RNE


@pytest.mark.parametrize("kind,zp,trans,Gn", [("s4", False, False, 1), ("u4", True, True, 1), ("s4", True, False, 64),
                                              ("s8", False, True, 1), ("u8", True, False, 1)])
@pytest.mark.parametrize("rnd", [RND_NONE, RND_BF16])
def test_dense_copy_is_the_reference_dequantization(kind, zp, trans, Gn, rnd):
    """The dense copy holds exactly the f32 weights the reference DynamicDequantize
    makes: (q - z) * s in f32 (exact here: |q - z| < 2**9 times a 24-bit scale), then
    the fpmath rounding; N = 200 is not a multiple of the 128-column blocks."""
    rng = np.random.default_rng(hash((kind, zp, trans, Gn, rnd)) % 2**32)
    K, N, G = 96, 192 if Gn > 1 else 200, 32
    lo, hi = RANGES[kind]
    q = rng.integers(lo, hi + 1, size=(K, N))
    scn = (rng.random((K // G, N // Gn)) + 0.5).astype(np.float32)
    zn = rng.integers(lo, hi + 1, size=(K // G, N // Gn)) if zp else None
    stored = q.T if trans else q
    w = pack4(stored) if kind in ("s4", "u4") else stored.astype(np.int8 if kind == "s8" else np.uint8)
    scu = np.ascontiguousarray(scn.T) if trans else scn
    zu = None if zn is None else (np.ascontiguousarray(zn.T) if trans else zn)
    pw = W.prepare(w, W.WeightSpec(kind, K, N, G, trans, Gn), scu, zu)
    s = np.repeat(np.repeat(scn, Gn, 1), G, 0).astype(np.float64)
    z = 0 if zn is None else np.repeat(np.repeat(zn, Gn, 1), G, 0)
    want = ((q - z) * s).astype(np.float32)  # exact in float64, so the f32 cast rounds nothing
    if rnd:
        want = _round(rnd)(want)
    got = W.dense_copy(pw, rnd)
    assert got.shape == (K, N) and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)
    assert W.dense_copy(pw, rnd) is got  # made once


def test_dense_copy_budget_and_release(monkeypatch):
    """Copies above DENSE_COPY_BYTES, or past DENSE_TOTAL_BYTES for the process, are
    not made (those prefills take the chunks, same bound); a freed prepared weight
    gives its bytes back."""
    import gc
    rng = np.random.default_rng(21)
    M, K, N, G = 16, 128, 256, 32
    q, sc, z, w, scu, zu = make("s4", K, N, G, False, False, rng)
    spec = W.WeightSpec("s4", K, N, G, False)
    x = rng.standard_normal((M, K)).astype(np.float32)
    r, b = ref(x.astype(np.float64), q, sc, z, G, "s4")
    nbytes = 4 * K * N
    gc.collect()
    base = W.dense_bytes_held()
    monkeypatch.setattr(W, "DENSE_COPY_BYTES", nbytes - 1)
    pw = W.prepare(w, spec, scu)
    check(W.wmatmul(x, None, spec, prepared=pw), r, b, K)
    assert pw.dense is None and W.dense_bytes_held() == base
    monkeypatch.setattr(W, "DENSE_COPY_BYTES", nbytes)
    monkeypatch.setattr(W, "DENSE_TOTAL_BYTES", base + nbytes)  # room for one copy
    check(W.wmatmul(x, None, spec, prepared=pw), r, b, K)
    assert pw.dense is not None and W.dense_bytes_held() == base + nbytes
    pw2 = W.prepare(w, spec, scu)
    check(W.wmatmul(x, None, spec, prepared=pw2), r, b, K)
    assert pw2.dense is None and W.dense_bytes_held() == base + nbytes
    del pw
    gc.collect()
    assert W.dense_bytes_held() == base
    check(W.wmatmul(x, None, spec, prepared=pw2), r, b, K)
    assert pw2.dense is not None and W.dense_bytes_held() == base + nbytes


def test_decode_guard_covers_scaled_partial_sums():
    """The interleaved int4 decode keeps its AVX2 partial sums scaled by up to 2**24
    (wgemv4.SUM_SCALE): activations whose scaled sums would overflow f32 where the
    unscaled ones do not take the float64 path (here every product is 2**100 * 7 and the
    scaled sums reach 2**131; the result, ~2**100, is finite).  Bound as above."""
    K, N, G = 128, 128, 128
    q = np.full((K, N), 7)
    sc = np.full((1, N), 2.0 ** -10, np.float32)
    spec = W.WeightSpec("s4", K, N, G, False)
    pw = W.prepare(pack4(q), spec, sc)
    x = np.full((1, K), 2.0 ** 100, np.float32)
    y = W.wmatmul(x, None, spec, prepared=pw)
    r, b = ref(x.astype(np.float64), q, sc, None, G, "s4")
    assert np.isfinite(y).all()
    check(y, r, b, G + K // G)


def test_dense_prefill_overflow_and_inf_take_float64_sums():
    """A prepared weight with a dense copy: f32 partial sums that would overflow where
    the float64 sum does not, and inf activations, still give what the reference's
    float64 sums give (the guard in front of every fast path), and so do huge products
    that cancel (an f32 FMA chain leaves ~1e29 of rounding error there, no inf or NaN)."""
    rng = np.random.default_rng(22)
    M, K, N, G = 12, 64, 128, 32
    q, sc, z, w, scu, zu = make("s4", K, N, G, False, False, rng)
    spec = W.WeightSpec("s4", K, N, G, False)
    pw = W.prepare(w, spec, scu)
    wd = (q * np.repeat(sc, G, 0)).astype(np.float32).astype(np.float64)
    x = rng.standard_normal((M, K)).astype(np.float32)
    W.wmatmul(x, None, spec, prepared=pw)
    assert pw.dense is not None
    x[0, :2] = (3e38, -3e38)  # the first two products overflow f32 in opposite signs
    x[1, 5] = np.inf
    y = W.wmatmul(x, None, spec, prepared=pw)
    with np.errstate(all="ignore"):
        r = (x.astype(np.float64) @ wd).astype(np.float32)  # float64 sums rounded once
    assert np.isinf(r[0]).any() and np.isfinite(r[0]).any() and np.isnan(r[1]).any()
    np.testing.assert_array_equal(y, r)  # the float64 sums are the reference's (NaNs where it has them)
    # huge products that cancel: the reference's exact 0, not an f32 rounding error of ~1e30
    x[2] = 0
    x[2, :4] = (1e36, 1e36, -1e36, -1e36)  # no f32 overflow: only the guard sends it to float64
    x[0, :2] = 0
    x[1, 5] = 0
    q[1:4] = q[0]
    pw = W.prepare(pack4(q), spec, scu)
    np.testing.assert_array_equal(W.wmatmul(x, None, spec, prepared=pw)[2], 0.0)

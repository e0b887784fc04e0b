"""The interleaved int4 layout and its lookup-table kernels (kernels/weight_compressed/wgemv4.py, kernels/weight_compressed/lut4.py).

References are independent: the layout is decoded with numpy from its documented
bit positions, and products are summed in float64.

Tolerance of the GEMV kernels: per group, ``G`` sequential f32 FMAs (one
rounding each, relative to a partial sum bounded by ``sum |x| |q - z|``), the
zero-point term ``z * xs`` and the subtraction (2 roundings), then one FMA per
group into the accumulator (``K/G`` roundings).  The reference dequantizes in
f32 first (one rounding of ``(q - z) * s``).  Each rounding is at most
``u = 2**-24`` relative to a partial sum bounded by ``B = |x| @ ((|q| + |z|)
|s|)`` (``|xs| <= sum |x|``), so ``|y - y64| <= (G + K/G + 4) * u * B``.

The AVX2 convert kernels sum ``x * u`` over the stored nibble ``u`` (s4: ``q + 8``)
and subtract ``(z + 8) * xs`` (u4: ``u = q``, ``z`` as given).  Their sums carry a
factor 16**j (the nibble masked in place), removed per group by a multiplication by
16**-j: powers of two scale every rounding exactly (no overflow: wmatmul's guard; no
underflow: normal data), so the count of roundings is unchanged and the same
derivation holds with ``|q| + |z|`` replaced by ``|u| + |z'|``, ``z' = z + 8`` for s4:
``B' = |x| @ ((|q + 8| + |z + 8|) |s|)``, at most ``B + 16 |x| @ |s|``.  For u4 the
sums are the lookup kernels' exactly (bit-identical results).
The dequantized panel is exact: ``q - z`` is an exact small integer and
``(q - z) * s`` is rounded once, as the reference does.
"""
import numba
import numpy as np
import pytest

from graph_api.kernels.weight_compressed import lut4
from graph_api.kernels.weight_compressed import wgemv4 as L
from graph_api.kernels.bits import RND_BF16, RND_NONE

U = 2.0 ** -24


def decode_layout(wb, K, Np, signed):
    """Numpy decoding of the documented layout: column 128 b + 16 j + l is
    nibble j (bits 4j..4j+3) of little-endian dword l of row k of block b,
    s4 stored as q + 8."""
    words = wb[:Np // 128 * K * 64].view("<u4").reshape(Np // 128, K, 16).astype(np.int64)
    q = np.empty((K, Np), np.int64)
    for b in range(Np // 128):
        for j in range(8):
            q[:, 128 * b + 16 * j:128 * b + 16 * j + 16] = (words[b] >> (4 * j)) & 15
    return q - 8 if signed else q


def operands(M, K, N, G, signed, zp, rng):
    q = rng.integers(-8 if signed else 0, 8 if signed else 16, (K, N))
    sc = (rng.random((K // G, N)) + 0.5).astype(np.float32)
    z = rng.integers(-8 if signed else 0, 8 if signed else 16, (K // G, N)).astype(np.float32) if zp else None
    x = rng.standard_normal((M, K)).astype(np.float32)
    return q, sc, z, x


def per_block(a, nblk):
    ng, N = a.shape
    return np.ascontiguousarray(a.reshape(ng, nblk, 128).transpose(1, 0, 2)).reshape(-1)


@pytest.mark.parametrize("signed", [True, False])
def test_layout_round_trip(signed):
    rng = np.random.default_rng(1)
    q = rng.integers(-8 if signed else 0, 8 if signed else 16, (40, 384))
    wb, table = L.pack_interleaved(q, signed)
    assert np.array_equal(decode_layout(wb, 40, 384, signed), q)
    assert wb.dtype == np.uint8 and wb.size == 3 * 40 * 64 + 64 and not wb[-64:].any()  # + one zero row
    assert np.array_equal(table, np.arange(16) - 8 if signed else np.arange(16))


CASES = [  # M, K, N, G, splits (K splits of the grid)
    (1, 256, 256, 32, 1), (1, 192, 384, 6, 2), (1, 128, 128, 128, 1), (1, 96, 128, 3, 4),
    (2, 128, 256, 32, 1), (3, 192, 128, 6, 3), (8, 256, 128, 64, 2), (5, 90, 128, 9, 1),
    (6, 64, 256, 16, 1), (7, 96, 128, 32, 2),
]


def bound(x, q, z, sc, G, S, signed, convert):
    """The module doc's bound: (G + K/G + 4 + S) u |x| @ ((|q| + |z|) |s|), with the
    convert kernels' |q + 8| + |z + 8| for s4."""
    K = x.shape[1]
    zz = np.repeat(z, G, 0) if z is not None else np.zeros(1)
    if convert and signed:
        q, zz = q + 8, zz + 8
    s = np.repeat(sc, G, 0).astype(np.float64)
    return (G + K // G + 4 + S) * U * (np.abs(x.astype(np.float64)) @ ((np.abs(q) + np.abs(zz)) * s))


def reference(x, q, z, sc, G):
    zz = np.repeat(z, G, 0) if z is not None else 0.0
    w32 = ((q - zz) * np.repeat(sc, G, 0).astype(np.float64)).astype(np.float32).astype(np.float64)
    return x.astype(np.float64) @ w32


@pytest.mark.parametrize("signed,zp", [(True, False), (False, False), (False, True), (True, True)])
@pytest.mark.parametrize("M,K,N,G,S", CASES)
def test_gemv_against_float64(M, K, N, G, S, signed, zp):
    """The drivers' kernel form (lookup with AVX-512, convert without); the other form is
    checked in test_gemv_forms."""
    rng = np.random.default_rng(hash((M, K, N, G, S, signed, zp)) % 2**32)
    q, sc, z, x = operands(M, K, N, G, signed, zp, rng)
    nblk = N // 128
    wb, table = L.pack_interleaved(q, signed)
    wbs, sbs, sgs = L.block_params(K, G, nblk)
    zf = per_block(z, nblk) if zp else np.zeros(1, np.float32)
    xs = x.reshape(M, K // G, G).sum(-1, dtype=np.float32)
    part = np.full((S, M, N), np.nan, np.float32)
    (L.gemv_m1 if M == 1 else L.gemv_rows)(x, xs, wb, wbs, table, per_block(sc, nblk), zf, sbs,
                                            1 if zp else 0, G, part)
    y = part.astype(np.float64).sum(0)
    b = bound(x, q, z, sc, G, S, signed, not lut4.HAS_VPERMPS)
    assert np.all(np.abs(y - reference(x, q, z, sc, G)) <= b)


@pytest.mark.parametrize("zp", [False, True])
@pytest.mark.parametrize("rnd", [RND_NONE, RND_BF16])
def test_dequant_panel_exact(zp, rnd):
    import ml_dtypes
    rng = np.random.default_rng(3)
    K, N, G = 96, 384, 32
    q, sc, z, _ = operands(1, K, N, G, True, zp, rng)
    nblk = N // 128
    wb, table = L.pack_interleaved(q, True)
    wbs, sbs, sgs = L.block_params(K, G, nblk)
    panel = np.empty((K, 256), np.float32)  # blocks 1 and 2
    L.dequant_panel(wb, wbs, table, per_block(sc, nblk), per_block(z, nblk) if zp else np.zeros(1, np.float32),
                    sbs, 1 if zp else 0, G, 1, rnd, panel)
    zz = np.repeat(z, G, 0) if zp else 0.0
    want = ((q - zz) * np.repeat(sc, G, 0)).astype(np.float32)[:, 128:]
    if rnd == RND_BF16:
        want = want.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(panel, want)


@pytest.mark.parametrize("path", ["vpermps16", "vpermps8", "lanes"])
def test_lookup_every_code_path(monkeypatch, path):
    """vlut4 emits a 16-float vpermps on AVX-512, two 8-float ones and a blend on AVX2,
    and a lane-by-lane lookup elsewhere: each gives table[(word >> shift) & 15] (a fresh
    function is compiled per path)."""
    if path == "vpermps16" and not lut4.HAS_VPERMPS:
        pytest.skip("the compile target has no AVX-512")
    if path == "vpermps8" and not (lut4.HAS_VPERMPS or lut4.HAS_VPERMPS8):
        pytest.skip("the compile target has no AVX2")
    monkeypatch.setattr(lut4, "HAS_VPERMPS", path == "vpermps16")
    monkeypatch.setattr(lut4, "HAS_VPERMPS8", path == "vpermps8")
    from graph_api.kernels.bits import vload, vstore

    def lookups(table, w, out):
        tab = vload(table, 0)
        for j in range(8):
            vstore(out, 16 * j, lut4.vlut4(tab, w, 0, 4 * j))
            vstore(out, 128 + 16 * j, lut4.vlut4(tab, w, 3, 4 * j))  # unaligned byte offset

    f = numba.njit(lookups)
    rng = np.random.default_rng(4)
    w = rng.integers(0, 256, 80, dtype=np.uint8)
    table = rng.standard_normal(16).astype(np.float32)
    out = np.empty(256, np.float32)
    f(table, w, out)
    for off, base in ((0, 0), (3, 128)):
        words = w[off:off + 64].view("<u4").astype(np.int64)
        for j in range(8):
            assert np.array_equal(out[base + 16 * j:base + 16 * j + 16], table[(words >> (4 * j)) & 15])


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("M,K,N,G,S", CASES)
def test_gemv_forms(M, K, N, G, S, signed):
    """Both block kernel forms on every target, with zero points: the convert kernels
    sum the same u4 products in the same order as the lookup ones (bit-identical
    outputs, both unpacks and the z * xs term); for s4 they sum x * (q + 8), so each
    form is checked against float64 with its own bound (module doc)."""
    rng = np.random.default_rng(hash((M, K, N, G, S, signed)) % 2**32)
    q, sc, z, x = operands(M, K, N, G, signed, True, rng)
    nblk = N // 128
    wb, table = L.pack_interleaved(q, signed)
    wbs, sbs, sgs = L.block_params(K, G, nblk)
    xs = x.reshape(M, K // G, G).sum(-1, dtype=np.float32)
    scb, zf = per_block(sc, nblk), per_block(z, nblk)
    ng = K // G
    gps = (ng + S - 1) // S
    out = []
    for blk_fn in ((L._blk_m1, L._blk_rows), (L._blk_m1_cvt, L._blk_rows_cvt)):
        part = np.full((S, M, N), np.nan, np.float32)
        for b in range(nblk):  # the drivers' work items, serially
            for sp in range(S):
                blk_fn[0 if M == 1 else 1](x, xs, wb, b * wbs, table, scb, zf, b * sbs, 1, G,
                                           min(sp * gps, ng), min((sp + 1) * gps, ng), part, sp, b)
        out.append(part)
    assert not np.isnan(out[0]).any() and not np.isnan(out[1]).any()
    if not signed:
        assert np.array_equal(out[0], out[1])
    ref = reference(x, q, z, sc, G)
    for part, convert in zip(out, (False, True)):
        assert np.all(np.abs(part.astype(np.float64).sum(0) - ref) <= bound(x, q, z, sc, G, S, signed, convert))


def test_masked_nibbles_every_slot():
    """vnibu gives u * 16**j for the unsigned nibble u under nib_mask(j), j < 7, and vnib7
    the top nibble, of 16 dwords at any byte offset: exact f32 values."""
    def unpack(w, out):
        for off, base in ((0, 0), (3, 128)):  # aligned and unaligned byte offsets
            for j in range(7):
                vstore(out, base + 16 * j, lut4.vnibu(w, off, lut4.nib_mask(j)))
            vstore(out, base + 112, lut4.vnib7(w, off))

    from graph_api.kernels.bits import vstore
    f = numba.njit(unpack)
    w = np.random.default_rng(5).integers(0, 256, 80, dtype=np.uint8)
    w[:8] = 255  # every nibble 15: the largest values, 15 * 16**6 for j = 6
    out = np.empty(256, np.float32)
    f(w, out)
    for off, base in ((0, 0), (3, 128)):
        words = w[off:off + 64].view("<u4").astype(np.int64)
        for j in range(8):
            nib = (words >> (4 * j)) & 15
            assert np.array_equal(out[base + 16 * j:base + 16 * j + 16], nib * 16.0 ** (j if j < 7 else 0))


@pytest.mark.parametrize("kind,zp", [("s8", False), ("s8", True), ("u8", False), ("u8", True)])
@pytest.mark.parametrize("M,K,N,G,S", CASES[:6] + CASES[-2:])
def test_int8_gemv_against_float64(M, K, N, G, S, kind, zp):
    """wgemv8 through wmatmul.prepare's blocked int8 copy (u8 stored as q - 128
    with zero point z - 128); same bound as the int4 kernels."""
    from graph_api.kernels.weight_compressed import wgemv8
    from graph_api.kernels.weight_compressed import wmatmul as W
    rng = np.random.default_rng(hash((M, K, N, G, S, kind, zp)) % 2**32)
    lo, hi = (-128, 127) if kind == "s8" else (0, 255)
    q = rng.integers(lo, hi + 1, (K, N))
    sc = (rng.random((K // G, N)) + 0.5).astype(np.float32)
    z = rng.integers(lo, hi + 1, (K // G, N)) if zp else None
    x = rng.standard_normal((M, K)).astype(np.float32)
    pw = W.prepare(q.astype(np.int8 if kind == "s8" else np.uint8), W.WeightSpec(kind, K, N, G, False), sc, z)
    xs = x.reshape(M, K // G, G).sum(-1, dtype=np.float32)
    part = np.full((S, M, N), np.nan, np.float32)
    wgemv8.gemv(x, xs, pw.w, pw.wbs, pw.sc, pw.zf, pw.sbs, pw.zmode, G, part)
    y = part.astype(np.float64).sum(0)
    zz = np.repeat(z, G, 0) if zp else 0
    s = np.repeat(sc, G, 0).astype(np.float64)
    w32 = ((q - zz) * s).astype(np.float32).astype(np.float64)
    x64 = x.astype(np.float64)
    zabs = np.abs(zz) if kind == "s8" else np.abs(np.asarray(zz) - 128)  # stored: q - 128, z - 128
    qabs = np.abs(q) if kind == "s8" else np.abs(q - 128)
    bound = (G + K // G + 4 + S) * U * (np.abs(x64) @ ((qabs + zabs) * s))
    assert np.all(np.abs(y - x64 @ w32) <= bound)


@pytest.mark.parametrize("zp", [True, False])
@pytest.mark.parametrize("M,K,N,G,S", CASES)
def test_int8_gemv_forms_identical(M, K, N, G, S, zp):
    """wgemv8's AVX2 block kernels (4 partial sums per pass) and its AVX-512 ones (16)
    sum the same products in the same order: bit-identical on every target (the gemv
    driver runs one of them; test_int8_gemv_against_float64 checks that one), with zero
    points (u8) and without (s8: the group step without the subtraction)."""
    from graph_api.kernels.weight_compressed import wgemv8
    from graph_api.kernels.weight_compressed import wmatmul as W
    rng = np.random.default_rng(hash((M, K, N, G, S, "forms")) % 2**32)
    sc = (rng.random((K // G, N)) + 0.5).astype(np.float32)
    x = rng.standard_normal((M, K)).astype(np.float32)
    if zp:
        q = rng.integers(0, 256, (K, N)).astype(np.uint8)
        pw = W.prepare(q, W.WeightSpec("u8", K, N, G, False), sc, rng.integers(0, 256, (K // G, N)))
    else:
        q = rng.integers(-128, 128, (K, N)).astype(np.int8)
        pw = W.prepare(q, W.WeightSpec("s8", K, N, G, False), sc)
    assert pw.zmode == (1 if zp else 0)
    xs = x.reshape(M, K // G, G).sum(-1, dtype=np.float32)
    ng = K // G
    gps = (ng + S - 1) // S
    out = []
    for blk_fn in ((wgemv8._blk_m1, wgemv8._blk_rows), (wgemv8._blk_m1_v, wgemv8._blk_rows_v)):
        part = np.full((S, M, N), np.nan, np.float32)
        for b in range(N // 128):
            for sp in range(S):
                blk_fn[0 if M == 1 else 1](x, xs, pw.w, b * pw.wbs, pw.sc, pw.zf, b * pw.sbs, pw.zmode, G,
                                           min(sp * gps, ng), min((sp + 1) * gps, ng), part, sp, b)
        out.append(part)
    assert not np.isnan(out[0]).any()
    assert np.array_equal(out[0], out[1])


@pytest.mark.parametrize("zp", [False, True])
@pytest.mark.parametrize("rnd", [RND_NONE, RND_BF16])
@pytest.mark.parametrize("blas", [False, True])
def test_prefill_chunk_against_float64(zp, rnd, blas):
    """prefill_chunk: blocks 1..2 of 3, K = 160 in steps of 48 rows (the last one
    16), M = 15 (groups of 8 and 4 rows, 3 single rows), into a column block of a
    wider output.  Bound: the Numba kernel sums each output's K products in
    order with FMAs; sgemm sums each step's products in f32 in some order and
    adds into the output once per step: either way at most K f32 roundings of
    partial sums of exactly rounded products: ``|y - y64| <= (K + 1) u B``."""
    import ml_dtypes
    from graph_api.kernels import openblas
    if blas and not openblas.available():
        pytest.skip("numpy's OpenBLAS (64-bit integers) not found")
    rng = np.random.default_rng(8)
    M, K, N, G = 15, 160, 384, 32
    q, sc, z, x = operands(M, K, N, G, False, zp, rng)
    nblk = N // 128
    wb, table = L.pack_interleaved(q, False)
    wbs, sbs, sgs = L.block_params(K, G, nblk)
    out = np.full((M, N + 5), np.float32(7.0))  # row stride N + 5; columns outside 128..383 untouched
    tile = np.empty(L.tile_floats(48, 2), np.float32)
    L.prefill_chunk(x, wb, wbs, table, per_block(sc, nblk), per_block(z, nblk) if zp else np.zeros(1, np.float32),
                    sbs, 1 if zp else 0, G, 1, 2, 48, rnd, tile, out, 128, N + 5,
                    openblas.sgemm_address() if blas else 0)
    zz = np.repeat(z, G, 0) if zp else 0.0
    w32 = ((q - zz) * np.repeat(sc, G, 0)).astype(np.float32)
    if rnd == RND_BF16:
        w32 = w32.astype(ml_dtypes.bfloat16).astype(np.float32)
    x64 = x.astype(np.float64)
    want = x64 @ w32.astype(np.float64)
    bound = (K + 1) * U * (np.abs(x64) @ np.abs(w32).astype(np.float64))
    assert np.all(np.abs(out[:, 128:384] - want[:, 128:]) <= bound[:, 128:])
    assert np.all(out[:, :128] == 7.0) and np.all(out[:, 384:] == 7.0)

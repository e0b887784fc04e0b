"""f32 attention prefill for short sequences (BERT-like shapes: S up to a few hundred).

Formula (per batch ``b``, query head ``h``, KV head ``h // rep``, query row ``i``)::

    s[j]   = (q[i] . k[j]) * scale  (or / scale)  + mask[b, h, i, j]   (-inf where causal hides j)
    out[i] = (sum_j exp(s[j] - max s) v[j]) / sum_j exp(s[j] - max s)

The general kernel in :mod:`graph_api.kernels.sdpa` streams K/V tiles with an
online softmax and, for K stored ``[S, D]``, scores by 16-lane dot products and
a transpose-and-add tree: at ``D = 32`` and ``S = 64`` that tree, the per-tile
rescaling and the per-element mask reads cost more than the products.  Here a
work item is one (batch, query head): K is transposed once into ``kT [D, S]``
(padded to 32 positions), each block of 32 query rows gets its whole score
rows (register-blocked 4 rows x 32 positions, an FMA per ``d``), the softmax
is the exact two-pass one (max, :func:`bits.exp32`, 16-lane sums), and
``P V`` is register-blocked 4 rows x 32 lanes of ``d``; each output row is
divided by its sum once.  Without AVX-512 (16 registers of 8 floats) both products
use 6 x 16 blocks instead, over blocks of 30 query rows (:data:`NARROW`; the 4 x 32
ones spilled: BERT's 8 x 12 heads at S = 64, D = 32, one thread on Zen 3: 3.4 ->
2.2-2.4 ms with 4 x 16; 6 x 16 keeps both FMA pipes busy, see :func:`score_rows16`).

Arithmetic: f32, explicit single-rounding FMAs in a fixed order (sequential
over ``d`` for a score, over ``j`` for an output), no fastmath; the same
rounding steps as the general kernel apart from its online rescaling.  A row
whose every score is -inf gives 0/0 = NaN, as the general kernel (the plan's
``inf_as_zero`` handling sees it).

Threads: one ``nogil`` function over work items, run by ``threads.run_items``.
Divisions are IEEE (``error_model="numpy"``): 0/0 gives NaN, not an exception.
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401 (numba: configured first)
from graph_api.kernels.isa import ISA

import numpy as np
from numba import njit

from graph_api.kernels.bits import (bits_from_f32, exp32, f32_from_bits, round_code, vadd, vbcast, vdiv, vexp,
                                    vfma, vload, vmax, vmul, vsplat, vstore, vsub)

QB = 32  #: query rows per block (their score rows stay in L1/L2)
PV_TB = 64  #: positions per block of the P V product (32 lanes of V: 8 KiB, in L1)
SP_PAD = 16  #: f32 padding of kT and score rows: 2**n-byte row strides alias cache sets
MAX_S = 4096  #: longer KV: the tiled online-softmax kernel
NEG_INF = np.float32(-np.inf)
#: the score and P V products in 6 x 16 register blocks (16 vector registers of 8 floats:
#: no AVX-512); both block shapes give equal results (tests run both)
NARROW = not ISA.avx512


def usable(q_kind: int, k_kind: int, v_kind: int, k_transposed: int, D: int, S: int, Sq: int,
           rnd: int, okind: int) -> bool:
    """f32 Q/K/V with K ``[S, D]``, no fpmath rounding, f32 output, D a multiple of 16,
    a prefill (more than 8 query rows; decode has its own kernels) over at most MAX_S keys."""
    return (q_kind == 0 and k_kind == 0 and v_kind == 0 and k_transposed == 0 and rnd == 0
            and okind == 0 and D % 16 == 0 and 0 < S <= MAX_S and Sq > 8)


@njit(inline="always", cache=True, error_model="numpy")
def score_rows(qb, kT, sc, Rp, D, Sp, ntc):
    """sc[r, t] = sum_d qb[r, d] * kT[d, t] for r < Rp (a multiple of 4), t < ntc (of 32);
    rows of kT and sc are Sp apart, 4 rows x 32 lanes of accumulators (also the
    tiled prefill's score step in sdpa/blocked.py)."""
    z = vsplat(np.float32(0.0))
    # column blocks outer: the D x 32 block of kT (16 KiB at D = 128) is read from L2 once
    # and reused from L1 by every group of 4 rows (rows outer streamed all of kT, 1 MiB
    # at S = 2048, once per 4 rows)
    for c in range(0, ntc, 32):
        for r0 in range(0, Rp, 4):
            q0 = r0 * D
            a0 = z
            a1 = z
            a2 = z
            a3 = z
            b0 = z
            b1 = z
            b2 = z
            b3 = z
            for d in range(D):
                k0 = vload(kT, d * Sp + c)
                k1 = vload(kT, d * Sp + c + 16)
                x0 = vsplat(qb[q0 + d])
                x1 = vsplat(qb[q0 + D + d])
                x2 = vsplat(qb[q0 + 2 * D + d])
                x3 = vsplat(qb[q0 + 3 * D + d])
                a0 = vfma(x0, k0, a0)
                b0 = vfma(x0, k1, b0)
                a1 = vfma(x1, k0, a1)
                b1 = vfma(x1, k1, b1)
                a2 = vfma(x2, k0, a2)
                b2 = vfma(x2, k1, b2)
                a3 = vfma(x3, k0, a3)
                b3 = vfma(x3, k1, b3)
            vstore(sc, r0 * Sp + c, a0)
            vstore(sc, r0 * Sp + c + 16, b0)
            vstore(sc, (r0 + 1) * Sp + c, a1)
            vstore(sc, (r0 + 1) * Sp + c + 16, b1)
            vstore(sc, (r0 + 2) * Sp + c, a2)
            vstore(sc, (r0 + 2) * Sp + c + 16, b2)
            vstore(sc, (r0 + 3) * Sp + c, a3)
            vstore(sc, (r0 + 3) * Sp + c + 16, b3)


# The per-row and per-block steps below are compiled functions of their own, called from
# prefill_items, not inlined into it: Numba's IR inlining made the kernel 12 s of compile on
# an empty cache (AVX2 host, CPU time), 8.4 s without, and the calls cost no run time
# (A/B interleaved, BERT-like shapes: 0.98-0.99x).  score_rows stays inlined: sdpa's tiled
# kernel inlines it too, and there a non-inlined tile step measured slower.
@njit(inline="always", cache=True)
def _lanes_max(v, part):
    """max of the 16 lanes of ``v``, lane 0 first (``part``: 16 floats of scratch)."""
    vstore(part, 0, v)
    mx = part[0]
    for j in range(1, 16):
        mx = max(mx, part[j])
    return mx


@njit(inline="always", cache=True)
def _lanes_sum(v, part):
    """sum of the 16 lanes of ``v`` in lane order (``part``: 16 floats of scratch)."""
    vstore(part, 0, v)
    s = part[0]
    for j in range(1, 16):
        s += part[j]
    return s


@njit(cache=True, error_model="numpy")
def _softmax_row(row, n, ntc, part):
    """exp(row - max) in place over ``ntc`` entries (those from ``n`` on are set to -inf,
    so 0); returns (max, sum) (the sum: 16 lane sums, then the lanes in order);
    (-inf, 0) for an all -inf row."""
    for t in range(n, ntc):
        row[t] = NEG_INF
    mv = vsplat(NEG_INF)
    for t in range(0, ntc, 16):
        mv = vmax(mv, vload(row, t))
    mx = _lanes_max(mv, part)
    if mx == NEG_INF:
        for t in range(ntc):
            row[t] = np.float32(0.0)
        return mx, np.float32(0.0)
    for t in range(ntc):
        row[t] = exp32(row[t] - mx)
    ls = vsplat(np.float32(0.0))
    for t in range(0, ntc, 16):
        ls = vadd(ls, vload(row, t))
    s = _lanes_sum(ls, part)
    return mx, s


@njit(inline="always", cache=True, error_model="numpy")
def _scaled_softmax_row(row, n, ntc, scale, smul, mflat, mo, has_mask, part):
    """:func:`_softmax_row` of ``row * scale`` (``smul``; else ``row / scale``) plus the
    mask's contiguous row ``mflat[mo:mo + n]`` (``has_mask``), in two passes instead of
    five: the scale, the mask and the max in one, the exponentials (:func:`bits.vexp`,
    exp32's values) and their 16 lane sums in the other.  The same operations on the
    same values in the same order as the separate row steps, so equal results (tests
    compare both); they stay for rounded scores, causal and strided masks."""
    sv = vsplat(scale)
    mv = vsplat(NEG_INF)
    n16 = n // 16 * 16
    for t in range(0, n16, 16):
        x = vmul(vload(row, t), sv) if smul else vdiv(vload(row, t), sv)
        if has_mask:
            x = vadd(x, vload(mflat, mo + t))
        vstore(row, t, x)
        mv = vmax(mv, x)
    for t in range(n16, n):
        x = row[t] * scale if smul else row[t] / scale
        row[t] = x + mflat[mo + t] if has_mask else x
    for t in range(n, ntc):
        row[t] = NEG_INF
    for t in range(n16, ntc, 16):
        mv = vmax(mv, vload(row, t))
    mx = _lanes_max(mv, part)
    if mx == NEG_INF:
        for t in range(ntc):
            row[t] = np.float32(0.0)
        return mx, np.float32(0.0)
    mxv = vsplat(mx)
    ls = vsplat(np.float32(0.0))
    for t in range(0, ntc, 16):
        e = vexp(vsub(vload(row, t), mxv))
        vstore(row, t, e)
        ls = vadd(ls, e)
    s = _lanes_sum(ls, part)
    return mx, s


@njit(cache=True, error_model="numpy")
def _scaled_softmax_rows(sc, Sp, nq, n, ntc, scale, smul, mflat, mo, ms, has_mask, part, rmx, lsum, diag):
    """:func:`_scaled_softmax_row` of the score rows ``r < nq`` of a block (row ``r`` at
    ``sc[r * Sp:]``, its mask row at ``mflat[mo + r * ms:]``), each row's max into
    ``rmx[r]`` and sum of exponentials into ``lsum[r]``.  Row ``r`` sees the first
    ``diag + r`` of the ``n`` positions (causal; ``diag = n`` without a causal mask),
    the rest are -inf (exp 0, as when the separate steps set them after the scale
    and the mask).  One call per block:
    a call per row (three arrays passed, a tuple returned) cost ~40 ns, a third of a
    64-key row."""
    for r in range(nq):
        nr = max(0, min(n, diag + r))
        rmx[r], lsum[r] = _scaled_softmax_row(sc[r * Sp:r * Sp + ntc], nr, ntc, scale, smul, mflat, mo + r * ms,
                                              has_mask, part)


@njit(cache=True, error_model="numpy")
def _round_f8(y, shift, tiny, quantum):
    """Finite f32 ``y`` to the nearest (even) value with ``23 - shift`` mantissa bits whose
    normal range starts at ``tiny`` (below it: multiples of ``quantum``, the subnormals),
    as ml_dtypes converts f32 to f8 (no saturation: the plan checks the range)."""
    a = abs(y)
    if a < tiny:
        r = np.rint(a / quantum) * quantum  # power-of-two scaling: exact
    else:
        u = bits_from_f32(a)
        half = (np.uint32(1) << shift) - np.uint32(1)
        u = (u + (half >> np.uint32(1)) + ((u >> shift) & np.uint32(1))) & ~half
        r = f32_from_bits(u)
    return r if y >= np.float32(0.0) else -r


@njit(cache=True, error_model="numpy")
def _quantize_row(row, n, total, prm):
    """row[t] = Dequantize(Quantize(row[t] / total)) for t < n, in f32 as the reference:
    p = e / sum;  y = p / qs + qz;  q = min(max(rne(y), lo), hi) for s8/u8 (``prm[6]`` 0),
    q = :func:`_round_f8` (y) for f8 (``prm[6]`` 1: prm[7..9] = shift, tiny, quantum);
    row = (q - dz) * ds.  ``p`` is first rounded by code ``prm[10]`` (a half-precision
    SoftMax output) and the row by code ``prm[11]`` (a TypeCast after the Dequantize),
    as :func:`bits.round_code`.  A row with no visible key (sum 0) becomes NaN: the plan
    hands it to the reference.

    The roundings are passes of their own over the row (:func:`_round_row`, the same f32
    values): inlined into each loop here, ``round_code`` (with the three roundings it
    inlines) cost ~1.5 s of compile on an empty cache for a path only static-quantized
    SDPA takes."""
    qs, qz, lo, hi, ds, dz = prm[0], prm[1], prm[2], prm[3], prm[4], prm[5]
    p_rnd, out_rnd = int(prm[10]), int(prm[11])
    if total == np.float32(0.0):
        for t in range(n):
            row[t] = np.float32(np.nan)
        return
    if p_rnd != 0:
        for t in range(n):
            row[t] = row[t] / total
        _round_row(row, n, p_rnd)
        total = np.float32(1.0)  # x / 1 is x exactly
    if prm[6] == np.float32(0.0):
        for t in range(n):
            y = np.rint(row[t] / total / qs + qz)
            row[t] = (min(max(y, lo), hi) - dz) * ds
    else:
        shift = np.uint32(prm[7])
        for t in range(n):
            y = _round_f8(row[t] / total / qs + qz, shift, prm[8], prm[9])
            row[t] = (y - dz) * ds
    if out_rnd != 0:
        _round_row(row, n, out_rnd)


@njit(cache=True, error_model="numpy")
def _round_row(row, n, rnd):
    """row[t] = round_code(row[t], rnd) for t < n."""
    for t in range(n):
        row[t] = round_code(row[t], rnd)


@njit(cache=True, error_model="numpy")
def _pv(sc, vb, v0, vs, acc, Rp, D, Sp, n):
    """acc[r, :] = sum_{t < n} sc[r, t] * V[t, :] (V rows at vb[v0 + t * vs]); 4 rows x 16/32 lanes.

    Positions in blocks of PV_TB: a block's 32 lanes of V (8 KiB) are read from L2 once
    and reused from L1 by every group of 4 rows (rows outer streamed all of V, 1 MiB at
    S = 2048, once per 4 rows); the accumulators go through ``acc`` between blocks, so
    each sum still runs over t in order."""
    z = vsplat(np.float32(0.0))
    for t0 in range(0, n, PV_TB):
        t1 = min(n, t0 + PV_TB)
        c = 0
        while c + 32 <= D:
            for r0 in range(0, Rp, 4):
                p0 = r0 * Sp
                o0 = r0 * D + c
                if t0 == 0:
                    a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = z
                else:
                    a0 = vload(acc, o0)
                    b0 = vload(acc, o0 + 16)
                    a1 = vload(acc, o0 + D)
                    b1 = vload(acc, o0 + D + 16)
                    a2 = vload(acc, o0 + 2 * D)
                    b2 = vload(acc, o0 + 2 * D + 16)
                    a3 = vload(acc, o0 + 3 * D)
                    b3 = vload(acc, o0 + 3 * D + 16)
                for t in range(t0, t1):
                    w0 = vload(vb, v0 + t * vs + c)
                    w1 = vload(vb, v0 + t * vs + c + 16)
                    x = vsplat(sc[p0 + t])
                    a0 = vfma(x, w0, a0)
                    b0 = vfma(x, w1, b0)
                    x = vsplat(sc[p0 + Sp + t])
                    a1 = vfma(x, w0, a1)
                    b1 = vfma(x, w1, b1)
                    x = vsplat(sc[p0 + 2 * Sp + t])
                    a2 = vfma(x, w0, a2)
                    b2 = vfma(x, w1, b2)
                    x = vsplat(sc[p0 + 3 * Sp + t])
                    a3 = vfma(x, w0, a3)
                    b3 = vfma(x, w1, b3)
                vstore(acc, o0, a0)
                vstore(acc, o0 + 16, b0)
                vstore(acc, o0 + D, a1)
                vstore(acc, o0 + D + 16, b1)
                vstore(acc, o0 + 2 * D, a2)
                vstore(acc, o0 + 2 * D + 16, b2)
                vstore(acc, o0 + 3 * D, a3)
                vstore(acc, o0 + 3 * D + 16, b3)
            c += 32
        if c < D:  # D = 16 (mod 32): one more 16-lane column
            for r0 in range(0, Rp, 4):
                p0 = r0 * Sp
                o0 = r0 * D + c
                if t0 == 0:
                    a0 = a1 = a2 = a3 = z
                else:
                    a0 = vload(acc, o0)
                    a1 = vload(acc, o0 + D)
                    a2 = vload(acc, o0 + 2 * D)
                    a3 = vload(acc, o0 + 3 * D)
                for t in range(t0, t1):
                    w0 = vload(vb, v0 + t * vs + c)
                    a0 = vfma(vsplat(sc[p0 + t]), w0, a0)
                    a1 = vfma(vsplat(sc[p0 + Sp + t]), w0, a1)
                    a2 = vfma(vsplat(sc[p0 + 2 * Sp + t]), w0, a2)
                    a3 = vfma(vsplat(sc[p0 + 3 * Sp + t]), w0, a3)
                vstore(acc, o0, a0)
                vstore(acc, o0 + D, a1)
                vstore(acc, o0 + 2 * D, a2)
                vstore(acc, o0 + 3 * D, a3)
    if n == 0:  # no position: zero sums (then 0/0 = NaN, as the general kernel)
        for i in range(Rp * D):
            acc[i] = np.float32(0.0)


@njit(inline="always", cache=True, error_model="numpy")
def score_rows16(qb, kT, sc, Rp, D, Sp, ntc):
    """:func:`score_rows` with 6 rows x 16 lanes of accumulators (``Rp`` a multiple of
    6), for CPUs with 16 vector registers of 8 floats (AVX2): score_rows' 4 x 32 block
    is 16 ymm accumulators and spilled (plus register shuffling each ``d``); 4 x 16 left
    8 FMA chains for 2 FMA pipes of 4-cycle latency, 12 keep both busy (Zen 3, one
    thread, S = 2048, D = 128: 57 -> 64 GFLOP/s).  Same sums in the same order: equal
    results.  The broadcasts are unchecked loads (:func:`bits.vbcast`): a checked index
    costs a sign test and an add per broadcast."""
    z = vsplat(np.float32(0.0))
    for c in range(0, ntc, 16):
        for r0 in range(0, Rp, 6):
            q0 = r0 * D
            a0 = a1 = a2 = a3 = a4 = a5 = z
            for d in range(D):
                k0 = vload(kT, d * Sp + c)
                a0 = vfma(vbcast(qb, q0 + d), k0, a0)
                a1 = vfma(vbcast(qb, q0 + D + d), k0, a1)
                a2 = vfma(vbcast(qb, q0 + 2 * D + d), k0, a2)
                a3 = vfma(vbcast(qb, q0 + 3 * D + d), k0, a3)
                a4 = vfma(vbcast(qb, q0 + 4 * D + d), k0, a4)
                a5 = vfma(vbcast(qb, q0 + 5 * D + d), k0, a5)
            vstore(sc, r0 * Sp + c, a0)
            vstore(sc, (r0 + 1) * Sp + c, a1)
            vstore(sc, (r0 + 2) * Sp + c, a2)
            vstore(sc, (r0 + 3) * Sp + c, a3)
            vstore(sc, (r0 + 4) * Sp + c, a4)
            vstore(sc, (r0 + 5) * Sp + c, a5)


@njit(cache=True, error_model="numpy")
def _pv16(sc, vb, v0, vs, acc, Rp, D, Sp, n):
    """:func:`_pv` with 6 rows x 16 lanes of accumulators (``Rp`` a multiple of 6; AVX2:
    see :func:`score_rows16`; 4 x 16 -> 6 x 16: 50-64 -> 78 GFLOP/s on the same case);
    the same sums in the same order."""
    z = vsplat(np.float32(0.0))
    for t0 in range(0, n, PV_TB):
        t1 = min(n, t0 + PV_TB)
        for c in range(0, D, 16):
            for r0 in range(0, Rp, 6):
                p0 = r0 * Sp
                o0 = r0 * D + c
                if t0 == 0:
                    a0 = a1 = a2 = a3 = a4 = a5 = z
                else:
                    a0 = vload(acc, o0)
                    a1 = vload(acc, o0 + D)
                    a2 = vload(acc, o0 + 2 * D)
                    a3 = vload(acc, o0 + 3 * D)
                    a4 = vload(acc, o0 + 4 * D)
                    a5 = vload(acc, o0 + 5 * D)
                for t in range(t0, t1):
                    w0 = vload(vb, v0 + t * vs + c)
                    a0 = vfma(vbcast(sc, p0 + t), w0, a0)
                    a1 = vfma(vbcast(sc, p0 + Sp + t), w0, a1)
                    a2 = vfma(vbcast(sc, p0 + 2 * Sp + t), w0, a2)
                    a3 = vfma(vbcast(sc, p0 + 3 * Sp + t), w0, a3)
                    a4 = vfma(vbcast(sc, p0 + 4 * Sp + t), w0, a4)
                    a5 = vfma(vbcast(sc, p0 + 5 * Sp + t), w0, a5)
                vstore(acc, o0, a0)
                vstore(acc, o0 + D, a1)
                vstore(acc, o0 + 2 * D, a2)
                vstore(acc, o0 + 3 * D, a3)
                vstore(acc, o0 + 4 * D, a4)
                vstore(acc, o0 + 5 * D, a5)
    if n == 0:  # no position: zero sums (then 0/0 = NaN, as the general kernel)
        for i in range(Rp * D):
            acc[i] = np.float32(0.0)


def _make_items(narrow: bool, quantized: bool = False, row_steps: bool = False):
    """The work-item kernel with the products of one register-block shape, and only the
    softmax path its calls take.

    The three choices are closure constants, not arguments: Numba prunes the untaken
    branches before it inlines or types anything, so a kernel compiles only what it
    runs, and each choice's value is part of the closure's on-disk cache key (the forms
    never share a cache entry).  ``narrow``: this CPU's register blocks (the 4 x 32
    steps cost ~2 s of compile on an empty cache on an AVX2 host, where they never
    run).  ``quantized``: the probabilities pass :func:`_quantize_row` (static-quantized
    SDPA only; with its roundings ~1.7 s of compile).  ``row_steps``: the separate
    per-row steps of rounded scores and key-strided masks (:func:`_softmax_row`,
    :func:`_round_row`: ~1.8 s) instead of the two-pass :func:`_scaled_softmax_rows`.
    """

    height = 6 if narrow else 4  # register-block rows of the products
    block = 30 if narrow else QB  # query rows per block: whole register blocks

    @njit(nogil=True, cache=True, error_model="numpy")
    def prefill_items(ids, qf, qstr, Hq, Sq, D, kb, kstr, vb, vstr, Hkv, S, scale, smul, mflat, mstr, has_mask,
                      causal, obuf, ostr, want_rows, rmax, rsum, pq_param, srnd):
        """Work items ``b * Hq + h`` of the module formula.

        Q [B, Hq, Sq, D], K and V [B, Hkv, S, D] and the output are flat f32 buffers read
        through the element strides of their first three axes, the D axis contiguous (any
        layout whose rows are contiguous: the heads of a [B, S, H, D] projection output are
        read, and the output rows written, in place): Q row ``(b, h, i)`` at
        ``qf[b*qstr[0] + h*qstr[1] + i*qstr[2]:][:D]``, K and V rows alike with ``kstr``,
        ``vstr``, output rows in ``obuf`` with ``ostr``;
        mask element ``(b, h, i, j)`` at ``mflat[b*mstr[0] + h*mstr[1] + i*mstr[2] + j*mstr[3]]``
        (stride 0 on broadcast axes); causal 0 none, 1 top-left, 2 bottom-right.
        ``want_rows``: each row's score max and sum of exponentials go to
        ``rmax``/``rsum`` flat [B, Hq, Sq] (the SoftMax stats of a training forward).
        ``quantized`` (closure): the probabilities pass a Quantize -> Dequantize pair before
        ``P V`` (static-quantized SDPA): see :func:`_quantize_row` for ``pq_param`` (f32).
        ``srnd``: rounding code (:func:`bits.round_code`) of the scores after the product,
        the scale and the mask (each a half-precision op output in the graph), 0 none; read
        only by the ``row_steps`` kernel (the one :func:`kernel` picks when it is nonzero).
        The products are 6 x 16 register blocks (:func:`score_rows16`, :func:`_pv16`) in
        blocks of 30 query rows when ``narrow``, else 4 x 32 (:func:`score_rows`,
        :func:`_pv`) in blocks of 32: equal results.
        """
        rep = Hq // Hkv
        coff = S - Sq if causal == 2 else 0
        Sp = (S + 31) // 32 * 32 + SP_PAD  # not a power of two: kT's rows d and d + 1 in other cache sets
        kT = np.zeros(D * Sp, np.float32)  # columns S..Sp stay 0
        sc = np.empty(QB * Sp, np.float32)  # (30 rows when narrow)
        acc = np.empty(QB * D, np.float32)
        qb = np.zeros(QB * D, np.float32)
        lsum = np.empty(QB, np.float32)
        rmx = np.empty(QB, np.float32)
        part = np.empty(16, np.float32)
        for it in ids:
            b = it // Hq
            h = it % Hq
            kbase = b * kstr[0] + (h // rep) * kstr[1]
            ks = kstr[2]
            for d in range(D):  # contiguous writes, strided reads: measured faster than the reverse
                kd = kT[d * Sp:d * Sp + S]
                for t in range(S):
                    kd[t] = kb[kbase + t * ks + d]
            for i0 in range(0, Sq, block):
                nq = min(block, Sq - i0)
                Rp = (nq + height - 1) // height * height
                for r in range(nq):
                    qo = b * qstr[0] + h * qstr[1] + (i0 + r) * qstr[2]
                    qrow = qf[qo:qo + D]
                    for d in range(D):
                        qb[r * D + d] = qrow[d]
                for r in range(nq, Rp):  # padding rows: finite zeros, never stored
                    for d in range(D):
                        qb[r * D + d] = np.float32(0.0)
                n = S  # positions any row of the block sees
                if causal != 0:
                    n = max(0, min(S, i0 + nq + coff))
                ntc = (n + 31) // 32 * 32
                if narrow:
                    score_rows16(qb, kT, sc, Rp, D, Sp, ntc)
                else:
                    score_rows(qb, kT, sc, Rp, D, Sp, ntc)
                for r in range(nq, Rp):  # padding rows: zero probabilities
                    for t in range(ntc):
                        sc[r * Sp + t] = np.float32(0.0)
                if row_steps:  # rounded scores, masks strided along the keys
                    for r in range(nq):
                        row = sc[r * Sp:r * Sp + ntc]
                        i = i0 + r
                        if srnd != 0:
                            _round_row(row, n, srnd)
                        if smul:
                            for t in range(n):
                                row[t] = row[t] * scale
                        else:
                            for t in range(n):
                                row[t] = row[t] / scale
                        if srnd != 0:
                            _round_row(row, n, srnd)
                        if has_mask:
                            mo = b * mstr[0] + h * mstr[1] + i * mstr[2]
                            ms = mstr[3]
                            if ms == 1:
                                mrow = mflat[mo:mo + n]
                                for t in range(n):
                                    row[t] = row[t] + mrow[t]
                            else:
                                for t in range(n):
                                    row[t] = row[t] + mflat[mo + t * ms]
                            if srnd != 0:
                                _round_row(row, n, srnd)
                        if causal != 0:
                            for t in range(max(0, i + coff + 1), n):
                                row[t] = NEG_INF
                        mx, lsum[r] = _softmax_row(row, n, ntc, part)
                        rmx[r] = mx
                else:  # scale, mask and max in one pass, exponentials and sums in another
                    _scaled_softmax_rows(sc, Sp, nq, n, ntc, scale, smul, mflat,
                                         b * mstr[0] + h * mstr[1] + i0 * mstr[2], mstr[2], has_mask, part,
                                         rmx, lsum, i0 + coff + 1 if causal != 0 else n)
                for r in range(nq):
                    if want_rows:
                        rmax[it * Sq + i0 + r] = rmx[r]
                        rsum[it * Sq + i0 + r] = lsum[r]
                    if quantized:
                        _quantize_row(sc[r * Sp:r * Sp + ntc], n, lsum[r], pq_param)
                        lsum[r] = np.float32(1.0)
                if narrow:
                    _pv16(sc, vb, b * vstr[0] + (h // rep) * vstr[1], vstr[2], acc, Rp, D, Sp, n)
                else:
                    _pv(sc, vb, b * vstr[0] + (h // rep) * vstr[1], vstr[2], acc, Rp, D, Sp, n)
                for r in range(nq):
                    o = b * ostr[0] + h * ostr[1] + (i0 + r) * ostr[2]
                    orow = obuf[o:o + D]
                    den = lsum[r]
                    for d in range(D):
                        orow[d] = acc[r * D + d] / den

    return prefill_items


_ITEMS = {}


def items_kernel(narrow: bool, quantized: bool = False, row_steps: bool = False):
    """The work-item kernel of either register-block shape with the given softmax path
    (:func:`_make_items`), made on first use (tests run both shapes; elsewhere only this
    CPU's, :data:`NARROW`, is ever made)."""
    key = (narrow, quantized, row_steps)
    if key not in _ITEMS:
        _ITEMS[key] = _make_items(*key)
    return _ITEMS[key]


def kernel(quantized: bool, srnd: int, has_mask: bool, mask_key_stride: int):
    """The work-item kernel for a call: this CPU's register blocks (:data:`NARROW`), the
    quantize step only for quantized probabilities, the separate row steps only for
    rounded scores (``srnd``) or a mask strided along the keys."""
    row_steps = srnd != 0 or (has_mask and mask_key_stride != 1)
    return items_kernel(NARROW, quantized, row_steps)

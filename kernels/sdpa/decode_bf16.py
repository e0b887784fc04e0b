"""Compressed SDPA decode under fpmath bf16: Q.K and P.V on AVX512_BF16 ``vdpbf16ps``.

The strict f32 decode kernel (``sdpa.decode.decode_items``) spends one FMA lane per K/V
element and query row of its head group: at 4 query heads per KV head that is
0.25 cycles per element, about twice the time the int4 cache takes to read.
``vdpbf16ps`` does 32 bf16 multiply-adds per instruction (twice the lanes of an
f32 FMA) with exact products and f32 accumulation, so under fpmath bf16 this
kernel computes::

    score[r, s] = sum_g sk[g, s] * (sum_{d in g} bf16(q[r, d]) * u[d, s]  -  z'[g, s] * Q_g[r])
    out[r, d]  += sum_s bf16(p[r, s] * sv[s, g]) * u[s, d]  -  sum_s bf16(p sv) * z'[s, g]

``u`` are the stored integers made bf16 (exact: |u| <= 256), ``z' = zp + off``
their zero point plus the encoding offset below, ``Q_g[r]`` the sum of the
bf16 query over group ``g``.  Per group the scale comes out of the partial sum
along the head dimension (Q.K), and for P.V it is folded into the
probability (a zmm of V holds 16 head dims of one group), which is rounded to
bf16 once.

What bf16 fpmath permits and what this computes.  The mode lets f32 inputs of
the MatMuls be rounded to bf16 (docs/fpmath.md), with ``apply_to_int`` the
dequantized K/V too; the caller asks for this kernel only then (``bf16_dot``).
It rounds Q and ``p * sv`` (the probability times the V scale) to bf16,
round-to-nearest-even, nothing else: the K/V integers are exact in bf16 and
the K scales are applied in f32, so it is at least as accurate as rounding the
dequantized K/V.  Error bound per output element against exact attention on
the bf16 query (u = 2^-24; tests/kernels/test_sdpa_bf16.py computes it)::

    2^-8 * sum_s P[s] |v[s, d]|                 p * sv rounded to bf16 once (unit roundoff 2^-8)
    + 2 max|v| * ds                             score error ds <= scale sum_g sk_g 70 u (off + 15 + z) sum_g |q|
    + 130 u (tiles * max|v| + (ovl + 15 + z) max sv)   f32 P.V sums of each tile, offsets included
    + 1e-6 max|v|                               the f32 merge of the splits

i.e. at most one bf16 rounding of max|V|, usually far less.  Both instructions
treat bf16/f32 denormals as zero (DAZ/FTZ), far below that bound.

int4 to bf16: :mod:`graph_api.kernels.bf16dot` makes each nibble ``off + n``
exactly (16/24 for K, 128/136 or 16/24 for V's low/high nibbles); ``off`` is
taken out through ``z'`` above: for Q.K with ``Q_g``, for P.V with the sums of
the rounded weights (``vdpbf16ps`` against pairs of ones and of zero points:
exact products), tile by tile so the f32 sums stay within ``(off + 15) *
sum_tile p sv``.  8-bit values need no offset.  Zero points must be integers
(DynamicDequantize's integer zero-point types), exact in bf16.

Pairs.  ``vdpbf16ps`` multiplies bf16 pairs lane by lane and adds both
products to the f32 lane: the pair must run along the reduction.  K is stored
``[D, S]``: lane = position, pair = rows d, d+1, low and high nibbles = even and
odd positions (scores in that even/odd order per 32 positions).  V is
``[S, D]``: lane = head dim, pair = rows s, s+1, the same helper.  Q is broadcast
as a pair (q[d], q[d+1]), the weights as (w[s, g], w[s+1, g]) (``vpermt2ps`` of
the probabilities against the ``[S, D/G]`` V scales, ``vcvtne2ps2bf16``, ``vpermw``).

How far from the limit (Zen 4 EPYC, 2 cores, `inspect_asm` and one-core CPU time,
L2-resident data).  ``vdpbf16ps`` zmm runs 1 per cycle per core (measured 3.63 G/s,
the same rate as a zmm FMA): at 4 query heads per KV head the floor is 0.125 cycles
per K/V element, Hq=32 Hkv=8 L=4096 0.144 ms on 2 cores, against 0.12 ms to read
the int4 cache cold at 43 GB/s -- so "60% of read bandwidth" needs the unpack,
softmax and weights to hide almost entirely behind the dot products.  The Q.K loop
issues per K row pair and 64 positions 16 ``vdpbf16ps``, 2 ``vpermt2b``, 4 shifts,
4 ``vpternlogd``, 4 loads, 4 broadcasts and 2 prefetches (the f32 kernel: 65
instructions for the same 512 multiply-adds); P.V about the same.  Measured per
K/V element and 4 rows: Q.K 0.195, P.V 0.18, weights 0.043, softmax 0.08 cycles
(per K+V element 0.25, the f32 kernel 0.35-0.37): ~0.29 ms at Hkv=8 L=4096, about
40% of the cold read bandwidth.  With one query head per KV head (Hkv = Hq) it is
0.11 cycles per element, about the time the int4 cache takes to read.

Layouts and limits as the f32 decode kernel (K transposed, V ``[S, D]``, D a
multiple of 64, int4 V groups a multiple of 32, 8-bit ones of 16), plus even
K groups.  ``HAVE_BF16`` guards the CPU feature; without it the caller keeps
the f32 path (inputs rounded, f32 FMAs).
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (configures numba first)

import numpy as np
from numba import njit

from graph_api.kernels import bf16dot
from graph_api.kernels.bf16dot import (itemsize_of, vbcast, vbits, vdpbf, vpack, vpair4_hi, vpair4_lo,
                                       vpair4_lo128, vpair8, vperm2)
from graph_api.kernels.bits import exp32, prefetch, vadd, vfma, vload, vload_even, vload_odd, vmul, vsplat, vstore
from graph_api.kernels.sdpa.online_softmax import online_softmax_row

DT = 128  #: KV positions per tile (one 64-byte line per int4 K row)
NEG_INF = np.float32(-np.inf)
#: whether this kernel may run (tests switch it off to run the f32 path)
HAVE_BF16 = bf16dot.HAVE_BF16


# ------------------------------------------------------------------ building blocks
@njit(inline="always", cache=True)
def _vecs(buf, a, b, cl, ch):
    """4 pair vectors of 64 values along the lanes from rows at bytes ``a`` and ``b``:
    int4 (``buf`` a uint16 view): low / high nibbles of bytes 0-15, then of 16-31
    (encodings lo16 / hi16, constants ``cl`` / ``ch``); 8-bit: elements 0-15, 16-31,
    32-47, 48-63."""
    if itemsize_of(buf) == 2:
        return (vpair4_lo(buf, a, b, cl), vpair4_hi(buf, a, b, ch),
                vpair4_lo(buf, a + 16, b + 16, cl), vpair4_hi(buf, a + 16, b + 16, ch))
    return (vpair8(buf, a, b), vpair8(buf, a + 16, b + 16),
            vpair8(buf, a + 32, b + 32), vpair8(buf, a + 48, b + 48))


@njit(inline="always", cache=True)
def _vecs_v(buf, a, b, cl, ch):
    """:func:`_vecs` with the low nibbles in the lo128 encoding (one operation fewer;
    the P.V sums are corrected per tile, so the larger offset costs little)."""
    if itemsize_of(buf) == 2:
        return (vpair4_lo128(buf, a, b, cl), vpair4_hi(buf, a, b, ch),
                vpair4_lo128(buf, a + 16, b + 16, cl), vpair4_hi(buf, a + 16, b + 16, ch))
    return (vpair8(buf, a, b), vpair8(buf, a + 16, b + 16),
            vpair8(buf, a + 32, b + 32), vpair8(buf, a + 48, b + 48))


@njit(inline="always", cache=True)
def _kparam4(arr, i, four):
    """K scales / zero points of a 64-position sub-block from flat index i, in the lane
    order of :func:`_vecs` (int4: even positions then odd ones)."""
    if four:
        return (vload_even(arr, i), vload_odd(arr, i), vload_even(arr, i + 32), vload_odd(arr, i + 32))
    return (vload(arr, i), vload(arr, i + 16), vload(arr, i + 32), vload(arr, i + 48))


@njit(inline="always", cache=True)
def _zparam4(arr, i, four, zs, ol, oh):
    """z' = zero point + encoding offset of the 4 vectors (offsets ``ol`` for the low
    nibbles, ``oh`` for the high ones; ``zs`` = 0: no zero points)."""
    el = vsplat(ol)
    eh = vsplat(oh)
    if zs:
        z0, z1, z2, z3 = _kparam4(arr, i, four)
        return vadd(z0, el), vadd(z1, eh), vadd(z2, el), vadd(z3, eh)
    return el, eh, el, eh


@njit(inline="always", cache=True)
def _sacc(sc, o, s0, s1, s2, s3, z0, z1, z2, z3, nq, a0, a1, a2, a3):
    """sc[o + 16v ..] += s_v * (a_v - z'_v * Q_g) for the 4 vectors of one row (nq = -Q_g)."""
    n = vsplat(nq)
    vstore(sc, o, vfma(s0, vfma(z0, n, a0), vload(sc, o)))
    vstore(sc, o + 16, vfma(s1, vfma(z1, n, a1), vload(sc, o + 16)))
    vstore(sc, o + 32, vfma(s2, vfma(z2, n, a2), vload(sc, o + 32)))
    vstore(sc, o + 48, vfma(s3, vfma(z3, n, a3), vload(sc, o + 48)))


@njit(cache=True)
def _score4(buf, k0, rs, pf, cl, ch, ol, oh, scb, s0i, srs, zpb, zs, G, D, qp, qsum, r0, sc, c):
    """sc[r0..r0+3, 64c..64c+63] = scores of 4 rows against one 64-position K sub-block.

    ``k0``: byte offset of row d=0 of the tile, ``rs`` the row stride in bytes, ``pf``
    the byte distance to the next tile (prefetched);
    ``cl``/``ch``/``ol``/``oh``: the int4 encodings' constants and offsets;
    ``s0i``: scale index of group 0 at the tile's first position, ``srs`` the group
    stride; zero points at ``s0i`` too when ``zs`` = 1.  ``qp``: bf16 pairs of Q
    (row r, pair p at r * D/2 + p); ``qsum``: Q summed per group.
    """
    four = itemsize_of(buf) == 2
    ng = D // G
    hp = D // 2
    z = vsplat(np.float32(0.0))
    sub = (32 if four else 64) * c
    o0 = r0 * DT + 64 * c
    for g in range(ng):
        a00 = z
        a01 = z
        a02 = z
        a03 = z
        a10 = z
        a11 = z
        a12 = z
        a13 = z
        a20 = z
        a21 = z
        a22 = z
        a23 = z
        a30 = z
        a31 = z
        a32 = z
        a33 = z
        for p in range(g * (G // 2), (g + 1) * (G // 2)):
            ra = k0 + 2 * p * rs + sub
            prefetch(buf, (ra + pf) // itemsize_of(buf))  # the next tile's lines of these rows,
            prefetch(buf, (ra + rs + pf) // itemsize_of(buf))  # spread over the work
            x0, x1, x2, x3 = _vecs(buf, ra, ra + rs, cl, ch)
            q = vbcast(qp, r0 * hp + p)
            a00 = vdpbf(a00, x0, q)
            a01 = vdpbf(a01, x1, q)
            a02 = vdpbf(a02, x2, q)
            a03 = vdpbf(a03, x3, q)
            q = vbcast(qp, (r0 + 1) * hp + p)
            a10 = vdpbf(a10, x0, q)
            a11 = vdpbf(a11, x1, q)
            a12 = vdpbf(a12, x2, q)
            a13 = vdpbf(a13, x3, q)
            q = vbcast(qp, (r0 + 2) * hp + p)
            a20 = vdpbf(a20, x0, q)
            a21 = vdpbf(a21, x1, q)
            a22 = vdpbf(a22, x2, q)
            a23 = vdpbf(a23, x3, q)
            q = vbcast(qp, (r0 + 3) * hp + p)
            a30 = vdpbf(a30, x0, q)
            a31 = vdpbf(a31, x1, q)
            a32 = vdpbf(a32, x2, q)
            a33 = vdpbf(a33, x3, q)
        si = s0i + g * srs + 64 * c
        s0, s1, s2, s3 = _kparam4(scb, si, four)
        z0, z1, z2, z3 = _zparam4(zpb, si, four, zs, ol, oh)
        _sacc(sc, o0, s0, s1, s2, s3, z0, z1, z2, z3, -qsum[r0 * ng + g], a00, a01, a02, a03)
        _sacc(sc, o0 + DT, s0, s1, s2, s3, z0, z1, z2, z3, -qsum[(r0 + 1) * ng + g], a10, a11, a12, a13)
        _sacc(sc, o0 + 2 * DT, s0, s1, s2, s3, z0, z1, z2, z3, -qsum[(r0 + 2) * ng + g], a20, a21, a22, a23)
        _sacc(sc, o0 + 3 * DT, s0, s1, s2, s3, z0, z1, z2, z3, -qsum[(r0 + 3) * ng + g], a30, a31, a32, a33)


@njit(cache=True)
def _score1(buf, k0, rs, pf, cl, ch, ol, oh, scb, s0i, srs, zpb, zs, G, D, qp, qsum, r0, sc, c):
    """One-row form of :func:`_score4`."""
    four = itemsize_of(buf) == 2
    ng = D // G
    hp = D // 2
    z = vsplat(np.float32(0.0))
    sub = (32 if four else 64) * c
    for g in range(ng):
        a0 = z
        a1 = z
        a2 = z
        a3 = z
        for p in range(g * (G // 2), (g + 1) * (G // 2)):
            ra = k0 + 2 * p * rs + sub
            prefetch(buf, (ra + pf) // itemsize_of(buf))  # the next tile's lines of these rows,
            prefetch(buf, (ra + rs + pf) // itemsize_of(buf))  # spread over the work
            x0, x1, x2, x3 = _vecs(buf, ra, ra + rs, cl, ch)
            q = vbcast(qp, r0 * hp + p)
            a0 = vdpbf(a0, x0, q)
            a1 = vdpbf(a1, x1, q)
            a2 = vdpbf(a2, x2, q)
            a3 = vdpbf(a3, x3, q)
        si = s0i + g * srs + 64 * c
        s0, s1, s2, s3 = _kparam4(scb, si, four)
        z0, z1, z2, z3 = _zparam4(zpb, si, four, zs, ol, oh)
        _sacc(sc, r0 * DT + 64 * c, s0, s1, s2, s3, z0, z1, z2, z3, -qsum[r0 * ng + g], a0, a1, a2, a3)


@njit(inline="always", cache=True)
def _vgroups(four, G, d0):
    """Groups of the 4 vectors of V head dims d0..d0+63 (int4: even/odd d of a 32-d chunk)."""
    if four:
        return d0 // G, d0 // G, (d0 + 32) // G, (d0 + 32) // G
    return d0 // G, (d0 + 16) // G, (d0 + 32) // G, (d0 + 48) // G


@njit(inline="always", cache=True)
def _acc_in(acc, o, al, zc, zo, g0, g1, g2, g3):
    """acc row vectors scaled by alpha, minus this tile's z' terms (the pairs add them
    back): ``zc[zo + 2g]`` for the low-nibble (or 8-bit) vectors, ``+ 1`` for the high."""
    l = vsplat(al)
    return (vfma(vload(acc, o), l, vsplat(-zc[zo + 2 * g0])),
            vfma(vload(acc, o + 16), l, vsplat(-zc[zo + 2 * g1 + 1])),
            vfma(vload(acc, o + 32), l, vsplat(-zc[zo + 2 * g2])),
            vfma(vload(acc, o + 48), l, vsplat(-zc[zo + 2 * g3 + 1])))


@njit(inline="always", cache=True)
def _vst4(arr, o, a0, a1, a2, a3):
    vstore(arr, o, a0)
    vstore(arr, o + 16, a1)
    vstore(arr, o + 32, a2)
    vstore(arr, o + 48, a3)


@njit(inline="always", cache=True)
def _wdot(W, wo, g0, g1, g2, g3, x0, x1, x2, x3, a0, a1, a2, a3):
    """a_v += the pair W[wo + g_v] times x_v for one row."""
    return (vdpbf(a0, x0, vbcast(W, wo + g0)), vdpbf(a1, x1, vbcast(W, wo + g1)),
            vdpbf(a2, x2, vbcast(W, wo + g2)), vdpbf(a3, x3, vbcast(W, wo + g3)))


@njit(cache=True)
def _pv4(vb, v0, pf, cl, ch, G, D, W, zc, acc, alpha, r0):
    """acc[r0..r0+3, :] = acc * alpha + sum_s w[r, s, g] u[s, :] - zc[r, g] over one tile.

    ``v0``: byte offset of the tile's row 0 (DT full rows readable), ``pf`` the byte
    distance to the next tile (prefetched); ``W``: the pair
    (w[2i], w[2i+1]) of row r, group g at ``(r * DT/2 + i) * ng + g``.  acc is in the
    int4 chunk order (32 d per chunk: even d then odd d) for int4.
    """
    four = itemsize_of(vb) == 2
    ng = D // G
    rowb = D // 2 if four else D
    R = ng * (DT // 2)
    for h in range(D // 64):
        g0, g1, g2, g3 = _vgroups(four, G, 64 * h)
        oa = r0 * D + 64 * h
        a00, a01, a02, a03 = _acc_in(acc, oa, alpha[r0], zc, 2 * r0 * ng, g0, g1, g2, g3)
        a10, a11, a12, a13 = _acc_in(acc, oa + D, alpha[r0 + 1], zc, 2 * (r0 + 1) * ng, g0, g1, g2, g3)
        a20, a21, a22, a23 = _acc_in(acc, oa + 2 * D, alpha[r0 + 2], zc, 2 * (r0 + 2) * ng, g0, g1, g2, g3)
        a30, a31, a32, a33 = _acc_in(acc, oa + 3 * D, alpha[r0 + 3], zc, 2 * (r0 + 3) * ng, g0, g1, g2, g3)
        hb = (32 if four else 64) * h
        for i in range(DT // 2):
            ra = v0 + 2 * i * rowb + hb
            prefetch(vb, (ra + pf) // itemsize_of(vb))
            prefetch(vb, (ra + rowb + pf) // itemsize_of(vb))
            x0, x1, x2, x3 = _vecs_v(vb, ra, ra + rowb, cl, ch)
            wo = r0 * R + i * ng
            a00, a01, a02, a03 = _wdot(W, wo, g0, g1, g2, g3, x0, x1, x2, x3, a00, a01, a02, a03)
            a10, a11, a12, a13 = _wdot(W, wo + R, g0, g1, g2, g3, x0, x1, x2, x3, a10, a11, a12, a13)
            a20, a21, a22, a23 = _wdot(W, wo + 2 * R, g0, g1, g2, g3, x0, x1, x2, x3, a20, a21, a22, a23)
            a30, a31, a32, a33 = _wdot(W, wo + 3 * R, g0, g1, g2, g3, x0, x1, x2, x3, a30, a31, a32, a33)
        _vst4(acc, oa, a00, a01, a02, a03)
        _vst4(acc, oa + D, a10, a11, a12, a13)
        _vst4(acc, oa + 2 * D, a20, a21, a22, a23)
        _vst4(acc, oa + 3 * D, a30, a31, a32, a33)


@njit(cache=True)
def _pv1(vb, v0, pf, cl, ch, G, D, W, zc, acc, alpha, r0):
    """One-row form of :func:`_pv4`."""
    four = itemsize_of(vb) == 2
    ng = D // G
    rowb = D // 2 if four else D
    for h in range(D // 64):
        g0, g1, g2, g3 = _vgroups(four, G, 64 * h)
        oa = r0 * D + 64 * h
        a0, a1, a2, a3 = _acc_in(acc, oa, alpha[r0], zc, 2 * r0 * ng, g0, g1, g2, g3)
        hb = (32 if four else 64) * h
        for i in range(DT // 2):
            ra = v0 + 2 * i * rowb + hb
            prefetch(vb, (ra + pf) // itemsize_of(vb))
            prefetch(vb, (ra + rowb + pf) // itemsize_of(vb))
            x0, x1, x2, x3 = _vecs_v(vb, ra, ra + rowb, cl, ch)
            a0, a1, a2, a3 = _wdot(W, (r0 * (DT // 2) + i) * ng, g0, g1, g2, g3, x0, x1, x2, x3,
                                   a0, a1, a2, a3)
        _vst4(acc, oa, a0, a1, a2, a3)


@njit(inline="always", cache=True)
def _eo_pos(t):
    """Position (in the tile) of slot ``t`` of the even/odd order: per 32 positions, the
    16 even ones then the 16 odd ones (the int4 K score order)."""
    return 32 * (t // 32) + 2 * (t % 16) + ((t // 16) & 1)


@njit(cache=True)
def _weight_tables(ng, four, pidx, widx):
    """Index tables of :func:`_weights` for ``ng`` V groups (16 % ng == 0).

    ``pidx[16b + l]``: the score slot (within its 32-position block) of the position of
    lane l of product vector b (lanes = (position, group) in the V scales' order);
    ``widx[w]``: the product (of a vector pair) that word w of the packed pairs takes,
    so that dword ``i * ng + g`` is (w[2i, g], w[2i + 1, g]).
    """
    for f in range(DT * ng):
        s = (f // ng) % 32
        pidx[f] = 16 * (s % 2) + s // 2 if four else s
    for w in range(32):
        i = (w // 2) // ng
        g = (w // 2) % ng
        widx[w] = (2 * i + w % 2) * ng + g


@njit(cache=True)
def _weights(vsc, vzp, zs, vs0, ng, ol, oh, sc, nrow, pidx, widx, W, part, zc):
    """W[(r * DT/2 + i) * ng + g] = (bf16(p[r, 2i] sv[2i, g]), bf16(p[r, 2i+1] sv[2i+1, g]))
    and zc[2 (r ng + g) + e] = sum_s bf16(p sv)[s, g] * (z[s, g] + off_e): the z' the
    pairs add, from the rounded weights (``vdpbf16ps`` with pairs of ones / zero
    points: exact products), so the two cancel up to f32 sums.

    ``sc``: p in the K tile's order; the V scales (and zero points) of the tile are
    ``[DT, ng]`` contiguous from ``vs0`` and already 0 past its end (staged).
    """
    nb = 2 * ng  # 16-lane product vectors per 32 positions
    one = vbits(np.uint32(0x3F803F80))  # the pair (1, 1)
    H = DT // 2
    for r in range(nrow):
        wsum = vsplat(np.float32(0.0))
        wz = vsplat(np.float32(0.0))
        for k in range(DT // 32):
            pa = vload(sc, r * DT + 32 * k)
            pb = vload(sc, r * DT + 32 * k + 16)
            for j in range(0, nb, 2):
                b = k * nb + j
                e = vs0 + 16 * b
                w = vpack(vmul(vperm2(pa, pb, pidx, 16 * b), vload(vsc, e)),
                          vmul(vperm2(pa, pb, pidx, 16 * b + 16), vload(vsc, e + 16)), widx, 0)
                vstore(W, r * H * ng + 8 * b, w)
                wsum = vdpbf(wsum, w, one)
                if zs:
                    wz = vdpbf(wz, w, vpack(vload(vzp, e), vload(vzp, e + 16), widx, 0))
        vstore(part, 0, wsum)
        vstore(part, 16, wz)
        for g in range(ng):
            ws = np.float32(0.0)
            zz = np.float32(0.0)
            for l in range(g, 16, ng):
                ws += part[l]
                zz += part[16 + l]
            zc[2 * (r * ng + g)] = ol * ws + zz
            zc[2 * (r * ng + g) + 1] = oh * ws + zz


# ------------------------------------------------------------------ the work items
@njit(nogil=True, cache=True)
def dec_items(ids, qf, kb, ksc, kzp, kzs, vb, vsc, vzp, vzs, sgn, kG, vG, Hkv, S, scale,
              smul, mflat, mstr, has_mask, causal, nsplit, pm, pl, pacc):
    """Work items ``ids`` (batch, KV head, KV split) -> partial (m, l, acc) per row, as
    ``sdpa.decode.decode_items`` (same arguments; ``qf`` already rounded to bf16).  ``kb``/``vb``:
    int4 bytes as a uint16 view, or int8/uint8; ``sgn``: s4/s8."""
    B, Hq, Sq, D = qf.shape
    four = itemsize_of(kb) == 2
    rep = Hq // Hkv
    nrow = rep * Sq
    Rp = (nrow + 3) // 4 * 4
    n4 = nrow // 4 * 4
    coff = S - Sq if causal == 2 else 0
    s_end = S if causal == 0 else min(S, Sq + coff)
    per = (((S + nsplit - 1) // nsplit + DT - 1) // DT) * DT
    ngk = D // kG
    ngv = D // vG
    hp = D // 2
    bpe = 2 if four else 1  # elements per byte
    isz = itemsize_of(kb)
    # int4 encodings (bf16dot.ENCODINGS): K lo16/hi16, V lo128/hi16; 8-bit: no offset
    cl = np.uint32(0x41C041C0 if sgn else 0x41804180)
    ch = cl
    cvl = np.uint32(0x43084308 if sgn else 0x43004300)
    ol = np.float32((24.0 if sgn else 16.0) if four else 0.0)
    ovl = np.float32((136.0 if sgn else 128.0) if four else 0.0)
    kst_rs = DT // bpe  # staged K row: DT positions, in bytes
    kst = np.zeros(D * kst_rs // isz, kb.dtype)
    vrow = D // bpe  # bytes per V row
    vst = np.zeros(DT * vrow // isz, vb.dtype)
    kb8 = kb.view(np.uint8)
    vb8 = vb.view(np.uint8)
    kst8 = kst.view(np.uint8)
    vst8 = vst.view(np.uint8)
    sst = np.zeros(ngk * DT, np.float32)
    zst = np.zeros(ngk * DT, np.float32)
    perm = np.empty(DT, np.int64)
    for t in range(DT):
        perm[t] = _eo_pos(t) if four else t
    qb = np.zeros(Rp * D, np.float32)
    qp = np.zeros(Rp * hp, np.float32)  # bf16 pairs of q as f32 bit patterns
    qpu = qp.view(np.uint32)
    qbu = qb.view(np.uint32)
    qsum = np.zeros(Rp * ngk, np.float32)
    sc = np.empty(Rp * DT, np.float32)
    acc = np.zeros(Rp * D, np.float32)
    m = np.empty(Rp, np.float32)
    lv = np.zeros(Rp * 16, np.float32)
    alpha = np.ones(Rp, np.float32)
    part = np.empty(16, np.float32)
    zc = np.zeros(2 * Rp * ngv, np.float32)
    vsst = np.zeros(DT * ngv, np.float32)  # V scales / zero points of a tail tile, 0 past its end
    vzst = np.zeros(DT * ngv, np.float32)
    pidx = np.empty(DT * ngv, np.int32)
    widx = np.empty(32, np.int16)
    _weight_tables(ngv, four, pidx, widx)
    wpart = np.zeros(32, np.float32)
    W = np.zeros(Rp * ngv * (DT // 2), np.float32)
    scv = vsplat(scale)
    for it in ids:
        sp = it % nsplit
        hk = (it // nsplit) % Hkv
        b = it // (nsplit * Hkv)
        sa = sp * per
        sb = min(s_end, sa + per)
        kbase = (b * Hkv + hk) * D * S
        ksbase = (b * Hkv + hk) * ngk * S
        vbase = (b * Hkv + hk) * S * D
        vsbase = (b * Hkv + hk) * S * ngv
        qsum[:] = 0.0
        for rr in range(nrow):
            qrow = qf[b, hk * rep + rr // Sq, rr % Sq]
            for d in range(D):
                qb[rr * D + d] = qrow[d]
                qsum[rr * ngk + d // kG] += qrow[d]
            for p in range(hp):  # q is bf16-exact: its top halves are the bf16 bits
                qpu[rr * hp + p] = (qbu[rr * D + 2 * p] >> 16) | (qbu[rr * D + 2 * p + 1] & np.uint32(0xFFFF0000))
        acc[:] = 0.0
        lv[:] = 0.0
        m[:] = NEG_INF
        for s0 in range(sa, sb, DT):
            nt = min(DT, sb - s0)
            if nt == DT:
                kbuf, k0, rs = kb, (kbase + s0) // bpe, S // bpe
                scb, zpb, s0i, srs, zs = ksc, kzp, ksbase + s0, S, kzs
                vbuf, v0 = vb, (vbase + s0 * D) // bpe
                vsb, vzb, vs0 = vsc, vzp, vsbase + s0 * ngv
                kpf, vpf = kst_rs, DT * vrow  # prefetch distances: one tile on
            else:  # tail tile, staged zero-padded so that the vector loads stay in bounds
                kbuf, k0, rs = kst, 0, kst_rs
                scb, zpb, s0i, srs, zs = sst, zst, 0, DT, 1
                nbk = (nt + bpe - 1) // bpe  # bytes holding nt positions of a K row
                src0 = (kbase + s0) // bpe
                for d in range(D):
                    for j in range(kst_rs):
                        kst8[d * kst_rs + j] = kb8[src0 + d * (S // bpe) + j] if j < nbk else 0
                for g in range(ngk):
                    for t in range(DT):
                        sst[g * DT + t] = ksc[ksbase + g * S + s0 + t] if t < nt else np.float32(0.0)
                        zst[g * DT + t] = kzp[(ksbase + g * S + s0 + t) * kzs] if t < nt \
                            else np.float32(0.0)
                vsrc = (vbase + s0 * D) // bpe
                for j in range(DT * vrow):
                    vst8[j] = vb8[vsrc + j] if j < nt * vrow else 0
                for j in range(DT * ngv):
                    vsst[j] = vsc[vsbase + s0 * ngv + j] if j < nt * ngv else np.float32(0.0)
                    vzst[j] = vzp[(vsbase + s0 * ngv + j) * vzs] if j < nt * ngv else np.float32(0.0)
                vbuf, v0 = vst, 0
                vsb, vzb, vs0 = vsst, vzst, 0
                kpf, vpf = 0, 0
            sc[:] = 0.0
            for c in range(DT // 64):
                for r0 in range(0, n4, 4):
                    _score4(kbuf, k0, rs, kpf, cl, ch, ol, ol, scb, s0i, srs, zpb, zs, kG, D, qp, qsum, r0, sc, c)
                for r0 in range(n4, nrow):
                    _score1(kbuf, k0, rs, kpf, cl, ch, ol, ol, scb, s0i, srs, zpb, zs, kG, D, qp, qsum, r0, sc, c)
            for rr in range(nrow):
                o = rr * DT
                if smul:
                    for t in range(0, DT, 16):
                        vstore(sc, o + t, vmul(vload(sc, o + t), scv))
                else:
                    for t in range(DT):
                        sc[o + t] = sc[o + t] / scale
                i = rr % Sq
                if nt < DT or has_mask or (causal != 0 and s0 + nt - 1 > i + coff):
                    hq = hk * rep + rr // Sq
                    for t in range(DT):
                        s = perm[t]
                        if s >= nt or (causal != 0 and s0 + s > i + coff):
                            sc[o + t] = NEG_INF
                        elif has_mask:
                            sc[o + t] += mflat[b * mstr[0] + hq * mstr[1] + i * mstr[2]
                                               + (s0 + s) * mstr[3]]
                online_softmax_row(sc, o, DT, rr, m, alpha, lv, part)
            _weights(vsb, vzb, vzs, vs0, ngv, ovl, ol, sc, nrow, pidx, widx, W, wpart, zc)
            for r0 in range(0, n4, 4):
                _pv4(vbuf, v0, vpf, cvl, ch, vG, D, W, zc, acc, alpha, r0)
            for r0 in range(n4, nrow):
                _pv1(vbuf, v0, vpf, cvl, ch, vG, D, W, zc, acc, alpha, r0)
        for rr in range(nrow):
            pm[it, rr] = m[rr]
            ls = np.float32(0.0)
            for j in range(16):
                ls += lv[rr * 16 + j]
            pl[it, rr] = ls
            for d in range(D):
                pacc[it, rr, d] = acc[rr * D + d]


@njit(cache=True, error_model="numpy")
def merge(pm, pl, pacc, Hkv, nsplit, four, res):
    """res [B, Hq, Sq, D] f32 = the split partials combined (log-sum-exp in split order,
    as ``sdpa.merge.merge_partials``, compiled: the numpy one cost ~50 us a call), int4 rows back
    from the chunk order to d order.  A row no split saw a finite score of is 0/0."""
    B, Hq, Sq, D = res.shape
    rep = Hq // Hkv
    rows = pm.shape[1]
    o = np.empty(D, np.float32)
    for bh in range(B * Hkv):
        b = bh // Hkv
        hk = bh % Hkv
        for r in range(rows):
            mx = NEG_INF
            for sp in range(nsplit):
                mx = max(mx, pm[bh * nsplit + sp, r])
            den = np.float32(0.0)
            o[:] = 0.0
            for sp in range(nsplit):
                it = bh * nsplit + sp
                if pm[it, r] == NEG_INF:
                    continue
                w = exp32(pm[it, r] - mx)
                den += pl[it, r] * w
                for d in range(D):
                    o[d] += pacc[it, r, d] * w
            hq = hk * rep + r // Sq
            i = r % Sq
            for d in range(D):
                res[b, hq, i, _eo_pos(d) if four else d] = o[d] / den


def usable(kk, vk, ktr, kG, vG, D, S, Sq) -> bool:
    """Whether this kernel takes these operands (the caller checked fpmath bf16)."""
    if not HAVE_BF16 or kk != vk or kk < 3 or not ktr or D % 64 or Sq > 8 or kG % 2:
        return False
    if kk >= 5:  # int4: whole bytes per K row (S even); a V zmm of 32 d in one group
        return S % 2 == 0 and vG % 32 == 0 and 16 % (D // vG) == 0
    return vG % 16 == 0 and 16 % (D // vG) == 0

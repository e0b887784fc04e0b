"""The register-blocked SDPA kernel (head size a multiple of 16): vectorised tile
loaders (:func:`_vrows`, :func:`_vkt`), scores and ``P V`` over blocks of 4 rows in
``f32x16`` registers; the same outputs as the tiled kernel (:mod:`.tiled`)."""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (numba: configured first)

import numpy as np
from numba import njit

from graph_api.kernels.sdpa import prefill
from graph_api.kernels.bits import (vadd, vfma, vhsum16, vld_kind, vload, vload_even, vload_odd, vmul, vnib_hi,
                                    vnib_lo, vsplat, vstore, vsub)
from graph_api.kernels.sdpa.online_softmax import online_softmax_row
from graph_api.kernels.sdpa.operands import NEG_INF
from graph_api.kernels.sdpa.tiled import load_k_tile, load_v_tile
from graph_api.kernels.sdpa.prefill import _round_row


TV = 64  #: KV positions per tile of the register-blocked kernel (multiple of 32)


@njit(cache=True)
def _vrows(buf, kind, G, sc, hs, zp, hz, rnd, e0, sb0, pos, nt, D, out):
    """out[t*D + dp] = dequantized row pos[t] (rows contiguous over d) for t < nt, vectorised.

    A compiled function (one call per tile), not inlined: :func:`attend_blocked` loads K rows
    and V rows with it, and an inlined copy per site cost ~2 s more compile per
    signature on an empty cache.

    ``e0``: flat element index of row 0 of the (b, h) block; ``sb0``: its flat scale index.
    int4: dp permuted like :func:`load_v_tile` (even d first); needs G % 32 == 0.
    Others: G % 16 == 0 (float kinds: G = D).
    """
    ng = D // G
    half = D // 2
    xm = np.uint8(0x88) if kind == 5 else np.uint8(0)
    off = np.float32(8.0) if kind == 5 else np.float32(0.0)
    for t in range(nt):
        e = e0 + pos[t] * D
        si = sb0 + pos[t] * ng
        o = t * D
        for g in range(ng):
            z = vsplat(off + (zp[si + g] if hz else np.float32(0.0)))
            s = vsplat(sc[si + g] if hs else np.float32(1.0))
            if kind >= 5:
                gb = G // 2
                r0 = (e + g * G) >> 1
                for j in range(0, gb, 16):
                    vstore(out, o + g * gb + j, vmul(vsub(vnib_lo(buf, r0 + j, xm), z), s))
                    vstore(out, o + half + g * gb + j, vmul(vsub(vnib_hi(buf, r0 + j, xm), z), s))
            else:
                for j in range(g * G, g * G + G, 16):
                    x = vld_kind(buf, e + j, kind)
                    if kind >= 3:
                        x = vmul(vsub(x, z), s)
                    vstore(out, o + j, x)
    if rnd != 0:
        _round_row(out, nt * D, rnd)


@njit(inline="always", cache=True)
def _vkt(buf, kind, G, sc, hs, zp, hz, rnd, base, sbase, S, s0, D, out, pos):
    """Full tile (TV positions from s0) of transposed K [D, S] -> out[d*TV + t], vectorised.

    int4 (S even): t < TV/2 are positions s0+2t, the rest s0+2(t-TV/2)+1.
    """
    ng = D // G
    if kind >= 5:
        for t in range(TV // 2):
            pos[t] = s0 + 2 * t
            pos[TV // 2 + t] = s0 + 2 * t + 1
        xm = np.uint8(0x88) if kind == 5 else np.uint8(0)
        off = vsplat(np.float32(8.0) if kind == 5 else np.float32(0.0))
        one = vsplat(np.float32(1.0))
        for g in range(ng):
            si = sbase + g * S + s0
            ze0 = off
            ze1 = off
            zo0 = off
            zo1 = off
            if hz:
                ze0 = vadd(off, vload_even(zp, si))
                ze1 = vadd(off, vload_even(zp, si + 32))
                zo0 = vadd(off, vload_odd(zp, si))
                zo1 = vadd(off, vload_odd(zp, si + 32))
            se0 = one
            se1 = one
            so0 = one
            so1 = one
            if hs:
                se0 = vload_even(sc, si)
                se1 = vload_even(sc, si + 32)
                so0 = vload_odd(sc, si)
                so1 = vload_odd(sc, si + 32)
            for d in range(g * G, g * G + G):
                r = (base + d * S + s0) >> 1
                o = d * TV
                vstore(out, o, vmul(vsub(vnib_lo(buf, r, xm), ze0), se0))
                vstore(out, o + 16, vmul(vsub(vnib_lo(buf, r + 16, xm), ze1), se1))
                vstore(out, o + 32, vmul(vsub(vnib_hi(buf, r, xm), zo0), so0))
                vstore(out, o + 48, vmul(vsub(vnib_hi(buf, r + 16, xm), zo1), so1))
    else:
        for t in range(TV):
            pos[t] = s0 + t
        zero = vsplat(np.float32(0.0))
        one = vsplat(np.float32(1.0))
        for g in range(ng):
            si = sbase + g * S + s0
            z0 = zero
            z1 = zero
            z2 = zero
            z3 = zero
            if hz:
                z0 = vload(zp, si)
                z1 = vload(zp, si + 16)
                z2 = vload(zp, si + 32)
                z3 = vload(zp, si + 48)
            c0 = one
            c1 = one
            c2 = one
            c3 = one
            if hs:
                c0 = vload(sc, si)
                c1 = vload(sc, si + 16)
                c2 = vload(sc, si + 32)
                c3 = vload(sc, si + 48)
            if kind == 0:  # f32 (G = D): the rows as stored, the kind a constant (no switch per load)
                for d in range(g * G, g * G + G):
                    r = base + d * S + s0
                    for j in range(0, TV, 16):
                        vstore(out, d * TV + j, vld_kind(buf, r + j, 0))
                continue
            for d in range(g * G, g * G + G):
                r = base + d * S + s0
                o = d * TV
                x0 = vld_kind(buf, r, kind)
                x1 = vld_kind(buf, r + 16, kind)
                x2 = vld_kind(buf, r + 32, kind)
                x3 = vld_kind(buf, r + 48, kind)
                if kind >= 3:
                    x0 = vmul(vsub(x0, z0), c0)
                    x1 = vmul(vsub(x1, z1), c1)
                    x2 = vmul(vsub(x2, z2), c2)
                    x3 = vmul(vsub(x3, z3), c3)
                vstore(out, o, x0)
                vstore(out, o + 16, x1)
                vstore(out, o + 32, x2)
                vstore(out, o + 48, x3)
    if rnd != 0:
        _round_row(out, D * TV, rnd)


@njit(inline="always", cache=True)
def _score_kr(qb, kr, s, part, Rp, D, ntc):
    """s[r, t] = sum_d qb[r, d] * kr[t, d] (rows of K contiguous over d) for t < ntc.

    Per (4 rows, 2 positions): 16-lane partial sums over d in registers, then a
    16 x 16 transpose-and-add tree (``vhsum16``) gives 16 positions' scores.
    ``part``: scratch [4 * 16 * 16] f32.
    """
    z = vsplat(np.float32(0.0))
    for r0 in range(0, Rp, 4):
        q0 = r0 * D
        for t0 in range(0, ntc, 16):
            for tt in range(0, 16, 2):
                ka = (t0 + tt) * D
                a0 = z
                a1 = z
                a2 = z
                a3 = z
                b0 = z
                b1 = z
                b2 = z
                b3 = z
                for c in range(0, D, 16):
                    k0 = vload(kr, ka + c)
                    k1 = vload(kr, ka + D + c)
                    x0 = vload(qb, q0 + c)
                    x1 = vload(qb, q0 + D + c)
                    x2 = vload(qb, q0 + 2 * D + c)
                    x3 = vload(qb, q0 + 3 * D + c)
                    a0 = vfma(x0, k0, a0)
                    b0 = vfma(x0, k1, b0)
                    a1 = vfma(x1, k0, a1)
                    b1 = vfma(x1, k1, b1)
                    a2 = vfma(x2, k0, a2)
                    b2 = vfma(x2, k1, b2)
                    a3 = vfma(x3, k0, a3)
                    b3 = vfma(x3, k1, b3)
                vstore(part, tt * 16, a0)
                vstore(part, tt * 16 + 16, b0)
                vstore(part, 256 + tt * 16, a1)
                vstore(part, 256 + tt * 16 + 16, b1)
                vstore(part, 512 + tt * 16, a2)
                vstore(part, 512 + tt * 16 + 16, b2)
                vstore(part, 768 + tt * 16, a3)
                vstore(part, 768 + tt * 16 + 16, b3)
            for i in range(4):
                vstore(s, (r0 + i) * TV + t0, vhsum16(part, 256 * i))


@njit(inline="always", cache=True)
def _pv(s, vf, acc, alpha, Rp, D, nt):
    """acc[r, :] = acc[r, :] * alpha[r] + sum_{t < nt} s[r, t] * vf[t, :]; 4 rows x 64 lanes."""
    Dm = D - D % 64
    for r0 in range(0, Rp, 4):
        l0 = vsplat(alpha[r0])
        l1 = vsplat(alpha[r0 + 1])
        l2 = vsplat(alpha[r0 + 2])
        l3 = vsplat(alpha[r0 + 3])
        o0 = r0 * D
        o1 = o0 + D
        o2 = o1 + D
        o3 = o2 + D
        p0 = r0 * TV
        p1 = p0 + TV
        p2 = p1 + TV
        p3 = p2 + TV
        for c in range(0, Dm, 64):
            a00 = vmul(vload(acc, o0 + c), l0)
            a01 = vmul(vload(acc, o0 + c + 16), l0)
            a02 = vmul(vload(acc, o0 + c + 32), l0)
            a03 = vmul(vload(acc, o0 + c + 48), l0)
            a10 = vmul(vload(acc, o1 + c), l1)
            a11 = vmul(vload(acc, o1 + c + 16), l1)
            a12 = vmul(vload(acc, o1 + c + 32), l1)
            a13 = vmul(vload(acc, o1 + c + 48), l1)
            a20 = vmul(vload(acc, o2 + c), l2)
            a21 = vmul(vload(acc, o2 + c + 16), l2)
            a22 = vmul(vload(acc, o2 + c + 32), l2)
            a23 = vmul(vload(acc, o2 + c + 48), l2)
            a30 = vmul(vload(acc, o3 + c), l3)
            a31 = vmul(vload(acc, o3 + c + 16), l3)
            a32 = vmul(vload(acc, o3 + c + 32), l3)
            a33 = vmul(vload(acc, o3 + c + 48), l3)
            for t in range(nt):
                vb = t * D + c
                v0 = vload(vf, vb)
                v1 = vload(vf, vb + 16)
                v2 = vload(vf, vb + 32)
                v3 = vload(vf, vb + 48)
                x = vsplat(s[p0 + t])
                a00 = vfma(x, v0, a00)
                a01 = vfma(x, v1, a01)
                a02 = vfma(x, v2, a02)
                a03 = vfma(x, v3, a03)
                x = vsplat(s[p1 + t])
                a10 = vfma(x, v0, a10)
                a11 = vfma(x, v1, a11)
                a12 = vfma(x, v2, a12)
                a13 = vfma(x, v3, a13)
                x = vsplat(s[p2 + t])
                a20 = vfma(x, v0, a20)
                a21 = vfma(x, v1, a21)
                a22 = vfma(x, v2, a22)
                a23 = vfma(x, v3, a23)
                x = vsplat(s[p3 + t])
                a30 = vfma(x, v0, a30)
                a31 = vfma(x, v1, a31)
                a32 = vfma(x, v2, a32)
                a33 = vfma(x, v3, a33)
            vstore(acc, o0 + c, a00)
            vstore(acc, o0 + c + 16, a01)
            vstore(acc, o0 + c + 32, a02)
            vstore(acc, o0 + c + 48, a03)
            vstore(acc, o1 + c, a10)
            vstore(acc, o1 + c + 16, a11)
            vstore(acc, o1 + c + 32, a12)
            vstore(acc, o1 + c + 48, a13)
            vstore(acc, o2 + c, a20)
            vstore(acc, o2 + c + 16, a21)
            vstore(acc, o2 + c + 32, a22)
            vstore(acc, o2 + c + 48, a23)
            vstore(acc, o3 + c, a30)
            vstore(acc, o3 + c + 16, a31)
            vstore(acc, o3 + c + 32, a32)
            vstore(acc, o3 + c + 48, a33)
        for c in range(Dm, D, 16):
            a0 = vmul(vload(acc, o0 + c), l0)
            a1 = vmul(vload(acc, o1 + c), l1)
            a2 = vmul(vload(acc, o2 + c), l2)
            a3 = vmul(vload(acc, o3 + c), l3)
            for t in range(nt):
                v0 = vload(vf, t * D + c)
                a0 = vfma(vsplat(s[p0 + t]), v0, a0)
                a1 = vfma(vsplat(s[p1 + t]), v0, a1)
                a2 = vfma(vsplat(s[p2 + t]), v0, a2)
                a3 = vfma(vsplat(s[p3 + t]), v0, a3)
            vstore(acc, o0 + c, a0)
            vstore(acc, o1 + c, a1)
            vstore(acc, o2 + c, a2)
            vstore(acc, o3 + c, a3)


@njit(nogil=True, cache=True)
def attend_blocked(ids, q, kb, kk, ktr, kG, ksc, khs, kzp, khz, vb, vk, vG, vsc, vhs, vzp, vhz, rnd,
            Hkv, S, scale, smul, mflat, mstr, has_mask, causal, qt, nsplit, fastk, kperm, vperm,
            kvec, vvec, pm, pl, pacc):
    """Register-blocked variant of :func:`attend_tiles` (D a multiple of 16); same outputs.

    K transposed: tile kT [D, TV] (scores vectorised over positions); K "bhsd":
    tile kr [TV, D] read like V (scores as 16-lane dot products over d, q
    permuted like the int4 tile when ``kperm``).  Rows padded to a multiple of 4.
    """
    B, Hq, Sq, D = q.shape
    rep = Hq // Hkv
    nqt = (Sq + qt - 1) // qt
    coff = S - Sq if causal == 2 else 0
    half = D // 2
    kng = D // kG
    vng = D // vG
    for it in ids:
        sp = it % nsplit
        r = it // nsplit
        qi = r % nqt
        r = r // nqt
        hk = r % Hkv
        b = r // Hkv
        i0 = qi * qt
        i1 = min(i0 + qt, Sq)
        nq = i1 - i0
        nrow = rep * nq
        Rp = (nrow + 3) // 4 * 4
        s_end = S
        if causal != 0:
            s_end = min(S, i1 - 1 + coff + 1)
        per = (((S + nsplit - 1) // nsplit + TV - 1) // TV) * TV
        sa = sp * per
        sb = min(s_end, sa + per)
        kbuf = np.empty(D * TV, np.float32)
        kT = kbuf.reshape((D, TV))
        kr = kbuf.reshape((TV, D))
        vf = np.empty((TV, D), np.float32)
        vflat = vf.reshape(-1)
        sc = np.zeros(Rp * TV, np.float32)
        part = np.empty(1024, np.float32)
        pos = np.empty(TV, np.int64)
        qb = np.zeros(Rp * D, np.float32)
        acc = np.zeros(Rp * D, np.float32)
        m = np.full(Rp, NEG_INF, np.float32)
        lv = np.zeros(Rp * 16, np.float32)
        alpha = np.ones(Rp, np.float32)
        for rr in range(nrow):
            hq = hk * rep + rr // nq
            i = i0 + rr % nq
            qrow = q[b, hq, i]
            if ktr == 0 and kperm:
                for d in range(half):
                    qb[rr * D + d] = qrow[2 * d]
                    qb[rr * D + half + d] = qrow[2 * d + 1]
            else:
                for d in range(D):
                    qb[rr * D + d] = qrow[d]
        s0 = sa
        while s0 < sb:
            nt = min(TV, sb - s0)
            ntc = (nt + 31) // 32 * 32
            if ktr != 0:
                if kvec and nt == TV:
                    _vkt(kb, kk, kG, ksc, khs, kzp, khz, rnd, (b * Hkv + hk) * D * S,
                         (b * Hkv + hk) * kng * S, S, s0, D, kbuf, pos)
                else:
                    fast = fastk and nt % 2 == 0
                    load_k_tile(kb, kk, ktr, kG, ksc, khs, kzp, khz, rnd, b, hk, Hkv, S, D, s0,
                                 nt, fast, kT, pos)
                prefill.score_rows(qb, kbuf, sc, Rp, D, TV, ntc)  # tile rows TV apart
            else:
                for t in range(nt):
                    pos[t] = s0 + t
                if kvec:
                    _vrows(kb, kk, kG, ksc, khs, kzp, khz, rnd, (b * Hkv + hk) * S * D,
                           (b * Hkv + hk) * S * kng, pos, nt, D, kbuf)
                else:
                    load_v_tile(kb, kk, kG, ksc, khs, kzp, khz, rnd, b, hk, Hkv, S, D, nt, kperm,
                                 pos, kr)
                _score_kr(qb, kbuf, sc, part, Rp, D, ntc)
            scv = vsplat(scale)
            for rr in range(nrow):
                hq = hk * rep + rr // nq
                i = i0 + rr % nq
                o = rr * TV
                if smul:
                    for t in range(0, ntc, 16):
                        vstore(sc, o + t, vmul(vload(sc, o + t), scv))
                else:
                    for t in range(nt):
                        sc[o + t] = sc[o + t] / scale
                for t in range(nt, ntc):
                    sc[o + t] = NEG_INF
                if has_mask:
                    m0 = b * mstr[0] + hq * mstr[1] + i * mstr[2]
                    for t in range(nt):
                        sc[o + t] += mflat[m0 + pos[t] * mstr[3]]
                if causal != 0 and s0 + nt - 1 > i + coff:
                    for t in range(nt):
                        if pos[t] > i + coff:
                            sc[o + t] = NEG_INF
                online_softmax_row(sc, o, ntc, rr, m, alpha, lv, part)
            if vvec:
                _vrows(vb, vk, vG, vsc, vhs, vzp, vhz, rnd, (b * Hkv + hk) * S * D,
                       (b * Hkv + hk) * S * vng, pos, nt, D, vflat)
            else:
                load_v_tile(vb, vk, vG, vsc, vhs, vzp, vhz, rnd, b, hk, Hkv, S, D, nt, vperm,
                             pos, vf)
            _pv(sc, vflat, acc, alpha, Rp, D, nt)
            s0 += nt
        for rr in range(nrow):
            pm[it, rr] = m[rr]
            ls = np.float32(0.0)
            for j in range(16):
                ls += lv[rr * 16 + j]
            pl[it, rr] = ls
            for d in range(D):
                pacc[it, rr, d] = acc[rr * D + d]

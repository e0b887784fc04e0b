"""Scaled dot-product attention with plain or int4/int8-compressed K/V.

Formula, per batch ``b``, query head ``h`` (KV head ``h // rep``), query row ``i``::

    s[j]   = (q[i] . k[j]) * scale  (or / scale)  + mask[b, h, i, j]   (-inf if causal hides j)
    out[i] = sum_j softmax(s)[j] * v[j]

with ``k[j, d] = (K[.., j, d] - zk) * sk`` dequantized tile by tile (groups of
``G`` along the head dimension ``D``) and the same for ``v``.  No f32 copy of K
or V is ever made: each work item dequantizes a tile of ``T = 128`` positions
into an L2-resident f32 buffer, scores it for all the query rows that share the
KV head (GQA/MQA: the K/V tile is read once for ``rep * Sq`` rows), and updates
an online softmax (running max ``m``, sum ``l`` and f32 accumulator).

Decode (few query rows): the KV length is split over work items
("flash-decoding"), so both threads are busy at batch 1 with one KV head; the
partial ``(m, l, acc)`` are merged in a fixed order.  Prefill: work items are
(batch, KV head, query tile of 32 positions); causal tiles beyond the diagonal
are skipped.

Arithmetic is f32 with explicit FMAs in a fixed order (no fastmath flags); the
exponential is :func:`graph_api.kernels.bits.exp32` (<= 2 ulp, vectorised).  fpmath
rounding (``rnd``) applies to f32 Q and to f32/dequantized K and V when asked.

Layouts: Q ``[B, Hq, Sq, D]``; K ``[B, Hkv, S, D]`` ("bhsd", scales
``[B, Hkv, S, D/G]``) or transposed ``[B, Hkv, D, S]`` ("bhds", scales
``[B, Hkv, D/G, S]``); V ``[B, Hkv, S, D]``.  Fastest: K transposed ("bhds":
the tile load is vectorised over positions; int4 needs even S) and V "bhsd"
(vectorised over d; int4 needs even D and G).  K "bhsd" is transposed into
the tile while converting (scalar stores); odd int4 shapes use per-element
indexing.
"""
from __future__ import annotations

from dataclasses import dataclass

from graph_api.kernels.numba_setup import numba  # noqa: F401

import numpy as np
from numba import njit, prange

from graph_api.kernels.bits import (act_kind, bf16_to_f32, exp32, f16_bits_to_f32, f32_to_bf16,
                          f32_to_f16_bits, fma32, i8_to_f32, nib_x, round_code,
                          vadd, vfma, vhsum16, vld_any, vload, vload_even, vload_odd,
                          vmax, vmul, vnib_hi, vnib_lo, vsplat, vstore, vsub)

T = 128  #: KV positions per tile
QT = 32  #: query positions per prefill tile
KINDS = {"f32": 0, "bf16": 1, "f16": 2, "s8": 3, "u8": 4, "s4": 5, "u4": 6}
CAUSAL = {None: 0, "none": 0, "top_left": 1, "bottom_right": 2}
NEG_INF = np.float32(-np.inf)


@dataclass
class KV:
    """One K or V operand.

    ``data``: the storage (packed uint8 for s4/u4 flat or any shape, int8,
    uint8, float32, uint16 bits for bf16/f16 or np.float16/bfloat16);
    ``kind`` a key of :data:`KINDS`; ``shape`` the logical ``(B, H, S, D)``;
    ``transposed``: stored ``[B, H, D, S]`` (K only); ``group``: G along D;
    ``scales``/``zps``: shaped like the storage with D replaced by D/G.
    """

    data: np.ndarray
    kind: str
    shape: tuple
    transposed: bool = False
    group: int = 0
    scales: np.ndarray | None = None
    zps: np.ndarray | None = None


def _kv_args(kv: KV):
    B, H, S, D = kv.shape
    kind = KINDS[kv.kind]
    buf = np.asarray(kv.data)
    if kind >= 5:
        buf = buf.reshape(-1).view(np.uint8)
    elif kind in (1, 2):
        buf = buf.reshape(-1).view(np.uint16)
    else:
        buf = buf.reshape(-1)
    G = kv.group if kind >= 3 else D
    if kind >= 3 and kv.scales is not None:
        sc = np.ascontiguousarray(np.asarray(kv.scales), dtype=np.float32).reshape(-1)
    else:
        sc = np.ones(1, np.float32)
    has_sc = kind >= 3 and kv.scales is not None
    if kind >= 3 and kv.zps is not None:
        zp = np.ascontiguousarray(np.asarray(kv.zps), dtype=np.float32).reshape(-1)
        has_zp = True
    else:
        zp = np.zeros(1, np.float32)
        has_zp = False
    return buf, kind, int(kv.transposed), G, sc, has_sc, zp, has_zp


@njit(inline="always", cache=True)
def _elem(buf, kind, idx):
    """Stored element at flat index ``idx`` as f32 (integers not yet dequantized)."""
    if kind == 0:
        return np.float32(buf[idx])
    if kind == 1:
        return bf16_to_f32(buf[idx])
    if kind == 2:
        return f16_bits_to_f32(buf[idx])
    if kind == 3 or kind == 4:
        return i8_to_f32(buf[idx])
    b = buf[idx >> 1]
    if kind == 5:
        return nib_x(b, np.uint8(0x88), (idx & 1) == 1) - np.float32(8.0)
    return nib_x(b, np.uint8(0), (idx & 1) == 1)


@njit(inline="always", cache=True)
def _cvt(x, kind):
    """One stored f32 / bf16 / f16 / s8 / u8 value as f32."""
    if kind == 0:
        return np.float32(x)
    if kind == 1:
        return bf16_to_f32(x)
    if kind == 2:
        return f16_bits_to_f32(x)
    return i8_to_f32(x)


@njit(inline="always", cache=True)
def _deq(v, sidx, sc, has_sc, zp, has_zp, rnd):
    if has_zp:
        v = v - zp[sidx]
    if has_sc:
        v = v * sc[sidx]
    return round_code(v, rnd)


@njit(cache=True)
def _load_k_tile(kb, kk, ktr, kG, ksc, khs, kzp, khz, rnd, b, h, H, S, D, s0, nt, fast, kT, pos):
    """kT[d, t] = dequantized K at position pos[t] (tile of nt positions from s0)."""
    half = nt // 2
    for t in range(nt):
        pos[t] = s0 + 2 * t if (fast and t < half) else (s0 + 2 * (t - half) + 1 if fast else s0 + t)
    base = (b * H + h) * D * S
    ng = D // kG
    if fast:  # int4, transposed, S and s0 even: row d is contiguous over positions
        xm = np.uint8(0x88) if kk == 5 else np.uint8(0)
        off = np.float32(8.0) if kk == 5 else np.float32(0.0)
        zE = np.empty(half, np.float32)
        zO = np.empty(half, np.float32)
        sE = np.empty(half, np.float32)
        sO = np.empty(half, np.float32)
        for g in range(ng):
            sbase = ((b * H + h) * ng + g) * S + s0
            for j in range(half):
                zE[j] = off + (kzp[sbase + 2 * j] if khz else np.float32(0.0))
                zO[j] = off + (kzp[sbase + 2 * j + 1] if khz else np.float32(0.0))
                sE[j] = ksc[sbase + 2 * j] if khs else np.float32(1.0)
                sO[j] = ksc[sbase + 2 * j + 1] if khs else np.float32(1.0)
            for d in range(g * kG, (g + 1) * kG):
                row0 = (base + d * S + s0) >> 1
                kd = kT[d]
                for j in range(half):
                    byte = kb[row0 + j]
                    kd[j] = (nib_x(byte, xm, False) - zE[j]) * sE[j]
                    kd[half + j] = (nib_x(byte, xm, True) - zO[j]) * sO[j]
        if rnd != 0:
            for d in range(D):
                for t in range(nt):
                    kT[d, t] = round_code(kT[d, t], rnd)
        return
    if ktr and (kk == 3 or kk == 4 or kk == 0):  # 8-bit / f32 transposed: rows contiguous over s
        zr = np.zeros(nt, np.float32)
        sr = np.ones(nt, np.float32)
        for g in range(ng):
            sbase = ((b * H + h) * ng + g) * S + s0
            if khz:
                for t in range(nt):
                    zr[t] = kzp[sbase + t]
            if khs:
                for t in range(nt):
                    sr[t] = ksc[sbase + t]
            for d in range(g * kG, (g + 1) * kG):
                row = kb[base + d * S + s0:base + d * S + s0 + nt]
                kd = kT[d]
                for t in range(nt):
                    kd[t] = (i8_to_f32(row[t]) - zr[t]) * sr[t]
        if rnd != 0:
            for d in range(D):
                for t in range(nt):
                    kT[d, t] = round_code(kT[d, t], rnd)
        return
    if not ktr:  # [S, D] rows: contiguous over d, transposed into kT while converting
        for t in range(nt):
            s = pos[t]
            row = kb[base + s * D:base + s * D + D] if kk < 5 else kb[:1]
            sb = ((b * H + h) * S + s) * ng
            if kk < 5:
                for g in range(ng):
                    z = kzp[sb + g] if khz else np.float32(0.0)
                    sc = ksc[sb + g] if khs else np.float32(1.0)
                    for d in range(g * kG, (g + 1) * kG):
                        kT[d, t] = (_cvt(row[d], kk) - z) * sc
            elif D % 2 == 0 and kG % 2 == 0:
                xm = np.uint8(0x88) if kk == 5 else np.uint8(0)
                off = np.float32(8.0) if kk == 5 else np.float32(0.0)
                r0 = (base + s * D) >> 1
                for g in range(ng):
                    z = off + (kzp[sb + g] if khz else np.float32(0.0))
                    sc = ksc[sb + g] if khs else np.float32(1.0)
                    for j in range(g * kG // 2, (g + 1) * kG // 2):
                        byte = kb[r0 + j]
                        kT[2 * j, t] = (nib_x(byte, xm, False) - z) * sc
                        kT[2 * j + 1, t] = (nib_x(byte, xm, True) - z) * sc
            else:
                for d in range(D):
                    kT[d, t] = _deq(_elem(kb, kk, base + s * D + d), sb + d // kG,
                                    ksc, khs, kzp, khz, np.int64(0))
        if rnd != 0:
            for d in range(D):
                for t in range(nt):
                    kT[d, t] = round_code(kT[d, t], rnd)
        return
    for t in range(nt):
        s = pos[t]
        for d in range(D):
            g = d // kG
            if ktr:
                idx = base + d * S + s
                sidx = ((b * H + h) * ng + g) * S + s
            else:
                idx = base + s * D + d
                sidx = ((b * H + h) * S + s) * ng + g
            kT[d, t] = _deq(_elem(kb, kk, idx), sidx, ksc, khs, kzp, khz, rnd)


@njit(cache=True)
def _load_v_tile(vb, vk, vG, vsc, vhs, vzp, vhz, rnd, b, h, H, S, D, nt, vperm, pos, vf):
    """vf[t, dp] = dequantized V[pos[t], d]; with vperm, dp = d/2 (even d) or D/2 + d/2."""
    ng = D // vG
    half = D // 2
    for t in range(nt):
        s = pos[t]
        rowbase = ((b * H + h) * S + s) * D
        sbase = ((b * H + h) * S + s) * ng
        if vperm:
            xm = np.uint8(0x88) if vk == 5 else np.uint8(0)
            off = np.float32(8.0) if vk == 5 else np.float32(0.0)
            r0 = rowbase >> 1
            vt = vf[t]
            vlo = vf[t, :half]
            vhi = vf[t, half:]
            gb = vG // 2
            for g in range(ng):
                z = off + (vzp[sbase + g] if vhz else np.float32(0.0))
                sc = vsc[sbase + g] if vhs else np.float32(1.0)
                src = vb[r0 + g * gb:r0 + g * gb + gb]
                lo = vlo[g * gb:g * gb + gb]
                hi = vhi[g * gb:g * gb + gb]
                for j in range(gb):
                    byte = src[j]
                    lo[j] = (nib_x(byte, xm, False) - z) * sc
                    hi[j] = (nib_x(byte, xm, True) - z) * sc
            if rnd != 0:
                for d in range(D):
                    vt[d] = round_code(vt[d], rnd)
        elif vk < 5:
            vt = vf[t]
            for g in range(ng):
                z = vzp[sbase + g] if vhz else np.float32(0.0)
                sc = vsc[sbase + g] if vhs else np.float32(1.0)
                src = vb[rowbase + g * vG:rowbase + g * vG + vG]
                dst = vt[g * vG:g * vG + vG]
                for j in range(vG):
                    dst[j] = (_cvt(src[j], vk) - z) * sc
            if rnd != 0:
                for d in range(D):
                    vt[d] = round_code(vt[d], rnd)
        else:
            for d in range(D):
                vf[t, d] = _deq(_elem(vb, vk, rowbase + d), sbase + d // vG, vsc, vhs, vzp, vhz, rnd)


@njit(parallel=True, cache=True)
def _attn(q, kb, kk, ktr, kG, ksc, khs, kzp, khz, vb, vk, vG, vsc, vhs, vzp, vhz, rnd,
          Hkv, S, scale, smul, mask, has_mask, causal, qt, nsplit, fastk, vperm,
          pm, pl, pacc):
    """Work item (b, kv head, query tile, kv split) -> partial (m, l, acc) per row.

    Rows of an item: the rep query heads of the KV head x the tile's query
    positions.  pm/pl: [items, rows], pacc: [items, rows, D] (d permuted if vperm).
    """
    B, Hq, Sq, D = q.shape
    rep = Hq // Hkv
    nqt = (Sq + qt - 1) // qt
    nitems = B * Hkv * nqt * nsplit
    coff = S - Sq if causal == 2 else 0
    for it in prange(nitems):
        sp = it % nsplit
        r = it // nsplit
        qi = r % nqt
        r = r // nqt
        hk = r % Hkv
        b = r // Hkv
        i0 = qi * qt
        i1 = min(i0 + qt, Sq)
        nrow = rep * (i1 - i0)
        s_end = S
        if causal != 0:
            s_end = min(S, i1 - 1 + coff + 1)
        per = (((S + nsplit - 1) // nsplit + T - 1) // T) * T
        sa = sp * per
        sb = min(s_end, sa + per)
        kT = np.empty((D, T), np.float32)
        vf = np.empty((T, D), np.float32)
        sc = np.empty((nrow, T), np.float32)
        pos = np.empty(T, np.int64)
        acc = np.zeros((nrow, D), np.float32)
        m = np.full(nrow, NEG_INF, np.float32)
        l = np.zeros(nrow, np.float32)
        s0 = sa
        while s0 < sb:
            nt = min(T, sb - s0)
            fast = fastk and nt % 2 == 0
            _load_k_tile(kb, kk, ktr, kG, ksc, khs, kzp, khz, rnd, b, hk, Hkv, S, D, s0, nt,
                         fast, kT, pos)
            # scores for every row (lanes over positions)
            for rr in range(nrow):
                hq = hk * rep + rr // (i1 - i0)
                i = i0 + rr % (i1 - i0)
                srow = sc[rr]
                qrow = q[b, hq, i]
                for t in range(nt):
                    srow[t] = 0.0
                for d in range(D):
                    qv = qrow[d]
                    kd = kT[d]
                    for t in range(nt):
                        srow[t] = fma32(qv, kd[t], srow[t])
                if smul:
                    for t in range(nt):
                        srow[t] = srow[t] * scale
                else:
                    for t in range(nt):
                        srow[t] = srow[t] / scale
                if has_mask:
                    mrow = mask[b, hq, i]
                    for t in range(nt):
                        srow[t] += mrow[pos[t]]
                if causal != 0 and s0 + nt - 1 > i + coff:
                    for t in range(nt):
                        if pos[t] > i + coff:
                            srow[t] = NEG_INF
            _load_v_tile(vb, vk, vG, vsc, vhs, vzp, vhz, rnd, b, hk, Hkv, S, D, nt, vperm, pos, vf)
            for rr in range(nrow):
                srow = sc[rr]
                arow = acc[rr]
                mt = m[rr]
                for t in range(nt):
                    mt = max(mt, srow[t])
                if mt == NEG_INF:
                    continue
                alpha = exp32(m[rr] - mt)
                m[rr] = mt
                ls = np.float32(0.0)
                for t in range(nt):
                    srow[t] = exp32(srow[t] - mt)
                for t in range(nt):
                    ls += srow[t]
                l[rr] = l[rr] * alpha + ls
                if alpha != np.float32(1.0):
                    for d in range(D):
                        arow[d] *= alpha
                for t in range(nt):
                    p = srow[t]
                    vt = vf[t]
                    for d in range(D):
                        arow[d] = fma32(p, vt[d], arow[d])
            s0 += nt
        for rr in range(nrow):
            pm[it, rr] = m[rr]
            pl[it, rr] = l[rr]
            for d in range(D):
                pacc[it, rr, d] = acc[rr, d]


TV = 64  #: KV positions per tile of the register-blocked kernel (multiple of 32)


@njit(inline="always", cache=True)
def _vrows(buf, kind, G, sc, hs, zp, hz, rnd, e0, sb0, pos, nt, D, out):
    """out[t*D + dp] = dequantized row pos[t] (rows contiguous over d) for t < nt, vectorised.

    ``e0``: flat element index of row 0 of the (b, h) block; ``sb0``: its flat scale index.
    int4: dp permuted like :func:`_load_v_tile` (even d first); needs G % 32 == 0.
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
                    x = vld_any(buf, e + j, kind == 2)
                    if kind >= 3:
                        x = vmul(vsub(x, z), s)
                    vstore(out, o + j, x)
    if rnd != 0:
        for i in range(nt * D):
            out[i] = round_code(out[i], rnd)


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
            for d in range(g * G, g * G + G):
                r = base + d * S + s0
                o = d * TV
                x0 = vld_any(buf, r, kind == 2)
                x1 = vld_any(buf, r + 16, kind == 2)
                x2 = vld_any(buf, r + 32, kind == 2)
                x3 = vld_any(buf, r + 48, kind == 2)
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
        for i in range(D * TV):
            out[i] = round_code(out[i], rnd)


@njit(inline="always", cache=True)
def _score_kt(qb, kT, s, Rp, D, ntc):
    """s[r, t] = sum_d qb[r, d] * kT[d, t] for t < ntc (multiple of 32); 4 rows x 32 lanes."""
    z = vsplat(np.float32(0.0))
    for r0 in range(0, Rp, 4):
        q0 = r0 * D
        for c in range(0, ntc, 32):
            a0 = z
            a1 = z
            a2 = z
            a3 = z
            b0 = z
            b1 = z
            b2 = z
            b3 = z
            for d in range(D):
                k0 = vload(kT, d * TV + c)
                k1 = vload(kT, d * TV + c + 16)
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
            vstore(s, r0 * TV + c, a0)
            vstore(s, r0 * TV + c + 16, b0)
            vstore(s, (r0 + 1) * TV + c, a1)
            vstore(s, (r0 + 1) * TV + c + 16, b1)
            vstore(s, (r0 + 2) * TV + c, a2)
            vstore(s, (r0 + 2) * TV + c + 16, b2)
            vstore(s, (r0 + 3) * TV + c, a3)
            vstore(s, (r0 + 3) * TV + c + 16, b3)


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


@njit(parallel=True, cache=True)
def _attn_v(q, kb, kk, ktr, kG, ksc, khs, kzp, khz, vb, vk, vG, vsc, vhs, vzp, vhz, rnd,
            Hkv, S, scale, smul, mask, has_mask, causal, qt, nsplit, fastk, kperm, vperm,
            kvec, vvec, pm, pl, pacc):
    """Register-blocked variant of :func:`_attn` (D a multiple of 16); same outputs.

    K transposed: tile kT [D, TV] (scores vectorised over positions); K "bhsd":
    tile kr [TV, D] read like V (scores as 16-lane dot products over d, q
    permuted like the int4 tile when ``kperm``).  Rows padded to a multiple of 4.
    """
    B, Hq, Sq, D = q.shape
    rep = Hq // Hkv
    nqt = (Sq + qt - 1) // qt
    nitems = B * Hkv * nqt * nsplit
    coff = S - Sq if causal == 2 else 0
    half = D // 2
    kng = D // kG
    vng = D // vG
    for it in prange(nitems):
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
                    _load_k_tile(kb, kk, ktr, kG, ksc, khs, kzp, khz, rnd, b, hk, Hkv, S, D, s0,
                                 nt, fast, kT, pos)
                _score_kt(qb, kbuf, sc, Rp, D, ntc)
            else:
                for t in range(nt):
                    pos[t] = s0 + t
                if kvec:
                    _vrows(kb, kk, kG, ksc, khs, kzp, khz, rnd, (b * Hkv + hk) * S * D,
                           (b * Hkv + hk) * S * kng, pos, nt, D, kbuf)
                else:
                    _load_v_tile(kb, kk, kG, ksc, khs, kzp, khz, rnd, b, hk, Hkv, S, D, nt, kperm,
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
                    for t in range(nt):
                        sc[o + t] += mask[b, hq, i, pos[t]]
                if causal != 0 and s0 + nt - 1 > i + coff:
                    for t in range(nt):
                        if pos[t] > i + coff:
                            sc[o + t] = NEG_INF
                mv = vsplat(m[rr])
                for t in range(0, ntc, 16):
                    mv = vmax(mv, vload(sc, o + t))
                vstore(part, 0, mv)
                mt = m[rr]
                for j in range(16):
                    mt = max(mt, part[j])
                if mt == NEG_INF:
                    alpha[rr] = np.float32(1.0)
                    for t in range(ntc):
                        sc[o + t] = np.float32(0.0)
                    continue
                al = exp32(m[rr] - mt)
                alpha[rr] = al
                m[rr] = mt
                for t in range(ntc):
                    sc[o + t] = exp32(sc[o + t] - mt)
                lsum = vmul(vload(lv, rr * 16), vsplat(al))
                for t in range(0, ntc, 16):
                    lsum = vadd(lsum, vload(sc, o + t))
                vstore(lv, rr * 16, lsum)
            if vvec:
                _vrows(vb, vk, vG, vsc, vhs, vzp, vhz, rnd, (b * Hkv + hk) * S * D,
                       (b * Hkv + hk) * S * vng, pos, nt, D, vflat)
            else:
                _load_v_tile(vb, vk, vG, vsc, vhs, vzp, vhz, rnd, b, hk, Hkv, S, D, nt, vperm,
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


@njit(parallel=True, cache=True)
def _merge(pm, pl, pacc, Hkv, Sq, qt, nsplit, vperm, okind, out):
    """Combine split partials in split order; out[b, h, i, d] (f32 or bf16/f16 bits)."""
    B, Hq, _, D = out.shape
    rep = Hq // Hkv
    nqt = (Sq + qt - 1) // qt
    half = D // 2
    for bh in prange(B * Hq):
        b = bh // Hq
        hq = bh % Hq
        hk = hq // rep
        for i in range(Sq):
            qi = i // qt
            i0 = qi * qt
            rr = (hq - hk * rep) * (min(i0 + qt, Sq) - i0) + (i - i0)
            base = ((b * Hkv + hk) * nqt + qi) * nsplit
            mx = NEG_INF
            for sp in range(nsplit):
                mx = max(mx, pm[base + sp, rr])
            den = np.float32(0.0)
            for d in range(D):
                o = np.float32(0.0)
                for sp in range(nsplit):
                    mm = pm[base + sp, rr]
                    if mm != NEG_INF:
                        dp = (d // 2 if d % 2 == 0 else half + d // 2) if vperm else d
                        o += pacc[base + sp, rr, dp] * exp32(mm - mx)
                if d == 0:
                    for sp in range(nsplit):
                        mm = pm[base + sp, rr]
                        if mm != NEG_INF:
                            den += pl[base + sp, rr] * exp32(mm - mx)
                v = o / den
                if okind == 0:
                    out[b, hq, i, d] = v
                elif okind == 1:
                    out[b, hq, i, d] = f32_to_bf16(v)
                else:
                    out[b, hq, i, d] = f32_to_f16_bits(v)


@njit(parallel=True, cache=True)
def _prep_q(q, kind, rnd, qf):
    B, H, Sq, D = qf.shape
    for bh in prange(B * H):
        b = bh // H
        h = bh % H
        for i in range(Sq):
            for d in range(D):
                if kind == 0:
                    qf[b, h, i, d] = round_code(np.float32(q[b, h, i, d]), rnd)
                elif kind == 1:
                    qf[b, h, i, d] = bf16_to_f32(q[b, h, i, d])
                else:
                    qf[b, h, i, d] = f16_bits_to_f32(q[b, h, i, d])


def _vec_ok(kind, G, D, transposed, S):
    """Whether the vectorised tile loaders (:func:`_vrows` / :func:`_vkt`) apply."""
    if D % 16:
        return False
    if transposed:
        return kind < 5 or S % 2 == 0
    return G % 32 == 0 if kind >= 5 else G % 16 == 0


def sdpa(q, k: KV, v: KV, *, scale=None, scale_mode="mul", mask=None, causal=None,
         out=None, out_dtype="f32", q_dtype=None, rnd: int = 0, kv_splits: int | None = None):
    """Attention ``softmax(q k^T * scale + mask) v`` -> [B, Hq, Sq, D].

    Args:
      q: [B, Hq, Sq, D] float32 / float16 / bfloat16 (or uint16 bits with
        ``q_dtype`` "bf16"/"f16").
      k, v: :class:`KV` operands (Hq must be a multiple of their H).
      scale: scalar (default 1/sqrt(D)); ``scale_mode`` "mul" or "div".
      mask: additive f32 mask broadcastable to [B, Hq, Sq, S] (any strides).
      causal: None, "top_left" or "bottom_right".
      out: optional preallocated output (f32 or uint16 for bf16/f16).
      rnd: fpmath rounding code applied to f32 Q, K and V values.
      kv_splits: override the KV split count (decode).
    """
    B, Hq, Sq, D = q.shape
    _, Hkv, S, _ = k.shape
    if q_dtype == "f16" and q.dtype == np.uint16:
        qk, qkind = q, 2
    else:
        qk, qkind = act_kind(np.ascontiguousarray(q))
    qf = np.empty((B, Hq, Sq, D), np.float32)
    _prep_q(qk, qkind, rnd if qkind == 0 else 0, qf)
    if scale is None:
        scale = 1.0 / np.sqrt(D)
    kb, kk, ktr, kG, ksc, khs, kzp, khz = _kv_args(k)
    vb, vk, _, vG, vsc, vhs, vzp, vhz = _kv_args(v)
    if mask is not None:
        m = np.asarray(mask).astype(np.float32)
        m = m.reshape((1,) * (4 - m.ndim) + m.shape)
        mask4 = np.broadcast_to(m, (B, Hq, Sq, S))
        has_mask = True
    else:
        mask4 = np.zeros((1, 1, 1, 1), np.float32)
        has_mask = False
    qt = Sq if Sq <= 8 else QT
    nqt = -(-Sq // qt)
    threads = numba.get_num_threads()
    if kv_splits is None:
        base = B * Hkv * nqt
        kv_splits = 1 if base >= 4 * threads else max(1, min(-(-S // 256), -(-8 * threads // base)))
    nsplit = int(kv_splits)
    items = B * Hkv * nqt * nsplit
    rows = (Hq // Hkv) * qt
    pm = np.empty((items, rows), np.float32)
    pl = np.empty((items, rows), np.float32)
    pacc = np.empty((items, rows, D), np.float32)
    fastk = kk >= 5 and ktr == 1 and S % 2 == 0 and rnd >= 0
    vperm = vk >= 5 and D % 2 == 0 and (vG % 2 == 0)
    kperm = kk >= 5 and ktr == 0 and D % 2 == 0 and (kG % 2 == 0)
    if D % 16 == 0:
        _attn_v(qf, kb, kk, ktr, kG, ksc, khs, kzp, khz, vb, vk, vG, vsc, vhs, vzp, vhz, rnd,
                Hkv, S, np.float32(scale), scale_mode == "mul", mask4, has_mask,
                CAUSAL[causal], qt, nsplit, fastk, kperm, vperm,
                _vec_ok(kk, kG, D, ktr, S), _vec_ok(vk, vG, D, 0, S), pm, pl, pacc)
    else:
        _attn(qf, kb, kk, ktr, kG, ksc, khs, kzp, khz, vb, vk, vG, vsc, vhs, vzp, vhz, rnd,
              Hkv, S, np.float32(scale), scale_mode == "mul", mask4, has_mask,
              CAUSAL[causal], qt, nsplit, fastk, vperm, pm, pl, pacc)
    okind = {"f32": 0, "bf16": 1, "f16": 2}[out_dtype]
    if out is None:
        out = np.empty((B, Hq, Sq, D), np.float32 if okind == 0 else np.uint16)
    _merge(pm, pl, pacc, Hkv, Sq, qt, nsplit, vperm, okind, out)
    return out

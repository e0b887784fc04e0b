"""The tiled SDPA kernel (any K/V kind, any head size): tile loaders that dequantize
``T`` positions of K or V into an f32 tile, and the work item that scores a tile
for all the query rows of a KV head and updates an online softmax.

The K/V storage is a byte view read by kind (:func:`bits.ld_kind`): one compiled
signature for every K/V dtype pair."""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (numba: configured first)

import numpy as np
from numba import njit

from graph_api.kernels.bits import exp32, fma32, ld_kind, nib_x
from graph_api.kernels.sdpa.operands import NEG_INF
from graph_api.kernels.sdpa.prefill import _round_row


T = 128  #: KV positions per tile
QT = 32  #: query positions per prefill tile


@njit(inline="always", cache=True)
def _elem(buf, kind, idx):
    """Stored element at flat index ``idx`` of the byte buffer ``buf`` as f32 (integers
    not yet dequantized)."""
    if kind < 5:
        return ld_kind(buf, idx, kind)
    b = buf[idx >> 1]
    if kind == 5:
        return nib_x(b, np.uint8(0x88), (idx & 1) == 1) - np.float32(8.0)
    return nib_x(b, np.uint8(0), (idx & 1) == 1)


@njit(cache=True)
def widen_run(buf, e0, kind, out):
    """out[j] = the stored f32 / bf16 / f16 / s8 / u8 element ``e0 + j`` (``kind`` 0..4) of
    the byte buffer ``buf`` as f32.  One loop per kind, the kind a constant in each: a
    loop on :func:`ld_kind` with the kind a variable keeps its switch per element and
    does not vectorise."""
    n = out.shape[0]
    if kind == 0:
        for j in range(n):
            out[j] = ld_kind(buf, e0 + j, 0)
    elif kind == 1:
        for j in range(n):
            out[j] = ld_kind(buf, e0 + j, 1)
    elif kind == 2:
        for j in range(n):
            out[j] = ld_kind(buf, e0 + j, 2)
    elif kind == 3:
        for j in range(n):
            out[j] = ld_kind(buf, e0 + j, 3)
    else:
        for j in range(n):
            out[j] = ld_kind(buf, e0 + j, 4)


@njit(inline="always", cache=True)
def _deq(v, sidx, sc, has_sc, zp, has_zp):
    if has_zp:
        v = v - zp[sidx]
    if has_sc:
        v = v * sc[sidx]
    return v


@njit(cache=True)
def _round_rows(a, nrows, n, rnd):
    """a[i, :n] = round_code(a[i, :n], rnd) for the rows i < nrows of the 2-D ``a``.

    The tile loaders round once at the end through this compiled function instead
    of inlining ``round_code`` (with the bf16, f16 and tf32 roundings it inlines)
    into each of their paths: ~1 s of compile per inlined copy on an empty cache, for
    one call per tile."""
    for i in range(nrows):
        _round_row(a[i], n, rnd)


@njit(cache=True)
def load_k_tile(kb, kk, ktr, kG, ksc, khs, kzp, khz, rnd, b, h, H, S, D, s0, nt, fast, kT, pos):
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
            _round_rows(kT, D, nt, rnd)
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
                kd = kT[d, :nt]
                widen_run(kb, base + d * S + s0, kk, kd)
                for t in range(nt):
                    kd[t] = (kd[t] - zr[t]) * sr[t]
        if rnd != 0:
            _round_rows(kT, D, nt, rnd)
        return
    if not ktr and (kk < 5 or (D % 2 == 0 and kG % 2 == 0)):
        # [S, D] rows: contiguous over d, transposed into kT while converting (odd int4
        # shapes take the per-element loop below)
        wide = np.empty(D, np.float32)
        for t in range(nt):
            s = pos[t]
            if kk < 5:
                widen_run(kb, base + s * D, kk, wide)
            sb = ((b * H + h) * S + s) * ng
            if kk < 5:
                for g in range(ng):
                    z = kzp[sb + g] if khz else np.float32(0.0)
                    sc = ksc[sb + g] if khs else np.float32(1.0)
                    for d in range(g * kG, (g + 1) * kG):
                        kT[d, t] = (wide[d] - z) * sc
            else:
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
        if rnd != 0:
            _round_rows(kT, D, nt, rnd)
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
            kT[d, t] = _deq(_elem(kb, kk, idx), sidx, ksc, khs, kzp, khz)
    if rnd != 0:
        _round_rows(kT, D, nt, rnd)


@njit(cache=True)
def load_v_tile(vb, vk, vG, vsc, vhs, vzp, vhz, rnd, b, h, H, S, D, nt, vperm, pos, vf):
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
        elif vk < 5:
            vt = vf[t]
            for g in range(ng):
                z = vzp[sbase + g] if vhz else np.float32(0.0)
                sc = vsc[sbase + g] if vhs else np.float32(1.0)
                dst = vt[g * vG:g * vG + vG]
                widen_run(vb, rowbase + g * vG, vk, dst)
                for j in range(vG):
                    dst[j] = (dst[j] - z) * sc
        else:
            for d in range(D):
                vf[t, d] = _deq(_elem(vb, vk, rowbase + d), sbase + d // vG, vsc, vhs, vzp, vhz)
    if rnd != 0:
        _round_rows(vf, nt, D, rnd)


@njit(nogil=True, cache=True)
def attend_tiles(ids, q, kb, kk, ktr, kG, ksc, khs, kzp, khz, vb, vk, vG, vsc, vhs, vzp, vhz, rnd,
          Hkv, S, scale, smul, mflat, mstr, has_mask, causal, qt, nsplit, fastk, vperm,
          pm, pl, pacc):
    """Work item (b, kv head, query tile, kv split) -> partial (m, l, acc) per row.

    Rows of an item: the rep query heads of the KV head x the tile's query
    positions.  pm/pl: [items, rows], pacc: [items, rows, D] (d permuted if vperm).
    """
    B, Hq, Sq, D = q.shape
    rep = Hq // Hkv
    nqt = (Sq + qt - 1) // qt
    coff = S - Sq if causal == 2 else 0
    for it in ids:
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
            load_k_tile(kb, kk, ktr, kG, ksc, khs, kzp, khz, rnd, b, hk, Hkv, S, D, s0, nt,
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
                    m0 = b * mstr[0] + hq * mstr[1] + i * mstr[2]
                    for t in range(nt):
                        srow[t] += mflat[m0 + pos[t] * mstr[3]]
                if causal != 0 and s0 + nt - 1 > i + coff:
                    for t in range(nt):
                        if pos[t] > i + coff:
                            srow[t] = NEG_INF
            load_v_tile(vb, vk, vG, vsc, vhs, vzp, vhz, rnd, b, hk, Hkv, S, D, nt, vperm, pos, vf)
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

"""Scaled dot-product attention with plain or int4/int8-compressed K/V.

Formula, per batch ``b``, query head ``h`` (KV head ``h // rep``), query row ``i``::

    s[j]   = (q[i] . k[j]) * scale  (or / scale)  + mask[b, h, i, j]   (-inf if causal hides j)
    out[i] = sum_j softmax(s)[j] * v[j]

with ``k[j, d] = (K[.., j, d] - zk) * sk`` dequantized tile by tile (groups of
``G`` along the head dimension ``D``) and the same for ``v``.  The tiled kernels
make no f32 copy of K or V: each work item dequantizes a tile of ``T = 128``
positions into an L2-resident f32 buffer, scores it for all the query rows that
share the KV head (GQA/MQA: the K/V tile is read once for ``rep * Sq`` rows), and
updates an online softmax (running max ``m``, sum ``l`` and f32 accumulator).
A prefill (at least 32 query rows) without fpmath rounding makes one instead: K
and V widened to f32 once per call (:func:`_widened_prefill`, in bounded chunks),
then the f32 prefill kernel (:mod:`graph_api.kernels.sdpa_prefill`); the tiled
kernel would dequantize each tile again for every tile of query rows.

Decode (few query rows): the KV length is split over work items
("flash-decoding"), so both threads are busy at batch 1 with one KV head; the
partial ``(m, l, acc)`` are merged in a fixed order (log-sum-exp, numpy).
Prefill: work items are (batch, KV head, query tile of 32 positions); causal
tiles beyond the diagonal are skipped.  int4/int8 decode with K stored
``[D, S]`` runs :func:`_dec_items`, which folds the scales into the products
instead of dequantizing tiles (see the section "compressed decode"); on AVX2 it
stages each K/V chunk as 8-bit integers first (:func:`_stage4`).  Measured (Zen 3,
AVX2, Hq=32 Hkv=8 L=4096 s4): ~8.8 us per 128 positions and KV head on one core,
~30-40% of the FMA bound of strict f32, which alone caps the decode at ~60-70% of
the machine's cold read bandwidth.

Threads: each kernel is one ``nogil`` function over a list of work items, run
on ``numba.get_num_threads()`` Python threads of :mod:`graph_api.kernels.threads`
(items dealt round-robin; the compressed decode's threads claim items one at a
time, :func:`threads.run_claimed`).  A ``prange`` wrapper would re-optimise everything it links and cost about as much
compile time again on an empty cache.

Arithmetic is f32 with explicit FMAs in a fixed order (no fastmath flags); the
exponential is :func:`graph_api.kernels.bits.exp32` (<= 2 ulp, vectorised).  fpmath
rounding (``rnd``) applies to f32 Q and to f32/dequantized K and V when asked.
Under fpmath bf16 with ``apply_to_int`` (``bf16_dot``) the int4/int8 decode runs
:mod:`graph_api.kernels.sdpa_bf16` instead: Q.K and P.V on ``vdpbf16ps``.

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

from graph_api.kernels.numba_setup import numba  # noqa: F401  (numba: configured first)
from graph_api.kernels.isa import ISA

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from graph_api.kernels import sdpa_bf16, sdpa_prefill, store
from graph_api.kernels.threads import run_claimed, run_items
from graph_api.kernels.sdpa_prefill import _round_row
from graph_api.kernels.wmatmul import make_epilogue
from graph_api.kernels.bits import (RND_BF16, act_kind, bf16_to_f32, exp32, f16_bits_to_f32, fma32, ld_kind,
                          nib_x, round_code,
                          vadd, vbcast, vfma, vhsum16, vld_any, vld_kind, vload, vload_even, vload_odd,
                          vexp, vmax, vmul, vnib_hi, vnib_lo, vsplat, vstore, vsub,
                          _V16, _flat_ptr, f32x16, prefetch)

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
    # the stored bytes whatever the element type: the tiled kernels read them by ``kind``
    # (:func:`ld_kind`, :func:`vld_kind`), so one signature serves every K/V dtype pair
    buf = np.asarray(kv.data).reshape(-1).view(np.uint8)
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
    """Stored element at flat index ``idx`` of the byte buffer ``buf`` as f32 (integers
    not yet dequantized)."""
    if kind < 5:
        return ld_kind(buf, idx, kind)
    b = buf[idx >> 1]
    if kind == 5:
        return nib_x(b, np.uint8(0x88), (idx & 1) == 1) - np.float32(8.0)
    return nib_x(b, np.uint8(0), (idx & 1) == 1)


@njit(cache=True)
def _widen_run(buf, e0, kind, out):
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
                _widen_run(kb, base + d * S + s0, kk, kd)
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
                _widen_run(kb, base + s * D, kk, wide)
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
        elif vk < 5:
            vt = vf[t]
            for g in range(ng):
                z = vzp[sbase + g] if vhz else np.float32(0.0)
                sc = vsc[sbase + g] if vhs else np.float32(1.0)
                dst = vt[g * vG:g * vG + vG]
                _widen_run(vb, rowbase + g * vG, vk, dst)
                for j in range(vG):
                    dst[j] = (dst[j] - z) * sc
        else:
            for d in range(D):
                vf[t, d] = _deq(_elem(vb, vk, rowbase + d), sbase + d // vG, vsc, vhs, vzp, vhz)
    if rnd != 0:
        _round_rows(vf, nt, D, rnd)


@njit(nogil=True, cache=True)
def _attn(ids, q, kb, kk, ktr, kG, ksc, khs, kzp, khz, vb, vk, vG, vsc, vhs, vzp, vhz, rnd,
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
                    m0 = b * mstr[0] + hq * mstr[1] + i * mstr[2]
                    for t in range(nt):
                        srow[t] += mflat[m0 + pos[t] * mstr[3]]
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


@njit(cache=True)
def _vrows(buf, kind, G, sc, hs, zp, hz, rnd, e0, sb0, pos, nt, D, out):
    """out[t*D + dp] = dequantized row pos[t] (rows contiguous over d) for t < nt, vectorised.

    A compiled function (one call per tile), not inlined: :func:`_attn_v` loads K rows
    and V rows with it, and an inlined copy per site cost ~2 s more compile per
    signature on an empty cache.

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
def _online_softmax_row(sc, o, n, rr, m, alpha, lv, part):
    """One row's tile of ``n`` scores (a multiple of 16) at ``sc[o:]`` joins the running
    softmax: the new running max ``m[rr]``, the factor ``alpha[rr]`` that rescales the
    earlier sums, the scores turned into ``exp(score - max)`` and added to the running
    sums ``lv[rr*16:]``.  A row masked so far keeps max -inf, alpha 1 and zero weights."""
    mv = vsplat(m[rr])
    for t in range(0, n, 16):
        mv = vmax(mv, vload(sc, o + t))
    vstore(part, 0, mv)
    mt = m[rr]
    for j in range(16):
        mt = max(mt, part[j])
    if mt == NEG_INF:
        alpha[rr] = np.float32(1.0)
        for t in range(n):
            sc[o + t] = np.float32(0.0)
        return
    al = exp32(m[rr] - mt)
    alpha[rr] = al
    m[rr] = mt
    # one pass: exponentials (:func:`vexp`, exp32's values) and the running sums; the
    # scalar exp32 loop LLVM vectorised ran ~3x slower (~10% of the decode tile)
    mv = vsplat(mt)
    lsum = vmul(vload(lv, rr * 16), vsplat(al))
    for t in range(0, n, 16):
        e = vexp(vsub(vload(sc, o + t), mv))
        vstore(sc, o + t, e)
        lsum = vadd(lsum, e)
    vstore(lv, rr * 16, lsum)


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
def _attn_v(ids, q, kb, kk, ktr, kG, ksc, khs, kzp, khz, vb, vk, vG, vsc, vhs, vzp, vhz, rnd,
            Hkv, S, scale, smul, mflat, mstr, has_mask, causal, qt, nsplit, fastk, kperm, vperm,
            kvec, vvec, pm, pl, pacc):
    """Register-blocked variant of :func:`_attn` (D a multiple of 16); same outputs.

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
                    _load_k_tile(kb, kk, ktr, kG, ksc, khs, kzp, khz, rnd, b, hk, Hkv, S, D, s0,
                                 nt, fast, kT, pos)
                sdpa_prefill.score_rows(qb, kbuf, sc, Rp, D, TV, ntc)  # tile rows TV apart
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
                    m0 = b * mstr[0] + hq * mstr[1] + i * mstr[2]
                    for t in range(nt):
                        sc[o + t] += mflat[m0 + pos[t] * mstr[3]]
                if causal != 0 and s0 + nt - 1 > i + coff:
                    for t in range(nt):
                        if pos[t] > i + coff:
                            sc[o + t] = NEG_INF
                _online_softmax_row(sc, o, ntc, rr, m, alpha, lv, part)
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


@njit(cache=True)
def _prep_q(q, kind, rnd, qf):
    B, H, Sq, D = qf.shape
    for bh in range(B * H):
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


def _decode_ok(kk, vk, ktr, kG, vG, khs, vhs, D, S, Sq, rnd):
    """Whether the compressed decode kernel (:func:`_dec_item`) takes these operands."""
    if kk != vk or kk < 3 or not ktr or rnd != 0 or D % 64 or Sq > 8:
        return False
    if kk >= 5:  # int4 as a uint16 view: whole 4-value elements per K row and per head
        return S % 4 == 0 and vG % 32 == 0
    return vG % 16 == 0


def sdpa(q, k: KV, v: KV, *, scale=None, scale_mode="mul", mask=None, causal=None,
         out=None, out_dtype="f32", q_dtype=None, rnd: int = 0, kv_splits: int | None = None,
         stats=None, prob_quant=None, score_rnd: int = 0, bf16_dot: bool = False):
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
      stats: optional f32 [B, Hq, Sq] output: each row's ``max + ln(sum exp(s - max))``
        of the scores (SoftMax's stats, see :func:`_row_stats`); -inf for a row
        whose every score is -inf.
      prob_quant: the parameters of :func:`sdpa_prefill._quantize_row` (quantize scale,
        zero point, integer range, dequantize scale, zero point, s8/u8 or f8 rounding):
        the normalised probabilities pass that Quantize -> Dequantize pair before
        ``P V``.  ``score_rnd``: rounding code of the scores after the product, the
        scale and the mask (half-precision score ops of the quantized form).  Only the
        exact two-pass kernel has them: f32 Q/K/V, K not transposed, no rounding,
        f32 output, D a multiple of 16, S <= sdpa_prefill.MAX_S (any Sq).
      bf16_dot: the partition's fpmath mode is bf16 with ``apply_to_int``: the products
        may take bf16 inputs (Q, the probabilities, K/V values).  With ``rnd`` bf16,
        int4/int8 decode then runs :mod:`graph_api.kernels.sdpa_bf16` (``vdpbf16ps``)
        where the CPU has AVX512_BF16, else the path that rounds the inputs.
    """
    B, Hq, Sq, D = q.shape
    _, Hkv, S, _ = k.shape
    if q_dtype == "f16" and q.dtype == np.uint16:
        qk, qkind = q, 2
    else:
        qk, qkind = act_kind(q)  # (views: the prefill kernel reads strided f32 rows as they are)
    if scale is None:
        scale = 1.0 / np.sqrt(D)
    kk, vk, ktr = KINDS[k.kind], KINDS[v.kind], int(k.transposed)
    if mask is not None:
        m = np.asarray(mask).astype(np.float32)
        m = m.reshape((1,) * (4 - m.ndim) + m.shape)
        has_mask = True
    else:
        has_mask = False
    # every kernel reads the mask as a flat buffer + strides (0 on broadcast axes):
    # one compiled signature with or without a mask, whatever its shape and layout
    mflat, mstr = _flat_mask(m if has_mask else None)
    okind = {"f32": 0, "bf16": 1, "f16": 2}[out_dtype]
    if ktr and Sq >= sdpa_prefill.QB and sdpa_prefill.usable(qkind, kk, vk, 0, D, S, Sq, rnd, okind):
        # f32 K stored [D, S]: one [S, D] copy (S * D moves next to >= 64 * S * D flops of
        # scores) runs it on the prefill kernel, and the tiled kernel, ~13 s of compile on
        # an empty cache (~2.7 s for the prefill kernel), is not compiled for f32 prefill
        k = KV(np.ascontiguousarray(np.asarray(k.data).reshape(B, Hkv, D, S).swapaxes(2, 3)), "f32", k.shape)
        ktr = 0
    if (prob_quant is None and rnd == 0 and (qkind, kk, vk) != (0, 0, 0) and Sq >= sdpa_prefill.QB
            and sdpa_prefill.usable(0, 0, 0, 0, D, S, Sq, 0, 0)):
        return _widened_prefill(qk if qkind == 0 else _q_f32(qk, qkind, 0), k, v, m if has_mask else None,
                                okind, out, stats, scale=scale, scale_mode=scale_mode, causal=causal)
    if prob_quant is not None:
        assert sdpa_prefill.usable(qkind, kk, vk, ktr, D, S, 9, rnd, okind), "prob_quant operands"
    assert score_rnd == 0 or prob_quant is not None, "score rounding: the quantized form only"
    if prob_quant is not None or sdpa_prefill.usable(qkind, kk, vk, ktr, D, S, Sq, rnd, okind):
        if out is None:
            out = np.empty((B, Hq, Sq, D), np.float32)
        direct = out.dtype == np.float32 and out.strides[-1] == 4 and min(out.strides) >= 0
        dest = out if direct else np.empty((B, Hq, Sq, D), np.float32)
        rows = B * Hq * Sq if stats is not None else 1
        rmax, rsum = np.empty(rows, np.float32), np.empty(rows, np.float32)
        args, work = _prefill_call(qk, k, v, scale, scale_mode, mflat, mstr, has_mask, causal, dest,
                                   stats is not None, rmax, rsum, prob_quant, score_rnd)
        run_items(*args, work=work)
        if not direct:
            out[...] = dest
        if stats is not None:
            stats[...] = _row_stats(rmax, rsum).reshape(B, Hq, Sq)
        return out
    qf = _q_f32(np.ascontiguousarray(qk), qkind, rnd)
    kb, kk, ktr, kG, ksc, khs, kzp, khz = _kv_args(k)
    vb, vk, _, vG, vsc, vhs, vzp, vhz = _kv_args(v)
    qt = Sq if Sq <= 8 else QT
    nqt = -(-Sq // qt)
    threads = numba.get_num_threads()
    if kv_splits is None:
        base = B * Hkv * nqt
        kv_splits = 1 if base >= 4 * threads else max(1, min(-(-S // 256), -(-8 * threads // base)))
    nsplit = int(kv_splits)
    items = B * Hkv * nqt * nsplit
    rows = (Hq // Hkv) * qt
    work = 2 * B * Hq * Sq * S * D
    pm = np.empty((items, rows), np.float32)
    pl = np.empty((items, rows), np.float32)
    pacc = np.empty((items, rows, D), np.float32)
    fastk = kk >= 5 and ktr == 1 and S % 2 == 0 and rnd >= 0
    vperm = vk >= 5 and D % 2 == 0 and (vG % 2 == 0)
    kperm = kk >= 5 and ktr == 0 and D % 2 == 0 and (kG % 2 == 0)
    dec = None
    if stats is None:  # stats: the tiled kernels' partials
        if bf16_dot and rnd == RND_BF16 and sdpa_bf16.usable(kk, vk, ktr, kG, vG, D, S, Sq):
            dec = sdpa_bf16.dec_items  # fpmath bf16: vdpbf16ps (Q and p * sv rounded to bf16)
        elif _decode_ok(kk, vk, ktr, kG, vG, khs, vhs, D, S, Sq, rnd):
            dec = _dec_items
    if dec is not None:
        four = kk >= 5
        if not khs:
            ksc = np.ones(B * Hkv * S * (D // kG), np.float32)
        if not vhs:
            vsc = np.ones(B * Hkv * S * (D // vG), np.float32)
        kzs, vzs = int(khz), int(vhz)
        if not khz:
            kzp = np.zeros(DT, np.float32)
        if four:  # int4 bytes as uint16: the kernel tells int4 from 8-bit by the itemsize
            kb, vb = kb.view(np.uint16), vb.view(np.uint16)
        else:  # int8 / uint8 as stored (the loads take the sign from the dtype)
            kb, vb = np.asarray(k.data).reshape(-1), np.asarray(v.data).reshape(-1)
        args = (qf, kb, ksc, kzp, kzs, vb, vsc, vzp, vzs, kk in (3, 5), kG, vG,
                Hkv, S, np.float32(scale), scale_mode == "mul", mflat, mstr, has_mask,
                CAUSAL[causal], nsplit, pm, pl, pacc)
        if dec is _dec_items:  # + the staged tiles' dtype and int4 staging parameters
            run_claimed(dec, items, *args, np.empty(0, np.uint8 if kk == 4 else np.int8),
                         np.array(stage_params(k.kind), np.int64), work=work)
        else:
            run_items(dec, items, *args, work=work)
        if dec is sdpa_bf16.dec_items:  # merged, reordered and written back compiled
            res = np.empty((B, Hq, Sq, D), np.float32)
            sdpa_bf16.merge(pm, pl, pacc, Hkv, nsplit, four, res)
            return _store_out(res, okind, out)
        if nsplit == 1:
            # one split per item: :func:`_merge_np`'s weights are all 1 (0 for a row that saw
            # no finite score, whose acc and sum are 0: 0/0 either way), so its result is
            # acc / l; this skips its ~40 us of numpy steps (sdpa_bf16.merge, compiled,
            # would cost ~2 s more of compile on an empty cache)
            with np.errstate(invalid="ignore", divide="ignore"):
                res = (pacc / pl[..., None]).reshape(B, Hq, Sq, D)
            return _store_out(res, okind, out)
        vperm = False
    elif D % 16 == 0:
        run_items(_attn_v, items, qf, kb, kk, ktr, kG, ksc, khs, kzp, khz, vb, vk, vG, vsc, vhs,
                vzp, vhz, rnd,
                Hkv, S, np.float32(scale), scale_mode == "mul", mflat, mstr, has_mask,
                CAUSAL[causal], qt, nsplit, fastk, kperm, vperm,
                _vec_ok(kk, kG, D, ktr, S), _vec_ok(vk, vG, D, 0, S), pm, pl, pacc, work=work)
    else:
        run_items(_attn, items, qf, kb, kk, ktr, kG, ksc, khs, kzp, khz, vb, vk, vG, vsc, vhs,
                   vzp, vhz, rnd,
              Hkv, S, np.float32(scale), scale_mode == "mul", mflat, mstr, has_mask,
              CAUSAL[causal], qt, nsplit, fastk, vperm, pm, pl, pacc, work=work)
    if out is None:
        out = np.empty((B, Hq, Sq, D), np.float32 if okind == 0 else np.uint16)
    _merge_np(pm, pl, pacc, Hkv, Sq, qt, nsplit, vperm, okind, out)
    if stats is not None:
        stats[...] = _merged_stats(pm, pl, Hkv, Sq, qt, nsplit, B, Hq)
    return out


#: the prefill kernel's probability-quantize parameters when there is none (see _quantize_row)
_NO_PROB_QUANT = (1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0)


#: f32 bytes of K and V widened at a time by :func:`_widened_prefill` (batches, or KV heads
#: of one batch, in chunks of at most this)
WIDEN_BYTES = 32 << 20


def _widened_prefill(qf, k: KV, v: KV, mask, okind, out, stats, **kw):
    """:func:`sdpa` of a prefill (``Sq >= QB`` query rows) whose K/V are stored as
    bf16/f16 or int8/int4 with grouped scales (or whose Q is bf16/f16), with no fpmath
    rounding: K and V widened to f32 once per call (:func:`_widen`, exact conversion and
    the kernels' dequantization ``(n - z) * s``), then the f32 prefill kernel.

    The tiled kernel dequantizes each K/V tile again for every tile of query rows, so
    it dequantized K and V ``Sq / QT`` times (S = 2048, s4 K/V: 2.3x the f32 time);
    here a K/V element is converted once for all the ``rep * Sq`` rows that read it.
    The f32 copies take at most :data:`WIDEN_BYTES` at a time (batches, or KV heads of
    one batch, in chunks).  ``out`` f32, or bf16/f16 bits rounded once from the f32
    result as the other kernels round it."""
    B, Hq, Sq, D = qf.shape
    _, Hkv, S, _ = k.shape
    rep = Hq // Hkv
    res = out if okind == 0 and out is not None else np.empty((B, Hq, Sq, D), np.float32)
    per_head = 2 * S * D * 4
    hc = max(1, min(Hkv, WIDEN_BYTES // per_head))
    bc = max(1, WIDEN_BYTES // (per_head * Hkv)) if hc == Hkv else 1
    for b0 in range(0, B, bc):
        b1 = min(B, b0 + bc)
        for h0 in range(0, Hkv, hc):
            h1 = min(Hkv, h0 + hc)
            part = (b1 - b0, h1 - h0, S, D)
            kf, vf = (_widen(kv, b0 * Hkv + h0, (b1 - 1) * Hkv + h1, part) for kv in (k, v))
            qs = (slice(b0, b1), slice(h0 * rep, h1 * rep))
            ms = None if mask is None else mask[b0:b1 if mask.shape[0] > 1 else 1,
                                                h0 * rep:h1 * rep if mask.shape[1] > 1 else 1]
            sdpa(qf[qs], kf, vf, mask=ms, out=res[qs], stats=None if stats is None else stats[qs], **kw)
    return res if okind == 0 else _store_out(res, okind, out)


#: the epilogue of no post-ops: :func:`store.store_tile` then only converts
_NO_POST_OPS = make_epilogue((), 1, 1)


def _store_out(res, okind, out):
    """``out`` (made when None) = the f32 result ``res`` [B, H, Sq, D] as f32, or as
    bf16/f16 bits rounded to nearest even (NaN kept quiet) in one compiled pass
    (:func:`store.store_tile`, already compiled for bf16/f16 MatMul outputs): numpy's
    rounding made ~6 temporaries of the whole result, 20-50 ms at 32 x 512 x 128."""
    if out is None:
        out = np.empty(res.shape, np.float32 if okind == 0 else np.uint16)
    if okind == 0:
        out[...] = res
        return out
    D = res.shape[-1]
    direct = out.flags.c_contiguous
    dest = out if direct else np.empty(res.shape, np.uint16)
    store.store_tile(np.ascontiguousarray(res).reshape(-1, D), dest.reshape(-1, D), np.int64(0), okind,
                     _NO_POST_OPS)
    if not direct:
        out[...] = dest
    return out


def _widen(kv: KV, bh0: int, bh1: int, shape) -> KV:
    """The (batch, head) pairs ``bh0 .. bh1`` (flat, consecutive in storage) of a K/V
    operand as an f32 KV of ``shape``: integers dequantized by :func:`_widen_ints` into
    ``[S, D]`` rows; f32 (a view) and bf16/f16 (widened exactly) in the stored layout
    (a K stored ``[D, S]`` is then copied to rows by :func:`sdpa`)."""
    B, H, S, D = kv.shape
    kind = KINDS[kv.kind]
    n = S * D
    flat = np.asarray(kv.data).reshape(-1)
    if kind == 0:
        x = flat[bh0 * n:bh1 * n]
    elif kind == 1:
        x = _widen_half(flat.view(np.uint16)[bh0 * n:bh1 * n], 1)
    elif kind == 2:
        x = _widen_half(flat.view(np.uint16)[bh0 * n:bh1 * n], 2)
    else:
        buf, _, ktr, G, sc, has_sc, zp, has_zp = _kv_args(kv)
        x = np.empty((bh1 - bh0) * n, np.float32)
        _widen_ints(buf.view(np.uint8), kind, G, sc, has_sc, zp, has_zp, ktr, bh0, bh1 - bh0, S, D, x)
        return KV(x.reshape(shape), "f32", tuple(shape))
    B2, H2 = shape[:2]
    stored = (B2, H2, D, S) if kv.transposed else (B2, H2, S, D)
    return KV(x.reshape(stored), "f32", tuple(shape), kv.transposed)


@njit(inline="always", cache=True)
def _int_row(buf, kind, e0, o):
    """o[c] = the stored s8/u8/s4/u4 integer (``kind`` 3..6) at flat index ``e0 + c``,
    as f32 (``buf`` the bytes; 4-bit: two a byte, the even index in the low nibble)."""
    L = o.shape[0]
    if kind >= 5 and e0 % 2 == 0 and L % 2 == 0:  # whole bytes
        src = buf[e0 >> 1:(e0 + L) >> 1]
        for j in range(L // 2):
            lo = np.int32(src[j] & 15)
            hi = np.int32(src[j] >> 4)
            if kind == 5:  # two's complement nibbles
                lo -= (lo & 8) << 1
                hi -= (hi & 8) << 1
            o[2 * j] = np.float32(lo)
            o[2 * j + 1] = np.float32(hi)
    elif kind >= 5:  # a row starting mid-byte (odd S, K stored [D, S])
        for c in range(L):
            e = e0 + c
            n = np.int32(buf[e >> 1] >> 4) if e & 1 else np.int32(buf[e >> 1] & 15)
            if kind == 5:
                n -= (n & 8) << 1
            o[c] = np.float32(n)
    else:
        src = buf[e0:e0 + L]
        for c in range(L):
            n = np.int32(src[c])
            if kind == 3:
                n -= (n & 128) << 1
            o[c] = np.float32(n)


@njit(parallel=True, cache=True)
def _widen_ints(buf, kind, G, sc, has_sc, zp, has_zp, ktr, bh0, nbh, S, D, out):
    """out [nbh, S, D] = the stored s8/u8/s4/u4 values (``kind`` 3..6, ``buf`` the bytes)
    of the (batch, head) pairs ``bh0 .. bh0 + nbh`` dequantized as the kernels do,
    ``(n - z) * s`` in f32 (``z``, ``s`` of the element's group along D).  The stored
    rows are ``(bh, s)`` over d, or with ``ktr`` (K stored [D, S]) ``(bh, d)`` over s,
    written 8 at a time as columns of the pair's [S, D] rows (from L1: a numpy
    transpose of the f32 copy cost ~7x the whole widening).  Each row: the integers,
    then the zero points and the scales in passes of their own (loops without
    branches or divisions vectorise)."""
    ng = D // G
    L = S if ktr else D
    rows = D if ktr else S  # stored rows of a (batch, head) pair
    for hb in prange(nbh):
        tmp = np.empty((8, L), np.float32)  # 8 rows over s, then written as 8 columns
        for rr in range(rows):
            r = hb * rows + rr
            o = tmp[rr % 8] if ktr else out[r * L:r * L + L]
            _int_row(buf, kind, bh0 * S * D + r * L, o)
            if ktr:  # row (bh, d): its group's zero points and scales run along s
                p0 = ((bh0 + hb) * ng + rr // G) * S
                if has_zp:
                    zr = zp[p0:p0 + S]
                    for c in range(L):
                        o[c] = o[c] - zr[c]
                if has_sc:
                    sr = sc[p0:p0 + S]
                    for c in range(L):
                        o[c] = o[c] * sr[c]
                if rr % 8 == 7 or rr == rows - 1:  # columns d0 .. rr of the [S, D] rows
                    d0 = rr - rr % 8
                    nd = rr - d0 + 1
                    dst = out[hb * S * D:(hb + 1) * S * D]
                    for c in range(S):
                        for i in range(nd):
                            dst[c * D + d0 + i] = tmp[i, c]
            else:  # row (bh, s): one zero point and scale per group of G along the row
                p0 = (bh0 * S + r) * ng
                for g in range(ng):
                    og = o[g * G:g * G + G]
                    if has_zp:
                        z = zp[p0 + g]
                        for c in range(G):
                            og[c] = og[c] - z
                    if has_sc:
                        sg = sc[p0 + g]
                        for c in range(G):
                            og[c] = og[c] * sg


def _prefill_call(q, k: KV, v: KV, scale, scale_mode, mflat, mstr, has_mask, causal, dest, want_rows,
                  rmax, rsum, prob_quant=None, score_rnd=0):
    """(:func:`threads.run_items`' arguments for the ``sdpa_prefill`` work-item kernel, its work) over
    f32 Q/K/V (rows read through their strides) into the row-strided f32 ``dest``."""
    B, Hq, Sq, D = q.shape
    _, Hkv, S, _ = k.shape
    fn = sdpa_prefill.kernel(prob_quant is not None, score_rnd, has_mask, mstr[3])
    args = (fn, B * Hq, *_rows(q), Hq, Sq, D, *_rows(_data4(k)), *_rows(_data4(v)),
            Hkv, S, np.float32(scale), scale_mode == "mul", mflat, mstr, has_mask, CAUSAL[causal],
            *_flat_out(dest), want_rows, rmax, rsum,
            np.asarray(prob_quant if prob_quant is not None else _NO_PROB_QUANT, np.float32), score_rnd)
    return args, 2 * B * Hq * Sq * S * D


def prefill_runner(q, k: KV, v: KV, *, scale, scale_mode="mul", mask=None, out=None):
    """:func:`sdpa` on the f32 prefill kernel as a callable on these arrays, for a caller
    that runs the same attention on the same memory again and again (the values may
    change between calls: ``CompiledPartition.bind``); None unless every argument is
    the caller's memory itself, nothing converted or copied per call: f32 Q, K ``[S, D]``,
    V and output ``out`` [B, Hq, Sq, D] whose rows are contiguous (any strides above:
    heads of a [B, S, H, D] buffer), a C-contiguous f32 additive mask (or None); no
    causal mask."""
    B, Hq, Sq, D = q.shape
    _, Hkv, S, _ = k.shape
    if not (k.kind == v.kind == "f32" and sdpa_prefill.usable(0, 0, 0, int(k.transposed), D, S, Sq, 0, 0)
            and out is not None and all(_row_strided(a) for a in (q, _data4(k), _data4(v), out))):
        return None
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.float32 or not mask.flags.c_contiguous:
            return None
        mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    unused = np.empty(1, np.float32)
    args, work = _prefill_call(q, k, v, scale, scale_mode, *_flat_mask(mask), mask is not None, None, out,
                               False, unused, unused)

    def runner() -> None:
        run_items(*args, work=work)

    return runner


def _row_strided(a) -> bool:
    """A 4-D f32 array whose rows (last axis) are contiguous, with non-negative strides."""
    return a.dtype == np.float32 and a.ndim == 4 and a.strides[-1] == 4 and min(a.strides) >= 0


def _data4(kv: KV) -> np.ndarray:
    """An f32 K/V operand's storage as [B, H, S, D] (a view where the storage allows)."""
    d = np.asarray(kv.data)
    return d if d.shape == tuple(kv.shape) else d.reshape(kv.shape)


def _rows(a):
    """(flat buffer, element strides of the first three axes) of a 4-D f32 array for the
    prefill kernel: its own memory when the rows are contiguous, else a C-order copy."""
    return _flat_out(a if _row_strided(a) else np.ascontiguousarray(a, dtype=np.float32))


def _flat_out(out):
    """A 4-D f32 array with a contiguous last axis and non-negative strides as (a flat
    C-contiguous view from its first element, element strides of its first three axes):
    one compiled signature for a dense output and for a strided view of the next layout."""
    st = [s // 4 for s in out.strides]
    span = 1 + sum((n - 1) * s for n, s in zip(out.shape, st)) if out.size else 0
    flat = np.lib.stride_tricks.as_strided(out, shape=(span,), strides=(4,))
    return flat, np.array(st[:3], np.int64)


def _row_stats(rmax, rsum):
    """SoftMax's stats ``max + ln(sum)`` of rows with f32 score max and sum of
    ``exp(s - max)``, evaluated in float64 and rounded once to f32 (the reference's
    formula on the kernel's f32 scores); -inf + ln 0 = -inf for an all -inf row."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (rmax.astype(np.float64) + np.log(rsum.astype(np.float64))).astype(np.float32)


def _merged_stats(pm, pl, Hkv, Sq, qt, nsplit, B, Hq):
    """[B, Hq, Sq] stats from the split partials (row max ``pm``, sum ``pl`` relative to
    it): M = max over splits, L = sum_sp pl exp(pm - M), stats = M + ln L, in float64 and
    rounded once to f32 as :func:`_row_stats` (rows laid out as in :func:`_merge_np`)."""
    rep = Hq // Hkv
    nqt = -(-Sq // qt)
    rows = pm.shape[1]
    with np.errstate(all="ignore"):  # rows past a short last tile hold unset partials (unused)
        pm = pm.reshape(B * Hkv * nqt, nsplit, rows).astype(np.float64)
        pl = pl.reshape(B * Hkv * nqt, nsplit, rows).astype(np.float64)
        mx = pm.max(axis=1)
        w = np.where(pm == -np.inf, 0.0, np.exp(pm - mx[:, None]))
        total = (pl * w).sum(axis=1)
        st = (mx + np.log(total)).astype(np.float32).reshape(B, Hkv, nqt, rows)
    res = np.empty((B, Hq, Sq), np.float32)
    for qi in range(nqt):
        nq = min(qt, Sq - qi * qt)
        res[:, :, qi * qt:qi * qt + nq] = st[:, :, qi, :rep * nq].reshape(B, Hq, nq)
    return res


def _flat_mask(m):
    """A 4-D f32 mask as a flat buffer + element strides (0 on broadcast dims): one type
    (one compiled signature) whatever the mask's shape and strides; no mask: placeholders."""
    if m is None:
        return np.zeros(1, np.float32), np.zeros(4, np.int64)
    mc = np.ascontiguousarray(m)
    return mc.reshape(-1), np.array([0 if mc.shape[i] == 1 else mc.strides[i] // 4 for i in range(4)], np.int64)


def _widen_half(bits, kind):
    """bf16 (``kind`` 1) or f16 (2) bits, uint16 of any shape, as a new f32 array, exactly:
    :func:`_widen_run` over the bytes (one compiled pass: numpy took 2.0 ms for
    ``astype(np.uint32) << 16`` of 2 M bf16 values and 4.7 ms for float16's ``astype``)."""
    out = np.empty(bits.shape, np.float32)
    _widen_run(np.ascontiguousarray(bits).reshape(-1).view(np.uint8), np.int64(0), np.int64(kind),
               out.reshape(-1))
    return out


def _q_f32(qk, qkind, rnd):
    """Q as f32 (bf16/f16 bits widened exactly; f32 rounded by ``rnd``)."""
    if qkind == 1:
        return _widen_half(qk, 1)
    if qkind == 2:
        return _widen_half(qk, 2)
    if rnd == 0:
        return np.ascontiguousarray(qk, dtype=np.float32)
    qf = np.empty(qk.shape, np.float32)
    _prep_q(qk, qkind, rnd, qf)
    return qf


def _merge_np(pm, pl, pacc, Hkv, Sq, qt, nsplit, vperm, okind, out):
    """Combine the split partials (log-sum-exp in split order) into out [B, Hq, Sq, D].

    Item ``((b * Hkv + hk) * nqt + qi) * nsplit + sp``, row ``(hq - hk * rep) * nq + i``;
    a split whose rows saw no finite score (m = -inf) has weight 0.  numpy, in f32
    (a few hundred values per row: not worth a compiled kernel).
    """
    B, Hq, _, D = out.shape
    rep = Hq // Hkv
    nqt = -(-Sq // qt)
    items, rows = pm.shape
    if vperm:  # d permuted (even d, then odd d) by the int4 V tile
        half = D // 2
        pacc = np.stack([pacc[..., :half], pacc[..., half:]], axis=-1).reshape(items, rows, D)
    pm = pm.reshape(B * Hkv * nqt, nsplit, rows)
    mx = pm.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        w = np.where(pm == NEG_INF, np.float32(0), np.exp(pm - mx)).astype(np.float32)
        den = np.zeros((B * Hkv * nqt, rows), np.float32)
        o = np.zeros((B * Hkv * nqt, rows, D), np.float32)
        pl = pl.reshape(B * Hkv * nqt, nsplit, rows)
        pa = pacc.reshape(B * Hkv * nqt, nsplit, rows, D)
        for sp in range(nsplit):
            den += pl[:, sp] * w[:, sp]
            o += pa[:, sp] * w[:, sp, :, None]
        o /= den[..., None]
    # rows of item (b, hk, qi): (head in group j, query i of the tile) -> out[b, hk*rep + j, qi*qt + i]
    o = o.reshape(B, Hkv, nqt, rows, D)
    res = np.empty((B, Hq, Sq, D), np.float32)
    for qi in range(nqt):
        nq = min(qt, Sq - qi * qt)
        res[:, :, qi * qt:qi * qt + nq] = o[:, :, qi, :rep * nq].reshape(B, Hq, nq, D)
    _store_out(res, okind, out)


# ====================================================================== compressed decode
# Decode (few query rows) with int4/int8 K stored transposed ``[D, S]`` and V
# stored ``[S, D]``, grouped scales along D.  The dequantization is folded into
# the two products instead of writing an f32 tile:
#
#   score[r, s] = sum_g sk[g, s] * (sum_{d in g} q[r, d] * n[d, s]  -  zk[g, s] * Q_g[r])
#   out[r, d]  += p[r, s] * (n[s, d] * sv[s, g] - zv[s, g] * sv[s, g])
#
# with ``n`` the stored integers (s4 read signed through a 16-entry table, so no
# offset is needed) and ``Q_g[r]`` the sum of q over group g.  One work item is
# (batch, KV head, KV split): it reads its K/V bytes once for all ``rep * Sq``
# query rows of the head group (GQA), in tiles of DT positions (one 64-byte
# line per K row for int4), prefetching the next tile.  Rows go in blocks of 4
# (16 register accumulators) and a 1-row form for the rest (MHA decode).
#
# Compile cost (the first call on an empty cache pays it): one signature per
# storage dtype -- int4 data arrive as a uint16 view, so ``kb``'s item size (:func:`_isz`) tells
# int4 from 8-bit and LLVM drops the other branch before optimising; absent zero
# points are a zeros buffer read with index stride 0 (no branch to unswitch);
# threads are Python threads around one ``nogil`` function (a parfor wrapper
# re-optimises all the code it links, costing as much again).
#
# How far from the limit (measured on the AMD EPYC Zen 4 machine, `inspect_asm` + perf):
# in strict f32 every K and every V element costs ``rep`` FMA lanes (the rows of the
# head group), and Zen 4 retires one 512-bit FMA (16 lanes) per cycle per core, so at
# rep = 4 the floor is 0.25 cycles per K/V element: Hq=32 Hkv=8 L=4096 needs >= 0.40 ms
# on 2 cores at 2.6 GHz while reading the int4 cache takes ~0.12-0.2 ms -- "60% of read
# bandwidth" is out of reach in strict f32 at rep >= 2 (it needs fpmath bf16/int8 dot
# instructions).  The inner loops emit 32 FMAs in 65 instructions (scores: 8 unpack =
# vpmovzxbd + vpsrld + 2 vpermd per 32 nibbles, 8 q broadcasts) and 16 FMAs in 39 (P*V);
# the whole kernel runs 0.35-0.37 cycles per element hot on one core (softmax, scale
# gathers and the per-group scale FMAs are the rest).  At rep = 1 (Hkv = Hq) the unpack
# dominates: ~3 vector instructions per 16 elements, measured ~0.3 cycles per element.
DT = 128  #: KV positions per decode tile
#: the compile target has AVX-512 (the one ISA layer: also when the user set the CPU name
#: and features, or left Numba's environment alone with GRAPH_API_NUMBA_DEFAULTS=0)
_HAS_AVX512 = ISA.avx512
_NIB_S = [float(i if i < 8 else i - 16) for i in range(16)]
_NIB_U = [float(i) for i in range(16)]


def _vnib_table(high: bool):
    @intrinsic
    def f(typingctx, arr, idx, signed):
        """The low/high nibbles of 16 bytes at byte offset ``idx`` of ``arr``'s buffer as
        f32x16, read as s4 (-8..7) when ``signed`` else u4 (0..15).  AVX-512: one
        ``vpermps`` table lookup per 16 nibbles (the index uses the low 4 bits)."""
        if not isinstance(arr, types.Array):
            return None
        sig = f32x16(arr, idx, signed)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            i8 = ir.IntType(8)
            i32v = ir.VectorType(ir.IntType(32), 16)
            base = builder.bitcast(ary.data, i8.as_pointer())
            p = builder.gep(base, [context.cast(builder, args[1], signature.args[1], types.intp)])
            v = builder.load(builder.bitcast(p, ir.VectorType(i8, 16).as_pointer()), align=1)
            v = builder.zext(v, i32v)
            if high:
                v = builder.lshr(v, ir.Constant(i32v, [4] * 16))
            sgn = builder.icmp_unsigned("!=", args[2], args[2].type(0))
            if _HAS_AVX512:
                lut = builder.select(sgn, ir.Constant(_V16, _NIB_S), ir.Constant(_V16, _NIB_U))
                fn = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(_V16, [_V16, i32v]), "llvm.x86.avx512.permvar.sf.512")
                return builder.call(fn, [lut, v])
            v = builder.and_(v, ir.Constant(i32v, [15] * 16))
            vs = builder.sub(builder.xor(v, ir.Constant(i32v, [8] * 16)), ir.Constant(i32v, [8] * 16))
            return builder.sitofp(builder.select(sgn, vs, v), _V16)

        return sig, codegen

    return f


vnib_tlo = _vnib_table(False)
vnib_thi = _vnib_table(True)


@intrinsic
def _isz(typingctx, arr):
    """``arr.itemsize`` as a compile-time constant (Numba's ``.itemsize`` is a field read at
    run time, so branches on it survived into the machine code and ``x // itemsize`` was an
    ``idiv``)."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, signature, args):
        return context.get_constant(types.intp, arr.dtype.bitwidth // 8)

    return types.intp(arr), codegen


@intrinsic
def _ld(typingctx, arr, idx):
    """float32 ``arr.flat[idx]`` without negative-index wraparound (see :func:`graph_api.kernels.bits.vbcast`)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], signature.args[1], types.intp)
        return builder.load(builder.gep(ary.data, [i]), align=4)

    return types.float32(arr, idx), codegen


@njit(inline="always", cache=True)
def _kvec4(buf, p, sgn):
    """The 4 vectors of 64 stored values from byte p: int4 (``buf`` a uint16 view): the
    low/high nibbles of bytes p..p+15, then of p+16..p+31; 8-bit: p, p+16, p+32, p+48."""
    if _isz(buf) == 2:
        return (vnib_tlo(buf, p, sgn), vnib_thi(buf, p, sgn),
                vnib_tlo(buf, p + 16, sgn), vnib_thi(buf, p + 16, sgn))
    return (vld_any(buf, p, False), vld_any(buf, p + 16, False),
            vld_any(buf, p + 32, False), vld_any(buf, p + 48, False))


@njit(inline="always", cache=True)
def _kparam4(arr, i, four):
    """Scales / zero points of a 64-position K sub-block from flat index i, in the order
    of :func:`_kvec4` (int4: even positions then odd ones)."""
    if four:
        return (vload_even(arr, i), vload_odd(arr, i), vload_even(arr, i + 32), vload_odd(arr, i + 32))
    return (vload(arr, i), vload(arr, i + 16), vload(arr, i + 32), vload(arr, i + 48))


@njit(cache=True)
def _dscore4(buf, k0, rs, sgn, scb, s0i, srs, zpb, zs, G, D, qb, qsum, r0, sc, c):
    """sc[r0..r0+3, 64c..64c+63] += scores of 4 rows against one 64-position K sub-block.

    ``k0``: byte offset of row d=0 of the tile, ``rs`` the row stride in bytes;
    ``s0i``: scale index of group 0 at the tile's first position, ``srs`` the group
    stride; zero points at ``s0i`` too, read only when ``zs`` = 1.
    """
    four = _isz(buf) == 2
    ng = D // G
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
        for d in range(g * G, g * G + G):
            x0, x1, x2, x3 = _kvec4(buf, k0 + d * rs + sub, sgn)
            q = vbcast(qb, r0 * D + d)
            a00 = vfma(q, x0, a00)
            a01 = vfma(q, x1, a01)
            a02 = vfma(q, x2, a02)
            a03 = vfma(q, x3, a03)
            q = vbcast(qb, (r0 + 1) * D + d)
            a10 = vfma(q, x0, a10)
            a11 = vfma(q, x1, a11)
            a12 = vfma(q, x2, a12)
            a13 = vfma(q, x3, a13)
            q = vbcast(qb, (r0 + 2) * D + d)
            a20 = vfma(q, x0, a20)
            a21 = vfma(q, x1, a21)
            a22 = vfma(q, x2, a22)
            a23 = vfma(q, x3, a23)
            q = vbcast(qb, (r0 + 3) * D + d)
            a30 = vfma(q, x0, a30)
            a31 = vfma(q, x1, a31)
            a32 = vfma(q, x2, a32)
            a33 = vfma(q, x3, a33)
        si = s0i + g * srs + 64 * c
        s0, s1, s2, s3 = _kparam4(scb, si, four)
        if zs:
            z0, z1, z2, z3 = _kparam4(zpb, si, four)
            _sacc(sc, o0, s0, s1, s2, s3, z0, z1, z2, z3, -qsum[r0 * ng + g], a00, a01, a02, a03)
            _sacc(sc, o0 + DT, s0, s1, s2, s3, z0, z1, z2, z3, -qsum[(r0 + 1) * ng + g], a10, a11, a12, a13)
            _sacc(sc, o0 + 2 * DT, s0, s1, s2, s3, z0, z1, z2, z3, -qsum[(r0 + 2) * ng + g], a20, a21, a22, a23)
            _sacc(sc, o0 + 3 * DT, s0, s1, s2, s3, z0, z1, z2, z3, -qsum[(r0 + 3) * ng + g], a30, a31, a32, a33)
        else:  # no zero points: skip their loads and FMAs (~10% of the 1-row kernel)
            _sacc0(sc, o0, s0, s1, s2, s3, a00, a01, a02, a03)
            _sacc0(sc, o0 + DT, s0, s1, s2, s3, a10, a11, a12, a13)
            _sacc0(sc, o0 + 2 * DT, s0, s1, s2, s3, a20, a21, a22, a23)
            _sacc0(sc, o0 + 3 * DT, s0, s1, s2, s3, a30, a31, a32, a33)


@njit(inline="always", cache=True)
def _sacc(sc, o, s0, s1, s2, s3, z0, z1, z2, z3, nq, a0, a1, a2, a3):
    """sc[o + 16v ..] += s_v * (a_v - z_v * Q_g) for the 4 vectors of one row (nq = -Q_g)."""
    n = vsplat(nq)
    vstore(sc, o, vfma(s0, vfma(z0, n, a0), vload(sc, o)))
    vstore(sc, o + 16, vfma(s1, vfma(z1, n, a1), vload(sc, o + 16)))
    vstore(sc, o + 32, vfma(s2, vfma(z2, n, a2), vload(sc, o + 32)))
    vstore(sc, o + 48, vfma(s3, vfma(z3, n, a3), vload(sc, o + 48)))


@njit(inline="always", cache=True)
def _sacc0(sc, o, s0, s1, s2, s3, a0, a1, a2, a3):
    """:func:`_sacc` without zero points: sc[o + 16v ..] += s_v * a_v."""
    vstore(sc, o, vfma(s0, a0, vload(sc, o)))
    vstore(sc, o + 16, vfma(s1, a1, vload(sc, o + 16)))
    vstore(sc, o + 32, vfma(s2, a2, vload(sc, o + 32)))
    vstore(sc, o + 48, vfma(s3, a3, vload(sc, o + 48)))


@njit(cache=True)
def _dscore1(buf, k0, rs, sgn, scb, s0i, srs, zpb, zs, G, D, qb, qsum, r0, sc, c):
    """One-row form of :func:`_dscore4`."""
    four = _isz(buf) == 2
    ng = D // G
    z = vsplat(np.float32(0.0))
    sub = (32 if four else 64) * c
    for g in range(ng):
        a0 = z
        a1 = z
        a2 = z
        a3 = z
        for d in range(g * G, g * G + G):
            x0, x1, x2, x3 = _kvec4(buf, k0 + d * rs + sub, sgn)
            q = vbcast(qb, r0 * D + d)
            a0 = vfma(q, x0, a0)
            a1 = vfma(q, x1, a1)
            a2 = vfma(q, x2, a2)
            a3 = vfma(q, x3, a3)
        si = s0i + g * srs + 64 * c
        s0, s1, s2, s3 = _kparam4(scb, si, four)
        if zs:
            z0, z1, z2, z3 = _kparam4(zpb, si, four)
            _sacc(sc, r0 * DT + 64 * c, s0, s1, s2, s3, z0, z1, z2, z3, -qsum[r0 * ng + g], a0, a1, a2, a3)
        else:
            _sacc0(sc, r0 * DT + 64 * c, s0, s1, s2, s3, a0, a1, a2, a3)


# ---- the AVX2 forms (targets without AVX-512: 16 registers of 8 floats).  The 4-row
# kernels above keep 16 f32x16 accumulators and 4 unpacked vectors live, three times
# AVX2's register file, so every FMA reloaded and spilled.  These take the 64-position
# sub-block (64 head dims for P V) one vector of 16 at a time: 4 rows x 1 vector (4
# accumulators, 8 registers) per pass over the group's rows.  The same products in the
# same order: bit-identical results (tested against the forms above).
# They read staged tiles (:func:`_stage4`): K and V are copied a 64-wide chunk at a time
# into 8 KB pass-major buffers of 8-bit values, contiguous along the loop of each pass,
# int4 widened to c * n (one 16-bit shift and mask per 16 values; c = 16 s4, 8 u4, q and
# the P V weights divided by c, exactly).  A vector is then one sign-extending load and
# convert; int4 vectors hold the 8 low nibbles of 8 stored bytes then their 8 high ones,
# whose halves land 16 columns apart in the score / accumulator tiles (:func:`_vld2`,
# :func:`_vst2`, K parameters de-interleaved by :func:`_vdeint`).  Unpacking nibbles in
# the loops (sign-extending load, 3 shifts, 2 masks, 2 converts per 16 values) and
# reading V rows 64 bytes apart through ``perm`` ran the loops at 6.5-7.5 cycles per 8
# FMAs; staged, 4.8-5.9 (one thread, L1, Zen 3 at 2.9 GHz; 4.0 is the 2-FMA-pipe bound,
# ~4.4 a broadcast-and-FMA loop alone).
#
# Bound (strict f32, AVX2): each K and each V value costs one FMA lane per row of the
# head group, 16 lanes per cycle per core, so rep / 8 cycles per position and head dim.
# Hq=32 Hkv=8 L=4096 (rep 4): 2.1 M core cycles, 0.36 ms on 2 cores at 2.9 GHz (0.43 at
# 2.45), where reading the 5.2 MB cache at the 21 GB/s measured takes 0.25 ms: at most
# ~60-70% of read bandwidth even with FMAs alone.  Measured per 128-position tile and KV
# head (4 rows), one thread, in the kernel (rdtsc around each step, Hkv = 8, fastest of
# 40-80 calls on a 2-core machine shared with other jobs): L = 1024: K staging ~0.6 us +
# scores ~2.8, scale + softmax 0.7, weights 0.65, V staging ~1.0 + P V ~1.6; 7.3 us in
# all (before staging: 7.5-9.0, copy 0.4-0.6, scores 2.6-3.0, P V 3.1-3.9); L = 4096
# (K and V from L3): 8.8 (9.6), the K rows (S / 2 bytes apart) costing ~1 us more to
# stage.  The FMA steps' bound is 1.4 us each (2.8 of 7.3: ~40%); softmax, weights and
# staging are ~40% of the tile.  At rep = 1 (MHA) the step loops do 1 FMA per converted
# vector and the staging is ~half the work.


@intrinsic
def _copy64(typingctx, dst, di, src, si):
    """64 bytes from byte offset ``si`` of ``src``'s buffer to byte offset ``di`` of
    ``dst``'s (one vector load and store; the element loop ran scalar)."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array)):
        return None
    sig = types.void(dst, di, src, si)

    def codegen(context, builder, signature, args):
        v64 = ir.VectorType(ir.IntType(8), 64)
        ptrs = []
        for a, i in ((0, 1), (2, 3)):
            ary = context.make_array(signature.args[a])(context, builder, args[a])
            base = builder.bitcast(ary.data, ir.IntType(8).as_pointer())
            p = builder.gep(base, [context.cast(builder, args[i], signature.args[i], types.intp)])
            ptrs.append(builder.bitcast(p, v64.as_pointer()))
        builder.store(builder.load(ptrs[1], align=1), ptrs[0], align=1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _stage4(typingctx, dst, di, dstride, src, si, sl, sr, msk):
    """Four 16-byte pieces of staged 8-bit values from one run of stored values: to
    bytes ``di``, ``di + dstride``, ``di + 2 dstride``, ``di + 3 dstride`` of ``dst``
    (int8/uint8) from byte ``si`` of ``src``.

    8-bit ``src`` (int8/uint8): the 64 bytes as they are, 16 per piece.  int4 ``src``
    (a uint16 view): 32 bytes, piece k = the low nibbles of bytes 8k..8k+7 then their
    high nibbles, each as ``c * n``: with 16-bit
    lanes, low = (w << sl) & msk and high = (w >> sr) & msk (the masks drop the bits a
    16-bit shift moves across a byte): s4 ``sl, sr, msk = 4, 0, 0xF0F0`` gives 16 * n
    (the sign in bit 7), u4 ``3, 1, 0x7878`` gives 8 * n (0..120, still an int8).  The
    step kernels then load a staged vector with one sign-extending convert; the
    factor c is divided out of q or of the P V weights exactly (a power of two), so
    (q / c) (c n) rounds as q n: the same sums bit for bit, unless q / c or a weight
    / c falls below 2**-126 (|q| < 2**-122: a subnormal loses bits, an absolute
    difference under 2**-142 per product, |c n| <= 128)."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array)):
        return None
    four = src.dtype.bitwidth == 16
    sig = types.void(dst, di, dstride, src, si, sl, sr, msk)

    def codegen(context, builder, signature, args):
        i8, i16, i32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)

        def byte_ptr(k, ik):
            ary = context.make_array(signature.args[k])(context, builder, args[k])
            base = builder.bitcast(ary.data, i8.as_pointer())
            return builder.gep(base, [context.cast(builder, args[ik], signature.args[ik], types.intp)])

        d0 = byte_ptr(0, 1)
        ds = context.cast(builder, args[2], signature.args[2], types.intp)
        ps = byte_ptr(3, 4)
        v16 = ir.VectorType(i8, 16)
        if four:
            w16 = ir.VectorType(i16, 16)
            w = builder.load(builder.bitcast(ps, w16.as_pointer()), align=1)

            def splat(k):
                x = builder.trunc(context.cast(builder, args[k], signature.args[k], types.int64), i16)
                x = builder.insert_element(ir.Constant(w16, ir.Undefined), x, i32(0))
                return builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(i32, 16), [0] * 16))

            m = splat(7)
            lo = builder.bitcast(builder.and_(builder.shl(w, splat(5)), m), ir.VectorType(i8, 32))
            hi = builder.bitcast(builder.and_(builder.lshr(w, splat(6)), m), ir.VectorType(i8, 32))
            pieces = [builder.shuffle_vector(lo, hi, ir.Constant(
                ir.VectorType(i32, 16), list(range(8 * k, 8 * k + 8)) + list(range(32 + 8 * k, 40 + 8 * k))))
                for k in range(4)]
        else:
            pieces = [builder.load(builder.bitcast(builder.gep(ps, [ir.Constant(ir.IntType(64), 16 * k)]),
                                                   v16.as_pointer()), align=1) for k in range(4)]
        for k in range(4):
            p = builder.gep(d0, [builder.mul(ds, ds.type(k))])
            builder.store(pieces[k], builder.bitcast(p, v16.as_pointer()), align=1)
        return context.get_dummy_value()

    return sig, codegen


_V8 = ir.VectorType(ir.FloatType(), 8)


@intrinsic
def _vld2(typingctx, arr, i, j):
    """arr.flat[i:i+8] and arr.flat[j:j+8] as one f32x16 (the two halves of a staged int4
    vector: 16 columns apart in the score and accumulator tiles)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32):
        return None
    sig = f32x16(arr, i, j)

    def codegen(context, builder, signature, args):
        a = _flat_ptr(context, builder, signature.args[0], args[0], args[1], signature.args[1])
        b = _flat_ptr(context, builder, signature.args[0], args[0], args[2], signature.args[2])
        va = builder.load(builder.bitcast(a, _V8.as_pointer()), align=4)
        vb = builder.load(builder.bitcast(b, _V8.as_pointer()), align=4)
        return builder.shuffle_vector(va, vb, ir.Constant(ir.VectorType(ir.IntType(32), 16), list(range(16))))

    return sig, codegen


@intrinsic
def _vst2(typingctx, arr, i, j, v):
    """arr.flat[i:i+8] = v[0:8], arr.flat[j:j+8] = v[8:16] (see :func:`_vld2`)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32):
        return None
    sig = types.void(arr, i, j, v)

    def codegen(context, builder, signature, args):
        m = ir.VectorType(ir.IntType(32), 8)
        for k, x in ((1, 0), (2, 8)):
            p = _flat_ptr(context, builder, signature.args[0], args[0], args[k], signature.args[k])
            half = builder.shuffle_vector(args[3], args[3], ir.Constant(m, list(range(x, x + 8))))
            builder.store(half, builder.bitcast(p, _V8.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _vdeint(typingctx, arr, i):
    """arr.flat[i + 2l] for l < 8, then arr.flat[i + 2l + 1]: the 16 per-position
    parameters (scales, zero points) of a staged int4 vector of K scores."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32):
        return None
    sig = f32x16(arr, i)

    def codegen(context, builder, signature, args):
        p = _flat_ptr(context, builder, signature.args[0], args[0], args[1], signature.args[1])
        w = builder.load(builder.bitcast(p, _V16.as_pointer()), align=4)
        mask = [2 * l for l in range(8)] + [2 * l + 1 for l in range(8)]
        return builder.shuffle_vector(w, w, ir.Constant(ir.VectorType(ir.IntType(32), 16), mask))

    return sig, codegen


@njit(inline="always", cache=True)
def _sacc_at(sc, o, s, z, nq, zs, a):
    """sc[o ..] += s * (a - z * Q_g) (nq = -Q_g; no zero-point term when zs = 0)."""
    if zs:
        a = vfma(z, vsplat(nq), a)
    vstore(sc, o, vfma(s, a, vload(sc, o)))


@njit(cache=True)
def _dscore4_v(kst, four, scb, s0i, srs, zpb, zs, G, D, qb, qsum, r0, sc, c):
    """:func:`_dscore4`, one vector of 16 positions per pass (the AVX2 form), from the
    staged chunk c of the tile (``kst``, :func:`_stage_k`: pass v, row d, 16 bytes,
    contiguous over d).  int4 (``four``): the vector is the 16 nibbles of 8 bytes (low
    ones then high ones, staged times c with q divided by c), its halves 16 score columns
    apart."""
    ng = D // G
    z = vsplat(np.float32(0.0))
    o0 = r0 * DT + 64 * c
    q0 = r0 * D
    for g in range(ng):
        si = s0i + g * srs + 64 * c
        for v in range(4):
            a0 = z
            a1 = z
            a2 = z
            a3 = z
            kp = v * D * 16
            for d in range(g * G, g * G + G):
                x = vld_any(kst, kp + 16 * d, False)
                a0 = vfma(vbcast(qb, q0 + d), x, a0)
                a1 = vfma(vbcast(qb, q0 + D + d), x, a1)
                a2 = vfma(vbcast(qb, q0 + 2 * D + d), x, a2)
                a3 = vfma(vbcast(qb, q0 + 3 * D + d), x, a3)
            if four:  # columns 32 (v >> 1) + 8 (v & 1) + l and 16 further; parameters de-interleaved
                s = _vdeint(scb, si + 16 * v)
                zv = _vdeint(zpb, si + 16 * v) if zs else z
                o = o0 + 32 * (v >> 1) + 8 * (v & 1)
                _sacc2(sc, o, s, zv, -qsum[r0 * ng + g], zs, a0)
                _sacc2(sc, o + DT, s, zv, -qsum[(r0 + 1) * ng + g], zs, a1)
                _sacc2(sc, o + 2 * DT, s, zv, -qsum[(r0 + 2) * ng + g], zs, a2)
                _sacc2(sc, o + 3 * DT, s, zv, -qsum[(r0 + 3) * ng + g], zs, a3)
            else:
                s = vload(scb, si + 16 * v)
                zv = vload(zpb, si + 16 * v) if zs else z
                o = o0 + 16 * v
                _sacc_at(sc, o, s, zv, -qsum[r0 * ng + g], zs, a0)
                _sacc_at(sc, o + DT, s, zv, -qsum[(r0 + 1) * ng + g], zs, a1)
                _sacc_at(sc, o + 2 * DT, s, zv, -qsum[(r0 + 2) * ng + g], zs, a2)
                _sacc_at(sc, o + 3 * DT, s, zv, -qsum[(r0 + 3) * ng + g], zs, a3)


@njit(inline="always", cache=True)
def _sacc2(sc, o, s, z, nq, zs, a):
    """:func:`_sacc_at` on the two halves of a staged int4 vector (columns o, o + 16)."""
    if zs:
        a = vfma(z, vsplat(nq), a)
    _vst2(sc, o, o + 16, vfma(s, a, _vld2(sc, o, o + 16)))


@njit(cache=True)
def _dscore1_v(kst, four, scb, s0i, srs, zpb, zs, G, D, qb, qsum, r0, sc, c):
    """:func:`_dscore1`, two vectors per pass (the AVX2 form; staged as in :func:`_dscore4_v`)."""
    ng = D // G
    z = vsplat(np.float32(0.0))
    for g in range(ng):
        si = s0i + g * srs + 64 * c
        for v in range(0, 4, 2):
            a0 = z
            a1 = z
            kp = v * D * 16
            for d in range(g * G, g * G + G):
                q = vbcast(qb, r0 * D + d)
                a0 = vfma(q, vld_any(kst, kp + 16 * d, False), a0)
                a1 = vfma(q, vld_any(kst, kp + 16 * (D + d), False), a1)
            nq = -qsum[r0 * ng + g]
            if four:  # vectors v, v + 1: columns 32 (v >> 1) + {0, 8} and 16 further
                o = r0 * DT + 64 * c + 32 * (v >> 1)
                _sacc2(sc, o, _vdeint(scb, si + 16 * v), _vdeint(zpb, si + 16 * v) if zs else z, nq, zs, a0)
                _sacc2(sc, o + 8, _vdeint(scb, si + 16 * v + 16), _vdeint(zpb, si + 16 * v + 16) if zs else z,
                       nq, zs, a1)
            else:
                o = r0 * DT + 64 * c + 16 * v
                _sacc_at(sc, o, vload(scb, si + 16 * v), vload(zpb, si + 16 * v) if zs else z, nq, zs, a0)
                _sacc_at(sc, o + 16, vload(scb, si + 16 * v + 16), vload(zpb, si + 16 * v + 16) if zs else z,
                         nq, zs, a1)


@njit(cache=True)
def _dpv4_v(vst, four, G, D, W, zc, acc, alpha, r0, h):
    """:func:`_dpv4` for head dims 64h..64h+63, one vector of 16 per pass (the AVX2 form),
    from the staged tile ``vst`` (:func:`_stage_v`: pass v, tile row t, 16 bytes,
    contiguous over t; row t holds position perm[t], positions >= nt hold row nt - 1
    with weight 0).  int4: the 16 nibbles of 8 bytes (low ones then high ones, staged
    times c with W divided by c), halves 16 accumulator columns apart, one group."""
    ng = D // G
    R = ng * DT
    for v in range(4):
        g = (64 * h + 32 * (v >> 1)) // G if four else (64 * h + 16 * v) // G
        o = r0 * D + 64 * h + (32 * (v >> 1) + 8 * (v & 1) if four else 16 * v)
        oh = o + 16 if four else o + 8  # the upper 8 lanes
        a0 = vsub(vmul(_vld2(acc, o, oh), vsplat(alpha[r0])), vsplat(zc[r0 * ng + g]))
        a1 = vsub(vmul(_vld2(acc, o + D, oh + D), vsplat(alpha[r0 + 1])), vsplat(zc[(r0 + 1) * ng + g]))
        a2 = vsub(vmul(_vld2(acc, o + 2 * D, oh + 2 * D), vsplat(alpha[r0 + 2])),
                  vsplat(zc[(r0 + 2) * ng + g]))
        a3 = vsub(vmul(_vld2(acc, o + 3 * D, oh + 3 * D), vsplat(alpha[r0 + 3])),
                  vsplat(zc[(r0 + 3) * ng + g]))
        wg = r0 * R + g * DT
        vp = v * DT * 16
        for t in range(DT):
            x = vld_any(vst, vp + 16 * t, False)
            wo = wg + t
            a0 = vfma(vbcast(W, wo), x, a0)
            a1 = vfma(vbcast(W, wo + R), x, a1)
            a2 = vfma(vbcast(W, wo + 2 * R), x, a2)
            a3 = vfma(vbcast(W, wo + 3 * R), x, a3)
        _vst2(acc, o, oh, a0)
        _vst2(acc, o + D, oh + D, a1)
        _vst2(acc, o + 2 * D, oh + 2 * D, a2)
        _vst2(acc, o + 3 * D, oh + 3 * D, a3)


@njit(cache=True)
def _dpv1_v(vst, four, G, D, W, zc, acc, alpha, r0, h):
    """:func:`_dpv1` for head dims 64h..64h+63, two vectors per pass (the AVX2 form;
    staged as in :func:`_dpv4_v`)."""
    ng = D // G
    for v in range(0, 4, 2):
        # int4: vectors v, v + 1 = bytes 16 (v >> 1) + {0, 8} of the chunk, one group
        ga = (64 * h + 32 * (v >> 1)) // G if four else (64 * h + 16 * v) // G
        gb = ga if four else (64 * h + 16 * v + 16) // G
        o = r0 * D + 64 * h + (32 * (v >> 1) if four else 16 * v)
        ob = o + 8 if four else o + 16
        al = vsplat(alpha[r0])
        a0 = vsub(vmul(_vld2(acc, o, o + 16) if four else vload(acc, o), al), vsplat(zc[r0 * ng + ga]))
        a1 = vsub(vmul(_vld2(acc, ob, ob + 16) if four else vload(acc, ob), al), vsplat(zc[r0 * ng + gb]))
        vp = v * DT * 16
        for t in range(DT):
            wa = vbcast(W, r0 * ng * DT + ga * DT + t)
            wb = vbcast(W, r0 * ng * DT + gb * DT + t)
            a0 = vfma(wa, vld_any(vst, vp + 16 * t, False), a0)
            a1 = vfma(wb, vld_any(vst, vp + 16 * (DT + t), False), a1)
        if four:
            _vst2(acc, o, o + 16, a0)
            _vst2(acc, ob, ob + 16, a1)
        else:
            vstore(acc, o, a0)
            vstore(acc, ob, a1)


@njit(inline="always", cache=True)
def _vgroups(four, G, d0):
    """Groups of the 4 vectors of V head dims d0..d0+63 (int4: even/odd d of a 32-d chunk)."""
    if four:
        return d0 // G, d0 // G, (d0 + 32) // G, (d0 + 32) // G
    return d0 // G, (d0 + 16) // G, (d0 + 32) // G, (d0 + 48) // G


@njit(inline="always", cache=True)
def _wfma(W, wo, ng, g0, g1, g2, g3, x0, x1, x2, x3, a0, a1, a2, a3):
    """a_v += W[g_v] * x_v (W[g] at W[wo + g * DT]) for one row."""
    return (vfma(vbcast(W, wo + g0 * DT), x0, a0), vfma(vbcast(W, wo + g1 * DT), x1, a1),
            vfma(vbcast(W, wo + g2 * DT), x2, a2), vfma(vbcast(W, wo + g3 * DT), x3, a3))


@njit(inline="always", cache=True)
def _acc_in(acc, o, al, zc, zo, g0, g1, g2, g3):
    """acc row vectors scaled by alpha, minus this tile's zero-point term (added back by
    the FMAs below: acc*alpha + sum W n - sum W z)."""
    l = vsplat(al)
    return (vsub(vmul(vload(acc, o), l), vsplat(zc[zo + g0])),
            vsub(vmul(vload(acc, o + 16), l), vsplat(zc[zo + g1])),
            vsub(vmul(vload(acc, o + 32), l), vsplat(zc[zo + g2])),
            vsub(vmul(vload(acc, o + 48), l), vsplat(zc[zo + g3])))


@njit(cache=True)
def _dpv4(vb, v0, sgn, G, D, perm, nt, W, zc, acc, alpha, r0):
    """acc[r0..r0+3, :] = acc * alpha + sum_t W[r, g, t] * n[pos t, :] - zc[r, g] over one
    tile, W = p * scale (one FMA per stored value and row: the scale is in W).

    ``v0``: element index of the tile's row 0.  acc is in the int4 chunk order (32 d per
    chunk: even d then odd d) for int4.
    """
    four = _isz(vb) == 2
    ng = D // G
    R = ng * DT
    for h in range(D // 64):
        g0, g1, g2, g3 = _vgroups(four, G, 64 * h)
        oa = r0 * D + 64 * h
        a00, a01, a02, a03 = _acc_in(acc, oa, alpha[r0], zc, r0 * ng, g0, g1, g2, g3)
        a10, a11, a12, a13 = _acc_in(acc, oa + D, alpha[r0 + 1], zc, (r0 + 1) * ng, g0, g1, g2, g3)
        a20, a21, a22, a23 = _acc_in(acc, oa + 2 * D, alpha[r0 + 2], zc, (r0 + 2) * ng, g0, g1, g2, g3)
        a30, a31, a32, a33 = _acc_in(acc, oa + 3 * D, alpha[r0 + 3], zc, (r0 + 3) * ng, g0, g1, g2, g3)
        for t in range(DT):
            s = perm[t]
            if s >= nt:
                continue
            e = v0 + s * D + 64 * h
            x0, x1, x2, x3 = _kvec4(vb, (e >> 1) if four else e, sgn)
            wo = r0 * R + t
            a00, a01, a02, a03 = _wfma(W, wo, ng, g0, g1, g2, g3, x0, x1, x2, x3, a00, a01, a02, a03)
            a10, a11, a12, a13 = _wfma(W, wo + R, ng, g0, g1, g2, g3, x0, x1, x2, x3, a10, a11, a12, a13)
            a20, a21, a22, a23 = _wfma(W, wo + 2 * R, ng, g0, g1, g2, g3, x0, x1, x2, x3, a20, a21, a22, a23)
            a30, a31, a32, a33 = _wfma(W, wo + 3 * R, ng, g0, g1, g2, g3, x0, x1, x2, x3, a30, a31, a32, a33)
        _vst4(acc, oa, a00, a01, a02, a03)
        _vst4(acc, oa + D, a10, a11, a12, a13)
        _vst4(acc, oa + 2 * D, a20, a21, a22, a23)
        _vst4(acc, oa + 3 * D, a30, a31, a32, a33)


@njit(inline="always", cache=True)
def _vst4(arr, o, a0, a1, a2, a3):
    vstore(arr, o, a0)
    vstore(arr, o + 16, a1)
    vstore(arr, o + 32, a2)
    vstore(arr, o + 48, a3)


@njit(cache=True)
def _dpv1(vb, v0, sgn, G, D, perm, nt, W, zc, acc, alpha, r0):
    """One-row form of :func:`_dpv4`."""
    four = _isz(vb) == 2
    ng = D // G
    for h in range(D // 64):
        g0, g1, g2, g3 = _vgroups(four, G, 64 * h)
        oa = r0 * D + 64 * h
        a0, a1, a2, a3 = _acc_in(acc, oa, alpha[r0], zc, r0 * ng, g0, g1, g2, g3)
        for t in range(DT):
            s = perm[t]
            if s >= nt:
                continue
            e = v0 + s * D + 64 * h
            x0, x1, x2, x3 = _kvec4(vb, (e >> 1) if four else e, sgn)
            a0, a1, a2, a3 = _wfma(W, r0 * ng * DT + t, ng, g0, g1, g2, g3, x0, x1, x2, x3,
                                   a0, a1, a2, a3)
        _vst4(acc, oa, a0, a1, a2, a3)


@njit(cache=True)
def _dweights(vsc, vzp, zs, vs0, ng, perm, nt, sc, nrow, svT, zvT, W, zc, cv):
    """W[r, g, t] = p[r, t] * sv[pos t, g] / cv and zc[r, g] = sum_t (p sv)[r, g, t] *
    zv[pos t, g] (zc only with zero points, zs = 1).  ``cv``: the power of two the staged
    V values carry (:func:`_stage4`; 1 unstaged): W / cv times cv * n is exactly W * n.
    Full tiles gather the scales without per-element tests (this transpose ran scalar at
    ~10% of the kernel's time)."""
    if nt == DT:  # stores contiguous (LLVM vectorised the other loop order with scatters)
        for g in range(ng):
            for t in range(DT):
                svT[g * DT + t] = _ld(vsc, vs0 + perm[t] * ng + g)
        if zs:
            for g in range(ng):
                for t in range(DT):
                    zvT[g * DT + t] = _ld(vzp, vs0 + perm[t] * ng + g)
    else:
        for g in range(ng):
            for t in range(DT):
                s = perm[t]
                i = vs0 + s * ng + g
                svT[g * DT + t] = vsc[i] if s < nt else np.float32(0.0)
                zvT[g * DT + t] = vzp[i * zs] if s < nt else np.float32(0.0)
    part = np.empty(16, np.float32)
    inv = vsplat(np.float32(1.0) / cv)
    for r in range(nrow):
        for g in range(ng):
            o = (r * ng + g) * DT
            if zs:
                zacc = vsplat(np.float32(0.0))
                for t in range(0, DT, 16):
                    zacc = vfma(vmul(vload(sc, r * DT + t), vload(svT, g * DT + t)), vload(zvT, g * DT + t), zacc)
                vstore(part, 0, zacc)
                z = np.float32(0.0)
                for j in range(16):
                    z += part[j]
                zc[r * ng + g] = z
            for t in range(0, DT, 16):
                vstore(W, o + t, vmul(vmul(vload(sc, r * DT + t), vload(svT, g * DT + t)), inv))


@intrinsic
def _fetch_add(typingctx, arr, i):
    """Atomically ``arr[i] += 1`` on an int64 array; the old value (sequentially consistent)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64):
        return None

    def codegen(context, builder, signature, args):
        p = _flat_ptr(context, builder, signature.args[0], args[0], args[1], signature.args[1])
        return builder.atomic_rmw("add", p, ir.IntType(64)(1), "seq_cst")

    return types.int64(arr, i), codegen


#: the forms :func:`_dec_items` runs: one f32x16 lookup per 16 nibbles and 16 live
#: accumulators with AVX-512; the one-vector passes on AVX2 (see above)
_DSCORE4, _DSCORE1, _DPV4, _DPV1 = ((_dscore4, _dscore1, _dpv4, _dpv1) if _HAS_AVX512
                                    else (_dscore4_v, _dscore1_v, _dpv4_v, _dpv1_v))
#: the AVX2 forms read staged tiles (:func:`_stage4`), the AVX-512 forms the stored bytes
_STAGED = not _HAS_AVX512


def stage_params(kind: str):
    """(sl, sr, msk, c) of :func:`_stage4` for a K/V storage kind: int4 staged as c * n."""
    if kind == "s4":
        return 4, 0, 0xF0F0, 16
    if kind == "u4":
        return 3, 1, 0x7878, 8
    return 0, 0, 0, 1


@njit(inline="always", cache=True)
def _stage_k(kst8, kb, b0, rsb, D, sl, sr, msk, c, pf):
    """Positions 64c..64c+63 of the K tile (D rows, row d at byte b0 + d * rsb of ``kb``)
    staged pass-major: pass v (16 positions), row d at byte (v * D + d) * 16 of ``kst8``.
    A chunk at a time: 8 KB of staged values that stay in L1 until the score step has
    read them (the whole tile, 16 KB, next to V's and the prefetched next tile, did not).
    ``pf`` > 0: prefetch the line ``pf`` bytes past each row's chunk (the next tile's),
    one row at a time between the stores rather than as a burst of D prefetches."""
    run = 32 if _isz(kb) == 2 else 64  # stored bytes per 4 passes
    for d in range(D):
        e = b0 + d * rsb + c * run
        _stage4(kst8, d * 16, D * 16, kb, e, sl, sr, msk)
        if pf:
            prefetch(kb, (e + pf) // _isz(kb))


@njit(inline="always", cache=True)
def _stage_v(vst8, vb, b0, perm, nt, D, sl, sr, msk, h, pf):
    """Head dims 64h..64h+63 of the V tile staged pass-major: row t = position
    min(perm[t], nt - 1) (row stride D values from byte b0 of ``vb``), pass v (16 head
    dims) at byte (v * DT + t) * 16 (8 KB, as :func:`_stage_k`).  ``pf``: prefetch the
    next tile's V (its lines spread over the rows of this one, as :func:`_stage_k`)."""
    four = _isz(vb) == 2
    run = 32 if four else 64
    rsb = D // 2 if four else D
    nl = DT * rsb // 64 // (D // 64)  # next-tile lines per call
    for t in range(DT):
        _stage4(vst8, t * 16, DT * 16, vb, b0 + min(perm[t], nt - 1) * rsb + h * run, sl, sr, msk)
        if pf and t < nl:
            prefetch(vb, (b0 + DT * rsb + (h * nl + t) * 64) // _isz(vb))


@njit(nogil=True, cache=True)
def _dec_items(ctr, qf, kb, ksc, kzp, kzs, vb, vsc, vzp, vzs, sgn, kG, vG, Hkv, S, scale,
               smul, mflat, mstr, has_mask, causal, nsplit, pm, pl, pacc, sdt, stp):
    """Work items (batch, KV head, KV split) of the compressed decode -> partial (m, l, acc)
    per row.  ``kb``/``vb``: int4 bytes as a uint16 view, or int8/uint8.  ``sdt``: an
    empty array of the staged tiles' dtype (int8, uint8 for u8); ``stp``: (sl, sr, msk,
    c) of :func:`_stage4` (:func:`stage_params`).

    Items are claimed one at a time from ``ctr`` = [next item, items finished, item
    count] (shared by the threads of one call, see :func:`threads.run_claimed`).  An item's
    results do not depend on the thread that ran it."""
    B, Hq, Sq, D = qf.shape
    four = _isz(kb) == 2
    rep = Hq // Hkv
    nrow = rep * Sq
    Rp = (nrow + 3) // 4 * 4
    n4 = nrow // 4 * 4
    coff = S - Sq if causal == 2 else 0
    s_end = S if causal == 0 else min(S, Sq + coff)
    per = (((S + nsplit - 1) // nsplit + DT - 1) // DT) * DT
    ngk = D // kG
    ngv = D // vG
    bpe = 2 if four else 1  # elements per byte
    kst_rs = DT // bpe  # staged K row: DT positions, in bytes
    kst = np.zeros(D * kst_rs // _isz(kb), kb.dtype)
    sst = np.zeros(ngk * DT, np.float32)
    zst = np.zeros(ngk * DT, np.float32)
    perm = np.empty(DT, np.int64)
    for t in range(DT):
        c, v, j = t // 64, (t % 64) // 16, t % 16
        perm[t] = 64 * c + (2 * (16 * (v >> 1) + j) + (v & 1) if four else 16 * v + j)
    qb = np.zeros(Rp * D, np.float32)
    qsum = np.zeros(Rp * ngk, np.float32)
    sc = np.empty(Rp * DT, np.float32)
    acc = np.zeros(Rp * D, np.float32)
    m = np.empty(Rp, np.float32)
    lv = np.zeros(Rp * 16, np.float32)
    alpha = np.ones(Rp, np.float32)
    part = np.empty(16, np.float32)
    svT = np.empty(ngv * DT, np.float32)
    zvT = np.empty(ngv * DT, np.float32)
    W = np.empty(Rp * ngv * DT, np.float32)
    zc = np.zeros(Rp * ngv, np.float32)
    scv = vsplat(scale)
    sl, sr, msk = stp[0], stp[1], stp[2]
    cst = np.float32(stp[3]) if _STAGED else np.float32(1.0)  # staged values are cst * n
    kst8 = np.zeros(D * 64 if _STAGED else 16, sdt.dtype)  # one chunk of 64 positions
    vst8 = np.zeros(DT * 64 if _STAGED else 16, sdt.dtype)  # 64 head dims
    nitems = ctr[2]
    while True:
        it = _fetch_add(ctr, 0)
        if it >= nitems:
            break
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
                qb[rr * D + d] = qrow[d] / cst  # exact (a power of two): (q / c) (c n) = q n
                qsum[rr * ngk + d // kG] += qrow[d]
        acc[:] = 0.0
        lv[:] = 0.0
        m[:] = NEG_INF
        for s0 in range(sa, sb, DT):
            nt = min(DT, sb - s0)
            if nt == DT:
                # the tile's D rows of K, S / bpe bytes apart in the cache, copied to kst
                # first: at power-of-two S the rows share few L1 sets (S = 4096 int4:
                # every row in 2 sets of 8 ways), and the score passes re-read each row
                # 4 times -- from L2 without the copy (s8: 20% of the score step); staged
                # (AVX2): :func:`_stage_k` reads the rows once into its pass-major tile
                kbuf, k0, rs = kst, 0, kst_rs
                src0 = (kbase + s0) // bpe
                if not _STAGED:
                    for d in range(D):
                        for j in range(0, kst_rs, 64):
                            _copy64(kst, d * kst_rs + j, kb, src0 + d * (S // bpe) + j)
                scb, zpb, s0i, srs, zs = ksc, kzp, ksbase + s0, S, kzs
                if not _STAGED and s0 + DT < sb:  # the next tile's K lines (staged: by _stage_k)
                    k1 = (kbase + s0) // bpe + kst_rs
                    for d in range(D):
                        prefetch(kb, (k1 + d * (S // bpe)) // _isz(kb))
                        if not four:
                            prefetch(kb, k1 + d * (S // bpe) + 64)
            else:  # tail tile, staged zero-padded so that the vector loads stay in bounds
                kbuf, k0, rs = kst, 0, kst_rs
                scb, zpb, s0i, srs, zs = sst, zst, 0, DT, 1
                isz = _isz(kb)
                nel = (nt + isz * bpe - 1) // (isz * bpe)  # buffer elements holding nt values
                src0 = (kbase + s0) // (bpe * isz)
                for d in range(D):
                    for j in range(kst_rs // isz):
                        kst[d * (kst_rs // isz) + j] = kb[src0 + d * (S // (bpe * isz)) + j] \
                            if j < nel else 0
                for g in range(ngk):
                    for t in range(DT):
                        sst[g * DT + t] = ksc[ksbase + g * S + s0 + t] if t < nt else np.float32(0.0)
                        zst[g * DT + t] = kzp[(ksbase + g * S + s0 + t) * kzs] if t < nt \
                            else np.float32(0.0)
            sc[:] = 0.0
            if _STAGED:
                for c in range(DT // 64):
                    _stage_k(kst8, kb if nt == DT else kst, (kbase + s0) // bpe if nt == DT else 0,
                             S // bpe if nt == DT else kst_rs, D, sl, sr, msk, c,
                             kst_rs if nt == DT and s0 + DT < sb and (c == 0 or not four) else 0)
                    for r0 in range(0, n4, 4):
                        _dscore4_v(kst8, four, scb, s0i, srs, zpb, zs, kG, D, qb, qsum, r0, sc, c)
                    for r0 in range(n4, nrow):
                        _dscore1_v(kst8, four, scb, s0i, srs, zpb, zs, kG, D, qb, qsum, r0, sc, c)
            else:
                for c in range(DT // 64):
                    for r0 in range(0, n4, 4):
                        _dscore4(kbuf, k0, rs, sgn, scb, s0i, srs, zpb, zs, kG, D, qb, qsum, r0, sc, c)
                    for r0 in range(n4, nrow):
                        _dscore1(kbuf, k0, rs, sgn, scb, s0i, srs, zpb, zs, kG, D, qb, qsum, r0, sc, c)
            if nt == DT and s0 + DT < sb:
                # the next tile's K scales (ng rows S apart: no hardware prefetcher stream),
                # V rows and V scales, issued here rather than with its K lines: one burst
                # of ~300 prefetches left the later ones unserved (the score and V staging
                # steps then waited on L3 / DRAM, ~1 us of a ~8 us tile at L = 4096)
                for g in range(ngk):
                    for t in range(0, DT, 16):
                        prefetch(ksc, ksbase + g * S + s0 + DT + t)
                        if kzs:
                            prefetch(kzp, ksbase + g * S + s0 + DT + t)
                if not _STAGED:  # (staged: by _stage_v)
                    nxt = (vbase + (s0 + DT) * D) // bpe
                    for e in range(nxt, nxt + DT * D // bpe, 64):
                        prefetch(vb, e // _isz(vb))
                for e in range(vsbase + (s0 + DT) * ngv, vsbase + (s0 + 2 * DT) * ngv, 16):
                    prefetch(vsc, e)
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
                _online_softmax_row(sc, o, DT, rr, m, alpha, lv, part)
            _dweights(vsc, vzp, vzs, vsbase + s0 * ngv, ngv, perm, nt, sc, nrow, svT, zvT, W, zc, cst)
            if _STAGED:
                for h in range(D // 64):
                    _stage_v(vst8, vb, (vbase + s0 * D) // bpe, perm, nt, D, sl, sr, msk, h,
                             nt == DT and s0 + DT < sb)
                    for r0 in range(0, n4, 4):
                        _dpv4_v(vst8, four, vG, D, W, zc, acc, alpha, r0, h)
                    for r0 in range(n4, nrow):
                        _dpv1_v(vst8, four, vG, D, W, zc, acc, alpha, r0, h)
            else:
                for r0 in range(0, n4, 4):
                    _dpv4(vb, vbase + s0 * D, sgn, vG, D, perm, nt, W, zc, acc, alpha, r0)
                for r0 in range(n4, nrow):
                    _dpv1(vb, vbase + s0 * D, sgn, vG, D, perm, nt, W, zc, acc, alpha, r0)
        for rr in range(nrow):
            pm[it, rr] = m[rr]
            ls = np.float32(0.0)
            for j in range(16):
                ls += lv[rr * 16 + j]
            pl[it, rr] = ls
            for d in range(D):  # int4: acc in chunk order (32 d: even d, then odd d) -> d order
                pacc[it, rr, d] = acc[rr * D + ((d & ~31) + 16 * (d & 1) + ((d & 31) >> 1) if four else d)]
        _fetch_add(ctr, 1)  # after the item's stores (sequentially consistent)


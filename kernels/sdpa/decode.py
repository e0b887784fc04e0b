"""The int4/int8 compressed SDPA decode: scales folded into the products, no f32
tile (see the comment below); the work item :func:`decode_items` runs the AVX-512
steps (:mod:`.decode_avx512`) or the AVX2 ones on staged tiles (:mod:`.decode_avx2`),
whichever the compile target has."""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (numba: configured first)

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from graph_api.kernels.bf16dot import itemsize_of
from graph_api.kernels.bits import _flat_ptr, prefetch, vfma, vload, vmul, vsplat, vstore
from graph_api.kernels.sdpa.decode_avx2 import (pv_1row_staged, pv_4rows_staged, scores_1row_staged,
                                                scores_4rows_staged, stage_k, stage_v)
from graph_api.kernels.sdpa.decode_avx512 import HAS_AVX512, pv_1row, pv_4rows, scores_1row, scores_4rows
from graph_api.kernels.sdpa.online_softmax import online_softmax_row
from graph_api.kernels.sdpa.operands import DT, NEG_INF


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
# storage dtype -- int4 data arrive as a uint16 view, so ``kb``'s item size (:func:`itemsize_of`) tells
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


@intrinsic
def _load_unchecked(typingctx, arr, idx):
    """float32 ``arr.flat[idx]`` without negative-index wraparound (see :func:`graph_api.kernels.bits.vbcast`)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], signature.args[1], types.intp)
        return builder.load(builder.gep(ary.data, [i]), align=4)

    return types.float32(arr, idx), codegen


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


@njit(cache=True)
def _pv_weights(vsc, vzp, zs, vs0, ng, perm, nt, sc, nrow, svT, zvT, W, zc, cv):
    """W[r, g, t] = p[r, t] * sv[pos t, g] / cv and zc[r, g] = sum_t (p sv)[r, g, t] *
    zv[pos t, g] (zc only with zero points, zs = 1).  ``cv``: the power of two the staged
    V values carry (:func:`_stage4`; 1 unstaged): W / cv times cv * n is exactly W * n.
    Full tiles gather the scales without per-element tests (this transpose ran scalar at
    ~10% of the kernel's time)."""
    if nt == DT:  # stores contiguous (LLVM vectorised the other loop order with scatters)
        for g in range(ng):
            for t in range(DT):
                svT[g * DT + t] = _load_unchecked(vsc, vs0 + perm[t] * ng + g)
        if zs:
            for g in range(ng):
                for t in range(DT):
                    zvT[g * DT + t] = _load_unchecked(vzp, vs0 + perm[t] * ng + g)
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


#: the forms :func:`decode_items` runs: with AVX-512 one f32x16 lookup per 16 nibbles and
#: 16 live accumulators, reading the stored bytes (:mod:`.decode_avx512`); on AVX2 the
#: one-vector passes over staged tiles (:mod:`.decode_avx2`, :func:`stage_k`/:func:`stage_v`)
_STAGED = not HAS_AVX512


@njit(nogil=True, cache=True)
def decode_items(ctr, qf, kb, ksc, kzp, kzs, vb, vsc, vzp, vzs, sgn, kG, vG, Hkv, S, scale,
               smul, mflat, mstr, has_mask, causal, nsplit, pm, pl, pacc, sdt, stp):
    """Work items (batch, KV head, KV split) of the compressed decode -> partial (m, l, acc)
    per row.  ``kb``/``vb``: int4 bytes as a uint16 view, or int8/uint8.  ``sdt``: an
    empty array of the staged tiles' dtype (int8, uint8 for u8); ``stp``: (sl, sr, msk,
    c) of :func:`_stage4` (:func:`stage_params`).

    Items are claimed one at a time from ``ctr`` = [next item, items finished, item
    count] (shared by the threads of one call, see :func:`threads.run_claimed`).  An item's
    results do not depend on the thread that ran it."""
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
    bpe = 2 if four else 1  # elements per byte
    kst_rs = DT // bpe  # staged K row: DT positions, in bytes
    kst = np.zeros(D * kst_rs // itemsize_of(kb), kb.dtype)
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
                # (AVX2): :func:`stage_k` reads the rows once into its pass-major tile
                kbuf, k0, rs = kst, 0, kst_rs
                src0 = (kbase + s0) // bpe
                if not _STAGED:
                    for d in range(D):
                        for j in range(0, kst_rs, 64):
                            _copy64(kst, d * kst_rs + j, kb, src0 + d * (S // bpe) + j)
                scb, zpb, s0i, srs, zs = ksc, kzp, ksbase + s0, S, kzs
                if not _STAGED and s0 + DT < sb:  # the next tile's K lines (staged: by stage_k)
                    k1 = (kbase + s0) // bpe + kst_rs
                    for d in range(D):
                        prefetch(kb, (k1 + d * (S // bpe)) // itemsize_of(kb))
                        if not four:
                            prefetch(kb, k1 + d * (S // bpe) + 64)
            else:  # tail tile, staged zero-padded so that the vector loads stay in bounds
                kbuf, k0, rs = kst, 0, kst_rs
                scb, zpb, s0i, srs, zs = sst, zst, 0, DT, 1
                isz = itemsize_of(kb)
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
                    stage_k(kst8, kb if nt == DT else kst, (kbase + s0) // bpe if nt == DT else 0,
                             S // bpe if nt == DT else kst_rs, D, sl, sr, msk, c,
                             kst_rs if nt == DT and s0 + DT < sb and (c == 0 or not four) else 0)
                    for r0 in range(0, n4, 4):
                        scores_4rows_staged(kst8, four, scb, s0i, srs, zpb, zs, kG, D, qb, qsum, r0, sc, c)
                    for r0 in range(n4, nrow):
                        scores_1row_staged(kst8, four, scb, s0i, srs, zpb, zs, kG, D, qb, qsum, r0, sc, c)
            else:
                for c in range(DT // 64):
                    for r0 in range(0, n4, 4):
                        scores_4rows(kbuf, k0, rs, sgn, scb, s0i, srs, zpb, zs, kG, D, qb, qsum, r0, sc, c)
                    for r0 in range(n4, nrow):
                        scores_1row(kbuf, k0, rs, sgn, scb, s0i, srs, zpb, zs, kG, D, qb, qsum, r0, sc, c)
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
                if not _STAGED:  # (staged: by stage_v)
                    nxt = (vbase + (s0 + DT) * D) // bpe
                    for e in range(nxt, nxt + DT * D // bpe, 64):
                        prefetch(vb, e // itemsize_of(vb))
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
                online_softmax_row(sc, o, DT, rr, m, alpha, lv, part)
            _pv_weights(vsc, vzp, vzs, vsbase + s0 * ngv, ngv, perm, nt, sc, nrow, svT, zvT, W, zc, cst)
            if _STAGED:
                for h in range(D // 64):
                    stage_v(vst8, vb, (vbase + s0 * D) // bpe, perm, nt, D, sl, sr, msk, h,
                             nt == DT and s0 + DT < sb)
                    for r0 in range(0, n4, 4):
                        pv_4rows_staged(vst8, four, vG, D, W, zc, acc, alpha, r0, h)
                    for r0 in range(n4, nrow):
                        pv_1row_staged(vst8, four, vG, D, W, zc, acc, alpha, r0, h)
            else:
                for r0 in range(0, n4, 4):
                    pv_4rows(vb, vbase + s0 * D, sgn, vG, D, perm, nt, W, zc, acc, alpha, r0)
                for r0 in range(n4, nrow):
                    pv_1row(vb, vbase + s0 * D, sgn, vG, D, perm, nt, W, zc, acc, alpha, r0)
        for rr in range(nrow):
            pm[it, rr] = m[rr]
            ls = np.float32(0.0)
            for j in range(16):
                ls += lv[rr * 16 + j]
            pl[it, rr] = ls
            for d in range(D):  # int4: acc in chunk order (32 d: even d, then odd d) -> d order
                pacc[it, rr, d] = acc[rr * D + ((d & ~31) + 16 * (d & 1) + ((d & 31) >> 1) if four else d)]
        _fetch_add(ctr, 1)  # after the item's stores (sequentially consistent)

"""The compressed decode's steps in their AVX2 form (:mod:`.decode`): K/V chunks
staged as 8-bit values (:func:`_stage4`), one vector of 16 per pass; the same
products in the same order as the AVX-512 form (:mod:`.decode_avx512`)."""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (numba: configured first)

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from graph_api.kernels.bf16dot import itemsize_of
from graph_api.kernels.bits import (_V16, _flat_ptr, f32x16, prefetch, vbcast, vfma, vld_any, vload, vmul, vsplat,
                                    vstore, vsub)
from graph_api.kernels.sdpa.operands import DT


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


def stage_params(kind: str):
    """(sl, sr, msk, c) of :func:`_stage4` for a K/V storage kind: int4 staged as c * n."""
    if kind == "s4":
        return 4, 0, 0xF0F0, 16
    if kind == "u4":
        return 3, 1, 0x7878, 8
    return 0, 0, 0, 1


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


@njit(inline="always", cache=True)
def stage_k(kst8, kb, b0, rsb, D, sl, sr, msk, c, pf):
    """Positions 64c..64c+63 of the K tile (D rows, row d at byte b0 + d * rsb of ``kb``)
    staged pass-major: pass v (16 positions), row d at byte (v * D + d) * 16 of ``kst8``.
    A chunk at a time: 8 KB of staged values that stay in L1 until the score step has
    read them (the whole tile, 16 KB, next to V's and the prefetched next tile, did not).
    ``pf`` > 0: prefetch the line ``pf`` bytes past each row's chunk (the next tile's),
    one row at a time between the stores rather than as a burst of D prefetches."""
    run = 32 if itemsize_of(kb) == 2 else 64  # stored bytes per 4 passes
    for d in range(D):
        e = b0 + d * rsb + c * run
        _stage4(kst8, d * 16, D * 16, kb, e, sl, sr, msk)
        if pf:
            prefetch(kb, (e + pf) // itemsize_of(kb))


@njit(inline="always", cache=True)
def stage_v(vst8, vb, b0, perm, nt, D, sl, sr, msk, h, pf):
    """Head dims 64h..64h+63 of the V tile staged pass-major: row t = position
    min(perm[t], nt - 1) (row stride D values from byte b0 of ``vb``), pass v (16 head
    dims) at byte (v * DT + t) * 16 (8 KB, as :func:`stage_k`).  ``pf``: prefetch the
    next tile's V (its lines spread over the rows of this one, as :func:`stage_k`)."""
    four = itemsize_of(vb) == 2
    run = 32 if four else 64
    rsb = D // 2 if four else D
    nl = DT * rsb // 64 // (D // 64)  # next-tile lines per call
    for t in range(DT):
        _stage4(vst8, t * 16, DT * 16, vb, b0 + min(perm[t], nt - 1) * rsb + h * run, sl, sr, msk)
        if pf and t < nl:
            prefetch(vb, (b0 + DT * rsb + (h * nl + t) * 64) // itemsize_of(vb))


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
def _add_group_scores(sc, o, s, z, nq, zs, a):
    """sc[o ..] += s * (a - z * Q_g) (nq = -Q_g; no zero-point term when zs = 0)."""
    if zs:
        a = vfma(z, vsplat(nq), a)
    vstore(sc, o, vfma(s, a, vload(sc, o)))


@njit(cache=True)
def scores_4rows_staged(kst, four, scb, s0i, srs, zpb, zs, G, D, qb, qsum, r0, sc, c):
    """:func:`scores_4rows`, one vector of 16 positions per pass (the AVX2 form), from the
    staged chunk c of the tile (``kst``, :func:`stage_k`: pass v, row d, 16 bytes,
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
                _add_group_scores_halves(sc, o, s, zv, -qsum[r0 * ng + g], zs, a0)
                _add_group_scores_halves(sc, o + DT, s, zv, -qsum[(r0 + 1) * ng + g], zs, a1)
                _add_group_scores_halves(sc, o + 2 * DT, s, zv, -qsum[(r0 + 2) * ng + g], zs, a2)
                _add_group_scores_halves(sc, o + 3 * DT, s, zv, -qsum[(r0 + 3) * ng + g], zs, a3)
            else:
                s = vload(scb, si + 16 * v)
                zv = vload(zpb, si + 16 * v) if zs else z
                o = o0 + 16 * v
                _add_group_scores(sc, o, s, zv, -qsum[r0 * ng + g], zs, a0)
                _add_group_scores(sc, o + DT, s, zv, -qsum[(r0 + 1) * ng + g], zs, a1)
                _add_group_scores(sc, o + 2 * DT, s, zv, -qsum[(r0 + 2) * ng + g], zs, a2)
                _add_group_scores(sc, o + 3 * DT, s, zv, -qsum[(r0 + 3) * ng + g], zs, a3)


@njit(inline="always", cache=True)
def _add_group_scores_halves(sc, o, s, z, nq, zs, a):
    """:func:`_add_group_scores` on the two halves of a staged int4 vector (columns o, o + 16)."""
    if zs:
        a = vfma(z, vsplat(nq), a)
    _vst2(sc, o, o + 16, vfma(s, a, _vld2(sc, o, o + 16)))


@njit(cache=True)
def scores_1row_staged(kst, four, scb, s0i, srs, zpb, zs, G, D, qb, qsum, r0, sc, c):
    """:func:`scores_1row`, two vectors per pass (the AVX2 form; staged as in :func:`scores_4rows_staged`)."""
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
                _add_group_scores_halves(sc, o, _vdeint(scb, si + 16 * v), _vdeint(zpb, si + 16 * v) if zs else z, nq, zs, a0)
                _add_group_scores_halves(sc, o + 8, _vdeint(scb, si + 16 * v + 16), _vdeint(zpb, si + 16 * v + 16) if zs else z,
                       nq, zs, a1)
            else:
                o = r0 * DT + 64 * c + 16 * v
                _add_group_scores(sc, o, vload(scb, si + 16 * v), vload(zpb, si + 16 * v) if zs else z, nq, zs, a0)
                _add_group_scores(sc, o + 16, vload(scb, si + 16 * v + 16), vload(zpb, si + 16 * v + 16) if zs else z,
                         nq, zs, a1)


@njit(cache=True)
def pv_4rows_staged(vst, four, G, D, W, zc, acc, alpha, r0, h):
    """:func:`pv_4rows` for head dims 64h..64h+63, one vector of 16 per pass (the AVX2 form),
    from the staged tile ``vst`` (:func:`stage_v`: pass v, tile row t, 16 bytes,
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
def pv_1row_staged(vst, four, G, D, W, zc, acc, alpha, r0, h):
    """:func:`pv_1row` for head dims 64h..64h+63, two vectors per pass (the AVX2 form;
    staged as in :func:`pv_4rows_staged`)."""
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

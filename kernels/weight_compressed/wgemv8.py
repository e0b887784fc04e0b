"""int8 decode GEMV (M <= 8) on the blocked prepared layout, partial sums in registers.

Layout (made by ``wmatmul.prepare``): blocks of 128 columns, block ``b`` one
contiguous stream of ``K`` rows of 128 signed bytes, ``[nblk, K, 128]`` int8;
u8 weights are stored as ``q - 128`` with zero point ``z - 128`` (``q - z``
unchanged, exactly), so one signed signature serves s8 and u8.  Scales and
zero points ``[nblk, K/G, 128]`` f32 as in :mod:`graph_api.kernels.weight_compressed.wgemv4`,
and the same formula and order: per group ``p = sum_k x[k] * q[k]`` by
sequential FMAs, then ``acc = fma(s, p - z * xs, acc)``; error bound
``(G + K/G + 3) * 2**-24 * sum_k |x_k| (|q| + |z|) |s|``.

Per 16 weights and activation row: one sign-extending load, one int-to-float
convert and one FMA (broadcast ``x[k]``); eight partial sums (M = 1) or two
rows x eight (M > 1, converted once per row pair) stay in registers.
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (configures numba first)

import numpy as np
from numba import njit, prange

from graph_api.kernels.bits import prefetch, vcvt8, vfma, vload, vmul, vsplat, vbcast, vstore, vsub
from graph_api.kernels.weight_compressed.lut4 import HAS_VPERMPS
from graph_api.kernels.weight_compressed.wgemv4 import _scale4

COLS = 128
_PF = 4096  #: software prefetch distance in bytes of the block stream (32 rows)


@njit(cache=True)
def _blk_m1(xf, xs, w, wo, sc, zf, so, zmode, G, g0, g1, part, s, blk):
    """One block, groups g0..g1, M == 1: 8 partial sums and 8 accumulators in registers."""
    zero = vsplat(np.float32(0.0))
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = zero
    last = w.shape[0] - 64
    for g in range(g0, g1):
        p0 = p1 = p2 = p3 = p4 = p5 = p6 = p7 = zero
        r = wo + g * G * COLS
        for k in range(g * G, g * G + G):
            prefetch(w, min(r + _PF, last))
            prefetch(w, min(r + _PF + 64, last))
            xv = vsplat(xf[0, k])
            p0 = vfma(xv, vcvt8(w, r), p0)
            p1 = vfma(xv, vcvt8(w, r + 16), p1)
            p2 = vfma(xv, vcvt8(w, r + 32), p2)
            p3 = vfma(xv, vcvt8(w, r + 48), p3)
            p4 = vfma(xv, vcvt8(w, r + 64), p4)
            p5 = vfma(xv, vcvt8(w, r + 80), p5)
            p6 = vfma(xv, vcvt8(w, r + 96), p6)
            p7 = vfma(xv, vcvt8(w, r + 112), p7)
            r += COLS
        o = so + g * COLS
        if zmode == 1:
            xsv = vsplat(xs[0, g])
            p0 = vsub(p0, vmul(vload(zf, o), xsv))
            p1 = vsub(p1, vmul(vload(zf, o + 16), xsv))
            p2 = vsub(p2, vmul(vload(zf, o + 32), xsv))
            p3 = vsub(p3, vmul(vload(zf, o + 48), xsv))
            p4 = vsub(p4, vmul(vload(zf, o + 64), xsv))
            p5 = vsub(p5, vmul(vload(zf, o + 80), xsv))
            p6 = vsub(p6, vmul(vload(zf, o + 96), xsv))
            p7 = vsub(p7, vmul(vload(zf, o + 112), xsv))
        a0 = vfma(vload(sc, o), p0, a0)
        a1 = vfma(vload(sc, o + 16), p1, a1)
        a2 = vfma(vload(sc, o + 32), p2, a2)
        a3 = vfma(vload(sc, o + 48), p3, a3)
        a4 = vfma(vload(sc, o + 64), p4, a4)
        a5 = vfma(vload(sc, o + 80), p5, a5)
        a6 = vfma(vload(sc, o + 96), p6, a6)
        a7 = vfma(vload(sc, o + 112), p7, a7)
    d = s * part.shape[2] + blk * COLS  # part[s, 0, blk*128 ...] (M == 1)
    vstore(part, d, a0)
    vstore(part, d + 16, a1)
    vstore(part, d + 32, a2)
    vstore(part, d + 48, a3)
    vstore(part, d + 64, a4)
    vstore(part, d + 80, a5)
    vstore(part, d + 96, a6)
    vstore(part, d + 112, a7)


@njit(cache=True)
def _blk_rows(xf, xs, w, wo, sc, zf, so, zmode, G, g0, g1, part, s, blk):
    """One block for 1 < M <= 8: row pairs (a missing second row repeats the
    first and is not stored), 2 x 8 partial sums in registers; the scaled
    accumulators live in L1, updated once per group."""
    M = xf.shape[0]
    zero = vsplat(np.float32(0.0))
    acc = np.zeros(M * COLS, np.float32)
    last = w.shape[0] - 64
    for g in range(g0, g1):
        o = so + g * COLS
        for m0 in range(0, M, 2):
            i1 = min(m0 + 1, M - 1)
            p0 = p1 = p2 = p3 = p4 = p5 = p6 = p7 = zero
            q0 = q1 = q2 = q3 = q4 = q5 = q6 = q7 = zero
            r = wo + g * G * COLS
            for k in range(g * G, g * G + G):
                prefetch(w, min(r + _PF, last))
                prefetch(w, min(r + _PF + 64, last))
                x0 = vsplat(xf[m0, k])
                x1 = vsplat(xf[i1, k])
                u = vcvt8(w, r)
                p0 = vfma(x0, u, p0)
                q0 = vfma(x1, u, q0)
                u = vcvt8(w, r + 16)
                p1 = vfma(x0, u, p1)
                q1 = vfma(x1, u, q1)
                u = vcvt8(w, r + 32)
                p2 = vfma(x0, u, p2)
                q2 = vfma(x1, u, q2)
                u = vcvt8(w, r + 48)
                p3 = vfma(x0, u, p3)
                q3 = vfma(x1, u, q3)
                u = vcvt8(w, r + 64)
                p4 = vfma(x0, u, p4)
                q4 = vfma(x1, u, q4)
                u = vcvt8(w, r + 80)
                p5 = vfma(x0, u, p5)
                q5 = vfma(x1, u, q5)
                u = vcvt8(w, r + 96)
                p6 = vfma(x0, u, p6)
                q6 = vfma(x1, u, q6)
                u = vcvt8(w, r + 112)
                p7 = vfma(x0, u, p7)
                q7 = vfma(x1, u, q7)
                r += COLS
            _scale4(acc, m0, np.int64(0), p0, p1, p2, p3, sc, zf, o, zmode, xs, g)
            _scale4(acc, m0, np.int64(64), p4, p5, p6, p7, sc, zf, o, zmode, xs, g)
            if m0 + 1 < M:
                _scale4(acc, m0 + 1, np.int64(0), q0, q1, q2, q3, sc, zf, o, zmode, xs, g)
                _scale4(acc, m0 + 1, np.int64(64), q4, q5, q6, q7, sc, zf, o, zmode, xs, g)
    for m in range(M):
        for j in range(COLS):
            part[s, m, blk * COLS + j] = acc[m * COLS + j]


# ---- the AVX2 forms (no AVX-512: 16 registers of 8 floats).  The forms above keep 16
# f32x16 values live (32 AVX2 registers) and spill on every row; these keep 4 partial
# sums per pass (64 columns for M = 1, 4 rows x 16 columns otherwise), the group's rows
# re-read from L1, the accumulators in memory.  Same products, same order: identical
# results (tested against the forms above on every target).


@njit(inline="always", cache=True)
def _step(p, s, z, xsv, zmode, a):
    """fma(s, p - z * xs, a), or fma(s, p, a) without zero points: one vector of the
    per-group step of the AVX2 forms.  Vectors only (the caller loads): an inlined helper
    taking the arrays left Numba's reference-count updates (atomics on counts the threads
    share) in the group loop, and a called one added a call with them per
    16 columns."""
    if zmode == 1:
        p = vsub(p, vmul(z, xsv))
    return vfma(s, p, a)


@njit(cache=True)
def _blk_m1_v(xf, xs, w, wo, sc, zf, so, zmode, G, g0, g1, part, s, blk):
    """:func:`_blk_m1`, 64 columns per pass."""
    zero = vsplat(np.float32(0.0))
    last = w.shape[0] - 64
    d = s * part.shape[2] + blk * COLS
    for j in range(0, COLS, 16):
        vstore(part, d + j, zero)
    for g in range(g0, g1):
        o = so + g * COLS
        for c in range(0, COLS, 64):
            p0 = p1 = p2 = p3 = zero
            r = wo + g * G * COLS + c
            for k in range(g * G, g * G + G):
                if c == 0:
                    prefetch(w, min(r + _PF, last))
                    prefetch(w, min(r + _PF + 64, last))
                xv = vbcast(xf, k)
                p0 = vfma(xv, vcvt8(w, r), p0)
                p1 = vfma(xv, vcvt8(w, r + 16), p1)
                p2 = vfma(xv, vcvt8(w, r + 32), p2)
                p3 = vfma(xv, vcvt8(w, r + 48), p3)
                r += COLS
            xsv = vsplat(xs[0, g])
            b = d + c
            oc = o + c
            vstore(part, b, _step(p0, vload(sc, oc), vload(zf, oc) if zmode == 1 else zero, xsv, zmode,
                                  vload(part, b)))
            vstore(part, b + 16, _step(p1, vload(sc, oc + 16), vload(zf, oc + 16) if zmode == 1 else zero, xsv,
                                       zmode, vload(part, b + 16)))
            vstore(part, b + 32, _step(p2, vload(sc, oc + 32), vload(zf, oc + 32) if zmode == 1 else zero, xsv,
                                       zmode, vload(part, b + 32)))
            vstore(part, b + 48, _step(p3, vload(sc, oc + 48), vload(zf, oc + 48) if zmode == 1 else zero, xsv,
                                       zmode, vload(part, b + 48)))


@njit(cache=True)
def _blk_rows_v(xf, xs, w, wo, sc, zf, so, zmode, G, g0, g1, part, s, blk):
    """:func:`_blk_rows` in tiles of 4 rows x 16 columns while 3 or more rows are left
    (a missing fourth row repeats the last and is not stored; one convert for 4 FMAs),
    then 2 rows x 32 columns."""
    M, K = xf.shape
    zero = vsplat(np.float32(0.0))
    acc = np.zeros(M * COLS, np.float32)
    last = w.shape[0] - 64
    for g in range(g0, g1):
        o = so + g * COLS
        for m0 in range(0, M - 2, 4):  # tiles of 4 rows while 3 or more are left
            x0 = m0 * K
            x1 = min(m0 + 1, M - 1) * K
            x2 = min(m0 + 2, M - 1) * K
            x3 = min(m0 + 3, M - 1) * K
            for c in range(0, COLS, 16):
                p0 = p1 = p2 = p3 = zero
                r = wo + g * G * COLS + c
                for k in range(g * G, g * G + G):
                    if c == 0 and m0 == 0:
                        prefetch(w, min(r + _PF, last))
                        prefetch(w, min(r + _PF + 64, last))
                    u = vcvt8(w, r)
                    p0 = vfma(vbcast(xf, x0 + k), u, p0)
                    p1 = vfma(vbcast(xf, x1 + k), u, p1)
                    p2 = vfma(vbcast(xf, x2 + k), u, p2)
                    p3 = vfma(vbcast(xf, x3 + k), u, p3)
                    r += COLS
                sv = vload(sc, o + c)  # the group's scales and zero points: the same for every row
                zv = vload(zf, o + c) if zmode == 1 else zero
                e = m0 * COLS + c
                vstore(acc, e, _step(p0, sv, zv, vsplat(xs[m0, g]), zmode, vload(acc, e)))
                if m0 + 1 < M:
                    e += COLS
                    vstore(acc, e, _step(p1, sv, zv, vsplat(xs[m0 + 1, g]), zmode, vload(acc, e)))
                if m0 + 2 < M:
                    e += COLS
                    vstore(acc, e, _step(p2, sv, zv, vsplat(xs[m0 + 2, g]), zmode, vload(acc, e)))
                if m0 + 3 < M:
                    e += COLS
                    vstore(acc, e, _step(p3, sv, zv, vsplat(xs[m0 + 3, g]), zmode, vload(acc, e)))
        m0 = (M + 1) // 4 * 4  # the rows after the 4-row tiles (1 or 2 of them, if any)
        if m0 < M:  # 2 rows x 32 columns
            x0 = m0 * K
            x1 = min(m0 + 1, M - 1) * K
            for c in range(0, COLS, 32):
                p0 = p1 = q0 = q1 = zero
                r = wo + g * G * COLS + c
                for k in range(g * G, g * G + G):
                    if c == 0 and M < 3:
                        prefetch(w, min(r + _PF, last))
                        prefetch(w, min(r + _PF + 64, last))
                    u0 = vcvt8(w, r)
                    u1 = vcvt8(w, r + 16)
                    v0 = vbcast(xf, x0 + k)
                    v1 = vbcast(xf, x1 + k)
                    p0 = vfma(v0, u0, p0)
                    p1 = vfma(v0, u1, p1)
                    q0 = vfma(v1, u0, q0)
                    q1 = vfma(v1, u1, q1)
                    r += COLS
                s0 = vload(sc, o + c)
                s1 = vload(sc, o + c + 16)
                z0 = vload(zf, o + c) if zmode == 1 else zero
                z1 = vload(zf, o + c + 16) if zmode == 1 else zero
                xa = vsplat(xs[m0, g])
                e = m0 * COLS + c
                vstore(acc, e, _step(p0, s0, z0, xa, zmode, vload(acc, e)))
                vstore(acc, e + 16, _step(p1, s1, z1, xa, zmode, vload(acc, e + 16)))
                if m0 + 1 < M:
                    xb = vsplat(xs[m0 + 1, g])
                    e += COLS
                    vstore(acc, e, _step(q0, s0, z0, xb, zmode, vload(acc, e)))
                    vstore(acc, e + 16, _step(q1, s1, z1, xb, zmode, vload(acc, e + 16)))
    for m in range(M):
        for j in range(COLS):
            part[s, m, blk * COLS + j] = acc[m * COLS + j]


#: the block kernels :func:`gemv` runs (AVX-512: the 16-register forms; else the AVX2 ones)
_M1, _ROWS = (_blk_m1, _blk_rows) if HAS_VPERMPS else (_blk_m1_v, _blk_rows_v)


@njit(parallel=True, cache=True)
def gemv(xf, xs, w, wbs, sc, zf, sbs, zmode, G, part):
    """int8 decode GEMV: part[S, M, nblk*128] raw sums; work item = (block, K split)."""
    S, M = part.shape[0], part.shape[1]
    nblk = part.shape[2] // COLS
    ng = xf.shape[1] // G
    gps = (ng + S - 1) // S
    for t in prange(nblk * S):
        blk = t // S
        s = t % S
        g0 = min(s * gps, ng)
        g1 = min((s + 1) * gps, ng)
        if M == 1:
            _M1(xf, xs, w, blk * wbs, sc, zf, blk * sbs, zmode, G, g0, g1, part, s, blk)
        else:
            _ROWS(xf, xs, w, blk * wbs, sc, zf, blk * sbs, zmode, G, g0, g1, part, s, blk)

"""int4 decode GEMV (M <= 8) and panel dequantization on the *interleaved* prepared layout.

Layout (made once per constant weight by :func:`pack_interleaved`): blocks of
``BLOCK_COLS = 128`` columns; block ``b`` is one contiguous stream of ``K``
rows of 64 bytes (16 little-endian dwords); nibble ``j`` (bits ``4j..4j+3``)
of dword ``l`` holds column ``128 b + 16 j + l``.  One 512-bit load per row
gives all 128 weights, and :func:`graph_api.kernels.lut4.vlut4` turns nibble
``j`` of the 16 dwords into the 16 consecutive columns ``16 j .. 16 j + 15``
(one shift and one ``vpermps``).  The nibbles are stored as given (s4 two's
complement, u4 unsigned); the lookup table gives the exact integer ``q``.
Scales (and zero points) are ``[nblk, K/G, 128]`` f32, one per column.

Formula (per output ``m, n``; groups ``g`` of ``G`` consecutive ``k``)::

    y[m, n] = sum_g s[g, n] * (sum_{k in g} x[m, k] * q[k, n]  -  z[g, n] * xs[m, g])

with ``xs[m, g] = sum_{k in g} x[m, k]`` (the zero-point term only with zero
points).  Strict IEEE f32: the inner sum is one FMA per weight, sequential
over ``k``, then ``acc = fma(s, p - z * xs, acc)`` per group in order; the
error bound is ``(G + K/G + 3) * 2**-24 * sum_k |x_k| (|q| + |z|) |s|``.

Cost per 128 weights and activation row (M = 1): one load, 7 shifts, 8
``vpermps``, 8 FMAs with an embedded broadcast of ``x[k]`` — 23 vector
operations, against ~30 for the byte-wise unpack with int-to-float converts.
The eight partial sums and eight accumulators of a block stay in registers
(``f32x16`` locals).  For 1 < M <= 8 the 128 weights of two rows are unpacked
once into registers and every activation row adds its FMAs into partial sums
kept in L1.
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (configures numba first)

import numpy as np
from numba import njit, prange

from graph_api.kernels.bits import prefetch, round_code, vfma, vload, vmul, vsplat, vstore, vsub
from graph_api.kernels.lut4 import TABLE_S4, TABLE_U4, vlut4

BLOCK_COLS = 128  #: columns per block (64 bytes per row: one cache line, one zmm load)
ROW_BYTES = 64
_PF = 2048  #: software prefetch distance in bytes of the block stream (32 rows)


def pack_interleaved(q, signed: bool):
    """Integer weights ``q [K, Np]`` (Np a multiple of 128, values in range) ->
    the flat uint8 interleaved stream ``[Np/128, K, 64]`` and the f32 lookup table."""
    K, Np = q.shape
    nblk = Np // BLOCK_COLS
    nib = (np.asarray(q).astype(np.int16) & 15).astype(np.uint32)  # two's complement nibble for s4
    # column 128 b + 16 j + l -> block b, dword l, nibble j
    t = nib.reshape(K, nblk, 8, 16)  # [k, b, j, l]
    words = np.zeros((nblk, K, 16), np.uint32)
    for j in range(8):
        words |= t[:, :, j, :].transpose(1, 0, 2) << np.uint32(4 * j)
    table = np.array(TABLE_S4 if signed else TABLE_U4, np.float32)
    return words.astype("<u4").view(np.uint8).reshape(-1), table


def block_params(K, G, nblk):
    """(weight stride per block, scale stride per block, scale stride per group)."""
    return K * ROW_BYTES, (K // G) * BLOCK_COLS, BLOCK_COLS


@njit(cache=True)
def _blk_m1(xf, xs, w, wo, table, sc, zf, so, zmode, G, g0, g1, part, s, blk):
    """One block, groups g0..g1, M == 1: 16 f32x16 registers (8 partial sums, 8 accumulators)."""
    tab = vload(table, 0)
    zero = vsplat(np.float32(0.0))
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = zero
    last = w.shape[0] - ROW_BYTES
    for g in range(g0, g1):
        p0 = p1 = p2 = p3 = p4 = p5 = p6 = p7 = zero
        r = wo + g * G * ROW_BYTES
        for k in range(g * G, g * G + G):
            prefetch(w, min(r + _PF, last))
            xv = vsplat(xf[0, k])
            p0 = vfma(xv, vlut4(tab, w, r, 0), p0)
            p1 = vfma(xv, vlut4(tab, w, r, 4), p1)
            p2 = vfma(xv, vlut4(tab, w, r, 8), p2)
            p3 = vfma(xv, vlut4(tab, w, r, 12), p3)
            p4 = vfma(xv, vlut4(tab, w, r, 16), p4)
            p5 = vfma(xv, vlut4(tab, w, r, 20), p5)
            p6 = vfma(xv, vlut4(tab, w, r, 24), p6)
            p7 = vfma(xv, vlut4(tab, w, r, 28), p7)
            r += ROW_BYTES
        o = so + g * BLOCK_COLS
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
    d = s * part.shape[2] + blk * BLOCK_COLS  # part[s, 0, blk*128 ...] (M == 1)
    vstore(part, d, a0)
    vstore(part, d + 16, a1)
    vstore(part, d + 32, a2)
    vstore(part, d + 48, a3)
    vstore(part, d + 64, a4)
    vstore(part, d + 80, a5)
    vstore(part, d + 96, a6)
    vstore(part, d + 112, a7)


@njit(parallel=True, cache=True)
def gemv_m1(xf, xs, w, wbs, table, sc, zf, sbs, zmode, G, part):
    """M == 1: part[S, 1, nblk*128] raw sums; work item = (block, K split)."""
    S = part.shape[0]
    nblk = part.shape[2] // BLOCK_COLS
    ng = xf.shape[1] // G
    gps = (ng + S - 1) // S
    for t in prange(nblk * S):
        blk = t // S
        s = t % S
        _blk_m1(xf, xs, w, blk * wbs, table, sc, zf, blk * sbs, zmode, G,
                min(s * gps, ng), min((s + 1) * gps, ng), part, s, blk)


@njit(cache=True)
def _blk_rows(xf, xs, w, wo, table, sc, zf, so, zmode, G, g0, g1, part, s, blk):
    """One block for 1 < M <= 8: two rows' 256 weights unpacked once into 16
    registers; each activation row adds its FMAs into partial sums in L1."""
    M = xf.shape[0]
    tab = vload(table, 0)
    p = np.empty(M * BLOCK_COLS, np.float32)
    acc = np.zeros(M * BLOCK_COLS, np.float32)
    last = w.shape[0] - ROW_BYTES
    for g in range(g0, g1):
        p[:] = 0.0
        r = wo + g * G * ROW_BYTES
        k = g * G
        while k + 2 <= g * G + G:
            prefetch(w, min(r + _PF, last))
            prefetch(w, min(r + _PF + ROW_BYTES, last))
            u0 = vlut4(tab, w, r, 0)
            u1 = vlut4(tab, w, r, 4)
            u2 = vlut4(tab, w, r, 8)
            u3 = vlut4(tab, w, r, 12)
            u4 = vlut4(tab, w, r, 16)
            u5 = vlut4(tab, w, r, 20)
            u6 = vlut4(tab, w, r, 24)
            u7 = vlut4(tab, w, r, 28)
            v0 = vlut4(tab, w, r + ROW_BYTES, 0)
            v1 = vlut4(tab, w, r + ROW_BYTES, 4)
            v2 = vlut4(tab, w, r + ROW_BYTES, 8)
            v3 = vlut4(tab, w, r + ROW_BYTES, 12)
            v4 = vlut4(tab, w, r + ROW_BYTES, 16)
            v5 = vlut4(tab, w, r + ROW_BYTES, 20)
            v6 = vlut4(tab, w, r + ROW_BYTES, 24)
            v7 = vlut4(tab, w, r + ROW_BYTES, 28)
            for m in range(M):
                x0 = vsplat(xf[m, k])
                x1 = vsplat(xf[m, k + 1])
                b = m * BLOCK_COLS
                vstore(p, b, vfma(x1, v0, vfma(x0, u0, vload(p, b))))
                vstore(p, b + 16, vfma(x1, v1, vfma(x0, u1, vload(p, b + 16))))
                vstore(p, b + 32, vfma(x1, v2, vfma(x0, u2, vload(p, b + 32))))
                vstore(p, b + 48, vfma(x1, v3, vfma(x0, u3, vload(p, b + 48))))
                vstore(p, b + 64, vfma(x1, v4, vfma(x0, u4, vload(p, b + 64))))
                vstore(p, b + 80, vfma(x1, v5, vfma(x0, u5, vload(p, b + 80))))
                vstore(p, b + 96, vfma(x1, v6, vfma(x0, u6, vload(p, b + 96))))
                vstore(p, b + 112, vfma(x1, v7, vfma(x0, u7, vload(p, b + 112))))
            r += 2 * ROW_BYTES
            k += 2
        if k < g * G + G:  # odd group size: the last row alone
            for m in range(M):
                x0 = vsplat(xf[m, k])
                for j in range(8):
                    b = m * BLOCK_COLS + 16 * j
                    vstore(p, b, vfma(x0, vlut4(tab, w, r, 4 * j), vload(p, b)))
        o = so + g * BLOCK_COLS
        for m in range(M):
            xsv = vsplat(xs[m, g])
            for j in range(8):
                b = m * BLOCK_COLS + 16 * j
                pv = vload(p, b)
                if zmode == 1:
                    pv = vsub(pv, vmul(vload(zf, o + 16 * j), xsv))
                vstore(acc, b, vfma(vload(sc, o + 16 * j), pv, vload(acc, b)))
    cols = part.shape[2]
    for m in range(M):
        for j in range(BLOCK_COLS):
            part[s, m, blk * BLOCK_COLS + j] = acc[m * BLOCK_COLS + j]


@njit(parallel=True, cache=True)
def gemv_rows(xf, xs, w, wbs, table, sc, zf, sbs, zmode, G, part):
    """1 < M <= 8: the weights are read and unpacked once for all M rows."""
    S = part.shape[0]
    nblk = part.shape[2] // BLOCK_COLS
    ng = xf.shape[1] // G
    gps = (ng + S - 1) // S
    for t in prange(nblk * S):
        blk = t // S
        s = t % S
        _blk_rows(xf, xs, w, blk * wbs, table, sc, zf, blk * sbs, zmode, G,
                  min(s * gps, ng), min((s + 1) * gps, ng), part, s, blk)


@njit(parallel=True, cache=True)
def dequant_panel(w, wbs, table, sc, zf, sbs, zmode, G, b0, rnd, panel):
    """panel[k, j] = round((q - z) * s) for blocks b0.. (exact f32 products;
    ``rnd``: fpmath rounding code of the dequantized weight, 0 for none)."""
    K = panel.shape[0]
    nbk = panel.shape[1] // BLOCK_COLS
    nk = (K + 31) // 32
    tab = vload(table, 0)
    zero = vsplat(np.float32(0.0))
    for t in prange(nk * nbk):
        c = t // nbk
        bb = t % nbk
        blk = b0 + bb
        for k in range(c * 32, min(c * 32 + 32, K)):
            r = blk * wbs + k * ROW_BYTES
            o = blk * sbs + (k // G) * BLOCK_COLS
            d = k * panel.shape[1] + bb * BLOCK_COLS
            for j in range(8):
                z = vload(zf, o + 16 * j) if zmode == 1 else zero
                vstore(panel, d + 16 * j, vmul(vsub(vlut4(tab, w, r, 4 * j), z), vload(sc, o + 16 * j)))
            if rnd != 0:
                for j in range(BLOCK_COLS):
                    panel[k, bb * BLOCK_COLS + j] = round_code(panel[k, bb * BLOCK_COLS + j], rnd)

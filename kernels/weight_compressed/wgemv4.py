"""int4 decode GEMV (M <= 8), panel dequantization and the prefill tile loop
(:func:`prefill_chunk`) on the *interleaved* prepared layout.

Layout (made once per constant weight by :func:`pack_interleaved`): blocks of
``BLOCK_COLS = 128`` columns; block ``b`` is one contiguous stream of ``K``
rows of 64 bytes (16 little-endian dwords); nibble ``j`` (bits ``4j..4j+3``)
of dword ``l`` holds column ``128 b + 16 j + l``.  One 512-bit load per row
gives all 128 weights, and :func:`graph_api.kernels.weight_compressed.lut4.vlut4` turns nibble
``j`` of the 16 dwords into the 16 consecutive columns ``16 j .. 16 j + 15``
(one shift and one ``vpermps``).  u4 nibbles are stored as given, s4 ones biased
(``u = q + 8``); the lookup table gives the exact integer ``q``.
Scales (and zero points) are ``[nblk, K/G, 128]`` f32, one per column.

Formula (per output ``m, n``; groups ``g`` of ``G`` consecutive ``k``)::

    y[m, n] = sum_g s[g, n] * (sum_{k in g} x[m, k] * q[k, n]  -  z[g, n] * xs[m, g])

with ``xs[m, g] = sum_{k in g} x[m, k]`` (the zero-point term only with zero
points).  Strict IEEE f32: the inner sum is one FMA per weight, sequential
over ``k``, then ``acc = fma(s, p - z * xs, acc)`` per group in order; the
error bound is ``(G + K/G + 3) * 2**-24 * sum_k |x_k| (|q| + |z|) |s|``.

Cost per 128 weights and activation row (M = 1): four 64-byte loads (at byte
offsets 0..3: nibble ``2i`` of a dword is the low nibble of the dword loaded
``i`` bytes further on), 4 shifts, 8 ``vpermps``, 8 FMAs with an embedded
broadcast of ``x[k]`` — 20 vector ALU operations, against ~30 for the
byte-wise unpack with int-to-float converts.  Measured on one Zen 4 core
(CPU time, L2-resident): 3.7 ns per 128 weights, where 8 FMAs alone take 2.3
ns; the lookups and shifts share the vector pipes with the FMAs.  The eight
partial sums and eight accumulators of a block stay in registers (``f32x16``
locals).  For 1 < M <= 8 register tiles of activation rows x columns
(:func:`_blk_rows`) reuse each lookup for 2 or 4 rows: within ~10% of one FMA
per weight and row, the bound of strict f32 arithmetic.

What that means for a decode step (K = N = 4096, s4, 2 Zen 4 cores): 131 K
rows of 128 weights at 3.7 ns per core take ~0.24 ms, hot or cold (one
thread on weights streamed from DRAM ran within 10% of its L2 time: the
hardware prefetcher keeps up and the software prefetch distance did not
matter).  Reading 10.5 MB (g32, f32 scales) at ~40 GB/s cold takes ~0.26 ms,
so cold decode is at the bandwidth bound; from L3 (~90 GB/s) it is
compute-bound at ~50% of L3 bandwidth.  More needs fewer vector operations
per weight than strict f32 allows (one FMA per weight and row; peers that go
faster round the activations: ONNX Runtime's int8 VNNI mode, PyTorch's bf16;
with fpmath bf16 + ``apply_to_int`` :mod:`graph_api.kernels.weight_compressed.wgemv4_bf16` does).

Targets without AVX-512 (AVX2: 16 registers of 8 floats, no 16-float ``vpermps``)
run the *convert* kernels (:func:`_blk_m1_cvt`, :func:`_blk_rows_cvt`) in register
tiles of 4 partial sums (the one-pass lookup form keeps 16 f32x16 values live, twice
AVX2's register file).  They do not look the nibbles up: nibble ``j`` of a dword is
masked in place and converted (:func:`graph_api.kernels.weight_compressed.lut4.vnibu`; nibble 7 shifted
down), which gives ``u * 16**j`` exactly -- the stored unsigned nibble times a power of
two -- in one ``vpand`` and one ``vcvtdq2ps`` per 8 weights, so the M = 1 loop is 24
vector operations per 64 weights (8 masks, 8 converts, 8 FMAs) where moving each
nibble down first took 32.  The sums keep the factor 16**j, removed once per group by
an exact multiplication, and s4's bias leaves with the zero points::

    y[m, n] = sum_g s * (16**-j * sum_k x[m, k] * u[k, n] * 16**j  -  (z + zc) * xs[m, g])

with ``zc = 8`` for s4 (``-table[0]``) and 0 for u4.  Powers of two scale every rounding
exactly (barring overflow, which wmatmul's guard rules out with the factor
:data:`SUM_SCALE` = 2**24, and underflow), so for u4 the results are the lookup
kernels' bit for bit; for s4 the sums run over ``|u| <= 15`` and ``|z + 8|`` instead of
``|q| <= 8`` and ``|z|``: the bound is ``(G + K/G + 3) * 2**-24 * sum_k |x_k| (|q + 8| +
|z + 8|) |s|``, at most ``16 * 2**-24 * (G + K/G + 3) * sum_k |x_k| |s|`` more.

Measured on Zen 3 (2.45 GHz; one core, CPU time, in-process A/B against the two-shift
unpack, interleaved, medians; the machine was loaded by other sessions, so ratios are
firmer than times).  The mask, convert and FMA share the 4 vector pipes: 24 such
operations on registers take 6 cycles, the 8 FMAs alone 4; the two-shift form took 10.
The M = 1 loop on L2-resident rows: 5.3 -> 3.7 ns per 64 weights (~9 cycles, 0.70x).
K = N = 4096, g128 s4, M = 1: 1.54 -> 1.27..1.34 ms per call (one copy of the weights,
the two kernels alternating: 17 MB through a 32 MB L3 shared with other work), 1.55 ->
1.35 ms streamed from DRAM (4 copies in rotation); one copy back to back from L3, ~0.95
ms.  g32 u4 + zero points from DRAM: 1.86 -> 1.46 ms.  Two threads (same A/B, lighter load):
0.91 -> 0.70 ms with one copy, 1.17 -> 0.84 ms from DRAM.  The quick benchmark's
M = 1 row (whole calls, lightly loaded, two runs each): 1.07..1.39 -> 0.88..0.97 ms cold,
1.09..1.12 -> 0.90 ms hot, where ONNX Runtime's MatMulNBits with int8 activations
(accuracy level 4) took 0.70..0.88 ms and PyTorch's int4pack_mm 1.56..1.65 ms.
M = 2, 4, 8 (g128 s4): 0.93x, 0.94x, 0.95x -- one FMA per weight and row bounds them;
M = 4 g32 u4 + zp: 0.61x: the former kernels also made ~30 reference-count calls per
group (atomics on counts the threads share), which the written-out loops of
:func:`_blk_m1_cvt` avoid.
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (configures numba first)

import numpy as np
from numba import njit, prange

from graph_api.kernels.bits import prefetch, vadd, vbcast, round_code, vfma, vload, vmul, vsplat, vstore, vsub
from graph_api.kernels.weight_compressed.lut4 import HAS_VPERMPS, TABLE_S4, TABLE_U4, nib_mask, vlut4, vnib7, vnibu
from graph_api.kernels.openblas import sgemm

BLOCK_COLS = 128  #: columns per block (64 bytes per row: one cache line, one zmm load)
ROW_BYTES = 64
_PF = 2048  #: software prefetch distance in bytes of the block stream (32 rows)
#: the AVX2 convert kernels' prefetch distance: bytes of the block stream ahead of the
#: *progress* through a group (its rows read in several passes; see :func:`_blk_m1_cvt`)
_PF_CVT = 8192


def pack_interleaved(q, signed: bool):
    """Integer weights ``q [K, Np]`` (Np a multiple of 128, values in range) ->
    the flat uint8 interleaved stream ``[Np/128, K, 64]`` (s4 as ``q + 8``) and the
    f32 lookup table (stored nibble -> ``q``)."""
    K, Np = q.shape
    nblk = Np // BLOCK_COLS
    # column 128 b + 16 j + l -> block b, little-endian dword l, nibble j: byte m = j // 2 of
    # the dword holds nibble 2m (low) and 2m + 1 (high), so the stream is built in bytes
    # (uint32 words shifted in 8 passes took ~3x as long)
    # s4 is stored biased (u = q + 8: the two's complement nibble with its top bit flipped)
    nib = ((np.asarray(q) & 15) ^ (8 if signed else 0)).astype(np.uint8).reshape(K, nblk, 4, 2, 16)  # [k, b, m, h, l]
    pairs = nib[:, :, :, 0, :] | (nib[:, :, :, 1, :] << np.uint8(4))  # [k, b, m, l]
    stream = np.empty(nblk * K * ROW_BYTES + ROW_BYTES, np.uint8)
    stream[:nblk * K * ROW_BYTES].reshape(nblk, K, 16, 4)[...] = pairs.transpose(1, 0, 3, 2)
    # + one zero row: the kernels also load rows at byte offsets 1..3 (see _blk_m1)
    stream[nblk * K * ROW_BYTES:] = 0
    return stream, np.array(TABLE_S4 if signed else TABLE_U4, np.float32)


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
            # nibble 2i of a dword is the low nibble of the dword loaded i bytes further
            # on: loads (cheap) instead of three of the seven shifts (measured -4%)
            p0 = vfma(xv, vlut4(tab, w, r, 0), p0)
            p1 = vfma(xv, vlut4(tab, w, r, 4), p1)
            p2 = vfma(xv, vlut4(tab, w, r + 1, 0), p2)
            p3 = vfma(xv, vlut4(tab, w, r + 1, 4), p3)
            p4 = vfma(xv, vlut4(tab, w, r + 2, 0), p4)
            p5 = vfma(xv, vlut4(tab, w, r + 2, 4), p5)
            p6 = vfma(xv, vlut4(tab, w, r + 3, 0), p6)
            p7 = vfma(xv, vlut4(tab, w, r + 3, 4), p7)
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


#: 16**-j: the partial sums of nibble slot ``j`` of the convert kernels carry the factor
#: 16**j of :func:`vnibu` (slot 7, shifted down, none); undone once per group
_UNSCALE = tuple([16.0 ** -j for j in range(7)] + [1.0])
#: the largest of those factors: the convert kernels' partial sums are up to this much larger
#: than the lookup kernels' (wmatmul's overflow guard accounts for it)
SUM_SCALE = 2.0 ** 24


@njit(inline="always", cache=True)
def _affine(p, f, s, z, xs, a):
    """fma(s, p * f - z * xs, a): one group's step of the convert kernels (``f`` = 16**-j,
    ``z`` = zero point + bias).  Vectors only: with array arguments, an inlined helper
    kept Numba's reference-count updates (atomics on counts the threads share) in the
    group loop, ~30 calls per group."""
    return vfma(s, vsub(vmul(p, f), vmul(z, xs)), a)


@njit(cache=True)
def _blk_m1_cvt(xf, xs, w, wo, table, sc, zf, so, zmode, G, g0, g1, part, s, blk):
    """:func:`_blk_m1` for targets without a 16-float ``vpermps`` (AVX2: 16 vector
    registers of 8 floats): per group, the block's 128 columns in two passes of 64
    (nibble slots 0..3, then 4..7: 4 partial sums, 8 registers; the second pass reads
    the group's rows from L1), the biased nibbles ``u`` masked and converted
    (:func:`vnibu`) with the factor 16**j left in the sums, then per group
    ``s * (p * 16**-j - (z + zc) * xs)`` with ``zc = -table[0]`` (8 for s4, 0 for u4)
    into the accumulators in ``part``.  u4 gives the lookup kernel's results bit for
    bit; s4 sums ``x * (q + 8)`` (error bound in the module doc).

    The row loops are written out: in an inlined helper, Numba's reference counting of
    the helper's array arguments (atomic updates shared by the threads) stayed around
    each loop.  The second exit of each row loop keeps LLVM from unrolling it at run
    time (two rows interleaved needed more than AVX2's 16 registers and spilled).

    Both passes prefetch, at half a row per row step, :data:`_PF_CVT` bytes ahead of the
    progress through the group (pass 1 at ``r0 + (r - r0) / 2``, pass 2 ``G * 32`` further):
    the stream is requested evenly over the group's time.  Prefetching ``2048`` bytes ahead
    of ``r`` in the first pass only left the memory idle in the second (Zen 3, one thread,
    weights streamed from DRAM, in-process A/B on a loaded machine, medians of 100, four
    runs: K = N = 4096 g128 s4 0.82..1.25 -> 0.73..1.16 ms, -4..-21%; g32 u4 + zp -4..-6%;
    L3-resident within noise)."""
    zs = vsplat(-table[0])
    zero = vsplat(np.float32(0.0))
    d = s * part.shape[2] + blk * BLOCK_COLS  # part[s, 0, blk*128 ...] (M == 1)
    for j in range(0, BLOCK_COLS, 16):
        vstore(part, d + j, zero)
    m0 = nib_mask(0)
    m1 = nib_mask(1)
    m2 = nib_mask(2)
    m3 = nib_mask(3)
    m4 = nib_mask(4)
    m5 = nib_mask(5)
    m6 = nib_mask(6)
    for g in range(g0, g1):
        o = so + g * BLOCK_COLS
        xsv = vsplat(xs[0, g])
        r0 = wo + g * G * ROW_BYTES
        end = r0 + G * ROW_BYTES
        p0 = p1 = p2 = p3 = zero
        r = r0
        for k in range(g * G, g * G + G):  # slots 0..3
            prefetch(w, ((r + r0) >> 1) + _PF_CVT)  # (past the buffer's end: no fault)
            xv = vbcast(xf, k)
            p0 = vfma(xv, vnibu(w, r, m0), p0)
            p1 = vfma(xv, vnibu(w, r, m1), p1)
            p2 = vfma(xv, vnibu(w, r, m2), p2)
            p3 = vfma(xv, vnibu(w, r, m3), p3)
            r += ROW_BYTES
            if r >= end:
                break
        vstore(part, d, _affine(p0, vsplat(np.float32(_UNSCALE[0])), vload(sc, o),
                                    vadd(vload(zf, o), zs) if zmode == 1 else zs, xsv, vload(part, d)))
        vstore(part, d + 16, _affine(p1, vsplat(np.float32(_UNSCALE[1])), vload(sc, o + 16),
                                    vadd(vload(zf, o + 16), zs) if zmode == 1 else zs, xsv, vload(part, d + 16)))
        vstore(part, d + 32, _affine(p2, vsplat(np.float32(_UNSCALE[2])), vload(sc, o + 32),
                                    vadd(vload(zf, o + 32), zs) if zmode == 1 else zs, xsv, vload(part, d + 32)))
        vstore(part, d + 48, _affine(p3, vsplat(np.float32(_UNSCALE[3])), vload(sc, o + 48),
                                    vadd(vload(zf, o + 48), zs) if zmode == 1 else zs, xsv, vload(part, d + 48)))
        p0 = p1 = p2 = p3 = zero
        r = r0
        for k in range(g * G, g * G + G):  # slots 4..7
            prefetch(w, ((r + r0) >> 1) + G * 32 + _PF_CVT)
            xv = vbcast(xf, k)
            p0 = vfma(xv, vnibu(w, r, m4), p0)
            p1 = vfma(xv, vnibu(w, r, m5), p1)
            p2 = vfma(xv, vnibu(w, r, m6), p2)
            p3 = vfma(xv, vnib7(w, r), p3)
            r += ROW_BYTES
            if r >= end:
                break
        vstore(part, d + 64, _affine(p0, vsplat(np.float32(_UNSCALE[4])), vload(sc, o + 64),
                                    vadd(vload(zf, o + 64), zs) if zmode == 1 else zs, xsv, vload(part, d + 64)))
        vstore(part, d + 80, _affine(p1, vsplat(np.float32(_UNSCALE[5])), vload(sc, o + 80),
                                    vadd(vload(zf, o + 80), zs) if zmode == 1 else zs, xsv, vload(part, d + 80)))
        vstore(part, d + 96, _affine(p2, vsplat(np.float32(_UNSCALE[6])), vload(sc, o + 96),
                                    vadd(vload(zf, o + 96), zs) if zmode == 1 else zs, xsv, vload(part, d + 96)))
        vstore(part, d + 112, _affine(p3, vsplat(np.float32(_UNSCALE[7])), vload(sc, o + 112),
                                    vadd(vload(zf, o + 112), zs) if zmode == 1 else zs, xsv, vload(part, d + 112)))


@njit(cache=True)
def _scale4(acc, m, c, q0, q1, q2, q3, sc, zf, o, zmode, xs, g):
    """acc[m, c + 16 j ..] = fma(s, p_j - z * xs[m, g], acc) for the four vectors of one row."""
    b = m * BLOCK_COLS + c
    if zmode == 1:
        xsv = vsplat(xs[m, g])
        q0 = vsub(q0, vmul(vload(zf, o + c), xsv))
        q1 = vsub(q1, vmul(vload(zf, o + c + 16), xsv))
        q2 = vsub(q2, vmul(vload(zf, o + c + 32), xsv))
        q3 = vsub(q3, vmul(vload(zf, o + c + 48), xsv))
    vstore(acc, b, vfma(vload(sc, o + c), q0, vload(acc, b)))
    vstore(acc, b + 16, vfma(vload(sc, o + c + 16), q1, vload(acc, b + 16)))
    vstore(acc, b + 32, vfma(vload(sc, o + c + 32), q2, vload(acc, b + 32)))
    vstore(acc, b + 48, vfma(vload(sc, o + c + 48), q3, vload(acc, b + 48)))


@njit(inline="always", cache=True)
def _pair(xf, xs, w, r, tab, sc, zf, o, zmode, G, g, m0, acc, last):
    """Rows m0, m0 + 1 (or m0 alone) of one group: 2 x 8 partial sums in registers."""
    M = xf.shape[0]
    i1 = min(m0 + 1, M - 1)
    zero = vsplat(np.float32(0.0))
    p0 = p1 = p2 = p3 = p4 = p5 = p6 = p7 = zero
    q0 = q1 = q2 = q3 = q4 = q5 = q6 = q7 = zero
    for k in range(g * G, g * G + G):
        prefetch(w, min(r + _PF, last))
        u0 = vlut4(tab, w, r, 0)
        u1 = vlut4(tab, w, r, 4)
        u2 = vlut4(tab, w, r + 1, 0)
        u3 = vlut4(tab, w, r + 1, 4)
        u4 = vlut4(tab, w, r + 2, 0)
        u5 = vlut4(tab, w, r + 2, 4)
        u6 = vlut4(tab, w, r + 3, 0)
        u7 = vlut4(tab, w, r + 3, 4)
        x0 = vsplat(xf[m0, k])
        x1 = vsplat(xf[i1, k])
        p0 = vfma(x0, u0, p0)
        p1 = vfma(x0, u1, p1)
        p2 = vfma(x0, u2, p2)
        p3 = vfma(x0, u3, p3)
        p4 = vfma(x0, u4, p4)
        p5 = vfma(x0, u5, p5)
        p6 = vfma(x0, u6, p6)
        p7 = vfma(x0, u7, p7)
        q0 = vfma(x1, u0, q0)
        q1 = vfma(x1, u1, q1)
        q2 = vfma(x1, u2, q2)
        q3 = vfma(x1, u3, q3)
        q4 = vfma(x1, u4, q4)
        q5 = vfma(x1, u5, q5)
        q6 = vfma(x1, u6, q6)
        q7 = vfma(x1, u7, q7)
        r += ROW_BYTES
    _scale4(acc, m0, np.int64(0), p0, p1, p2, p3, sc, zf, o, zmode, xs, g)
    _scale4(acc, m0, np.int64(64), p4, p5, p6, p7, sc, zf, o, zmode, xs, g)
    if m0 + 1 < M:
        _scale4(acc, m0 + 1, np.int64(0), q0, q1, q2, q3, sc, zf, o, zmode, xs, g)
        _scale4(acc, m0 + 1, np.int64(64), q4, q5, q6, q7, sc, zf, o, zmode, xs, g)


@njit(cache=True)
def _blk_rows(xf, xs, w, wo, table, sc, zf, so, zmode, G, g0, g1, part, s, blk):
    """One block for 1 < M <= 8, in register tiles of 16 partial sums: 4
    activation rows x 64 columns while 3 or more rows are left (a missing
    fourth row repeats the last one and is not stored), then 2 rows x 128
    columns (:func:`_pair`).  Per group, each tile streams the group's rows
    from L1 and unpacks its part of every row (4 lookups for 16 FMAs, or 8
    for 16); the scaled accumulators live in L1, updated once per group.
    Measured per core and 128 weights: M = 2 5.4 ns, M = 4 10 ns, M = 8 20 ns,
    within 10% of one FMA per weight (the unpack-once-into-L1 loop took 7,
    13.6 and 28 ns: partial-sum loads and stores)."""
    M = xf.shape[0]
    tab = vload(table, 0)
    zero = vsplat(np.float32(0.0))
    acc = np.zeros(M * BLOCK_COLS, np.float32)
    last = w.shape[0] - ROW_BYTES
    for g in range(g0, g1):
        o = so + g * BLOCK_COLS
        for m0 in range(0, M - 2, 4):  # tiles of 4 rows while 3 or more are left
            i1 = min(m0 + 1, M - 1)
            i2 = min(m0 + 2, M - 1)
            i3 = min(m0 + 3, M - 1)
            for half in range(2):
                p00 = p01 = p02 = p03 = p10 = p11 = p12 = p13 = zero
                p20 = p21 = p22 = p23 = p30 = p31 = p32 = p33 = zero
                r = wo + g * G * ROW_BYTES + 2 * half  # nibbles 4h..4h+3: dwords at byte offsets 2h, 2h+1
                for k in range(g * G, g * G + G):
                    prefetch(w, min(r + _PF, last))
                    u0 = vlut4(tab, w, r, 0)
                    u1 = vlut4(tab, w, r, 4)
                    u2 = vlut4(tab, w, r + 1, 0)
                    u3 = vlut4(tab, w, r + 1, 4)
                    x0 = vsplat(xf[m0, k])
                    x1 = vsplat(xf[i1, k])
                    x2 = vsplat(xf[i2, k])
                    x3 = vsplat(xf[i3, k])
                    p00 = vfma(x0, u0, p00)
                    p01 = vfma(x0, u1, p01)
                    p02 = vfma(x0, u2, p02)
                    p03 = vfma(x0, u3, p03)
                    p10 = vfma(x1, u0, p10)
                    p11 = vfma(x1, u1, p11)
                    p12 = vfma(x1, u2, p12)
                    p13 = vfma(x1, u3, p13)
                    p20 = vfma(x2, u0, p20)
                    p21 = vfma(x2, u1, p21)
                    p22 = vfma(x2, u2, p22)
                    p23 = vfma(x2, u3, p23)
                    p30 = vfma(x3, u0, p30)
                    p31 = vfma(x3, u1, p31)
                    p32 = vfma(x3, u2, p32)
                    p33 = vfma(x3, u3, p33)
                    r += ROW_BYTES
                c = 64 * half
                _scale4(acc, m0, c, p00, p01, p02, p03, sc, zf, o, zmode, xs, g)
                if m0 + 1 < M:
                    _scale4(acc, m0 + 1, c, p10, p11, p12, p13, sc, zf, o, zmode, xs, g)
                if m0 + 2 < M:
                    _scale4(acc, m0 + 2, c, p20, p21, p22, p23, sc, zf, o, zmode, xs, g)
                if m0 + 3 < M:
                    _scale4(acc, m0 + 3, c, p30, p31, p32, p33, sc, zf, o, zmode, xs, g)
        m0 = (M + 1) // 4 * 4  # the rows after the 4-row tiles (1 or 2 of them, if any)
        if m0 < M:
            _pair(xf, xs, w, wo + g * G * ROW_BYTES, tab, sc, zf, o, zmode, G, g, m0, acc, last)
    for m in range(M):
        for j in range(BLOCK_COLS):
            part[s, m, blk * BLOCK_COLS + j] = acc[m * BLOCK_COLS + j]


@njit(cache=True)
def _blk_rows_cvt(xf, xs, w, wo, table, sc, zf, so, zmode, G, g0, g1, part, s, blk):
    """:func:`_blk_rows` for targets without a 16-float ``vpermps`` (AVX2, 16 vector
    registers of 8 floats): register tiles of 4 partial sums (8 registers), either 4
    activation rows x one nibble slot of 16 columns while 3 or more rows are left (one
    unpack, :func:`vnibu`, for 4 FMAs; a missing fourth row repeats the last and is not
    stored), or 2 rows x two slots.  Per group each tile re-reads the group's rows from
    L1; sums, scaling, results and written-out loops as :func:`_blk_m1_cvt`'s.  Prefetch as
    there, spread over the passes of the first tile (8 passes of a 4-row tile, or the 4 of
    the 2-row tile when M <= 2: 1/8 or 1/4 row per row step); the first pass alone
    prefetched before (M = 2 from DRAM, one thread: -8..-9%; M = 4 within noise)."""
    M, K = xf.shape
    zs = vsplat(-table[0])
    zero = vsplat(np.float32(0.0))
    acc = np.zeros(M * BLOCK_COLS, np.float32)
    for g in range(g0, g1):
        o = so + g * BLOCK_COLS
        r0 = wo + g * G * ROW_BYTES
        k0 = g * G
        end = r0 + G * ROW_BYTES
        for m0 in range(0, M - 2, 4):  # tiles of 4 rows while 3 or more are left
            x0 = m0 * K  # flat offsets of the tile's activation rows
            x1 = min(m0 + 1, M - 1) * K
            x2 = min(m0 + 2, M - 1) * K
            x3 = min(m0 + 3, M - 1) * K
            for j in range(8):  # nibble slot j: columns 16 j ..
                m = nib_mask(min(j, 6))
                top = j == 7
                pf = m0 == 0
                p0 = p1 = p2 = p3 = zero
                r = r0
                for k in range(k0, k0 + G):
                    if pf:  # the group's progress: pass j of 8 covers eighth j
                        prefetch(w, r0 + ((r - r0) >> 3) + j * G * 8 + _PF_CVT)
                    if top:
                        u = vnib7(w, r)
                    else:
                        u = vnibu(w, r, m)
                    p0 = vfma(vbcast(xf, x0 + k), u, p0)
                    p1 = vfma(vbcast(xf, x1 + k), u, p1)
                    p2 = vfma(vbcast(xf, x2 + k), u, p2)
                    p3 = vfma(vbcast(xf, x3 + k), u, p3)
                    r += ROW_BYTES
                    if r >= end:
                        break
                c = 16 * j
                f = vsplat(np.float32(_UNSCALE[j]))
                sv = vload(sc, o + c)
                zv = vadd(vload(zf, o + c), zs) if zmode == 1 else zs
                b = m0 * BLOCK_COLS + c
                vstore(acc, b, _affine(p0, f, sv, zv, vsplat(xs[m0, g]), vload(acc, b)))
                if m0 + 1 < M:
                    b += BLOCK_COLS
                    vstore(acc, b, _affine(p1, f, sv, zv, vsplat(xs[m0 + 1, g]), vload(acc, b)))
                if m0 + 2 < M:
                    b += BLOCK_COLS
                    vstore(acc, b, _affine(p2, f, sv, zv, vsplat(xs[m0 + 2, g]), vload(acc, b)))
                if m0 + 3 < M:
                    b += BLOCK_COLS
                    vstore(acc, b, _affine(p3, f, sv, zv, vsplat(xs[m0 + 3, g]), vload(acc, b)))
        m0 = (M + 1) // 4 * 4  # the rows after the 4-row tiles (1 or 2 of them, if any)
        if m0 < M:
            x0 = m0 * K
            x1 = min(m0 + 1, M - 1) * K
            for b in range(4):  # slots 2b and 2b + 1
                ma = nib_mask(2 * b)
                mb = nib_mask(min(2 * b + 1, 6))
                top = b == 3
                pf = M < 3
                p0 = p1 = q0 = q1 = zero
                r = r0
                for k in range(k0, k0 + G):
                    if pf:  # pass b of 4 covers quarter b
                        prefetch(w, r0 + ((r - r0) >> 2) + b * G * 16 + _PF_CVT)
                    ua = vnibu(w, r, ma)
                    if top:
                        ub = vnib7(w, r)
                    else:
                        ub = vnibu(w, r, mb)
                    v0 = vbcast(xf, x0 + k)
                    v1 = vbcast(xf, x1 + k)
                    p0 = vfma(v0, ua, p0)
                    p1 = vfma(v0, ub, p1)
                    q0 = vfma(v1, ua, q0)
                    q1 = vfma(v1, ub, q1)
                    r += ROW_BYTES
                    if r >= end:
                        break
                c = 32 * b
                fa = vsplat(np.float32(_UNSCALE[2 * b]))
                fb = vsplat(np.float32(_UNSCALE[2 * b + 1]))
                sa = vload(sc, o + c)
                sb = vload(sc, o + c + 16)
                za = vadd(vload(zf, o + c), zs) if zmode == 1 else zs
                zb = vadd(vload(zf, o + c + 16), zs) if zmode == 1 else zs
                xv = vsplat(xs[m0, g])
                e = m0 * BLOCK_COLS + c
                vstore(acc, e, _affine(p0, fa, sa, za, xv, vload(acc, e)))
                vstore(acc, e + 16, _affine(p1, fb, sb, zb, xv, vload(acc, e + 16)))
                if m0 + 1 < M:
                    xv = vsplat(xs[m0 + 1, g])
                    e += BLOCK_COLS
                    vstore(acc, e, _affine(q0, fa, sa, za, xv, vload(acc, e)))
                    vstore(acc, e + 16, _affine(q1, fb, sb, zb, xv, vload(acc, e + 16)))
    for m in range(M):
        for j in range(BLOCK_COLS):
            part[s, m, blk * BLOCK_COLS + j] = acc[m * BLOCK_COLS + j]


#: the block kernels the GEMV drivers run: the lookup forms where the target has a 16-float
#: ``vpermps`` (AVX-512), else the convert forms (:func:`_blk_m1_cvt`, :func:`_blk_rows_cvt`)
_M1, _ROWS = (_blk_m1, _blk_rows) if HAS_VPERMPS else (_blk_m1_cvt, _blk_rows_cvt)


# Two drivers, not one with an ``M == 1`` branch (as wgemv8's): a process that only decodes
# one row compiles only the M = 1 block kernel.
@njit(parallel=True, cache=True)
def _gemv_m1(xf, xs, w, wbs, table, sc, zf, sbs, zmode, G, part):
    S = part.shape[0]
    nblk = part.shape[2] // BLOCK_COLS
    ng = xf.shape[1] // G
    gps = (ng + S - 1) // S
    for t in prange(nblk * S):
        blk = t // S
        s = t % S
        _M1(xf, xs, w, blk * wbs, table, sc, zf, blk * sbs, zmode, G,
            min(s * gps, ng), min((s + 1) * gps, ng), part, s, blk)


@njit(parallel=True, cache=True)
def _gemv_rows(xf, xs, w, wbs, table, sc, zf, sbs, zmode, G, part):
    S = part.shape[0]
    nblk = part.shape[2] // BLOCK_COLS
    ng = xf.shape[1] // G
    gps = (ng + S - 1) // S
    for t in prange(nblk * S):
        blk = t // S
        s = t % S
        _ROWS(xf, xs, w, blk * wbs, table, sc, zf, blk * sbs, zmode, G,
              min(s * gps, ng), min((s + 1) * gps, ng), part, s, blk)


def gemv_m1(xf, xs, w, wbs, table, sc, zf, sbs, zmode, G, part):
    """M == 1: part[S, 1, nblk*128] raw sums; work item = (block, K split)."""
    _gemv_m1(xf, xs, w, wbs, table, sc, zf, sbs, zmode, G, part)


def gemv_rows(xf, xs, w, wbs, table, sc, zf, sbs, zmode, G, part):
    """1 < M <= 8: the weights are read and unpacked once for all M rows."""
    _gemv_rows(xf, xs, w, wbs, table, sc, zf, sbs, zmode, G, part)


@njit(inline="always", cache=True)
def _dequant_rows(w, wbs, tab, sc, zf, sbs, zmode, G, blk, k0, k1, rnd, tile, d0, ld):
    """tile[d0 + (k - k0) * ld + j] = round((q[k, 128 blk + j] - z) * s) for k0 <= k < k1,
    j < 128 (``tile`` flat f32; exact f32 products, then the fpmath rounding ``rnd``)."""
    zero = vsplat(np.float32(0.0))
    g0 = k0 // G
    for g in range(g0, (k1 + G - 1) // G):  # one division per group, not per row (~25 cycles)
        o = blk * sbs + g * BLOCK_COLS
        for k in range(max(k0, g * G), min(k1, g * G + G)):
            r = blk * wbs + k * ROW_BYTES
            d = d0 + (k - k0) * ld
            for j in range(8):
                z = vload(zf, o + 16 * j) if zmode == 1 else zero
                vstore(tile, d + 16 * j, vmul(vsub(vlut4(tab, w, r, 4 * j), z), vload(sc, o + 16 * j)))
            if rnd != 0:
                for j in range(BLOCK_COLS):
                    tile[d + j] = round_code(tile[d + j], rnd)


@njit(parallel=True, cache=True, nogil=True)
def dequant_panel(w, wbs, table, sc, zf, sbs, zmode, G, b0, rnd, panel):
    """panel[k, j] = round((q - z) * s) for blocks b0.. (exact f32 products;
    ``rnd``: fpmath rounding code of the dequantized weight, 0 for none)."""
    K = panel.shape[0]
    ld = panel.shape[1]
    nbk = ld // BLOCK_COLS
    nk = (K + 31) // 32
    tab = vload(table, 0)
    flat = panel.reshape(-1)
    for t in prange(nk * nbk):
        c = t // nbk
        bb = t % nbk
        k0 = c * 32
        _dequant_rows(w, wbs, tab, sc, zf, sbs, zmode, G, b0 + bb, k0, min(k0 + 32, K), rnd, flat,
                      k0 * ld + bb * BLOCK_COLS, ld)


#: f32 padding of a prefill tile row: row strides of 2**n bytes (1024 columns: 4 KiB) map
#: the rows sgemm's B packing reads together to the same cache sets (one Zen 5 core,
#: M = 32, K = N = 4096, 1024 x 256 tiles: the sgemms took 18.5 ms unpadded, 15.3 padded)
TILE_PAD = 16


def tile_floats(kc: int, nb: int) -> int:
    """f32 elements of a :func:`prefill_chunk` tile of ``kc`` rows and ``nb`` blocks."""
    return kc * (nb * BLOCK_COLS + TILE_PAD)


@njit(inline="always", cache=True)
def _mk8(x, r0, k0, k1, tile, ld, j, out, o, ldo, first):
    """:func:`_mk4` for 8 rows: 16 accumulators, 10 loads per 16 FMAs (4 rows: 6 per 8;
    measured 5-7% faster at M = 32..128)."""
    p = o + r0 * ldo + j
    if first:
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = vsplat(np.float32(0.0))
        b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = a0
    else:
        a0 = vload(out, p)
        b0 = vload(out, p + 16)
        a1 = vload(out, p + ldo)
        b1 = vload(out, p + ldo + 16)
        a2 = vload(out, p + 2 * ldo)
        b2 = vload(out, p + 2 * ldo + 16)
        a3 = vload(out, p + 3 * ldo)
        b3 = vload(out, p + 3 * ldo + 16)
        a4 = vload(out, p + 4 * ldo)
        b4 = vload(out, p + 4 * ldo + 16)
        a5 = vload(out, p + 5 * ldo)
        b5 = vload(out, p + 5 * ldo + 16)
        a6 = vload(out, p + 6 * ldo)
        b6 = vload(out, p + 6 * ldo + 16)
        a7 = vload(out, p + 7 * ldo)
        b7 = vload(out, p + 7 * ldo + 16)
    for k in range(k0, k1):
        t = (k - k0) * ld + j
        w0 = vload(tile, t)
        w1 = vload(tile, t + 16)
        xv = vsplat(x[r0, k])
        a0 = vfma(xv, w0, a0)
        b0 = vfma(xv, w1, b0)
        xv = vsplat(x[r0 + 1, k])
        a1 = vfma(xv, w0, a1)
        b1 = vfma(xv, w1, b1)
        xv = vsplat(x[r0 + 2, k])
        a2 = vfma(xv, w0, a2)
        b2 = vfma(xv, w1, b2)
        xv = vsplat(x[r0 + 3, k])
        a3 = vfma(xv, w0, a3)
        b3 = vfma(xv, w1, b3)
        xv = vsplat(x[r0 + 4, k])
        a4 = vfma(xv, w0, a4)
        b4 = vfma(xv, w1, b4)
        xv = vsplat(x[r0 + 5, k])
        a5 = vfma(xv, w0, a5)
        b5 = vfma(xv, w1, b5)
        xv = vsplat(x[r0 + 6, k])
        a6 = vfma(xv, w0, a6)
        b6 = vfma(xv, w1, b6)
        xv = vsplat(x[r0 + 7, k])
        a7 = vfma(xv, w0, a7)
        b7 = vfma(xv, w1, b7)
    vstore(out, p, a0)
    vstore(out, p + 16, b0)
    vstore(out, p + ldo, a1)
    vstore(out, p + ldo + 16, b1)
    vstore(out, p + 2 * ldo, a2)
    vstore(out, p + 2 * ldo + 16, b2)
    vstore(out, p + 3 * ldo, a3)
    vstore(out, p + 3 * ldo + 16, b3)
    vstore(out, p + 4 * ldo, a4)
    vstore(out, p + 4 * ldo + 16, b4)
    vstore(out, p + 5 * ldo, a5)
    vstore(out, p + 5 * ldo + 16, b5)
    vstore(out, p + 6 * ldo, a6)
    vstore(out, p + 6 * ldo + 16, b6)
    vstore(out, p + 7 * ldo, a7)
    vstore(out, p + 7 * ldo + 16, b7)


@njit(inline="always", cache=True)
def _mk4(x, r0, k0, k1, tile, ld, j, out, o, ldo, first):
    """out rows r0..r0+3, columns j..j+31 (flat ``out[o + r * ldo + j + l]``)
    += x[r, k0:k1] @ tile rows 0..k1-k0: 8 f32x16 accumulators, one FMA per
    product, sequential over k and continuing from ``out`` unless ``first``."""
    p = o + r0 * ldo + j
    if first:
        a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = vsplat(np.float32(0.0))
    else:
        a0 = vload(out, p)
        b0 = vload(out, p + 16)
        a1 = vload(out, p + ldo)
        b1 = vload(out, p + ldo + 16)
        a2 = vload(out, p + 2 * ldo)
        b2 = vload(out, p + 2 * ldo + 16)
        a3 = vload(out, p + 3 * ldo)
        b3 = vload(out, p + 3 * ldo + 16)
    for k in range(k0, k1):
        t = (k - k0) * ld + j
        w0 = vload(tile, t)
        w1 = vload(tile, t + 16)
        x0 = vsplat(x[r0, k])
        a0 = vfma(x0, w0, a0)
        b0 = vfma(x0, w1, b0)
        x1 = vsplat(x[r0 + 1, k])
        a1 = vfma(x1, w0, a1)
        b1 = vfma(x1, w1, b1)
        x2 = vsplat(x[r0 + 2, k])
        a2 = vfma(x2, w0, a2)
        b2 = vfma(x2, w1, b2)
        x3 = vsplat(x[r0 + 3, k])
        a3 = vfma(x3, w0, a3)
        b3 = vfma(x3, w1, b3)
    vstore(out, p, a0)
    vstore(out, p + 16, b0)
    vstore(out, p + ldo, a1)
    vstore(out, p + ldo + 16, b1)
    vstore(out, p + 2 * ldo, a2)
    vstore(out, p + 2 * ldo + 16, b2)
    vstore(out, p + 3 * ldo, a3)
    vstore(out, p + 3 * ldo + 16, b3)


@njit(inline="always", cache=True)
def _mk1(x, r, k0, k1, tile, ld, j, out, o, ldo, first):
    """One row of :func:`_mk4` (the rows after the last group of 4)."""
    p = o + r * ldo + j
    if first:
        a0 = b0 = vsplat(np.float32(0.0))
    else:
        a0 = vload(out, p)
        b0 = vload(out, p + 16)
    for k in range(k0, k1):
        t = (k - k0) * ld + j
        x0 = vsplat(x[r, k])
        a0 = vfma(x0, vload(tile, t), a0)
        b0 = vfma(x0, vload(tile, t + 16), b0)
    vstore(out, p, a0)
    vstore(out, p + 16, b0)


@njit(cache=True, nogil=True)
def prefill_chunk(x, w, wbs, table, sc, zf, sbs, zmode, G, b0, nb, kc, rnd, tile, out, o_off, ldo, sgemm_fn):
    """``out[:, cols] = x @ dequant(W)[:, cols]`` for the columns of blocks ``b0 .. b0 + nb``
    (one thread): K in steps of ``kc`` rows, each dequantized into ``tile`` (``kc`` rows of
    ``128 nb`` f32, row stride ``128 nb + TILE_PAD``; cache-resident) and multiplied into
    ``out`` (f32 C-contiguous, the block's first element at flat ``o_off``, row stride
    ``ldo``).  With ``sgemm_fn`` (an address, not 0): one ``cblas_sgemm`` per step adding
    into ``out`` (beta 0 for the first step; f32 sums in sgemm's order, one addition per
    step).  With 0: the register-blocked :func:`_mk8` (8 rows x 32 columns), one f32 FMA
    per product in k order across all steps -- faster than OpenBLAS's sgemm for small M
    (the rows of ``x`` stay in L1), slower for large M (measured in wmatmul)."""
    M, K = x.shape
    width = nb * BLOCK_COLS
    ld = width + TILE_PAD
    tab = vload(table, 0)
    for k0 in range(0, K, kc):
        k1 = min(K, k0 + kc)
        for bb in range(nb):
            _dequant_rows(w, wbs, tab, sc, zf, sbs, zmode, G, b0 + bb, k0, k1, rnd, tile, bb * BLOCK_COLS, ld)
        if sgemm_fn != 0:
            sgemm(sgemm_fn, M, width, k1 - k0, x, k0, K, tile, 0, ld, np.float32(0.0 if k0 == 0 else 1.0),
                  out, o_off, ldo)
            continue
        for j in range(0, width, 32):
            r = 0
            while r + 8 <= M:
                _mk8(x, r, k0, k1, tile, ld, j, out, o_off, ldo, k0 == 0)
                r += 8
            while r + 4 <= M:
                _mk4(x, r, k0, k1, tile, ld, j, out, o_off, ldo, k0 == 0)
                r += 4
            while r < M:
                _mk1(x, r, k0, k1, tile, ld, j, out, o_off, ldo, k0 == 0)
                r += 1


"""int4 decode GEMV (M <= 8) with AVX512_BF16 ``vdpbf16ps``, for fpmath bf16 with ``apply_to_int``.

Formula (per output ``m, n``; groups ``g`` of ``G`` consecutive ``k``)::

    y[m, n] = sum_g s[g, n] * (sum_{k in g} xb[m, k] * q[k, n]  -  z[g, n] * xs[m, g])

``xb = bf16(x)`` (round to nearest even, once per call, as the reference's
fpmath rounding), ``q`` the stored integer (s4: -8..7, u4: 0..15), ``z`` the
zero point, ``xs[m, g]`` the f32 sum of the group's ``xb``.

Why this is what bf16 fpmath permits.  The mode lets f32 data be computed as
bf16, and ``apply_to_int`` up-converts integer weights to bf16 using their
scales and zero points.  Here the integer part ``q`` is converted to bf16
exactly (|q| <= 15 needs 4 significant bits; bf16 has 8), each product
``xb * q`` is exact in f32 (8 x 8 significant bits), the products are summed
in f32, and the group's scale multiplies the group's f32 sum (the scale is a
common factor of the group's weights: ``sum_k xb (q - z) s = s sum_k xb (q - z)``).
Every value that enters a multiplication is a bf16 value (xb, q) or an f32
one (s, z), so the only rounding to bf16 is the activations'; the weights
keep more precision than ``bf16((q - z) s)`` would (that rounding, which the
reference and the prefill path apply, moves each weight by up to 2**-9
relative).  Versus the float64 value ``y64 = sum_k xb (q - z) s``::

    |y - y64| <= (G + K/G + 3) * 2**-24 * sum_k |xb_k| (|q| + |z|) |s|  +  K * 2**-126 * 16 * max |s|

The first term is f32 accumulation: ``vdpbf16ps`` adds two exact products
per lane with at most two roundings (Intel's definition: one ``+=`` per
product; a fused sum of two rounds once), i.e. at most ``G`` roundings of
the group's partial sum, one for ``z * xs`` and the subtraction, one per
scaled group sum added.  The second: ``vdpbf16ps`` treats denormal inputs and
results as zero (DAZ/FTZ), each flush moves the sum by less than 2**-126
times ``|q| <= 16`` (scaled by ``s``).  The difference from the reference
(bf16-rounded dequantized weights) adds ``2**-9 * sum_k |xb_k| |(q - z) s|``.

Layout (made once per constant weight by :func:`pack_pairs`): blocks of 128
columns; block ``b`` is one contiguous stream of ``K/2`` *pair rows* of 128
bytes: two halves of 64 bytes (columns ``64 h ..``), each 32 little-endian
16-bit words; word ``2 i + p`` holds in its nibble ``j`` the weight
``q[2 kp + p, 128 b + 64 h + 16 j + i]``.  So a 16-bit lane pair ``(2 i,
2 i + 1)`` is the ``(k, k + 1)`` pair of one column, as ``vdpbf16ps`` wants it.

Per pair row (256 weights, M = 1): 4 loads (at byte offsets 0 and 1 of each
half: the low nibble of the word loaded 1 byte further on is nibble 2),
4 shifts by 4, 8 ``vpermw`` (the 16-bit table lookup of the nibble, a 32-entry
table, value ``table[i & 15]``: ``vpermw`` reads the low 5 bits of each index
and ignores the rest) and 8 ``vdpbf16ps`` whose activation operand is an
embedded 32-bit broadcast of ``(xb[k], xb[k+1])``: 10 vector ALU operations per
128 weights, where the strict f32 kernel (:mod:`graph_api.kernels.weight_compressed.wgemv4`)
needs 20.  For 1 < M <= 8 each lookup serves 2 or 4 activation rows (16
partial sums in registers), so a row costs 4 ``vdpbf16ps`` per 128 weights.

Measured on one Zen 4 core (CPU time, weights L2-resident, 4096 x 256 s4
g128): 2.1 ns (~7.7 cycles) per 128 weights at M = 1, where the strict f32
kernel takes 3.7-3.9 ns; K = N = 4096 on one thread: 0.275 ms vs 0.507 ms.
The bound is the vector pipes: ``vdpbf16ps`` issues at most one per cycle
(4 cycles per 128 weights), and the lookups share the 256-bit FP pipes with
it (without the ``vpermw`` the loop takes 5.3 cycles, without lookups and
shifts 5.1; a ``vpternlogq`` magic-number unpack instead of ``vpermw`` costs
the same).  So one core consumes ~30 GB/s of s4 weights at M = 1 and two
about match the machine's cold read bandwidth (~63 GB/s idle).  M = 2 / 4 / 8: 3.4 / 6.5 / 11.7 ns
per 128 weights, ~1.1 cycles per ``vdpbf16ps`` plus ~1 per lookup (8-row
tiles with half the lookups measured slower: 12.9 ns at M = 8); the floor
is M x 4 ``vdpbf16ps`` per 128 weights, so M rows cost ~M/2..M times one.

Numba/LLVM never forms ``vdpbf16ps`` or ``vpermw`` from loops: :func:`vdp4`
calls ``llvm.x86.avx512.permvar.hi.512`` and
``llvm.x86.avx512bf16.dpbf16ps.512`` (LLVM 22 types its operands ``<32 x
bfloat>``; llvmlite's ``ir`` has no bfloat type, :class:`_BFloat` spells it).
The kernel is used only where the compile target has ``+avx512bf16``
(:data:`HAVE_BF16`); elsewhere ``wmatmul`` keeps its other paths.
"""
from __future__ import annotations

from dataclasses import dataclass

from graph_api.kernels.isa import ISA
from graph_api.kernels.numba_setup import numba  # noqa: F401  (configures numba first)

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from graph_api.kernels.bits import f32x16, prefetch, vfma, vload, vmul, vsplat, vstore, vsub
from graph_api.kernels import bf16dot
from graph_api.kernels.bf16dot import _BFloat
from graph_api.kernels.weight_compressed.wgemv4 import _scale4

BLOCK_COLS = 128  #: columns per block
PAIR_BYTES = 128  #: bytes per pair row of a block (two k rows of 128 nibbles)
_PF = 2048  #: software prefetch distance in bytes of the block stream (16 pair rows)


#: whether the compiled code may use vdpbf16ps and vpermw (wmatmul takes this path only then)
HAVE_BF16 = bf16dot.HAVE_BF16 and ISA.avx512


_V16 = ir.VectorType(ir.FloatType(), 16)
_I16V = ir.VectorType(ir.IntType(16), 32)
_I32V = ir.VectorType(ir.IntType(32), 16)
_I32X32 = ir.VectorType(ir.IntType(32), 32)  # shuffle mask type of a 32-lane splat
_BF32 = ir.VectorType(_BFloat(), 32)


@intrinsic
def vdp4(typingctx, acc, table, arr, idx, shift, xpair):
    """``acc + vdpbf16ps(table[(word >> shift) & 31], broadcast(xpair))`` per lane.

    ``word``: the 32 little-endian 16-bit words at byte offset ``idx`` of ``arr``'s
    buffer (64 bytes, unchecked); ``table``: 32 bf16 values as the bits of an
    f32x16; ``xpair``: two bf16 values as a 32-bit integer (low half first);
    ``shift``: 0, 4, 8 or 12.  Lane ``i`` of the result adds
    ``t[2i] * x0 + t[2i+1] * x1`` (f32 accumulation) to ``acc[i]``.
    """
    if not isinstance(arr, types.Array):
        return None
    sig = f32x16(acc, table, arr, idx, shift, xpair)

    def codegen(context, builder, signature, args):
        acc_v, tab, ary_val, i_val, sh, xp = args
        ary = context.make_array(signature.args[2])(context, builder, ary_val)
        base = builder.bitcast(ary.data, ir.IntType(8).as_pointer())
        i = context.cast(builder, i_val, signature.args[3], types.intp)
        words = builder.load(builder.bitcast(builder.gep(base, [i]), _I16V.as_pointer()), align=1)
        sh = context.cast(builder, sh, signature.args[4], types.int16)
        shv = builder.insert_element(ir.Constant(_I16V, ir.Undefined), sh, ir.IntType(32)(0))
        words = builder.lshr(words, builder.shuffle_vector(shv, shv, ir.Constant(_I32X32, [0] * 32)))
        perm = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_I16V, [_I16V, _I16V]), "llvm.x86.avx512.permvar.hi.512")
        wv = builder.call(perm, [builder.bitcast(tab, _I16V), words])
        x32 = context.cast(builder, xp, signature.args[5], types.int32)
        xv = builder.insert_element(ir.Constant(_I32V, ir.Undefined), x32, ir.IntType(32)(0))
        xv = builder.shuffle_vector(xv, xv, ir.Constant(_I32V, [0] * 16))
        dp = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_V16, [_V16, _BF32, _BF32]), "llvm.x86.avx512bf16.dpbf16ps.512")
        return builder.call(dp, [acc_v, builder.bitcast(wv, _BF32), builder.bitcast(xv, _BF32)])

    return sig, codegen


# ------------------------------------------------------------------ layout
def _bf16_bits(values) -> np.ndarray:
    """bf16 bits of values exact in bf16 (small integers)."""
    return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def lookup_table(signed: bool) -> np.ndarray:
    """32 bf16 entries ``value(i & 15)`` (s4 two's complement or u4) as 16 f32 bit patterns."""
    vals = [(i & 15) - 16 if signed and (i & 15) >= 8 else (i & 15) for i in range(32)]
    return _bf16_bits(vals).view(np.float32).copy()


def pack_pairs(q) -> np.ndarray:
    """Integer weights ``q [K, Np]`` (K even, Np a multiple of 128, values in range)
    -> the flat uint8 pair stream ``[Np/128, K/2, 2, 32 words]`` (see the module doc)."""
    K, Np = q.shape
    nblk = Np // BLOCK_COLS
    nib = (np.asarray(q).astype(np.int16) & 15).astype(np.uint16)
    t = nib.reshape(K // 2, 2, nblk, 2, 4, 16)  # [kp, p, b, h, j, i]
    words = np.zeros((K // 2, 2, nblk, 2, 16), np.uint16)  # [kp, p, b, h, i]
    for j in range(4):
        words |= t[:, :, :, :, j, :] << np.uint16(4 * j)
    words = words.transpose(2, 0, 3, 4, 1)  # [b, kp, h, i, p]: word 2i + p of half h
    # + 64 zero bytes: the kernels also load 64 bytes at byte offset 1 of the last half
    return np.concatenate([np.ascontiguousarray(words).astype("<u2").view(np.uint8).reshape(-1),
                           np.zeros(64, np.uint8)])


@dataclass
class PairsWeight:
    """A constant int4 weight prepared for this kernel (``wmatmul.prepare_bf16``).

    ``sc``/``zf`` as in the interleaved layout: flat ``[nblk, K/G, 128]`` f32
    (``zf`` a 1-element dummy without zero points); ``src`` the user's
    ``(w, scales, zps)`` for the paths that do not use the pair stream.
    """

    spec: object
    w: np.ndarray
    table: np.ndarray
    nblk: int
    sc: np.ndarray
    zf: np.ndarray
    zmode: int
    src: tuple
    bounds: tuple

    @property
    def wbs(self) -> int:
        """Bytes per block stream."""
        return self.spec.K // 2 * PAIR_BYTES

    @property
    def sbs(self) -> int:
        """Scales per block."""
        return self.spec.K // self.spec.group * BLOCK_COLS


# ------------------------------------------------------------------ activations
@njit(cache=True)
def pairs_of(xf, xb):
    """``xb[m, kp]`` = the bf16 bits of ``xf[m, 2kp]`` (low half) and ``xf[m, 2kp+1]``
    (high half); ``xf`` holds bf16 values already (the fpmath rounding), so
    taking the high 16 bits of each f32 is exact."""
    xu = xf.view(np.uint32)
    for m in range(xf.shape[0]):
        for kp in range(xb.shape[1]):
            xb[m, kp] = np.int32((xu[m, 2 * kp] >> np.uint32(16)) | (xu[m, 2 * kp + 1] & np.uint32(0xFFFF0000)))


# ------------------------------------------------------------------ kernels
@njit(cache=True)
def _blk_m1(xb, xs, w, wo, table, sc, zf, so, zmode, G, g0, g1, part, s, blk):
    """One block, groups g0..g1, M == 1: 8 partial sums and 8 accumulators in registers."""
    tab = vload(table, 0)
    zero = vsplat(np.float32(0.0))
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = zero
    last = w.shape[0] - 64
    hp = G // 2
    for g in range(g0, g1):
        p0 = p1 = p2 = p3 = p4 = p5 = p6 = p7 = zero
        r = wo + g * hp * PAIR_BYTES
        for kp in range(g * hp, g * hp + hp):
            prefetch(w, min(r + _PF, last))
            prefetch(w, min(r + _PF + 64, last))
            xv = xb[0, kp]
            p0 = vdp4(p0, tab, w, r, 0, xv)
            p1 = vdp4(p1, tab, w, r, 4, xv)
            p2 = vdp4(p2, tab, w, r + 1, 0, xv)
            p3 = vdp4(p3, tab, w, r + 1, 4, xv)
            p4 = vdp4(p4, tab, w, r + 64, 0, xv)
            p5 = vdp4(p5, tab, w, r + 64, 4, xv)
            p6 = vdp4(p6, tab, w, r + 65, 0, xv)
            p7 = vdp4(p7, tab, w, r + 65, 4, xv)
            r += PAIR_BYTES
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


@njit(inline="always", cache=True)
def _pair(xb, xs, w, r, tab, sc, zf, o, zmode, G, g, m0, acc, last):
    """Rows m0, m0 + 1 (or m0 alone) of one group, all 128 columns: 2 x 8 partial sums."""
    M = xb.shape[0]
    i1 = min(m0 + 1, M - 1)
    zero = vsplat(np.float32(0.0))
    p0 = p1 = p2 = p3 = p4 = p5 = p6 = p7 = zero
    q0 = q1 = q2 = q3 = q4 = q5 = q6 = q7 = zero
    hp = G // 2
    for kp in range(g * hp, g * hp + hp):
        prefetch(w, min(r + _PF, last))
        prefetch(w, min(r + _PF + 64, last))
        x0 = xb[m0, kp]
        x1 = xb[i1, kp]
        p0 = vdp4(p0, tab, w, r, 0, x0)
        q0 = vdp4(q0, tab, w, r, 0, x1)
        p1 = vdp4(p1, tab, w, r, 4, x0)
        q1 = vdp4(q1, tab, w, r, 4, x1)
        p2 = vdp4(p2, tab, w, r + 1, 0, x0)
        q2 = vdp4(q2, tab, w, r + 1, 0, x1)
        p3 = vdp4(p3, tab, w, r + 1, 4, x0)
        q3 = vdp4(q3, tab, w, r + 1, 4, x1)
        p4 = vdp4(p4, tab, w, r + 64, 0, x0)
        q4 = vdp4(q4, tab, w, r + 64, 0, x1)
        p5 = vdp4(p5, tab, w, r + 64, 4, x0)
        q5 = vdp4(q5, tab, w, r + 64, 4, x1)
        p6 = vdp4(p6, tab, w, r + 65, 0, x0)
        q6 = vdp4(q6, tab, w, r + 65, 0, x1)
        p7 = vdp4(p7, tab, w, r + 65, 4, x0)
        q7 = vdp4(q7, tab, w, r + 65, 4, x1)
        r += PAIR_BYTES
    _scale4(acc, m0, 0, p0, p1, p2, p3, sc, zf, o, zmode, xs, g)
    _scale4(acc, m0, 64, p4, p5, p6, p7, sc, zf, o, zmode, xs, g)
    if m0 + 1 < M:
        _scale4(acc, m0 + 1, 0, q0, q1, q2, q3, sc, zf, o, zmode, xs, g)
        _scale4(acc, m0 + 1, 64, q4, q5, q6, q7, sc, zf, o, zmode, xs, g)


@njit(cache=True)
def _blk_rows(xb, xs, w, wo, table, sc, zf, so, zmode, G, g0, g1, part, s, blk):
    """One block for 1 < M <= 8: register tiles of 16 partial sums, 4 activation
    rows x 64 columns while 3 or more rows are left (a missing fourth row
    repeats the last one and is not stored), then 2 rows x 128 columns
    (:func:`_pair`).  Each tile streams the group's pair rows from L1 and looks
    up its part of every row once for all its rows; the scaled accumulators
    live in L1, updated once per group."""
    M = xb.shape[0]
    tab = vload(table, 0)
    zero = vsplat(np.float32(0.0))
    acc = np.zeros(M * BLOCK_COLS, np.float32)
    last = w.shape[0] - 64
    hp = G // 2
    for g in range(g0, g1):
        o = so + g * BLOCK_COLS
        for m0 in range(0, M - 2, 4):  # tiles of 4 rows while 3 or more are left
            i1 = min(m0 + 1, M - 1)
            i2 = min(m0 + 2, M - 1)
            i3 = min(m0 + 3, M - 1)
            for half in range(2):
                p00 = p01 = p02 = p03 = p10 = p11 = p12 = p13 = zero
                p20 = p21 = p22 = p23 = p30 = p31 = p32 = p33 = zero
                r = wo + g * hp * PAIR_BYTES + 64 * half
                for kp in range(g * hp, g * hp + hp):
                    prefetch(w, min(r + _PF, last))
                    x0 = xb[m0, kp]
                    x1 = xb[i1, kp]
                    x2 = xb[i2, kp]
                    x3 = xb[i3, kp]
                    p00 = vdp4(p00, tab, w, r, 0, x0)
                    p10 = vdp4(p10, tab, w, r, 0, x1)
                    p20 = vdp4(p20, tab, w, r, 0, x2)
                    p30 = vdp4(p30, tab, w, r, 0, x3)
                    p01 = vdp4(p01, tab, w, r, 4, x0)
                    p11 = vdp4(p11, tab, w, r, 4, x1)
                    p21 = vdp4(p21, tab, w, r, 4, x2)
                    p31 = vdp4(p31, tab, w, r, 4, x3)
                    p02 = vdp4(p02, tab, w, r + 1, 0, x0)
                    p12 = vdp4(p12, tab, w, r + 1, 0, x1)
                    p22 = vdp4(p22, tab, w, r + 1, 0, x2)
                    p32 = vdp4(p32, tab, w, r + 1, 0, x3)
                    p03 = vdp4(p03, tab, w, r + 1, 4, x0)
                    p13 = vdp4(p13, tab, w, r + 1, 4, x1)
                    p23 = vdp4(p23, tab, w, r + 1, 4, x2)
                    p33 = vdp4(p33, tab, w, r + 1, 4, x3)
                    r += PAIR_BYTES
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
            _pair(xb, xs, w, wo + g * hp * PAIR_BYTES, tab, sc, zf, o, zmode, G, g, m0, acc, last)
    for m in range(M):
        for j in range(BLOCK_COLS):
            part[s, m, blk * BLOCK_COLS + j] = acc[m * BLOCK_COLS + j]


@njit(parallel=True, cache=True)
def gemv(xb, xs, w, wbs, table, sc, zf, sbs, zmode, G, part):
    """part[S, M, nblk*128] raw sums (S K-splits); work item = (block, K split)."""
    S, M = part.shape[0], part.shape[1]
    nblk = part.shape[2] // BLOCK_COLS
    ng = xs.shape[1]
    gps = (ng + S - 1) // S
    for t in prange(nblk * S):
        blk = t // S
        s = t % S
        g0 = min(s * gps, ng)
        g1 = min((s + 1) * gps, ng)
        if M == 1:
            _blk_m1(xb, xs, w, blk * wbs, table, sc, zf, blk * sbs, zmode, G, g0, g1, part, s, blk)
        else:
            _blk_rows(xb, xs, w, blk * wbs, table, sc, zf, blk * sbs, zmode, G, g0, g1, part, s, blk)

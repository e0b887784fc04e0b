"""Exact 8-bit integer GEMM on int16 pairs (``vpmaddwd``), for AVX2 CPUs without VNNI.

::

    C[m, n] = sum_k A[m, k] * B[k, n]          int32, exact

A holds the s8 weights, B the 8-bit data less its zero point (``x - zp``,
within [-255, 255]), both widened to int16 once (A when the weights are
packed, B while the columns are gathered).  ``vpmaddwd`` multiplies 16 int16
pairs and adds each pair into an int32 lane: 16 multiply-adds per instruction,
exact (a product is at most 255 * 128 in magnitude, a pair twice that), then
one ``vpaddd`` into the accumulator; the int32 sums are exact while
``K * 255 * 128 < 2**31`` (:func:`exact`).  No zero-point correction terms:
the zero point is subtracted as B is gathered.

Why not ``vpmaddubsw`` (u8 x s8, 32 multiply-adds): it saturates each pair
sum to int16 (255 * 127 * 2 > 32767), so it is exact only for 7-bit
operands.  Why an LLVM intrinsic: LLVM 22 (Numba 0.68) compiles the plain
tile of :mod:`graph_api.kernels.igemm` (4-byte groups, ``_tile_portable``)
on AVX2 to scalar ``imull`` / ``movzbl`` (no vector instruction in its inner
loop), and never keeps a row block of C in registers from a plain loop; the
micro-kernel below calls ``llvm.x86.avx2.pmadd.wd`` on a register tile of
``MR x NR`` = 6 x 16 int32 (12 ymm accumulators, 2 panel loads, one
broadcast: 15 of the 16 ymm registers).  Per K pair: 12 ``vpmaddwd``, 12
``vpaddd``, 2 loads, 6 broadcasts, against 24 ``vfmadd`` for the same
multiply-adds in f32: about twice the f32 GEMM's rate on Zen 3.

Layouts (int16 pairs in 32-bit words, K padded to even and N to a multiple of
NR with zeros): B panels ``bp[p, k2, j, t] = B[2*k2 + t, p*NR + j]``; A
``ap[g, k2, i, t] = A[g*MR + i, 2*k2 + t]`` (rows past M zero).
"""
from __future__ import annotations

from graph_api.kernels.isa import ISA
from graph_api.kernels.numba_setup import numba  # noqa: F401  (configures numba first)

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

#: int32 columns per packed panel (two ymm of 8 lanes)
NR = 16
#: rows per micro-kernel call (6 x 2 accumulators + 2 panel vectors + 1 broadcast of 16 ymm)
MR = 6
#: rows per parallel task (a multiple of MR)
MB = 96
#: K pairs per block: a block of a panel (KC2 * NR * 4 bytes, 16 KB) stays in L1
KC2 = 256

#: whether the compiled code may use AVX2's vpmaddwd (x86 with AVX2: every CPU this
#: project targets; tests read it to skip elsewhere)
HAVE_AVX2 = ISA.avx2


def exact(K: int, a_bound: int, b_bound: int) -> bool:
    """Whether the int16-pair GEMM is exact: operands within int16 and every partial
    sum (at most ``K * a_bound * b_bound`` in magnitude) within int32."""
    return a_bound <= 2 ** 15 - 1 and b_bound <= 2 ** 15 - 1 and K * a_bound * b_bound < 2 ** 31


# ------------------------------------------------------------------ the micro-kernel
def _tile_codegen(mr: int):
    """IR of ``c[i, j] (+)= sum_k a[i, k] * b[k, j]`` for ``mr`` rows x NR columns.

    One loop over ``k2`` pairs; the ``mr x 2`` accumulators are phis (registers);
    they start at zero when ``first`` is nonzero, else at the C values."""
    i16, i32, i64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
    v8, v16 = ir.VectorType(i32, 8), ir.VectorType(i16, 16)
    nv = NR // 8

    def codegen(context, builder, sig, args):
        aty, _, bty, _, _, cty, _, _, _ = sig.args
        a_arr, a_off, b_arr, b_off, k2, c_arr, c_off, ldc, first = args
        i8p = ir.IntType(8).as_pointer()
        a_ptr = builder.bitcast(context.make_array(aty)(context, builder, a_arr).data, i8p)
        b_ptr = builder.bitcast(context.make_array(bty)(context, builder, b_arr).data, i8p)
        c_ptr = builder.bitcast(context.make_array(cty)(context, builder, c_arr).data, i32.as_pointer())
        pmadd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8, [v16, v16]),
                                               "llvm.x86.avx2.pmadd.wd")
        cvec = [[builder.bitcast(builder.gep(c_ptr, [builder.add(c_off, builder.add(
            builder.mul(ldc, ir.Constant(i64, i)), ir.Constant(i64, 8 * j)))]), v8.as_pointer())
            for j in range(nv)] for i in range(mr)]
        is_first = builder.icmp_signed("!=", first, ir.Constant(i64, 0))
        zero_v = ir.Constant(v8, [0] * 8)
        init = [[builder.select(is_first, zero_v, builder.load(cvec[i][j], align=4))
                 for j in range(nv)] for i in range(mr)]
        a_base = builder.gep(a_ptr, [a_off])
        b_base = builder.gep(b_ptr, [b_off])
        entry = builder.block
        loop = builder.append_basic_block("pairs.loop")
        done = builder.append_basic_block("pairs.done")
        builder.cbranch(builder.icmp_signed(">", k2, ir.Constant(i64, 0)), loop, done)

        builder.position_at_end(loop)
        k = builder.phi(i64)
        acc = [[builder.phi(v8) for _ in range(nv)] for _ in range(mr)]
        bvec = builder.bitcast(builder.gep(b_base, [builder.mul(k, ir.Constant(i64, NR * 4))]), v16.as_pointer())
        bs = [builder.load(builder.gep(bvec, [ir.Constant(i64, j)]), align=1) for j in range(nv)]
        arow = builder.bitcast(builder.gep(a_base, [builder.mul(k, ir.Constant(i64, MR * 4))]), i32.as_pointer())
        undef = ir.Constant(v8, ir.Undefined)
        zeros = ir.Constant(v8, [0] * 8)
        new = []
        for i in range(mr):
            aval = builder.load(builder.gep(arow, [ir.Constant(i64, i)]), align=1)
            av = builder.shuffle_vector(builder.insert_element(undef, aval, ir.Constant(i32, 0)), undef, zeros)
            av = builder.bitcast(av, v16)
            new.append([builder.add(acc[i][j], builder.call(pmadd, [av, bs[j]])) for j in range(nv)])
        k_next = builder.add(k, ir.Constant(i64, 1))
        tail = builder.block
        builder.cbranch(builder.icmp_signed("<", k_next, k2), loop, done)
        k.add_incoming(ir.Constant(i64, 0), entry)
        k.add_incoming(k_next, tail)
        for i in range(mr):
            for j in range(nv):
                acc[i][j].add_incoming(init[i][j], entry)
                acc[i][j].add_incoming(new[i][j], tail)

        builder.position_at_end(done)
        final = [[builder.phi(v8) for _ in range(nv)] for _ in range(mr)]  # phis first
        for i in range(mr):
            for j in range(nv):
                final[i][j].add_incoming(init[i][j], entry)
                final[i][j].add_incoming(new[i][j], tail)
                builder.store(final[i][j], cvec[i][j], align=4)
        return context.get_dummy_value()

    return codegen


def _make_tile(mr: int):
    @intrinsic
    def tile(typingctx, a, a_off, b, b_off, k2, c, c_off, ldc, first):
        """``C[:mr, :NR] (+)= A[:mr, :2*k2] @ panel``: A packed from byte ``a_off``,
        the panel from byte ``b_off``; C at element ``c_off``, rows ``ldc`` apart."""
        i64 = types.int64
        return types.void(a, i64, b, i64, i64, c, i64, i64, i64), _tile_codegen(mr)

    return tile


_T1, _T2, _T3, _T4, _T5, _T6 = (_make_tile(m) for m in range(1, MR + 1))


@njit(inline="always", cache=True)
def _tile(a, a_off, bp, b_off, k2, c, c_off, ldc, first, mr):
    """Dispatch on the row count (each a separately generated micro-kernel)."""
    if mr == 6:
        _T6(a, a_off, bp, b_off, k2, c, c_off, ldc, first)
    elif mr == 5:
        _T5(a, a_off, bp, b_off, k2, c, c_off, ldc, first)
    elif mr == 4:
        _T4(a, a_off, bp, b_off, k2, c, c_off, ldc, first)
    elif mr == 3:
        _T3(a, a_off, bp, b_off, k2, c, c_off, ldc, first)
    elif mr == 2:
        _T2(a, a_off, bp, b_off, k2, c, c_off, ldc, first)
    else:
        _T1(a, a_off, bp, b_off, k2, c, c_off, ldc, first)


@njit(parallel=True, cache=True)
def gemm(ap, M, bp, k2, taps, tap_panels, wp, ow, c):
    """``c[m, y*ow + q] = sum_t sum_k A_t[m, k] * B[k, (y + t*tap_rows)*wp + q]`` for
    ``q < ow`` (int32, ``c`` C-contiguous [M, rows*ow]) from ``ap`` (``taps`` copies of
    :func:`pack_a`'s layout, one after the other) and the panels ``bp`` (:func:`pack_b`,
    or gathered in that layout), ``tap_panels = tap_rows * wp / NR``.

    A plain GEMM is ``taps = 1``, ``wp = ow = N``.  Several taps are a stride-1
    convolution on rows of ``wp`` columns (a multiple of NR): tap ``t`` (kernel row ``t``)
    reads B ``t*tap_rows`` rows of the image further, so a panel's ``taps`` products
    are one accumulation; of each row's ``wp`` columns only the first ``ow`` are kept
    (panels wholly past ``ow`` are skipped).

    Tasks are (panel, row block) pairs, panel-major, so a thread keeps its panels in
    L1/L2 while it walks the row blocks.  A panel of ``NR`` kept columns is stored
    straight into C; one partly kept sums into a [MB, NR] tile of its own, then copied."""
    N = c.shape[1]
    nrows = N // ow  # output rows
    row_panels = (wp + NR - 1) // NR
    panels = nrows * row_panels
    mblocks = (M + MB - 1) // MB
    a_tap = ((M + MR - 1) // MR) * MR * k2 * 4  # bytes of one tap's packed A
    cflat = c.reshape(-1)
    for task in prange(panels * mblocks):
        p = task // mblocks
        m0 = (task % mblocks) * MB
        m1 = min(m0 + MB, M)
        y = p // row_panels
        q0 = (p % row_panels) * NR
        if q0 >= ow:
            continue
        nn = min(NR, ow - q0)
        n0 = y * ow + q0  # the panel's first column in C
        direct = nn == NR
        ct = cflat if direct else np.empty(MB * NR, np.int32)
        for t in range(taps):
            for k0 in range(0, k2, KC2):
                k1 = min(k0 + KC2, k2)
                b_off = ((p + t * tap_panels) * k2 + k0) * NR * 4
                first = 1 if t == 0 and k0 == 0 else 0
                for r in range(m0, m1, MR):
                    a_off = t * a_tap + (r // MR * k2 + k0) * MR * 4
                    if direct:
                        _tile(ap, a_off, bp, b_off, k1 - k0, ct, r * N + n0, N, first, min(MR, m1 - r))
                    else:
                        _tile(ap, a_off, bp, b_off, k1 - k0, ct, (r - m0) * NR, NR, first, min(MR, m1 - r))
        if not direct:
            for m in range(m0, m1):
                src = ct[(m - m0) * NR:(m - m0) * NR + nn]
                dst = c[m, n0:n0 + nn]
                for j in range(nn):
                    dst[j] = src[j]


# ------------------------------------------------------------------ packing (numpy, once per operand)
def pack_a(a: np.ndarray) -> np.ndarray:
    """A [M, K] (integers within int16) as the micro-kernel's int16 pairs, flat."""
    M, K = a.shape
    k2, groups = -(-K // 2), -(-M // MR)
    a16 = np.zeros((groups * MR, 2 * k2), np.int16)
    a16[:M, :K] = a
    return np.ascontiguousarray(a16.reshape(groups, MR, k2, 2).transpose(0, 2, 1, 3)).reshape(-1)


def pack_b(b: np.ndarray) -> np.ndarray:
    """B [K, N] (integers within int16) as int16-pair panels, flat (tests; the
    convolution gathers its columns straight into this layout)."""
    K, N = b.shape
    k2, panels = -(-K // 2), -(-N // NR)
    b16 = np.zeros((2 * k2, panels * NR), np.int16)
    b16[:K, :N] = b
    return np.ascontiguousarray(b16.reshape(k2, 2, panels, NR).transpose(2, 0, 3, 1)).reshape(-1)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` as int32 [M, N], exact when :func:`exact` holds for the operands' bounds."""
    M, K = a.shape
    N = b.shape[1]
    c = np.empty((M, N), np.int32)
    gemm(pack_a(a), M, pack_b(b), -(-K // 2), 1, 0, max(N, 1), max(N, 1), c)
    return c

"""bf16 GEMM on AVX512_BF16 (``vdpbf16ps``), on the AMX kernel's packed layouts.

``C[M, N] (f32) = A[M, K] (bf16) @ B[K, N] (bf16)``, products exact, sums in f32:
the AMX kernel's contract (:mod:`graph_api.kernels.amx`) on hosts with AVX512_BF16 and
no tile unit (AMD Zen 4/5; Intel Cooper Lake).  ``vdpbf16ps`` multiplies 16 lanes of
bf16 pairs and adds both products to an f32 lane: 32 multiply-adds per instruction,
twice an f32 FMA's.

A and B are packed exactly as for AMX (:func:`amx.pack_a`, :func:`amx.pack_b`), so a
constant weight packed once serves either unit and the plans do not care which runs::

    B: per 32-column panel, per 32-deep step: two 1 KiB halves (columns 0-15, 16-31),
       each 16 rows of K pairs x 16 columns x 2 bf16  -> one zmm per (pair, half)
    A: per 32-row block, per 32-deep step: rows 0-15 then 16-31, 64 bytes a row
       (32 bf16)                                       -> one 4-byte pair per (row, pair)

Micro-kernel (:func:`_tile`): 8 rows x 32 columns of C in 16 zmm accumulators; per K
pair, two B loads, eight 4-byte broadcasts of A and 16 ``vdpbf16ps``; a 32-deep step is
unrolled.  Driver (:func:`_gemm_par`): the AMX driver's order, threads over B panels; K
in chunks whose panel slice (16 KiB) stays in L1 while it meets the chunk's row blocks
(in L2); sums between chunks in a per-block f32 buffer; the last chunk writes whole
blocks straight into C and edge blocks through a thread-local block.

``vdpbf16ps`` treats subnormal inputs as zero and flushes subnormal results (Intel's
definition; AMD's Zen 4 does the same), as ``tdpbf16ps``: results are within the f32
accumulation bound ``K * 2**-24 * sum |a b|`` (plus 2**-126 per flushed term) of the
float64 sum of the same bf16 products.

Why an LLVM intrinsic: LLVM never forms ``vdpbf16ps`` from a loop (see
:mod:`graph_api.kernels.bf16dot`).  Only compiled where ``ISA.avx512_bf16`` holds.
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (configures numba first)

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from graph_api.kernels.amx import BLOCK, TILE_ELEMS, drive
from graph_api.kernels.isa import ISA

#: the host may run the kernels below (compiling them elsewhere fails in LLVM's selector)
AVAILABLE = ISA.avx512_bf16

#: rows of C per micro-kernel call (16 accumulators, 2 B vectors, 1 broadcast of 32 zmm)
MR = 8
#: 32-deep steps per K chunk: a panel's slice of B (2 KiB a step) stays in L1 (32 KiB on
#: Zen 4) beside the A rows being multiplied
K_CHUNK = 8
#: rows of A per pass over B (their packed bf16 for one K chunk, 128 KiB, stays in L2)
M_CHUNK = 256

_STEP_BYTES = 2 * TILE_ELEMS * 2  # one 32-deep step of a packed A row block or B panel
_F32V = ir.VectorType(ir.FloatType(), 16)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


def _tile_codegen(context, builder, sig, args):
    """IR of an 8 x 32 block of C: ``dst <- (src if accumulate else 0) + steps`` 32-deep
    steps of A (8 rows at ``a``, 64 bytes apart, 2 KiB a step) and B (a panel at ``b``,
    2 KiB a step).  Addresses are plain integers."""
    from graph_api.kernels.bf16dot import _BF32

    a, b, steps, src, src_rb, dst, dst_rb, accumulate = args
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32V, [_F32V, _BF32, _BF32]),
                                        "llvm.x86.avx512bf16.dpbf16ps.512")
    vptr = _F32V.as_pointer()
    i32ptr = _I32.as_pointer()

    def at(base, offset):
        return builder.add(base, offset if isinstance(offset, ir.Value) else ir.Constant(_I64, offset))

    def c_ptr(base, rb, i, h):
        return builder.inttoptr(at(at(base, builder.mul(rb, ir.Constant(_I64, i))), 64 * h), vptr)

    keep = builder.icmp_signed("!=", accumulate, ir.Constant(_I64, 0))
    zero = ir.Constant(_F32V, [0.0] * 16)
    init = []
    for i in range(MR):
        for h in range(2):
            # the load runs only when accumulating (src may be any address otherwise)
            with builder.if_else(keep) as (then, other):
                with then:
                    then_block = builder.block
                    loaded = builder.load(c_ptr(src, src_rb, i, h), align=4)
                with other:
                    other_block = builder.block
            phi = builder.phi(_F32V)
            phi.add_incoming(loaded, then_block)
            phi.add_incoming(zero, other_block)
            init.append(phi)

    entry = builder.block
    loop = builder.append_basic_block("dpbf.loop")
    done = builder.append_basic_block("dpbf.done")
    builder.cbranch(builder.icmp_signed(">", steps, ir.Constant(_I64, 0)), loop, done)

    builder.position_at_end(loop)
    s = builder.phi(_I64)
    acc = [builder.phi(_F32V) for _ in range(2 * MR)]
    step_off = builder.mul(s, ir.Constant(_I64, _STEP_BYTES))
    a_step, b_step = at(a, step_off), at(b, step_off)
    cur = list(acc)
    undef = ir.Constant(ir.VectorType(_I32, 16), ir.Undefined)
    splat = ir.Constant(ir.VectorType(_I32, 16), [0] * 16)
    for kk in range(16):
        bv = [builder.bitcast(builder.load(builder.inttoptr(at(b_step, h * 1024 + kk * 64), vptr), align=1), _BF32)
              for h in range(2)]
        for i in range(MR):
            word = builder.load(builder.inttoptr(at(a_step, i * 64 + kk * 4), i32ptr), align=4)
            av = builder.shuffle_vector(builder.insert_element(undef, word, ir.Constant(_I32, 0)), undef, splat)
            av = builder.bitcast(av, _BF32)
            for h in range(2):
                cur[2 * i + h] = builder.call(fn, [cur[2 * i + h], av, bv[h]])
    s_next = builder.add(s, ir.Constant(_I64, 1))
    tail = builder.block
    builder.cbranch(builder.icmp_signed("<", s_next, steps), loop, done)
    s.add_incoming(ir.Constant(_I64, 0), entry)
    s.add_incoming(s_next, tail)
    for j in range(2 * MR):
        acc[j].add_incoming(init[j], entry)
        acc[j].add_incoming(cur[j], tail)

    builder.position_at_end(done)
    final = [builder.phi(_F32V) for _ in range(2 * MR)]
    for j in range(2 * MR):
        final[j].add_incoming(init[j], entry)
        final[j].add_incoming(cur[j], tail)
    for i in range(MR):
        for h in range(2):
            builder.store(final[2 * i + h], c_ptr(dst, dst_rb, i, h), align=4)
    return context.get_dummy_value()


@intrinsic
def _tile(typingctx, a, b, steps, src, src_rb, dst, dst_rb, accumulate):
    """See :func:`_tile_codegen` (all arguments int64)."""
    i64 = types.int64
    return types.void(i64, i64, i64, i64, i64, i64, i64, i64), _tile_codegen


@njit(inline="always", cache=True)
def _block(a_addr, b_addr, steps, src, src_rb, dst, dst_rb, accumulate):
    """A 32 x 32 block of C as four 8-row micro-tiles (A's rows 0-15 in one half of a
    step, 16-31 in the other, 64 bytes a row)."""
    for g in range(4):
        a_rows = a_addr + (g // 2) * 1024 + (g % 2) * 8 * 64
        _tile(a_rows, b_addr, steps, src + 8 * g * src_rb, src_rb, dst + 8 * g * dst_rb, dst_rb, accumulate)


@njit(parallel=True, cache=True, nogil=True)
def _gemm_par(a, b, c, M, N, steps, chunks, m_lo, m_hi, partial):
    """Rows ``m_lo:m_hi`` (multiples of 32) of ``C[:M, :N] = A @ B``: ``a``, ``b`` packed
    (:func:`amx.pack_a`, :func:`amx.pack_b`), ``c`` C's f32 values (flat); ``chunks`` + 1
    panel boundaries, one chunk per task; ``partial`` f32 scratch of a 32 x 32 block per
    (panel, row block) for the sums between K chunks."""
    block_bytes = steps * _STEP_BYTES
    mblocks = (m_hi - m_lo) // BLOCK
    a0 = a.ctypes.data
    b0 = b.ctypes.data
    p0 = partial.ctypes.data
    c0 = c.ctypes.data
    for t in prange(chunks.shape[0] - 1):
        blk = np.empty(BLOCK * BLOCK, np.float32)
        blk_addr = blk.ctypes.data
        for k0 in range(0, steps, K_CHUNK):
            kn = min(K_CHUNK, steps - k0)
            last = k0 + kn == steps
            acc = 1 if k0 > 0 else 0
            for p in range(chunks[t], chunks[t + 1]):
                n0 = p * BLOCK
                nn = min(BLOCK, N - n0)
                b_addr = b0 + p * block_bytes + k0 * _STEP_BYTES
                for mb in range(mblocks):
                    m0 = m_lo + mb * BLOCK
                    part = p0 + (p * mblocks + mb) * BLOCK * BLOCK * 4
                    a_addr = a0 + (m0 // BLOCK) * block_bytes + k0 * _STEP_BYTES
                    if not last:
                        _block(a_addr, b_addr, kn, part, BLOCK * 4, part, BLOCK * 4, acc)
                    elif m0 + BLOCK <= M and nn == BLOCK:  # a whole block: straight into C
                        _block(a_addr, b_addr, kn, part, BLOCK * 4, c0 + (m0 * N + n0) * 4, N * 4, acc)
                    else:  # an edge block: through the thread's block, then its rows that exist
                        _block(a_addr, b_addr, kn, part, BLOCK * 4, blk_addr, BLOCK * 4, acc)
                        for r in range(min(BLOCK, M - m0)):
                            row = (m0 + r) * N + n0
                            for j in range(nn):
                                c[row + j] = blk[r * BLOCK + j]


def gemm(a_packed: np.ndarray, b_packed: np.ndarray, c: np.ndarray, K: int, tasks: int | None = None) -> None:
    """``c[M, N] = A @ B`` with ``vdpbf16ps``: ``a_packed`` from :func:`amx.pack_a`,
    ``b_packed`` from :func:`amx.pack_b` (both of depth ``K``), ``c`` f32 [M, N]
    C-contiguous.  Requires ``ISA.avx512_bf16``."""
    if not AVAILABLE:
        raise RuntimeError("AVX512_BF16 is not available on this target")
    drive(_gemm_par, (), a_packed, b_packed, c, K, tasks, K_CHUNK, M_CHUNK)

"""bf16 GEMM on the AMX tile unit (``tdpbf16ps``), through LLVM inline assembly.

``C[M, N] (f32) = A[M, K] (bf16) @ B[K, N] (bf16)``, products exact, sums in f32.

Numba has no AMX intrinsics, but LLVM assembles inline ``asm`` once
``llvmlite.binding.initialize_native_asmparser()`` has run (``isa.amx_ready`` does it,
with Linux's grant of the tile state).  Each instruction is one inline ``asm``
statement with side effects and a memory clobber: LLVM itself never allocates the tile
registers (no AMX code of its own is generated), so their contents live from one
statement to the next.

Geometry (one *block* = 32 x 32 of C, four 16 x 16 f32 tiles, tmm0-3)::

    for k in K / 32:                       tmm4, tmm5 = A rows 0-15, 16-31, columns k*32 ..
        tmm4, tmm5 <- A                    tmm6, tmm7 = B columns 0-15, 16-31 (VNNI pairs)
        tmm6, tmm7 <- packed B             tdpbf16ps: C += A B (16 x 16 x 32 per instruction)
        tmm0 += tmm4 tmm6; tmm1 += tmm4 tmm7; tmm2 += tmm5 tmm6; tmm3 += tmm5 tmm7

A is read in place (bf16 bits, rows of ``lda`` elements, K padded to 32 with zeros,
M padded to 32); B is packed once (:func:`pack_b`) into 1 KiB tiles in the order the
kernel reads them: for each 32-column panel, for each 32-deep step, its two tiles of
16 rows (pairs of K) x 16 columns x 2 bf16.  Threads split the panels (each reads its
part of B once, keeping A in L2); each block's four tiles go to a 32 x 32 f32 buffer
of the thread's and then to the rows of C that exist.

The unit flushes subnormal inputs and results to zero (Intel's definition of
``tdpbf16ps``) and rounds its f32 sums to nearest even, in its own order: the results
differ from a float64 sum of the same bf16 products by at most the f32 accumulation
bound ``K * 2**-24 * sum |a b|`` (plus 2**-126 per flushed term).
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (configures numba first)

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from graph_api.kernels.isa import ISA

#: this process may run the kernels below (asking also initialises LLVM's assembler
#: parser, without which compiling them aborts the process); nothing here compiles a
#: kernel unless it is True: on a CPU without AMX the assembler may refuse the mnemonics
AVAILABLE = ISA.amx_bf16

#: the rows / columns of C one block covers, and the K of one tile step
BLOCK, KSTEP = 32, 32
#: uint16 elements in one packed B tile (16 rows x 32 bf16)
TILE_ELEMS = 16 * 32
#: 32-deep steps per K chunk: a B panel's chunk (32 KiB) stays in L1 while it meets
#: every row block; measured on one Sapphire Rapids core: 1.4 TFLOP/s with A and B in
#: L1/L2, 0.8 when a block streams 256 KiB of each from L2 (one step's 4 KiB of tile
#: loads take as long as its four products)
K_CHUNK = 16


def _asm(text: str, nargs: int):
    """An intrinsic that runs the assembly ``text`` with ``nargs`` integer register
    operands ($0, $1, ...), with side effects and a memory clobber."""
    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        values = [context.cast(builder, a, t, types.int64) for a, t in zip(args, sig.args)]
        fnty = ir.FunctionType(ir.VoidType(), [i64] * nargs)
        constraint = ",".join(["r"] * nargs + ["~{memory}"])
        builder.call(ir.InlineAsm(fnty, text, constraint, side_effect=True), values)
        return context.get_dummy_value()

    if nargs == 0:
        def typer(typingctx):
            return types.void(), codegen
    elif nargs == 1:
        def typer(typingctx, a):
            return (types.void(a), codegen) if isinstance(a, types.Integer) else None
    else:
        def typer(typingctx, a, b):
            return (types.void(a, b), codegen) if all(isinstance(x, types.Integer) for x in (a, b)) else None
    return intrinsic(typer)


tile_config = _asm("ldtilecfg ($0)", 1)  #: load the tile configuration at this address
prefetch_l1 = _asm("prefetcht0 ($0)", 1)  #: the cache line at this address, into L1 (never faults)
tile_release = _asm("tilerelease", 0)
zero0, zero1, zero2, zero3 = (_asm(f"tilezero %tmm{t}", 0) for t in range(4))
load0, load1, load2, load3, load4, load5, load6, load7 = (_asm(f"tileloadd ($0,$1,1), %tmm{t}", 2) for t in range(8))
store0, store1, store2, store3 = (_asm(f"tilestored %tmm{t}, ($0,$1,1)", 2) for t in range(4))
# AT&T order: tdpbf16ps src2, src1, dst (dst += src1 src2)
dot_0_4_6 = _asm("tdpbf16ps %tmm6, %tmm4, %tmm0", 0)
dot_1_4_7 = _asm("tdpbf16ps %tmm7, %tmm4, %tmm1", 0)
dot_2_5_6 = _asm("tdpbf16ps %tmm6, %tmm5, %tmm2", 0)
dot_3_5_7 = _asm("tdpbf16ps %tmm7, %tmm5, %tmm3", 0)


def tile_config_bytes() -> np.ndarray:
    """The 64-byte tile configuration (palette 1): every tile 16 rows of 64 bytes."""
    cfg = np.zeros(64, np.uint8)
    cfg[0] = 1  # palette
    colsb = cfg[16:32].view(np.uint16)
    colsb[:8] = 64
    cfg[48:56] = 16
    return cfg


@njit(inline="always", cache=True)
def _zero_c():
    """The four C tiles (tmm0-3) to zero."""
    zero0()
    zero1()
    zero2()
    zero3()


@njit(inline="always", cache=True)
def _store_c(dst, row_bytes):
    """The four C tiles as a 32 x 32 block at ``dst`` (rows of ``row_bytes``)."""
    store0(dst, row_bytes)
    store1(dst + 64, row_bytes)
    store2(dst + 16 * row_bytes, row_bytes)
    store3(dst + 16 * row_bytes + 64, row_bytes)


@njit(cache=True, nogil=True)
def _block(a_addr, b_addr, steps, src, src_row_bytes, dst, dst_row_bytes, accumulate):
    """A 32 x 32 block of C: the f32 block at ``src`` (rows of ``src_row_bytes``; zeros
    when not ``accumulate``) plus ``steps`` 32-deep steps of a packed A row block and a
    packed B panel (2 KiB a step each), stored at ``dst``."""
    if accumulate:
        load0(src, src_row_bytes)
        load1(src + 64, src_row_bytes)
        load2(src + 16 * src_row_bytes, src_row_bytes)
        load3(src + 16 * src_row_bytes + 64, src_row_bytes)
    else:
        _zero_c()
    for s in range(steps):
        load4(a_addr + s * 2048, 64)
        load5(a_addr + s * 2048 + 1024, 64)
        load6(b_addr + s * 2048, 64)
        load7(b_addr + s * 2048 + 1024, 64)
        dot_0_4_6()
        dot_1_4_7()
        dot_2_5_6()
        dot_3_5_7()
    _store_c(dst, dst_row_bytes)


@njit(parallel=True, cache=True, nogil=True)
def _gemm_par(a, b, c, M, N, steps, cfg, chunks, m_lo, m_hi, partial):
    """Rows ``m_lo:m_hi`` (multiples of 32) of ``C[:M, :N] = A @ B`` (see the module
    docstring): ``a`` and ``b`` packed, ``steps`` 32-deep steps, ``c`` C's M x N f32
    values (flat); ``chunks`` + 1 panel boundaries, one chunk per task; ``partial``:
    f32 scratch of a 32 x 32 block per (panel, row block of the rows) for the sums
    between K chunks.

    Order per task: K in chunks of ``K_CHUNK`` steps; in a chunk, each panel of B
    (32 KiB, kept in L1) meets every row block of A (the chunk's rows of A, kept in L2);
    the last chunk writes the blocks into C."""
    step_bytes = 2 * TILE_ELEMS * 2
    block_bytes = steps * step_bytes  # one packed A row block or B panel
    mblocks = (m_hi - m_lo) // BLOCK
    a0 = a.ctypes.data
    b0 = b.ctypes.data
    p0 = partial.ctypes.data
    c0 = c.ctypes.data
    for t in prange(chunks.shape[0] - 1):
        blk = np.empty(BLOCK * BLOCK, np.float32)
        blk_addr = blk.ctypes.data
        tile_config(cfg.ctypes.data)
        for k0 in range(0, steps, K_CHUNK):
            kn = min(K_CHUNK, steps - k0)
            last = k0 + kn == steps
            for p in range(chunks[t], chunks[t + 1]):
                n0 = p * BLOCK
                nn = min(BLOCK, N - n0)
                b_addr = b0 + p * block_bytes + k0 * step_bytes
                # the next panel's chunk of B (or the first of the next K chunk) comes in
                # while this one meets the row blocks: from L3 or DRAM, a tile's first
                # load otherwise waits for its 16 lines one after another
                nxt = b_addr + block_bytes if p + 1 < chunks[t + 1] else \
                    b0 + chunks[t] * block_bytes + (k0 + kn) * step_bytes
                span = (kn * step_bytes + mblocks - 1) // mblocks
                for mb in range(mblocks):
                    for off in range(mb * span, (mb + 1) * span, 64):
                        prefetch_l1(nxt + off)
                    m0 = m_lo + mb * BLOCK
                    part = p0 + (p * mblocks + mb) * BLOCK * BLOCK * 4
                    a_addr = a0 + (m0 // BLOCK) * block_bytes + k0 * step_bytes
                    if not last:
                        _block(a_addr, b_addr, kn, part, BLOCK * 4, part, BLOCK * 4, k0 > 0)
                    elif m0 + BLOCK <= M and nn == BLOCK:  # a whole block: straight into C
                        _block(a_addr, b_addr, kn, part, BLOCK * 4, c0 + (m0 * N + n0) * 4, N * 4, k0 > 0)
                    else:  # an edge block: through the thread's block, then its rows that exist
                        _block(a_addr, b_addr, kn, part, BLOCK * 4, blk_addr, BLOCK * 4, k0 > 0)
                        for r in range(min(BLOCK, M - m0)):
                            row = (m0 + r) * N + n0
                            for j in range(nn):
                                c[row + j] = blk[r * BLOCK + j]
        tile_release()


def padded(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


@njit(parallel=True, cache=True)
def _pack_b_par(b_bits, out, K, N, panels, steps):
    """``out`` (zeros) <- B's bf16 bits ``b_bits`` [K, N] in panel order."""
    for p in prange(panels):
        for s in range(steps):
            for half in range(2):
                base = ((p * steps + s) * 2 + half) * TILE_ELEMS
                for kk in range(16):
                    for j in range(16):
                        n = p * BLOCK + half * 16 + j
                        if n >= N:
                            continue
                        for e in range(2):
                            k = s * KSTEP + 2 * kk + e
                            if k < K:
                                out[base + kk * 32 + 2 * j + e] = b_bits[k, n]


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """The bf16 bits (round to nearest even) of f32 ``x``, any shape and strides."""
    out = np.empty(x.shape, np.uint16)
    _bits_flat(np.ascontiguousarray(x, dtype=np.float32).reshape(-1).view(np.uint32), out.reshape(-1))
    return out


@njit(parallel=True, cache=True)
def _bits_flat(bits, out):
    for i in prange(bits.shape[0]):
        out[i] = _bf16_rne(bits[i])


def pack_b(b_bits: np.ndarray) -> np.ndarray:
    """B's bf16 bits [K, N] (uint16, any strides) packed for :func:`gemm` (zeros pad K
    and N to multiples of 32)."""
    K, N = b_bits.shape
    panels, steps = padded(N) // BLOCK, padded(K) // KSTEP
    out = np.zeros(panels * steps * 2 * TILE_ELEMS, np.uint16)
    _pack_b_par(np.ascontiguousarray(b_bits), out, K, N, panels, steps)
    return out


@njit(inline="always", cache=True)
def _bf16_rne(bits):
    if (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000) and (bits & np.uint32(0x7FFFFF)):
        return np.uint16((bits >> np.uint32(16)) | np.uint32(0x40))  # NaN stays NaN
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return np.uint16(rounded >> np.uint32(16))


def pack_a(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """f32 ``a`` [M, K] (C-contiguous) as packed bf16 tiles (round to nearest even;
    exact where the plan rounded the values to bf16 already): for each 32-row block,
    for each 32-deep step, rows 0-15 then 16-31, each 16 x 32 bf16 (zeros pad M and K)."""
    M, K = a.shape
    if out is None:
        out = np.empty(padded(M) * padded(K), np.uint16)
    _pack_a_par(np.ascontiguousarray(a, dtype=np.float32).view(np.uint32), out, M, K)
    return out


@njit(parallel=True, cache=True)
def _pack_a_par(bits, out, M, K):
    steps = -(-K // KSTEP)
    for rb in prange(-(-M // BLOCK)):
        for s in range(steps):
            for r in range(BLOCK):
                m = rb * BLOCK + r
                base = ((rb * steps + s) * 2 + r // 16) * TILE_ELEMS + (r % 16) * 32
                for kk in range(KSTEP):
                    k = s * KSTEP + kk
                    out[base + kk] = _bf16_rne(bits[m, k]) if m < M and k < K else np.uint16(0)


def chunks_for(panels: int, tasks: int) -> np.ndarray:
    """Panel boundaries of ``tasks`` (at most ``panels``) nearly equal chunks."""
    tasks = max(1, min(tasks, panels))
    return np.linspace(0, panels, tasks + 1).round().astype(np.int64)


_CFG = tile_config_bytes()


#: rows of A per pass over B (their packed bf16 for one K chunk, 256 KiB, stays in L2)
M_CHUNK = 256


def gemm(a_packed: np.ndarray, b_packed: np.ndarray, c: np.ndarray, K: int, tasks: int | None = None) -> None:
    """``c[M, N] = A @ B`` on the AMX unit: ``a_packed`` from :func:`pack_a`,
    ``b_packed`` from :func:`pack_b` (both of depth ``K``), ``c`` f32 [M, N]
    C-contiguous.  Requires ``ISA.amx_bf16``."""
    if not ISA.amx_bf16:
        raise RuntimeError("AMX-BF16 is not available on this target")
    drive(_gemm_par, (_CFG,), a_packed, b_packed, c, K, tasks, K_CHUNK, M_CHUNK)


def drive(block_driver, extra: tuple, a_packed, b_packed, c, K: int, tasks, k_chunk: int, m_chunk: int) -> None:
    """Run a bf16 unit's parallel block driver (:func:`_gemm_par` here, ``dpbf16_gemm``'s
    on AVX512_BF16) over ``c[M, N] = A @ B``: tasks over chunks of B panels, rows in
    passes of ``m_chunk``, and the f32 scratch for the sums between K chunks of
    ``k_chunk`` steps.  ``extra``: the driver's own arguments after ``steps``."""
    M, N = c.shape
    panels = padded(N) // BLOCK
    chunks = chunks_for(panels, tasks or numba.get_num_threads() * 4)
    steps = padded(K) // KSTEP
    partial = np.empty(panels * min(padded(M), m_chunk) * BLOCK if steps > k_chunk else 1, np.float32)
    for m_lo in range(0, padded(M), m_chunk):
        block_driver(a_packed, b_packed, c.reshape(-1), M, N, steps, *extra, chunks, m_lo,
                     min(padded(M), m_lo + m_chunk), partial)


# ====================================================================== int8 (tdpbusd / tdpbsud)
# The exact 8-bit GEMM of ``kernels.igemm`` (u8 x s8 or s8 x u8 -> s32, zero points as
# int32 corrections) on the tile unit.  B is igemm's packed panel (``PackedB``: 64
# columns, rows of 4-byte K quadruples, 256 bytes a row), read in place: a B tile is 16
# quadruple rows x 16 columns of one panel at a row stride of 256 bytes.  A is packed
# per call into 16 x 64-byte tiles (:func:`pack_a8`), K padded with zeros to 64: the
# B rows past K (the next panel's, or the panel array's zero tail) meet zero bytes of A.
dot8_0_4_6 = _asm("tdpbusd %tmm6, %tmm4, %tmm0", 0)
dot8_1_4_7 = _asm("tdpbusd %tmm7, %tmm4, %tmm1", 0)
dot8_2_5_6 = _asm("tdpbusd %tmm6, %tmm5, %tmm2", 0)
dot8_3_5_7 = _asm("tdpbusd %tmm7, %tmm5, %tmm3", 0)
dots8_0_4_6 = _asm("tdpbsud %tmm6, %tmm4, %tmm0", 0)
dots8_1_4_7 = _asm("tdpbsud %tmm7, %tmm4, %tmm1", 0)
dots8_2_5_6 = _asm("tdpbsud %tmm6, %tmm5, %tmm2", 0)
dots8_3_5_7 = _asm("tdpbsud %tmm7, %tmm5, %tmm3", 0)
#: bytes of K one int8 step covers (a tile row), and the bytes igemm's panel rows hold
KSTEP8, PANEL_ROW = 64, 256
#: zero bytes igemm's packed panels need after their end for the last step's tile rows
B8_TAIL = 16 * PANEL_ROW


@njit(cache=True, nogil=True)
def _block8(a_addr, b_addr, steps, dst, a_unsigned):
    """A 32 x 32 int32 block (rows of 128 bytes at ``dst``) = ``steps`` 64-deep steps of
    a packed A row block (2 KiB a step) times 32 columns of a B panel (16 quadruple
    rows a step: 4 KiB of the panel, two 16-column tiles)."""
    _zero_c()
    for s in range(steps):
        load4(a_addr + s * 2048, 64)
        load5(a_addr + s * 2048 + 1024, 64)
        load6(b_addr + s * 16 * PANEL_ROW, PANEL_ROW)
        load7(b_addr + s * 16 * PANEL_ROW + 64, PANEL_ROW)
        if a_unsigned:
            dot8_0_4_6()
            dot8_1_4_7()
            dot8_2_5_6()
            dot8_3_5_7()
        else:
            dots8_0_4_6()
            dots8_1_4_7()
            dots8_2_5_6()
            dots8_3_5_7()
    _store_c(dst, 128)


@njit(parallel=True, cache=True, nogil=True)
def _igemm_par(ap, M, bp, k4, colterm, cb, rowsum, a_unsigned, c, cfg):
    """``C[m, n] = (A @ B')[m, n] + colterm[n] - cb[n] * rowsum[m]`` (int32, wrapping),
    igemm's contract: ``ap`` from :func:`pack_a8`, ``bp`` igemm's packed panels (with
    :data:`B8_TAIL` zero bytes after them), ``c`` int32 [M, N] (any row stride).
    Tasks: 32-column halves of the 64-column panels; each walks every row block."""
    N = c.shape[1]
    steps = -(-k4 * 4 // KSTEP8)
    halves = -(-N // 32)
    mblocks = -(-M // BLOCK)
    a0 = ap.ctypes.data
    b0 = bp.ctypes.data
    for h in prange(halves):
        blk = np.empty(BLOCK * BLOCK, np.int32)
        tile_config(cfg.ctypes.data)
        p = h // 2
        n0 = h * 32
        nn = min(32, N - n0)
        b_addr = b0 + p * k4 * PANEL_ROW + (h % 2) * 128
        col = colterm[n0:n0 + nn]
        cbn = cb[n0:n0 + nn]
        for mb in range(mblocks):
            _block8(a0 + mb * steps * 2048, b_addr, steps, blk.ctypes.data, a_unsigned)
            m0 = mb * BLOCK
            for r in range(min(BLOCK, M - m0)):
                corr = rowsum[m0 + r]
                src = blk[r * BLOCK:r * BLOCK + nn]
                dst = c[m0 + r, n0:n0 + nn]
                for j in range(nn):
                    dst[j] = np.int32(src[j] + col[j] - cbn[j] * corr)
        tile_release()


@njit(parallel=True, cache=True)
def _pack_a8_par(a, out, rowsum, M, K, want_rowsum):
    """Row by row: each 64-byte piece of a row is one slice copy (a byte loop with the
    bounds tests inside cost as much as the GEMM at K = 384)."""
    steps = -(-K // KSTEP8)
    for rb in prange(-(-M // BLOCK)):
        for r in range(BLOCK):
            m = rb * BLOCK + r
            for s in range(steps):
                base = ((rb * steps + s) * 2 + r // 16) * 1024 + (r % 16) * 64
                k0 = s * KSTEP8
                n = min(KSTEP8, K - k0) if m < M else 0
                if n > 0:
                    out[base:base + n] = a[m, k0:k0 + n]
                out[base + n:base + KSTEP8] = 0
            if want_rowsum and m < M:
                total = 0
                row = a[m]
                for k in range(K):
                    total += np.int32(row[k])
                rowsum[m] = total


def pack_a8(a: np.ndarray, rowsum: np.ndarray, want_rowsum: bool, out: np.ndarray | None = None) -> np.ndarray:
    """u8/s8 ``a`` [M, K] as int8 tiles (the layout of :func:`pack_a`, 64 bytes of K a
    tile row, zeros past M and K) and, when wanted, its row sums into ``rowsum``."""
    M, K = a.shape
    size = padded(M) * -(-K // KSTEP8) * KSTEP8
    if out is None:
        out = np.empty(size, a.dtype)
    _pack_a8_par(a, out[:size], rowsum, M, K, want_rowsum)
    return out


def igemm(ap, M, bp, k4, colterm, cb, rowsum, a_unsigned, c) -> None:
    """:func:`_igemm_par` (requires ``ISA.amx_int8``)."""
    if not ISA.amx_int8:
        raise RuntimeError("AMX-INT8 is not available on this target")
    _igemm_par(ap, M, bp, k4, colterm, cb, rowsum, a_unsigned, c, _CFG)

"""Exact 8-bit integer GEMM on AVX-512 VNNI (``vpdpbusd``), in Numba.

::

    C[m, n] = sum_k (A[m, k] - za) * (B[k, n] - zb[n])          int32, exact

A is u8 or s8 (the activations, used as they are), B is s8 or u8 (the
weights, packed once into :class:`PackedB`).  ``vpdpbusd`` multiplies
unsigned bytes by signed bytes, four per 32-bit lane, and adds the four
products to the lane: 64 multiply-adds per instruction.  B is stored with the
signedness opposite to A's (u8 x s8 or s8 x u8), flipping its top bit when
needed, and the zero points come out of the sum exactly::

    B'  = B - offb          offb = +-128 when B's signedness is flipped, else 0
    C   = A @ B' - cb[n] * rowsum(A)[m] - za * colsum(B')[n] + K * za * cb[n]
    cb  = zb - offb         (the expansion of (A - za)(B' - cb))

All of it is int32 arithmetic, exact modulo 2**32, so exact whenever the
partial sums (``|A @ B'| <= K * 255 * 128``) and the result fit:
:func:`exact_in_int32` says when (K up to 33025 whatever the values); callers
keep another path beyond.

Why an LLVM intrinsic: LLVM 22 (Numba 0.68) vectorises the plain loop
``acc += int32(a[k]) * int32(b[k])`` into ``vpmovzxbd`` + ``vpmovsxbd`` +
``vpdpwssd`` (16 multiply-adds per instruction, 12 instructions per 64 MACs)
and never forms ``vpdpbusd`` from a loop, whatever the layout; the
micro-kernel below calls ``llvm.x86.avx512.vpdpbusd.512`` directly (1.7
instructions per 64 MACs: per two K steps of 6 rows, 48 vpdpbusd, 12 broadcasts,
8 panel loads).  Machines without AVX-512 VNNI run the portable
loop (:func:`_tile_portable`), same results.

Layout (oneDNN's VNNI weight layout): ``bp[p, k4, j, t] = B'[4*k4 + t, p*NR + j]``,
``NR`` = 64 columns per panel (four zmm), K padded to a multiple of 4 and N to
a multiple of NR with zeros.  The micro-kernel keeps ``MR x 4`` accumulators
(MR <= 6 rows) in registers and broadcasts 4 bytes of each A row per step;
A is repacked per call with the rows of a micro-tile interleaved (:func:`_pack_a`).
Parallel tasks are (64-column panel, 96-row block) pairs; K is walked in
blocks of KC bytes so a block of the panel stays in L1.
"""
from __future__ import annotations

from graph_api.kernels.isa import ISA
from graph_api.kernels.numba_setup import numba  # noqa: F401  (configures numba first)


import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from graph_api.kernels import scratch

#: columns per packed panel (4 zmm of 16 int32 lanes)
NR = 64
#: rows per micro-kernel call (6 x 4 accumulators + 4 B vectors + 1 broadcast of 32 zmm)
MR = 6
#: rows per parallel task (a multiple of MR)
MB = 96


#: whether the compiled code may use vpdpbusd (tests switch it off to run the portable kernel)
HAVE_VNNI = ISA.avx512_vnni


# ------------------------------------------------------------------ the micro-kernel
def _vnni_tile_codegen(mr: int, a_unsigned: bool):
    """IR of ``c[i, j] (+)= sum_k a[i, k] * b[k, j]`` for ``mr`` rows x NR columns.

    One loop over ``k4`` groups of 4; ``mr x NR/16`` accumulators are phis (registers);
    they start at zero when ``first`` is nonzero, else at the C values.
    """
    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    v16 = ir.VectorType(i32, 16)
    nv = NR // 16

    def codegen(context, builder, sig, args):
        aty, _, bty, _, _, cty, _, _, _ = sig.args
        a_arr, a_off, b_arr, b_off, k4, c_arr, c_off, ldc, first = args
        a_ptr = context.make_array(aty)(context, builder, a_arr).data
        b_ptr = context.make_array(bty)(context, builder, b_arr).data
        c_ptr = context.make_array(cty)(context, builder, c_arr).data
        a_ptr = builder.bitcast(a_ptr, i8.as_pointer())
        b_ptr = builder.bitcast(b_ptr, i8.as_pointer())
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [v16, v16, v16]),
                                            "llvm.x86.avx512.vpdpbusd.512")
        c_ptr = builder.bitcast(c_ptr, i32.as_pointer())
        cvec = [[builder.bitcast(builder.gep(c_ptr, [builder.add(c_off, builder.add(
            builder.mul(ldc, ir.Constant(i64, i)), ir.Constant(i64, 16 * j)))]), v16.as_pointer())
            for j in range(nv)] for i in range(mr)]
        is_first = builder.icmp_signed("!=", first, ir.Constant(i64, 0))
        zero_v = ir.Constant(v16, [0] * 16)
        init = [[builder.select(is_first, zero_v, builder.load(cvec[i][j], align=4))
                 for j in range(nv)] for i in range(mr)]
        a_rows = [builder.gep(a_ptr, [builder.add(a_off, ir.Constant(i64, 4 * i))]) for i in range(mr)]
        b_base = builder.gep(b_ptr, [b_off])
        entry = builder.block
        loop = builder.append_basic_block("vnni.loop")
        done = builder.append_basic_block("vnni.done")
        builder.cbranch(builder.icmp_signed(">", k4, ir.Constant(i64, 0)), loop, done)

        builder.position_at_end(loop)
        k = builder.phi(i64)
        acc = [[builder.phi(v16) for _ in range(nv)] for _ in range(mr)]
        boff = builder.mul(k, ir.Constant(i64, NR * 4))
        bvec = builder.bitcast(builder.gep(b_base, [boff]), v16.as_pointer())
        bs = [builder.load(builder.gep(bvec, [ir.Constant(i64, j)]), align=1) for j in range(nv)]
        aoff = builder.mul(k, ir.Constant(i64, 4 * MR))
        new = []
        undef = ir.Constant(v16, ir.Undefined)
        zeros = ir.Constant(ir.VectorType(i32, 16), [0] * 16)
        for i in range(mr):
            ap = builder.bitcast(builder.gep(a_rows[i], [aoff]), i32.as_pointer())
            aval = builder.load(ap, align=1)
            av = builder.shuffle_vector(builder.insert_element(undef, aval, ir.Constant(i32, 0)), undef, zeros)
            row = []
            for j in range(nv):
                u, s = (av, bs[j]) if a_unsigned else (bs[j], av)
                row.append(builder.call(fn, [acc[i][j], u, s]))
            new.append(row)
        k_next = builder.add(k, ir.Constant(i64, 1))
        tail = builder.block
        builder.cbranch(builder.icmp_signed("<", k_next, k4), loop, done)
        k.add_incoming(ir.Constant(i64, 0), entry)
        k.add_incoming(k_next, tail)
        for i in range(mr):
            for j in range(nv):
                acc[i][j].add_incoming(init[i][j], entry)
                acc[i][j].add_incoming(new[i][j], tail)

        builder.position_at_end(done)
        final = [[builder.phi(v16) for _ in range(nv)] for _ in range(mr)]  # phis first
        for i in range(mr):
            for j in range(nv):
                final[i][j].add_incoming(init[i][j], entry)
                final[i][j].add_incoming(new[i][j], tail)
                builder.store(final[i][j], cvec[i][j], align=4)
        return context.get_dummy_value()

    return codegen


def _make_tile(mr: int, a_unsigned: bool):
    @intrinsic
    def tile(typingctx, a, a_off, b, b_off, k4, c, c_off, ldc, first):
        """``C[:mr, :NR] (+)= A[:mr, :4*k4] @ panel``: A packed from byte ``a_off``,
        the panel from byte ``b_off``; C at element ``c_off``, rows ``ldc`` apart."""
        i64 = types.int64
        sig = types.void(a, i64, b, i64, i64, c, i64, i64, i64)
        return sig, _vnni_tile_codegen(mr, a_unsigned)

    return tile


_T1u, _T2u, _T3u, _T4u, _T5u, _T6u = (_make_tile(m, True) for m in range(1, MR + 1))
_T1s, _T2s, _T3s, _T4s, _T5s, _T6s = (_make_tile(m, False) for m in range(1, MR + 1))


@njit(inline="always", cache=True)
def _tile_vnni(a, a_off, bp, b_off, k4, c, c_off, ldc, first, mr, a_unsigned):
    """Dispatch on the row count (each a separately generated micro-kernel)."""
    args = (a, a_off, bp, b_off, k4, c, c_off, ldc, first)
    if a_unsigned:
        if mr == 6:
            _T6u(*args)
        elif mr == 5:
            _T5u(*args)
        elif mr == 4:
            _T4u(*args)
        elif mr == 3:
            _T3u(*args)
        elif mr == 2:
            _T2u(*args)
        else:
            _T1u(*args)
    else:
        if mr == 6:
            _T6s(*args)
        elif mr == 5:
            _T5s(*args)
        elif mr == 4:
            _T4s(*args)
        elif mr == 3:
            _T3s(*args)
        elif mr == 2:
            _T2s(*args)
        else:
            _T1s(*args)


@njit(inline="always", cache=True)
def _tile_portable(a, a_off, bp, b_off, k4, c, c_off, ldc, first, mr):
    """The same tile in plain Numba (LLVM vectorises it with vpmaddwd / vpdpwssd)."""
    for i in range(mr):
        crow = c_off + i * ldc
        if first:
            c[crow:crow + NR] = 0
        for kk in range(k4):
            base = b_off + kk * NR * 4
            at = a_off + kk * MR * 4 + i * 4
            a0 = np.int32(a[at])
            a1 = np.int32(a[at + 1])
            a2 = np.int32(a[at + 2])
            a3 = np.int32(a[at + 3])
            for j in range(NR):
                p = base + 4 * j
                c[crow + j] = np.int32(c[crow + j] + a0 * np.int32(bp[p]) + a1 * np.int32(bp[p + 1])
                                       + a2 * np.int32(bp[p + 2]) + a3 * np.int32(bp[p + 3]))


@njit(inline="always", cache=True)
def _pack_a_kernel(a32, M, k4, ap32):
    """``ap32[g, kk, i] = a32[g*MR + i, kk]`` (zeros past M): 4-byte words of A
    with the rows of one micro-tile interleaved, so the micro-kernel reads A
    sequentially (rows of A a power of two apart would share L1 sets)."""
    for g in prange((M + MR - 1) // MR):
        base = g * k4 * MR
        for i in range(MR):
            m = g * MR + i
            if m < M:
                for kk in range(k4):
                    ap32[base + kk * MR + i] = a32[m, kk]
            else:
                for kk in range(k4):
                    ap32[base + kk * MR + i] = 0


@njit(inline="always", cache=True)
def _rowsum_kernel(a, rowsum):
    for m in prange(a.shape[0]):
        s = 0
        for k in range(a.shape[1]):
            s += np.int32(a[m, k])
        rowsum[m] = s


#: below this many bytes of A, packing runs serially (a parallel launch costs more)
PACK_SERIAL_BELOW = 1 << 20


@njit(parallel=True, cache=True)
def _pack_a_par(a32, M, k4, ap32):
    _pack_a_kernel(a32, M, k4, ap32)


@njit(cache=True)
def _pack_a_ser(a32, M, k4, ap32):
    _pack_a_kernel(a32, M, k4, ap32)


@njit(parallel=True, cache=True)
def _rowsum_par(a, rowsum):
    _rowsum_kernel(a, rowsum)


@njit(cache=True)
def _rowsum_ser(a, rowsum):
    _rowsum_kernel(a, rowsum)


def _pack_a(a: np.ndarray, k4: int, rowsum, want_rowsum: bool) -> np.ndarray:
    """A packed for the micro-kernel (a flat byte array), and its row sums when wanted."""
    M, K = a.shape
    if K != 4 * k4 or not a.flags.c_contiguous:
        buf = scratch.empty((M, 4 * k4), a.dtype)
        buf[:, :K] = a
        buf[:, K:] = 0
        a = buf
    serial = a.size < PACK_SERIAL_BELOW
    ap = scratch.empty(-(-M // MR) * MR * k4 * 4, a.dtype)
    (_pack_a_ser if serial else _pack_a_par)(a.view(np.int32), M, k4, ap.view(np.int32))
    if want_rowsum:
        (_rowsum_ser if serial else _rowsum_par)(a, rowsum)
    return ap


#: K bytes per block: the block of a 64-column panel (KC * 64 bytes) stays in L1
KC = 256


def _make_gemm(vnni: bool, parallel: bool):
    """The parallel driver over (panel, row block) tasks, on one micro-kernel kind.

    Separate functions per micro-kernel (the VNNI one must never be compiled for
    a CPU without it) and per threading (small GEMMs run serially: a parallel
    launch costs more).  The task body stays inline in each driver, so the
    micro-kernels compile once per driver: as a compiled function of its own,
    called by both, it made the GEMM 1.5-1.7x slower (512x384x1536 1.33 ->
    2.27 ms, quiet; with its tile buffer allocated inside, still 1.96 ms).
    """

    @njit(parallel=parallel, cache=True)
    def gemm(ap, M, bp, k4, colterm, cb, rowsum, a_unsigned, c):
        """``C[m, n] = (A @ B')[m, n] + colterm[n] - cb[n] * rowsum[m]`` (int32, wrapping).

        ``ap`` A packed by :func:`_pack_a`, ``bp`` the flat packed panels, ``c``
        int32 [M, N].  Task order: panel-major, so a thread keeps its B panel in
        cache while it walks the row blocks; each task sums into its own
        contiguous [MB, NR] tile and writes it to C once, with the corrections.
        """
        # ``parallel`` read here makes it a closure cell: Numba's on-disk cache keys a
        # closure on its bytecode and cell values, not on its decorator, so without
        # it the serial and the parallel driver shared one cache entry and a process
        # could load the serial code as the parallel driver (the int8 ResNet block
        # ran 1.6-2.3x slower from a cache the test suite had filled)
        threads_wanted = parallel  # noqa: F841
        N = c.shape[1]
        panels = (N + NR - 1) // NR
        mblocks = (M + MB - 1) // MB
        kc4 = KC // 4
        for task in prange(panels * mblocks):
            p = task // mblocks
            m0 = (task % mblocks) * MB
            m1 = min(m0 + MB, M)
            n0 = p * NR
            ct = np.empty(MB * NR, np.int32)
            for q0 in range(0, k4, kc4):
                q1 = min(q0 + kc4, k4)
                b_off = (p * k4 + q0) * NR * 4
                first = 1 if q0 == 0 else 0
                for r in range(m0, m1, MR):
                    mr = min(MR, m1 - r)
                    a_off = (r // MR * k4 + q0) * MR * 4
                    if vnni:
                        _tile_vnni(ap, a_off, bp, b_off, q1 - q0, ct, (r - m0) * NR, NR, first, mr, a_unsigned)
                    else:
                        _tile_portable(ap, a_off, bp, b_off, q1 - q0, ct, (r - m0) * NR, NR, first, mr)
            nn = min(NR, N - n0)
            col = colterm[n0:n0 + nn]
            cbn = cb[n0:n0 + nn]
            for m in range(m0, m1):
                corr = rowsum[m]
                # row slices: LLVM vectorises this loop; indexing c[m, n0 + j] it
                # did not (~1.8 ns per output element, more than the products at small K)
                src = ct[(m - m0) * NR:(m - m0) * NR + nn]
                dst = c[m, n0:n0 + nn]
                for j in range(nn):
                    dst[j] = np.int32(src[j] + col[j] - cbn[j] * corr)

    return gemm


_DRIVERS: dict = {}
#: GEMMs of fewer multiply-adds than this run on one thread
SERIAL_BELOW = 1 << 20


def driver(parallel: bool = True):
    """The compiled driver for this CPU (VNNI when it has it)."""
    key = (HAVE_VNNI, parallel)
    if key not in _DRIVERS:
        _DRIVERS[key] = _make_gemm(HAVE_VNNI, parallel)
    return _DRIVERS[key]


@njit(inline="always", cache=True)
def _byte(b, k, n, shift):
    """B[k, n] + shift as the low byte of a uint32, and as an integer (0 past K)."""
    if k < b.shape[0]:
        v = np.int32(b[k, n]) + shift
        return np.uint32(v & 255), v
    return np.uint32(0), 0


@njit(inline="always", cache=True)
def _pack_b_kernel(b, shift, k4, out32, colsum):
    """``out[p, kk, j, t] = B[4*kk + t, p*NR + j] + shift`` as bytes (zeros past K and N),
    and the column sums of the shifted values.  Four rows of B at a time, read
    along their contiguous rows, make one 32-bit word per column."""
    K, N = b.shape
    full = K // 4  # groups of four rows inside B: a branch-free loop LLVM vectorises
    for p in prange((N + NR - 1) // NR):
        n0 = p * NR
        nn = min(NR, N - n0)
        sums = np.zeros(NR, np.int32)  # |sum| <= K * 255: int32 for any K this GEMM serves
        for kk in range(k4):
            row = (p * k4 + kk) * NR
            k = 4 * kk
            if kk < full:
                for j in range(nn):
                    v0 = np.int32(b[k, n0 + j]) + shift
                    v1 = np.int32(b[k + 1, n0 + j]) + shift
                    v2 = np.int32(b[k + 2, n0 + j]) + shift
                    v3 = np.int32(b[k + 3, n0 + j]) + shift
                    out32[row + j] = np.uint32((v0 & 255) | ((v1 & 255) << 8) | ((v2 & 255) << 16)
                                               | ((v3 & 255) << 24))
                    sums[j] += v0 + v1 + v2 + v3
            else:
                for j in range(nn):
                    w0, v0 = _byte(b, k, n0 + j, shift)
                    w1, v1 = _byte(b, k + 1, n0 + j, shift)
                    w2, v2 = _byte(b, k + 2, n0 + j, shift)
                    w3, v3 = _byte(b, k + 3, n0 + j, shift)
                    out32[row + j] = w0 | (w1 << 8) | (w2 << 16) | (w3 << 24)
                    sums[j] += v0 + v1 + v2 + v3
            for j in range(nn, NR):
                out32[row + j] = 0
        for j in range(nn):
            colsum[n0 + j] = sums[j]


@njit(parallel=True, cache=True)
def _pack_b_par(b, shift, k4, out, colsum):
    _pack_b_kernel(b, shift, k4, out, colsum)


@njit(cache=True)
def _pack_b_ser(b, shift, k4, out, colsum):
    _pack_b_kernel(b, shift, k4, out, colsum)


# ------------------------------------------------------------------ the Python entry points
_OTHER = {np.dtype(np.uint8): np.dtype(np.int8), np.dtype(np.int8): np.dtype(np.uint8)}


class PackedB:
    """``B' = B - offb`` in VNNI panels for A of dtype ``a_dtype``, and its column terms.

    ``B'`` has the signedness opposite to A's (``vpdpbusd`` multiplies u8 by
    s8): ``offb`` is 0 when B already has it, else +-128 (a flip of the top bit).
    ``zb`` is B's zero point, per tensor or per column.
    """

    def __init__(self, b: np.ndarray, a_dtype, zb=0):
        b = np.asarray(b)
        self.a_dtype = np.dtype(a_dtype)
        if b.ndim != 2 or b.dtype not in _OTHER or self.a_dtype not in _OTHER:
            raise TypeError(f"PackedB wants a 2-D s8/u8 B and an s8/u8 A dtype, got {b.dtype} {b.shape}, {a_dtype}")
        b = np.ascontiguousarray(b)  # packed once: a copy of a strided B keeps one kernel signature per dtype
        self.K, self.N = (int(d) for d in b.shape)
        self.dtype = _OTHER[self.a_dtype]
        offb = 0 if b.dtype == self.dtype else (128 if b.dtype == np.uint8 else -128)
        self.k4 = -(-self.K // 4)
        panels = -(-self.N // NR)
        size = panels * self.k4 * NR * 4
        # a view of the head of a buffer with zeros after it: the AMX kernel's last K step
        # reads up to 16 rows past a panel (they meet A's zero padding)
        self.panels = np.zeros(size + _amx_tail(), self.dtype)[:size]
        #: column sums of B' and cb = zb - offb (B - zb = B' - cb)
        self.colsum = np.zeros(self.N, np.int64)
        (_pack_b_ser if self.K * self.N < PACK_SERIAL_BELOW else _pack_b_par)(
            b, -offb, self.k4, self.panels.view(np.uint32), self.colsum)
        self.cb = np.ascontiguousarray(np.broadcast_to(np.asarray(zb, np.int64) - offb, (self.N,)))

    def column_terms(self, za: int) -> np.ndarray:
        """``K * za * cb - za * colsum(B')`` as int32 (exact modulo 2**32, like all of C)."""
        return ((self.K * int(za)) * self.cb - int(za) * self.colsum).astype(np.int32)


def _amx_int8() -> bool:
    """GEMMs run on the AMX tile unit (``ISA.amx_int8``; tests switch it off to run VNNI)."""
    return USE_AMX and ISA.amx_int8


#: whether :func:`gemm` may use the AMX tile unit where the host has it
USE_AMX = True


def _amx_tail() -> int:
    if not ISA.amx_int8:
        return 0
    from graph_api.kernels import amx

    return amx.B8_TAIL


def exact_in_int32(K: int, a_bound: float, b_bound: float) -> bool:
    """Whether :func:`gemm` is exact: the u8 x s8 partial sums (<= K * 255 * 128)
    and the result (<= K * a_bound * b_bound, the bounds of |A - za| and |B - zb|) fit int32."""
    return K * 255 * 128 < 2 ** 31 and K * a_bound * b_bound < 2 ** 31


def gemm(a: np.ndarray, packed: PackedB, za: int = 0, out: np.ndarray | None = None) -> np.ndarray:
    """``(A - za) @ (B - zb)`` as int32 [M, N], exact (see :func:`exact_in_int32`).

    ``a`` [M, K] of ``packed.a_dtype`` (any strides); ``za`` an integer (per-tensor
    zero point); ``out`` an optional int32 [M, N] array (any row stride).
    """
    M, K = a.shape
    if K != packed.K or a.dtype != packed.a_dtype:
        raise ValueError(f"A {a.dtype} {a.shape} does not fit B packed for {packed.a_dtype} K={packed.K}")
    if out is None:
        out = scratch.empty((M, packed.N), np.int32)
    if M == 0 or packed.N == 0 or K == 0:
        out[...] = 0
        return out
    rowsum = np.zeros(M, np.int32)
    parallel = M * packed.N * K >= SERIAL_BELOW
    if parallel and _amx_int8():  # the tile unit (kernels/amx.py): same int32 sums, same corrections
        from graph_api.kernels import amx

        ap = amx.pack_a8(a, rowsum, bool(np.any(packed.cb)),
                         scratch.empty(amx.padded(M) * -(-K // amx.KSTEP8) * amx.KSTEP8, a.dtype))
        amx.igemm(ap, M, packed.panels, packed.k4, packed.column_terms(za), packed.cb.astype(np.int32),
                  rowsum, packed.a_dtype == np.uint8, out)
        return out
    ap = _pack_a(a, packed.k4, rowsum, bool(np.any(packed.cb)))
    driver(parallel)(ap, M, packed.panels, packed.k4, packed.column_terms(za), packed.cb.astype(np.int32),
                     rowsum, packed.a_dtype == np.uint8, out)
    return out


def int_gemm(cols: np.ndarray, w2: np.ndarray, chunk: int | None = None) -> np.ndarray:
    """``sum_j w2[g, o, j] * cols[g, j, p]`` as f64 [G*O, P], exact: the contract of
    :func:`graph_api.kernels.convolution.conv.int_gemm` on the int8 GEMM.

    ``cols`` [G, J, P] and ``w2`` [G, O, J] hold integers in f32: the weights in
    the s8 range, the columns spanning at most 256 consecutive values (8-bit
    data minus a zero point).  ``chunk`` (the f32 BLAS path's exact reduction
    length) is not needed: the int32 sums are exact up to 65793 terms; longer
    reductions are split and summed in f64 (exact below 2**53).  Per group: A = the weights (s8), B = the
    columns shifted by their minimum into u8, that shift undone as B's zero point.
    """
    G, J, P = cols.shape
    O = w2.shape[1]
    out = np.zeros((G, O, P), np.float64)
    if not out.size or not J:
        return out.reshape(G * O, P)
    span = (2 ** 31 - 1) // (128 * 255)  # |sum| <= J * 128 * 255 stays within int32
    for g in range(G):
        lo = float(cols[g].min())
        if float(cols[g].max()) - lo > 255 or float(w2[g].min()) < -128 or float(w2[g].max()) > 127:
            raise ValueError("int_gemm: operands outside the 8-bit ranges")
        w8 = w2[g].astype(np.int8)
        for j0 in range(0, J, span):
            j1 = min(j0 + span, J)
            b = (cols[g, j0:j1] - np.float32(lo)).astype(np.uint8)
            packed = PackedB(b, np.int8, zb=-int(lo))
            out[g] += gemm(w8[:, j0:j1], packed, 0)
    return out.reshape(G * O, P)

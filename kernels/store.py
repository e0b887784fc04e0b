"""One pass over a row-major ``[R, N]`` f32 result: post-op chain, conversion,
and a strided store.

``out[roff[r] + coff[n]] = convert(epilogue(acc[r, n]))`` where ``out`` is the
flat destination buffer (f32, or bf16/f16 bits as uint16) and ``roff``/``coff``
are element offsets worked out at compile time.  A reshape, transpose or
reorder of the result after the post-ops is therefore written by this store,
not by a later copy.  The epilogue program is ``graph_api.kernels.wmatmul``'s (codes of
``graph_api.postops``); strict f32, no fastmath.

Row by row (:func:`ep_row`): the row is copied into a small buffer, each
program step is one loop over it (so every loop vectorises: the step's branch
is outside the loop), then the row is stored in runs of consecutive offsets
(``contiguous_run``: the whole row, or e.g. the head dimension of a
reshape+transpose).  Evaluating the program per element instead (an op loop
inside the element loop) kept everything scalar: 7x slower for bias+GELU.
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # configures numba first

import math

import numpy as np
from numba import njit, prange

from graph_api import working_memory
from graph_api.kernels.bits import (exp32, f32_to_bf16, f32_to_f16_bits, gelu_erf32, gelu_tanh32, round_bf16, round_f16,
                                    tanh32, vadd, vload, vmax, vmul, vsplat, vstore, vsub)
from graph_api.kernels.openblas import sgemm
from graph_api.kernels.threads import split_threads
from graph_api.kernels.weight_compressed.wmatmul import _ep_steps
from graph_api.logical_tensor import dense_strides
from graph_api.postops import (ADD, EXP, GELU_ERF, GELU_TANH, LINEAR, MUL, RELU, ROUND_BF16, ROUND_F16, RSUB,
                               SIGMOID, SILU, SUB, TANH, UNARY_FIRST)

OUT_F32, OUT_BF16, OUT_F16 = 0, 1, 2
#: below this many elements one thread does it (no launch cost)
SERIAL_BELOW = 32768


@njit(inline="always", cache=True)
def _put(out, i, v, okind):
    if okind == 0:
        out[i] = v
    elif okind == 1:
        out[i] = f32_to_bf16(v)
    else:
        out[i] = f32_to_f16_bits(v)


@njit(cache=True, error_model="numpy")
def ep_row(v, r, ops, fpar, ipar, buf, orow, c0):
    """The epilogue program applied in place to ``v``, row ``r`` and columns ``c0 ..
    c0 + len(v)`` of the ``[R, N]`` result.

    One loop over the row per step (the step's branch is outside the loop, so
    the loops vectorise), the same f32 formulas as ``wmatmul._ep_steps``, except
    GELU, which is :func:`bits.gelu_erf32` / :func:`bits.gelu_tanh32` (one rational
    function each, within 4 u |x|, u = 2**-24), Tanh's :func:`bits.tanh32`,
    and the exponentials of Exp, Sigmoid and Swish, which are
    :func:`bits.exp32` (<= 2 ulp each, vectorised)
    instead of scalar libm calls (``error_model="numpy"``: IEEE divisions, no
    zero-divisor branch to stop the loops vectorising).  Steps without a loop of their own here run
    element by element in :func:`wmatmul._ep_steps`.  ``orow`` is scratch of length N (a
    scalar operand broadcast along the row).  Callers pass ``c0`` as an int64
    variable: a literal ``0`` would make Numba compile a second signature
    (``Literal[int](0)``) of this function and of its caller.
    """
    N = v.shape[0]
    for i in range(ops.shape[0]):
        op = ops[i]
        if op < UNARY_FIRST:  # binary: operand row o (the running value itself when the offset is -1)
            off = ipar[i, 0]
            if off < 0:
                o = v
            elif ipar[i, 2] == 0:
                x = buf[off + r * ipar[i, 1]]
                for n in range(N):
                    orow[n] = x
                o = orow
            else:
                o = buf[off + r * ipar[i, 1] + c0:off + r * ipar[i, 1] + c0 + N]
            if op == ADD:
                for n in range(N):
                    v[n] = v[n] + o[n]
            elif op == MUL:
                for n in range(N):
                    v[n] = v[n] * o[n]
            elif op == SUB:
                for n in range(N):
                    v[n] = v[n] - o[n]
            elif op == RSUB:
                for n in range(N):
                    v[n] = o[n] - v[n]
            else:
                _ep_steps(v, r, c0, ops[i:i + 1], fpar[i:i + 1], ipar[i:i + 1], buf)
        elif op == GELU_ERF:
            for n in range(N):
                v[n] = gelu_erf32(v[n])
        elif op == RELU:  # x * 0 below 0 (NaN at -inf), as _ep_steps
            # as a product with the comparison, not ``x if x > 0 else x * 0``: LLVM turns
            # that select, which leaves v[n] unchanged when x > 0, into a masked store
            # (vmaskmovps), microcoded on AMD's AVX2 cores: ReLU ran 3.5x slower than
            # a plain copy on Zen 3.  Same values: x * 1 = x, x * 0 as before.
            for n in range(N):
                x = v[n]
                v[n] = x * np.float32(x > np.float32(0.0))
        elif op == GELU_TANH:
            for n in range(N):
                v[n] = gelu_tanh32(v[n])
        elif op == TANH:
            for n in range(N):
                v[n] = tanh32(v[n])
        elif op == EXP:
            for n in range(N):
                v[n] = exp32(v[n])
        elif op == SIGMOID:  # oneDNN's logistic: 0 once exp(-x) overflows, and for NaN
            for n in range(N):
                x = v[n]
                y = np.float32(1.0) / (np.float32(1.0) + exp32(-x))
                v[n] = y if -x < np.float32(88.72283172607421875) else np.float32(0.0)
        elif op == SILU:
            a = fpar[i, 0]
            for n in range(N):
                x = v[n]
                v[n] = x / (np.float32(1.0) + exp32(-a * x))
        elif op == LINEAR:
            a, b = fpar[i, 0], fpar[i, 1]
            for n in range(N):
                v[n] = a * v[n] + b
        elif op == ROUND_BF16:
            for n in range(N):
                v[n] = round_bf16(v[n])
        elif op == ROUND_F16:
            for n in range(N):
                v[n] = round_f16(v[n])
        else:
            _ep_steps(v, r, c0, ops[i:i + 1], fpar[i:i + 1], ipar[i:i + 1], buf)


@njit(inline="always", cache=True)
def _put_run(v, n0, n1, out, b, okind):
    """out[b + n] = convert(v[n]) for n in [n0, n1): one loop per output type over
    slices indexed from 0 (no negative-index wraparound: the loops vectorise)."""
    src = v[n0:n1]
    dst = out[b + n0:b + n1]
    if okind == 0:
        for n in range(src.shape[0]):
            dst[n] = src[n]
    elif okind == 1:
        for n in range(src.shape[0]):
            dst[n] = f32_to_bf16(src[n])
    else:
        for n in range(src.shape[0]):
            dst[n] = f32_to_f16_bits(src[n])


@njit(inline="always", cache=True)
def put_dense(v, out, base, okind):
    """out[base + n] = convert(v[n]) for the whole row."""
    _put_run(v, 0, v.shape[0], out, base, okind)


@njit(inline="always", cache=True)
def _put_row(v, out, base, coff, run, okind):
    """out[base + coff[n]] = convert(v[n]); coff is contiguous within runs of ``run``."""
    N = v.shape[0]
    for j in range(0, N, run):
        _put_run(v, j, j + run, out, base + coff[j] - j, okind)


@njit(cache=True)
def _store_block(acc, head, out, roff, coff, run, okind, ops, fpar, ipar, buf, r0, r1, bad):
    """Rows ``r0 .. r1`` of ``acc`` through the epilogue into ``out``.  With a non-empty
    ``bad`` (one flag per row): a row of ``acc`` holding an inf or a NaN is not stored
    and gets ``bad[r] = 1`` (checked once the row is in L1, instead of a pass of its own
    over the tile)."""
    N = acc.shape[1]
    v = np.empty(N, np.float32)
    orow = np.empty(N, np.float32)
    check = bad.shape[0] > 0
    for r in range(r0, r1):
        row = acc[r]
        if head.shape[0]:  # the head's own bias, added as the row is read
            for n in range(N):
                v[n] = row[n] + head[n]
        else:
            for n in range(N):
                v[n] = row[n]
        if check:
            if _finite(row, 0, N):
                bad[r] = 0
            else:
                bad[r] = 1
                continue
        ep_row(v, r, ops, fpar, ipar, buf, orow, np.int64(0))
        _put_row(v, out, roff[r], coff, run, okind)


@njit(parallel=True, cache=True)
def _store_par(acc, head, out, roff, coff, run, okind, ops, fpar, ipar, buf, blocks, bad):
    """_store_block over ``blocks`` row blocks; ``bad``: :data:`NO_ROWS`, passed in (a global
    array would be a read-only constant here: another _store_block signature)."""
    R = acc.shape[0]
    step = (R + blocks - 1) // blocks
    for b in prange(blocks):
        _store_block(acc, head, out, roff, coff, run, okind, ops, fpar, ipar, buf, b * step,
                     min(R, b * step + step), bad)


#: no bias row before the epilogue
NO_HEAD = np.zeros(0, np.float32)
#: no per-row overflow flags (the store checks nothing)
NO_ROWS = np.zeros(0, np.uint8)


@njit(cache=True, nogil=True)
def _tile_block(acc, out, n0, okind, ops, fpar, ipar, buf, r0, r1):
    C = min(acc.shape[1], out.shape[1] - n0)
    v = np.empty(C, np.float32)
    orow = np.empty(C, np.float32)
    for r in range(r0, r1):
        row = acc[r]
        for n in range(C):
            v[n] = row[n]
        ep_row(v, r, ops, fpar, ipar, buf, orow, n0)
        put_dense(v, out[r], n0, okind)


@njit(parallel=True, cache=True, nogil=True)
def _tile_par(acc, out, n0, okind, ops, fpar, ipar, buf, blocks):
    R = acc.shape[0]
    step = (R + blocks - 1) // blocks
    for b in prange(blocks):
        _tile_block(acc, out, n0, okind, ops, fpar, ipar, buf, b * step, min(R, b * step + step))


def store_tile(acc, out, n0, okind, ep) -> None:
    """``out[r, n0 + j] = convert(epilogue(acc[r, j]))`` for the columns inside ``out``
    (``out``: [R, N] f32 or bf16/f16 bits; ``acc``: an f32 column panel of the result,
    maybe wider than what is left of N)."""
    R = acc.shape[0]
    if acc.size < SERIAL_BELOW:
        _tile_block(acc, out, n0, okind, ep.ops, ep.fpar, ep.ipar, ep.buf, 0, R)
    else:
        _tile_par(acc, out, n0, okind, ep.ops, ep.fpar, ep.ipar, ep.buf, max(1, min(R, 4 * numba.get_num_threads())))


@njit(cache=True)
def _abs_max_flat(x):
    """max |x| of a flat C-contiguous f32 array in one read (16-lane running maxima of x
    and of -x); NaN when x holds an inf or a NaN (their x * 0 is NaN: a sum of those
    products stays 0 only for finite x)."""
    n = x.shape[0]
    z = vsplat(np.float32(0.0))
    hi = z
    lo = z
    bad = z
    n16 = n - n % 16
    for i in range(0, n16, 16):
        v = vload(x, i)
        hi = vmax(hi, v)
        lo = vmax(lo, vsub(z, v))
        bad = vadd(bad, vmul(v, z))
    lanes = np.empty(48, np.float32)
    vstore(lanes, 0, hi)
    vstore(lanes, 16, lo)
    vstore(lanes, 32, bad)
    m = np.float32(0.0)
    s = np.float32(0.0)
    for j in range(16):
        m = max(m, max(lanes[j], lanes[16 + j]))
        s += lanes[32 + j]
    for i in range(n16, n):
        m = max(m, abs(x[i]))
        s += x[i] * np.float32(0.0)
    return m if s == 0 else np.float32(np.nan)


def abs_max(x) -> float:
    """max |x| over an f32 array (0 when empty); NaN when it holds an inf or a NaN.
    One read for a C-contiguous array, numpy's max and min otherwise."""
    if not x.size:
        return 0.0
    if x.dtype == np.float32 and x.flags.c_contiguous:
        return float(_abs_max_flat(x.reshape(-1)))
    # a NaN makes both NaN, and max() returns its first argument when it is NaN
    m = max(float(np.max(x)), -float(np.min(x)))
    return m if m < np.inf else float("nan")


def contiguous_run(coff) -> int:
    """The longest ``L`` dividing N with ``coff`` consecutive within each run of L columns."""
    N = coff.shape[0]
    if N == 0:
        return 1
    step = np.flatnonzero(np.diff(coff) != 1) + 1  # where a run breaks
    run = N
    for b in step:
        run = math.gcd(run, int(b))
    return max(run, 1)


def store(acc2d, out_flat, roff, coff, okind, ep, run: int | None = None, head=NO_HEAD) -> None:
    """Apply epilogue ``ep`` to ``acc2d`` (f32 [R, N]) and store through the offsets
    (``run``: :func:`contiguous_run` of ``coff`` when the caller knows it).  ``head``: an
    f32 [N] row added to every row before the epilogue (a MatMul's bias: one f32 add,
    as the epilogue's add step, without a pass of its own or a place in its buffer)."""
    store_runner(acc2d, out_flat, roff, coff, okind, ep, run, head)()


def store_runner(acc2d, out_flat, roff, coff, okind, ep, run: int | None = None, head=NO_HEAD):
    """:func:`store` on these arrays as a callable, its argument list made once (for a
    caller that stores the same memory again and again; the values may change)."""
    R, N = acc2d.shape
    if run is None:
        run = contiguous_run(coff)
    if acc2d.size < SERIAL_BELOW:
        fn, args = _store_block, (acc2d, head, out_flat, roff, coff, run, okind, ep.ops, ep.fpar, ep.ipar, ep.buf, 0, R,
                                  NO_ROWS)
    else:
        fn, args = _store_par, (acc2d, head, out_flat, roff, coff, run, okind, ep.ops, ep.fpar, ep.ipar, ep.buf,
                                min(R, 4 * numba.get_num_threads()), NO_ROWS)

    def runner() -> None:
        fn(*args)

    return runner


@njit(cache=True)
def _finite(x, i0, i1):
    """No inf or NaN in the flat f32 ``x[i0:i1]`` (16-lane sums of x * 0, as _abs_max_flat)."""
    z = vsplat(np.float32(0.0))
    bad = z
    i = i0
    while i + 16 <= i1:
        bad = vadd(bad, vmul(vload(x, i), z))
        i += 16
    lanes = np.empty(16, np.float32)
    vstore(lanes, 0, bad)
    s = np.float32(0.0)
    for j in range(16):
        s += lanes[j]
    for j in range(i, i1):
        s += x[j] * np.float32(0.0)
    return s == 0


@njit(parallel=True, cache=True)
def _gemm_store_par(fn, a, b, head, out, roff, coff, run, okind, ops, fpar, ipar, buf, acc, rows, bad, dout):
    """Row tiles of ``a @ b`` (single-threaded sgemm at address ``fn`` per tile, one
    tile after another on each thread) each stored by _store_block while it is in
    cache; a non-empty ``dout`` (the dense f32 output, with no epilogue): the sgemm writes
    its rows itself.
    A row holding an inf or a NaN is not stored: ``bad[r] = 1`` (its f32 sums may
    have overflowed; the caller redoes it); with ``dout``, every row of such a tile."""
    R, K = a.shape
    N = b.shape[1]
    direct = dout.shape[0] > 0
    acc2 = acc[:0].reshape(0, N) if direct else acc[:R * N].reshape(R, N)
    for t in prange((R + rows - 1) // rows):
        r0 = t * rows
        r1 = min(R, r0 + rows)
        if direct:
            sgemm(fn, r1 - r0, N, K, a, r0 * K, K, b, 0, N, np.float32(0.0), dout, r0 * N, N)
            flag = 0 if _finite(dout, r0 * N, r1 * N) else 1
            for r in range(r0, r1):
                bad[r] = flag
            continue
        sgemm(fn, r1 - r0, N, K, a, r0 * K, K, b, 0, N, np.float32(0.0), acc, r0 * N, N)
        _store_block(acc2, head, out, roff, coff, run, okind, ops, fpar, ipar, buf, r0, r1, bad)


#: bytes of one row tile's f32 products in :func:`gemm_store`: each thread's rows in
#: one tile up to this (every tile re-packs B in its sgemm, so few, large tiles; the
#: epilogue then reads its tile from L2/L3, not from DRAM)
GEMM_TILE_BYTES = 4 << 20


def gemm_store(a, b, out_flat, roff, coff, okind, ep, run, head=NO_HEAD, direct=False) -> None:
    """``store(a @ b, ...)`` fused: ``a`` [R, K] and ``b`` [K, N] C-contiguous f32, the
    product in f32 by numpy's OpenBLAS sgemm, single-threaded per row tile on Numba's
    threads (OpenBLAS's own threads never run: after a GEMM they spin for ~0.1 s and took
    half of the other core from the Numba kernels that followed; measured on Zen 3:
    the BERT encoder's SDPA 22 -> 12 ms with them held off), each tile's epilogue
    store run while the tile is in cache.  Rows with an inf or a NaN (an f32 sum may
    have overflowed where the reference's float64 sum did not) are redone with float64
    sums rounded once, as the reference MatMul (with no epilogue, the whole tile of
    such a row); only those rows are written, once.
    The tile products go to the execution's scratchpad (:mod:`graph_api.kernels.scratch`).
    Requires ``openblas.available()``."""
    gemm_runner(a, b, out_flat, roff, coff, okind, ep, run, head, direct)()


def gemm_runner(a, b, out_flat, roff, coff, okind, ep, run, head=NO_HEAD, direct=False):
    """:func:`gemm_store` on these arrays as a callable: the tiling, the tile-product
    buffer (from the current scratch arena) and the argument list made once, for a
    caller that runs the same product on the same memory again and again (the values
    may change between calls)."""
    from graph_api.kernels import openblas, scratch

    R, K = a.shape
    N = b.shape[1]
    threads = split_threads()  # deterministic mode: the sgemm row tiles depend on the shapes only
    per_thread = -(-R // threads)
    tiles = threads * max(1, -(-per_thread * N * 4 // GEMM_TILE_BYTES))
    rows = -(-R // tiles)
    acc = NO_HEAD if direct else scratch.empty(R * N, np.float32)
    bad = np.zeros(R, np.uint8)
    args = (openblas.sgemm_address(), a, b, head, out_flat, roff, coff, run, okind, ep.ops, ep.fpar,
            ep.ipar, ep.buf, acc, rows, bad, out_flat if direct else NO_HEAD)
    single_threaded = openblas.single_threaded

    def runner() -> None:
        with single_threaded():
            _gemm_store_par(*args)
        if bad.any():
            _redo_rows(a, b, out_flat, roff, coff, okind, ep, run, head, direct, bad)

    return runner


def _redo_rows(a, b, out_flat, roff, coff, okind, ep, run, head, direct, bad) -> None:
    """The rows ``bad`` marks, again with float64 sums rounded once (see :func:`gemm_store`)."""
    R, N = a.shape[0], b.shape[1]
    fix = np.empty((R, N), np.float32)
    b64 = b.astype(np.float64)
    rows = np.flatnonzero(bad)
    with np.errstate(all="ignore"):
        fix[rows] = a[rows].astype(np.float64) @ b64
    # runs of consecutive marked rows, each stored as one block
    cut = np.flatnonzero(np.diff(rows) != 1) + 1
    for run_rows in np.split(rows, cut):
        r0, r1 = int(run_rows[0]), int(run_rows[-1]) + 1
        if direct:
            out_flat[r0 * N:r1 * N] = fix[r0:r1].reshape(-1)
        else:
            _store_block(fix, head, out_flat, roff, coff, run, okind, ep.ops, ep.fpar, ep.ipar, ep.buf, r0, r1,
                         NO_ROWS)


@njit(parallel=True, cache=True)
def _matmul_cols_par(fn, a, b, out, cols, bad):
    """``out[:, c0:c1] = a @ b[:, c0:c1]`` per column block (single-threaded sgemm at
    ``fn``; ``out`` flat, rows N apart); ``bad[t] = 1`` where the block holds an inf or a NaN."""
    R, K = a.shape
    N = b.shape[1]
    for t in prange(bad.shape[0]):
        c0 = t * cols
        w = min(N, c0 + cols) - c0
        bad[t] = 0
        if w <= 0:
            continue
        sgemm(fn, R, w, K, a, 0, K, b, c0, N, np.float32(0.0), out, c0, N)
        for r in range(R):
            if not _finite(out, r * N + c0, r * N + c0 + w):
                bad[t] = 1
                break


def matmul_into(a, b, out) -> None:
    """``out[...] = a @ b`` for C-contiguous f32 ``a`` [R, K], ``b`` [K, N], ``out`` [R, N]:
    blocks of columns by single-threaded sgemm on Numba's threads (as :func:`gemm_store`,
    so OpenBLAS's own threads never spin after it; columns, because a convolution's
    product has few rows and long ones: each block re-packs only its part of ``b``).
    Blocks with an inf or a NaN are redone with float64 sums rounded once, as the
    reference.  numpy's matmul where that does not apply (small, other layouts)."""
    from graph_api.kernels import openblas

    R, K = a.shape
    N = b.shape[1]
    if not (R * N >= SERIAL_BELOW and K > 0 and a.dtype == b.dtype == out.dtype == np.float32 and a.flags.c_contiguous
            and b.flags.c_contiguous and out.flags.c_contiguous and out.shape == (R, N) and openblas.available()):
        np.matmul(a, b, out=out)
        return
    threads = split_threads()  # deterministic mode: the sgemm column blocks depend on the shapes only
    cols = -(-N // threads)
    bad = np.zeros(-(-N // cols), np.uint8)
    with openblas.single_threaded():
        _matmul_cols_par(openblas.sgemm_address(), a, b, out.reshape(-1), cols, bad)
    for t in np.flatnonzero(bad):
        c0, c1 = t * cols, min(N, t * cols + cols)
        with np.errstate(all="ignore"):
            out[:, c0:c1] = a.astype(np.float64) @ b[:, c0:c1].astype(np.float64)


def element_offsets(shape, strides) -> np.ndarray:
    """Element offset of every index of a strided tensor, as an array of ``shape``
    (one int64 per element: only for small tensors, :data:`TABLE_ELEMENTS`)."""
    off = working_memory.zeros(tuple(shape), np.int64, "an offset table")
    for axis, (d, s) in enumerate(zip(shape, strides)):
        view = [1] * len(shape)
        view[axis] = d
        off += (np.arange(d, dtype=np.int64) * s).reshape(view)
    return off


#: a layout that strides cannot express is checked on an offset table of at most
#: this many elements (8 bytes each); larger ones are refused (the plan's reason)
TABLE_ELEMENTS = 1 << 20


def reshape_strides(shape, strides, new_shape):
    """Strides that view the strided ``(shape, strides)`` as ``new_shape`` without
    moving an element (numpy's no-copy reshape rule), or None when none exist."""
    shape, new_shape = tuple(int(d) for d in shape), tuple(int(d) for d in new_shape)
    if math.prod(shape) != math.prod(new_shape):
        return None
    if math.prod(shape) == 0:
        return tuple(dense_strides(new_shape))
    old = [(d, s) for d, s in zip(shape, strides) if d != 1]
    od, os_ = [d for d, _ in old], [s for _, s in old]
    nd = list(new_shape)
    result = [0] * len(nd)
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < len(nd) and oi < len(od):
        np_, op = nd[ni], od[oi]
        while np_ != op:
            if np_ < op:
                np_ *= nd[nj]
                nj += 1
            else:
                op *= od[oj]
                oj += 1
        for k in range(oi, oj - 1):  # the old axes merged here must be one run
            if os_[k] != od[k + 1] * os_[k + 1]:
                return None
        result[nj - 1] = os_[oj - 1]
        for k in range(nj - 1, ni, -1):
            result[k - 1] = result[k] * nd[k]
        ni, nj, oi, oj = nj, nj + 1, oj, oj + 1
    return tuple(result)  # trailing new dims of 1 keep stride 0: never stepped along


def row_col_offsets(shape, strides):
    """``(roff, coff)`` of a strided tensor seen as [R, N] (N its last dim): one
    offset per row (over the leading dims) and per column, ``O(R + N)`` memory."""
    N = int(shape[-1]) if len(shape) else 1
    lead, lstr = tuple(shape[:-1]), tuple(strides[:-1])
    R = math.prod(lead)
    roff = working_memory.zeros(R, np.int64, "the output's row offsets")
    view = roff.reshape(lead) if lead else roff
    for axis, (d, s) in enumerate(zip(lead, lstr)):
        if s:
            idx = [1] * len(lead)
            idx[axis] = d
            view += (np.arange(d, dtype=np.int64) * s).reshape(idx)
    coff = np.arange(N, dtype=np.int64) * (int(strides[-1]) if len(shape) else 0)
    return roff, coff


def separable(off2d: np.ndarray):
    """``(roff, coff)`` with ``off2d == roff[:, None] + coff[None, :]``, or None."""
    roff = np.ascontiguousarray(off2d[:, 0])
    coff = np.ascontiguousarray(off2d[0, :] - off2d[0, 0])
    if off2d.size and not np.array_equal(off2d, roff[:, None] + coff[None, :]):
        return None
    return roff, coff

"""Weight-compressed MatMul: ``y = post_ops(x @ dequant(W))`` with int4/int8 weights.

Formula (per output ``m, n``; groups ``g`` of ``G`` consecutive ``k``)::

    y[m, n] = sum_g s[g, n] * (sum_{k in g} x[m, k] * u[k, n]  -  z[g, n] * xs[m, g])
    xs[m, g] = sum_{k in g} x[m, k]

where ``u`` is the stored integer read as unsigned (s4 bytes are XORed with
0x88, which makes ``u = q + 8`` and ``z = 8``; s8 is read signed with ``z = 0``)
and ``z`` the zero point (0 without one).  Everything is f32: the inner sums
use explicit single-rounding FMAs (``bits.fma32``) in a fixed order (sequential
over ``k`` inside a group, then groups in order), so the result is exact IEEE
f32 arithmetic without any fastmath flag; it differs from the float64 value of
the dequantized product by the usual accumulation bound
``~ (G + K/G) * 2**-24 * sum |x w|``.

Layouts (``W`` logical ``[K, N]``; the graph may give ``[N, K]`` with
``transpose_b``).  Scales are ``[K/G, N/G_N]``: groups run along K, along N
(``WeightSpec.group_n``, oneDNN's ``group_shape [1, G_N]``) or both.

* **interleaved** (fastest; made by :func:`prepare` once per constant int4
  weight): blocks of 128 columns, each one contiguous stream of 64-byte rows
  whose 16 dwords hold 8 nibbles each (see :mod:`graph_api.kernels.wgemv4`:
  one 512-bit load and a ``vpermps`` lookup per 16 weights, which gives the
  exact integer ``q``, so ``z`` is the zero point itself; s4 nibbles are
  stored biased, ``q + 8``, which AVX2's mask-and-convert kernels read as ``u``
  with ``z + 8``).  int8 (**blocked**): 128 columns,
  one byte each, ``[nblk, K, 128]``.  One scale (and zero point) per column
  and group.  Each thread streams whole blocks.
* **natural [K, N]** (packed row-major, ``N % 128 == 0``, groups along K): the
  byte-wise int4 kernels (``_gemv4_m1``: byte ``j`` of a row chunk holds
  column ``2j`` in its low nibble, ``2j+1`` in its high one) address the
  user's buffer in place (see :class:`PreparedWeight`: flat arrays with
  block and row strides); other N use the generic kernel.
* **natural [N, K]** (transpose_b, groups ``[1, G]``): one row per output
  column; :func:`prepare` repacks it to interleaved (a transpose of nibbles).  The
  direct (non-constant weight) path dequantizes panels and uses BLAS for
  M > 8 and a K-reduction kernel for decode.

Paths: decode (M <= 8): GEMV streaming the packed weights once, N blocks (and
K splits when there are few blocks) over threads; M > 1 unpacks each weight
row once for all M rows.  Activation prep and the epilogue run serially for
small outputs (one thread launch per call).  Each kernel has one compiled
signature (runtime masks and strides instead of specialisations).
Prefill (M > 8): each of ``numba.get_num_threads()`` Python threads takes the
next few hundred output columns and, for prepared int4 weights
(:func:`_prefill_chunks`), walks K in tiles of a few hundred rows: it
dequantizes a tile exactly (f32 ``(q - z) * s``, then the fpmath rounding)
into a cache-resident buffer and multiplies it into the output block -- below
384 rows with a Numba register-blocked kernel (8 rows x 32 columns, one FMA
per product in k order), above with one single-threaded OpenBLAS ``sgemm``
per tile called from the Numba kernel (:mod:`graph_api.kernels.openblas`;
OpenBLAS's thread count is held at 1 meanwhile; on AVX2-only targets every
tile product is sgemm's: the register block needs 32 vector registers).  The threads never wait for
each other; no thread wakes up per tile.  A prepared weight whose f32 form is
small (:data:`DENSE_COPY_BYTES`, within a process-wide :data:`DENSE_TOTAL_BYTES`)
keeps that form, dequantized once by the same kernels (:func:`dense_copy`), and
its prefills are f32 BLAS on it: the dense MatMul's fused row-tile GEMM.  Other layouts dequantize full-K
panels per thread and use numpy's ``matmul``.  Without a reachable OpenBLAS
(and more than one thread) those use panels of up to ``PANEL_BYTES``, a
parallel dequantization, then one multi-threaded sgemm each.  All schemes sum
in f32 (the error bound is K roundings).

Post-ops are an *epilogue program* (see :func:`make_epilogue`): int-coded ops
with per-op scalars and an operand view ``(offset, stride_m, stride_n)`` into
one f32 buffer, applied per output element before the final store, which may
convert to bf16/f16 bits.
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass

from graph_api.kernels.numba_setup import numba  # noqa: F401  (configures numba first)

import math

import numpy as np
from numba import njit, prange

from graph_api.kernels import bf16_matmul
from graph_api.kernels.threads import split_threads
from graph_api.kernels.weight_compressed import wgemv4 as W4
from graph_api.kernels.weight_compressed import wgemv8 as W8
from graph_api.kernels.weight_compressed import wgemv4_bf16 as B4
from graph_api.kernels.weight_compressed.lut4 import HAS_VPERMPS  # AVX-512F: 32 vector registers
from graph_api.kernels.bits import (RND_BF16, f32_to_bf16, f32_to_f16_bits, fma32, nib_x, prefetch, round_bf16,
                          round_f16, round_code, load_row_f32, vfma, vload, vnib_hi, vnib_lo, vsplat, vstore)

PANEL_BYTES = 64 << 20  #: prefill: f32 bytes of one dequantized panel (K x width)
DECODE_MAX_M = 8
_PF_ROWS = 32  #: software prefetch distance in block rows (32 * 64 B = 2 KiB)

# weight kinds
S4, U4, S8, U8 = "s4", "u4", "s8", "u8"

# --------------------------------------------------------------- epilogue ops
# codes and names come from the one post-op table (graph_api.postops)
from graph_api.postops import (ABS as EP_ABS, ADD as EP_ADD, BINARY_CODES as BINARY_OPS,  # noqa: E402
                               CLAMP as EP_CLAMP, DIV as EP_DIV, ELU as EP_ELU, EXP as EP_EXP,
                               GELU_ERF as EP_GELU_ERF, GELU_TANH as EP_GELU_TANH,
                               HARD_SIGMOID as EP_HARD_SIGMOID, HARD_SWISH as EP_HARD_SWISH,
                               LEAKY_RELU as EP_LEAKY_RELU, LINEAR as EP_LINEAR, LOG as EP_LOG,
                               MAX as EP_MAX, MIN as EP_MIN, MISH as EP_MISH, MUL as EP_MUL,
                               POW as EP_POW, RDIV as EP_RDIV, RECIPROCAL as EP_RECIPROCAL,
                               RELU as EP_RELU, ROUND as EP_ROUND, ROUND_BF16 as EP_ROUND_BF16,
                               ROUND_F16 as EP_ROUND_F16, RSUB as EP_RSUB, SIGMOID as EP_SIGMOID,
                               SILU as EP_SILU, SOFT_PLUS as EP_SOFT_PLUS, SQRT as EP_SQRT,
                               SQUARE as EP_SQUARE, SUB as EP_SUB, TANH as EP_TANH,
                               UNARY_CODES as UNARY_OPS, UNARY_FIRST as EP_UNARY_FIRST)
OUT_F32, OUT_BF16, OUT_F16 = 0, 1, 2
#: operand of a binary post-op that is the running value itself (``Multiply(y, y)``)
RUNNING = "running value"


@dataclass
class Epilogue:
    """A compiled post-op chain: ``ops[i]`` with ``fpar[i] = (alpha, beta)`` and
    ``ipar[i] = (offset, stride_m, stride_n)`` into ``buf`` for binary ops."""

    ops: np.ndarray
    fpar: np.ndarray
    ipar: np.ndarray
    buf: np.ndarray


def make_epilogue(post_ops, M: int, N: int, buf: np.ndarray | None = None) -> Epilogue:
    """Build the epilogue program for an ``[M, N]`` output.

    ``post_ops`` is a sequence of ``(name, arg)``: unary ``("relu", None)``,
    ``("clamp", (lo, hi))``, ``("silu", alpha)``, ``("linear", (a, b))``,
    ``("elu", alpha)``, ``("leaky_relu", alpha)``; binary ``("add", array)``
    where ``array`` broadcasts to ``[M, N]`` (scalar, ``[N]``, ``[1, N]``,
    ``[M, 1]`` or ``[M, N]``; bf16/f16 operands are widened here), or
    :data:`RUNNING` for the running value itself (offset -1 in ``ipar``).
    ``buf``: an f32 array of the operands' total size to copy several operands into
    (a caller that runs the same program again keeps it: no allocation per call).
    """
    if not post_ops:
        return _NO_POSTOPS
    post_ops = list(post_ops)
    P = len(post_ops)
    ops = np.zeros(max(P, 1), np.int32)
    fpar = np.zeros((max(P, 1), 2), np.float32)
    ipar = np.zeros((max(P, 1), 3), np.int64)
    chunks, off = [], 0
    for i, (name, arg) in enumerate(post_ops):
        if name in BINARY_OPS and isinstance(arg, str) and arg == RUNNING:
            ops[i] = BINARY_OPS[name]
            ipar[i] = (-1, 0, 0)
        elif name in BINARY_OPS:
            ops[i] = BINARY_OPS[name]
            a = np.asarray(arg).astype(np.float32, copy=False)
            a2 = a.reshape((1,) * (2 - a.ndim) + a.shape[-2:]) if a.ndim <= 2 else \
                a.reshape(-1, a.shape[-1])
            sm = 0 if a2.shape[0] == 1 else a2.shape[1]
            sn = 0 if a2.shape[1] == 1 else 1
            flat = np.ascontiguousarray(a2).reshape(-1)
            ipar[i] = (off, sm, sn)
            chunks.append(flat)
            off += flat.size
        else:
            ops[i] = UNARY_OPS[name]
            if name in ("silu", "swish"):
                fpar[i, 0] = 1.0 if arg is None else arg
            elif isinstance(arg, tuple):
                fpar[i] = arg
            elif arg is not None:
                fpar[i, 0] = arg
    # one writeable operand is its own buffer, not a copy (a read-only array would be
    # another Numba type: one more compiled signature of every kernel taking ``buf``)
    if len(chunks) == 1 and chunks[0].flags.writeable:
        buf = chunks[0]
    elif not chunks:
        buf = np.zeros(1, np.float32)
    elif buf is not None and buf.shape == (off,):
        np.concatenate(chunks, out=buf)
    else:
        buf = np.concatenate(chunks)
    return Epilogue(ops[:P] if P else ops[:0], fpar, ipar, buf)


#: the program without post-ops, shared (the kernels only read it; building it was ~3 us
#: of Python per decode call, several times that right after a kernel has evicted the
#: interpreter's data from the caches)
_NO_POSTOPS = Epilogue(np.zeros(0, np.int32), np.zeros((1, 2), np.float32), np.zeros((1, 3), np.int64),
                       np.zeros(1, np.float32))


@njit(inline="always", cache=True)
def _put(out, m, n, v, okind):
    """Store f32 ``v`` as f32, bf16 bits or f16 bits (``okind`` 0/1/2)."""
    if okind == 0:
        out[m, n] = v
    elif okind == 1:
        out[m, n] = f32_to_bf16(v)
    else:
        out[m, n] = f32_to_f16_bits(v)


@njit(inline="always", cache=True)
def _fdiv(a, b):
    """IEEE ``a / b`` in f32 (Numba's default error model raises on a zero divisor)."""
    if b != 0:
        return a / b
    if a != a or a == 0:
        return np.float32(np.nan)
    return np.float32(math.copysign(np.inf, a) * math.copysign(1.0, b))


@njit(cache=True)
def _ep_steps(v, r, c0, ops, fpar, ipar, buf):
    """``v[n] = epilogue(v[n])`` over row ``r``, columns ``c0 ..`` of the result: the
    post-op codes of :mod:`graph_api.postops`, in order, in f32.

    A compiled function of its own, called once per row (by the stores here, in
    ``kernels/store.py``, ``kernels/sparse.py`` and ``kernels/qmatmul.py``): a call
    per row costs nothing next to the row.  The codes are written out here, not in
    ``inline='always'`` helpers: Numba's IR inlining runs a helper's untyped passes
    again and deep-copies its IR (with the helpers it inlines itself) at every call
    site, which made this function cost 3.6 s of compile on an empty cache (AVX2
    host, CPU time).  A compiled call per element instead costs 2-5x the run time."""
    one, zero = np.float32(1.0), np.float32(0.0)
    for n in range(v.shape[0]):
        x = v[n]
        for i in range(ops.shape[0]):
            op = ops[i]
            a = fpar[i, 0]
            if op < EP_UNARY_FIRST:
                o = x if ipar[i, 0] < 0 else buf[ipar[i, 0] + r * ipar[i, 1] + (c0 + n) * ipar[i, 2]]
                if op == EP_ADD:
                    x = x + o
                elif op == EP_MUL:
                    x = x * o
                elif op == EP_SUB:
                    x = x - o
                elif op == EP_DIV or op == EP_RDIV:  # x / o, o / x
                    x = _fdiv(x, o) if op == EP_DIV else _fdiv(o, x)
                elif op == EP_MAX:  # NaN from either side, as the reference's np.maximum
                    x = x if (x > o or x != x) else o
                elif op == EP_MIN:
                    x = x if (x < o or x != x) else o
                else:  # EP_RSUB
                    x = o - x
            elif op == EP_RELU:  # oneDNN's relu: x * 0 below 0 (NaN at -inf, as the reference)
                x = x if x > 0 else x * zero
            elif op == EP_GELU_ERF:
                x = np.float32(0.5) * x * (one + np.float32(math.erf(x * np.float32(0.7071067811865476))))
            elif op == EP_GELU_TANH:
                x = np.float32(0.5) * x * (one + np.float32(math.tanh(
                    np.float32(0.7978845608028654) * (x + np.float32(0.044715) * x * x * x))))
            elif op == EP_SIGMOID:  # oneDNN's logistic: 0 once exp(-x) overflows, and for NaN
                x = one / (one + np.float32(math.exp(-x))) if -x < np.float32(88.72283172607421875) else zero
            elif op == EP_SILU:
                x = x / (one + np.float32(math.exp(-a * x)))
            elif op == EP_TANH:
                x = np.float32(math.tanh(x))
            elif op == EP_CLAMP:  # oneDNN's clip: NaN becomes the min
                x = x if x > a else a
                x = x if x < fpar[i, 1] else fpar[i, 1]
            elif op == EP_LINEAR:
                x = a * x + fpar[i, 1]
            elif op == EP_ELU:
                if x < 0:
                    x = a * (np.float32(math.exp(x)) - one)
            elif op == EP_ABS:
                x = abs(x)
            elif op == EP_EXP:
                x = np.float32(math.exp(x))
            elif op == EP_SQUARE:
                x = x * x
            elif op == EP_LEAKY_RELU:
                if x < 0:
                    x = x * a
            elif op == EP_HARD_SIGMOID or op == EP_HARD_SWISH:
                # hard_sigmoid(a, b) / hard_swish = x * hard_sigmoid(1/6, 1/2)
                t = a * x + fpar[i, 1] if op == EP_HARD_SIGMOID else x / np.float32(6.0) + np.float32(0.5)
                t = zero if t < zero else (one if t > one else t)
                x = t if op == EP_HARD_SIGMOID else x * t
            elif op == EP_LOG:
                x = np.float32(np.log(x))
            elif op == EP_MISH or op == EP_SOFT_PLUS:  # mish = x tanh(softplus(x)); soft_plus(beta)
                beta = one if op == EP_MISH else a
                bx = beta * x
                sp = bx / beta if bx >= np.float32(88.72283172607421875) else \
                    np.float32(math.log1p(math.exp(bx))) / beta
                x = sp if op == EP_SOFT_PLUS else x * np.float32(math.tanh(sp))
            elif op == EP_ROUND:
                x = np.float32(np.rint(x))
            elif op == EP_SQRT:
                x = np.float32(np.sqrt(x))
            elif op == EP_POW:
                x = np.float32(np.power(x, a))
            elif op == EP_RECIPROCAL:
                x = np.float32(math.copysign(np.inf, x)) if x == zero else one / x
            elif op == EP_ROUND_BF16:
                x = round_bf16(x)
            elif op == EP_ROUND_F16:
                x = round_f16(x)
        v[n] = x


@njit(inline="always", cache=True)
def _put_row(v, out, m, n0, okind):
    """out[m, n0 + j] = convert(v[j]) (f32, bf16 bits or f16 bits)."""
    for j in range(v.shape[0]):
        _put(out, m, n0 + j, v[j], okind)


@njit(cache=True)
def _store_rows(acc, m0, n0, out, okind, ops, fpar, ipar, buf):
    """out[m0+i, n0+j] = convert(epilogue(acc[i, j])) for the tile ``acc``."""
    R, C = acc.shape
    C = min(C, out.shape[1] - n0)
    v = np.empty(max(C, 0), np.float32)
    for i in range(R):
        for j in range(C):
            v[j] = np.float32(acc[i, j])
        if ops.shape[0]:
            _ep_steps(v, m0 + i, n0, ops, fpar, ipar, buf)
        _put_row(v, out, m0 + i, n0, okind)


@njit(cache=True)
def _finish_serial(part, out, okind, ops, fpar, ipar, buf):
    """:func:`_finish` without a thread launch (decode outputs are small)."""
    S, M, Np = part.shape
    N = out.shape[1]
    v = np.empty(N, np.float32)
    for m in range(M):
        for n in range(N):
            v[n] = part[0, m, n]
        for s in range(1, S):
            for n in range(N):
                v[n] += part[s, m, n]
        if ops.shape[0]:
            _ep_steps(v, m, np.int64(0), ops, fpar, ipar, buf)
        _put_row(v, out, m, np.int64(0), okind)


@njit(cache=True)
def _prep_x_serial(x, kind, rnd, G, xf, xs):
    """:func:`_prep_x` without a thread launch; returns max |xf| (NaN if any is NaN) for
    :func:`_fast_is_exact`, found in the same pass (a separate numpy max cost ~20 us
    per decode call)."""
    M, K = xf.shape
    amax = np.float32(0.0)
    nan = False
    for m in range(M):
        load_row_f32(x[m], kind, rnd, xf[m])
        for g in range(K // G):
            s = np.float32(0.0)
            for k in range(g * G, g * G + G):
                v = xf[m, k]
                s += v
                a = abs(v)
                nan |= a != a
                amax = max(amax, a)
            xs[m, g] = s
    return np.float32(np.nan) if nan else amax


def finish(part, out, okind, ep):
    """Sum partials, epilogue, store (serial below 64K outputs: no launch cost)."""
    f = _finish_serial if out.size < 65536 else _finish
    f(part, out, okind, ep.ops, ep.fpar, ep.ipar, ep.buf)


@njit(parallel=True, cache=True)
def _finish(part, out, okind, ops, fpar, ipar, buf):
    """Sum K-split partials (fixed order), apply the epilogue, store."""
    S, M, Np = part.shape
    N = out.shape[1]
    nb = (N + 255) // 256
    for t in prange(M * nb):
        m = t // nb
        n0 = (t % nb) * 256
        v = np.empty(min(256, N - n0), np.float32)
        for j in range(v.shape[0]):
            v[j] = part[0, m, n0 + j]
        for s in range(1, S):
            for j in range(v.shape[0]):
                v[j] += part[s, m, n0 + j]
        if ops.shape[0]:
            _ep_steps(v, m, n0, ops, fpar, ipar, buf)
        _put_row(v, out, m, n0, okind)


# ----------------------------------------------------------- activation prep
@njit(parallel=True, cache=True)
def _prep_x(x, kind, rnd, G, xf, xs):
    """x (f32 / bf16 bits / f16 bits) -> rounded f32 ``xf`` and group sums ``xs``."""
    M, K = xf.shape
    for m in prange(M):
        load_row_f32(x[m], kind, rnd, xf[m])
        for g in range(K // G):
            s = np.float32(0.0)
            for k in range(g * G, g * G + G):
                s += xf[m, k]
            xs[m, g] = s


# ------------------------------------------------------------ decode kernels
# One compiled signature per kernel serves every weight layout: the weights,
# scales and zero points are flat arrays, and a block's row ``k`` starts at
# ``blk * wbs + k * wks`` (scales: group ``g`` at ``blk * sbs + g * sgs``), so
# the prepared blocked copy and a zero-copy view of the user's [K, N] buffer
# run the same machine code.  Rows are ``cbw`` bytes (a multiple of 64), read
# through row slices (a slice's indices are provably in range: a flat index
# ``w[r + c]`` carries Numba's negative-index wraparound and the loop stays
# scalar).  The int4 M == 1 and M > 1 kernels are separate
# functions, so a decode step compiles only the one it runs.
_U = 4  #: rows per step of the int4 kernels (accumulators loaded/stored once per step)


@njit(inline="always", cache=True)
def _scale_group(xsum, sc, zf, so, zmode, zc, pE, pO, accE, accO, r):
    """acc[r] += s * (p[r] - z * xsum) for one group (z: the zero point array when
    ``zmode == 1``, else the constant ``zc``: 0, or 8 for s4 read as q + 8)."""
    cbw = pE.shape[1]
    srow = sc[so:so + 2 * cbw]  # slices: indices provably in range, so the loops vectorise
    if zmode == 1:
        zrow = zf[so:so + 2 * cbw]
        for c in range(cbw):
            accE[r, c] = fma32(srow[2 * c], pE[r, c] - zrow[2 * c] * xsum, accE[r, c])
            accO[r, c] = fma32(srow[2 * c + 1], pO[r, c] - zrow[2 * c + 1] * xsum, accO[r, c])
    else:
        zx = zc * xsum
        for c in range(cbw):
            accE[r, c] = fma32(srow[2 * c], pE[r, c] - zx, accE[r, c])
            accO[r, c] = fma32(srow[2 * c + 1], pO[r, c] - zx, accO[r, c])


@njit(inline="always", cache=True)
def _prefetch_rows(w, r, wks, cbw, n):
    """Prefetch ``n`` block rows from offset ``r`` (every 64-byte line)."""
    for i in range(n):
        for q in range(0, cbw, 64):
            prefetch(w, r + i * wks + q)


@njit(inline="always", cache=True)
def _store_part(part, s, blk, accE, accO):
    M, cbw = accE.shape
    base = blk * 2 * cbw
    for m in range(M):
        for j in range(cbw):
            part[s, m, base + 2 * j] = accE[m, j]
            part[s, m, base + 2 * j + 1] = accO[m, j]


@njit(inline="always", cache=True)
def _rows4(w0, w1, w2, w3, x0, x1, x2, x3, xm, pE, pO, cbw):
    """p[c] += x0 * u0[c] + .. + x3 * u3[c] (sequential FMAs) for both nibbles of 4 rows."""
    for c in range(cbw):
        b0 = w0[c]
        b1 = w1[c]
        b2 = w2[c]
        b3 = w3[c]
        a = fma32(x0, nib_x(b0, xm, False), pE[0, c])
        a = fma32(x1, nib_x(b1, xm, False), a)
        a = fma32(x2, nib_x(b2, xm, False), a)
        pE[0, c] = fma32(x3, nib_x(b3, xm, False), a)
        a = fma32(x0, nib_x(b0, xm, True), pO[0, c])
        a = fma32(x1, nib_x(b1, xm, True), a)
        a = fma32(x2, nib_x(b2, xm, True), a)
        pO[0, c] = fma32(x3, nib_x(b3, xm, True), a)


@njit(cache=True)
def _blk4_m1(xf, xs, w, wo, wks, cbw, xm, sc, zf, so, sgs, zmode, zc, G, g0, g1, part, s, blk):
    """One block, groups g0..g1, M == 1 (see :func:`_gemv4_m1`)."""
    K = xf.shape[1]
    pE = np.empty((1, cbw), np.float32)
    pO = np.empty((1, cbw), np.float32)
    accE = np.zeros((1, cbw), np.float32)
    accO = np.zeros((1, cbw), np.float32)
    for g in range(g0, g1):
        pE[0, :] = 0.0
        pO[0, :] = 0.0
        k = g * G
        while k + _U <= g * G + G:
            x0 = xf[0, k]
            x1 = xf[0, k + 1]
            x2 = xf[0, k + 2]
            x3 = xf[0, k + 3]
            r0 = wo + k * wks
            _prefetch_rows(w, wo + min(k + _PF_ROWS, K - _U) * wks, wks, cbw, _U)
            w0 = w[r0:r0 + cbw]
            w1 = w[r0 + wks:r0 + wks + cbw]
            w2 = w[r0 + 2 * wks:r0 + 2 * wks + cbw]
            w3 = w[r0 + 3 * wks:r0 + 3 * wks + cbw]
            if xm == 0:  # prepared copies: the same loop with a literal mask (no XOR: 4 of ~34 ops)
                _rows4(w0, w1, w2, w3, x0, x1, x2, x3, np.uint8(0), pE, pO, cbw)
            else:
                _rows4(w0, w1, w2, w3, x0, x1, x2, x3, xm, pE, pO, cbw)
            k += _U
        while k < g * G + G:  # groups that are not a multiple of _U rows
            x0 = xf[0, k]
            w0 = w[wo + k * wks:wo + k * wks + cbw]
            for c in range(cbw):
                b0 = w0[c]
                pE[0, c] = fma32(x0, nib_x(b0, xm, False), pE[0, c])
                pO[0, c] = fma32(x0, nib_x(b0, xm, True), pO[0, c])
            k += 1
        _scale_group(xs[0, g], sc, zf, so + g * sgs, zmode, zc, pE, pO, accE, accO, 0)
    _store_part(part, s, blk, accE, accO)


@njit(parallel=True, cache=True)
def _gemv4_m1(xf, xs, w, wbs, wks, cbw, xm, sc, zf, sbs, sgs, zmode, zc, G, part):
    """int4 decode GEMV, M == 1: part[S, 1, NBLK*2*cbw] raw sums.

    Work item = (block, K split).  Byte ``j`` of a block row holds columns
    ``2j`` (low nibble) and ``2j+1`` (high); per group, sequential f32 FMAs
    over k into ``pE``/``pO`` (even/odd columns), then ``acc += s * (p - z *
    sum(x))``.  Rows go four at a time: the partial sums are loaded and stored
    once per four rows, and the weights are prefetched ``_PF_ROWS`` ahead.
    The block body is its own (serial) function: the parallel region stays
    small, which keeps Numba's parfor passes, and so the compile, short.
    """
    S = part.shape[0]
    NBLK = part.shape[2] // (2 * cbw)
    ng = xf.shape[1] // G
    gps = (ng + S - 1) // S
    for t in prange(NBLK * S):
        blk = t // S
        s = t % S
        _blk4_m1(xf, xs, w, blk * wbs, wks, cbw, xm, sc, zf, blk * sbs, sgs, zmode, zc, G,
                 min(s * gps, ng), min((s + 1) * gps, ng), part, s, blk)


@njit(cache=True)
def _blk4_rows(xf, xs, w, wo, wks, cbw, xm, sc, zf, so, sgs, zmode, zc, G, g0, g1, part, s, blk):
    """One block for 1 < M <= DECODE_MAX_M: four weight rows are unpacked once
    into L1 (``u``), then each activation row takes its 4 x 2 FMAs per byte
    from there (partial sums loaded and stored once per four rows)."""
    M, K = xf.shape
    u = np.empty((2 * _U, cbw), np.float32)  # rows 0..3 low nibbles, then high
    pE = np.empty((M, cbw), np.float32)
    pO = np.empty((M, cbw), np.float32)
    accE = np.zeros((M, cbw), np.float32)
    accO = np.zeros((M, cbw), np.float32)
    for g in range(g0, g1):
        pE[:] = 0.0
        pO[:] = 0.0
        k = g * G
        while k < g * G + G:
            n = _U if k + _U <= g * G + G else 1
            _prefetch_rows(w, wo + min(k + _PF_ROWS, K - n) * wks, wks, cbw, n)
            for i in range(n):
                wr = w[wo + (k + i) * wks:wo + (k + i) * wks + cbw]
                ue = u[i]
                uo = u[_U + i]
                for c in range(cbw):
                    ue[c] = nib_x(wr[c], xm, False)
                    uo[c] = nib_x(wr[c], xm, True)
            if n == _U:
                e0, e1, e2, e3 = u[0], u[1], u[2], u[3]
                o0, o1, o2, o3 = u[4], u[5], u[6], u[7]
                for m in range(M):
                    x0 = xf[m, k]
                    x1 = xf[m, k + 1]
                    x2 = xf[m, k + 2]
                    x3 = xf[m, k + 3]
                    pe = pE[m]
                    po = pO[m]
                    for c in range(cbw):
                        pe[c] = fma32(x3, e3[c], fma32(x2, e2[c], fma32(x1, e1[c], fma32(x0, e0[c], pe[c]))))
                        po[c] = fma32(x3, o3[c], fma32(x2, o2[c], fma32(x1, o1[c], fma32(x0, o0[c], po[c]))))
            else:
                e0, o0 = u[0], u[_U]
                for m in range(M):
                    x0 = xf[m, k]
                    pe = pE[m]
                    po = pO[m]
                    for c in range(cbw):
                        pe[c] = fma32(x0, e0[c], pe[c])
                        po[c] = fma32(x0, o0[c], po[c])
            k += n
        for m in range(M):
            _scale_group(xs[m, g], sc, zf, so + g * sgs, zmode, zc, pE, pO, accE, accO, m)
    _store_part(part, s, blk, accE, accO)


@njit(parallel=True, cache=True)
def _gemv4_rows(xf, xs, w, wbs, wks, cbw, xm, sc, zf, sbs, sgs, zmode, zc, G, part):
    """:func:`_gemv4_m1` for 1 < M <= DECODE_MAX_M: the weights are read from
    memory (and unpacked) once for all M rows (:func:`_blk4_rows`)."""
    S = part.shape[0]
    NBLK = part.shape[2] // (2 * cbw)
    ng = xf.shape[1] // G
    gps = (ng + S - 1) // S
    for t in prange(NBLK * S):
        blk = t // S
        s = t % S
        _blk4_rows(xf, xs, w, blk * wbs, wks, cbw, xm, sc, zf, blk * sbs, sgs, zmode, zc, G,
                   min(s * gps, ng), min((s + 1) * gps, ng), part, s, blk)


# ------------------------------------------------------ generic (any layout)
@njit(inline="always", cache=True)
def _wval(w, idx, bits4, signed):
    """Integer weight at dense linear index ``idx`` of the uint8 buffer ``w`` (packed
    nibbles or bytes; ``signed``: s4/s8).  s8 reads its bytes through the uint8 view
    too, so the callers compile one signature for all four kinds (an int8 ``w`` was a
    second compile of each: ~5 s on an empty cache, AVX2 host, CPU time)."""
    if bits4:
        b = np.int32(w[idx >> 1])
        q = (b >> 4) & 15 if idx & 1 else b & 15
        if signed and q >= 8:
            q -= 16
        return np.float32(q)
    q = np.int32(w[idx])
    if signed:
        q = (q ^ 128) - 128
    return np.float32(q)


@njit(parallel=True, cache=True, nogil=True)
def _dequant_panel(w, bits4, signed, trans, K, N, G, Gn, sc, zp, has_zp, n0, rnd, panel):
    """panel[k, j] = round((q[k, n0+j] - z) * s) for j < panel width (exact f32).

    ``w`` is the user's flat buffer: [K, N] (``trans`` False, scales [K/G, N])
    or [N, K] (``trans`` True, scales [N, K/G]).  Columns past N are zeros.
    """
    NB = panel.shape[1]
    nk = (K + 63) // 64
    for c in prange(nk):
        for k in range(c * 64, min(c * 64 + 64, K)):
            g = k // G
            for j in range(NB):
                n = n0 + j
                if n >= N:
                    panel[k, j] = 0.0
                    continue
                if trans:
                    q = _wval(w, n * K + k, bits4, signed)
                    s = sc[n // Gn, g]
                    z = zp[n // Gn, g] if has_zp else np.float32(0.0)
                else:
                    q = _wval(w, k * N + n, bits4, signed)
                    s = sc[g, n // Gn]
                    z = zp[g, n // Gn] if has_zp else np.float32(0.0)
                panel[k, j] = round_code((q - z) * s, rnd)


@njit(parallel=True, cache=True, nogil=True)
def _dequant_panel_blk(w, wbs, wks, cbw, xm, sc, zf, sbs, sgs, zmode, zc, G, b0, rnd, panel):
    """Dequantize int4 blocks b0.. (addressed as in :func:`_gemv4_m1`) into
    panel[K, 2*cbw*nb].

    Exact f32 ``(u - z) * s`` per element (z = 8 for s4, the zero point, or 0);
    branch-free inner loops over a block row (vectorised), rounding pass after.
    """
    K = panel.shape[0]
    nbk = panel.shape[1] // (2 * cbw)
    nk = (K + 31) // 32
    for t in prange(nk * nbk):
        c = t // nbk
        bb = t % nbk
        blk = b0 + bb
        zrow = np.full(2 * cbw, zc, np.float32)
        for k in range(c * 32, min(c * 32 + 32, K)):
            so = blk * sbs + (k // G) * sgs
            r = blk * wbs + k * wks
            wr = w[r:r + cbw]
            srow = sc[so:so + 2 * cbw]
            if zmode == 1:
                zrow[:] = zf[so:so + 2 * cbw]
            prow = panel[k, bb * 2 * cbw:(bb + 1) * 2 * cbw]
            for j in range(cbw):
                b = wr[j]
                prow[2 * j] = (nib_x(b, xm, False) - zrow[2 * j]) * srow[2 * j]
                prow[2 * j + 1] = (nib_x(b, xm, True) - zrow[2 * j + 1]) * srow[2 * j + 1]
            if rnd != 0:
                for j in range(2 * cbw):
                    prow[j] = round_code(prow[j], rnd)


@njit(parallel=True, cache=True)
def _gemv_generic(xf, w, bits4, signed, trans, K, N, G, Gn, sc, zp, has_zp, n_lo, out):
    """out[m, n - n_lo] for n in n_lo..N: any layout, one column per work item.

    Used for tails (N not a multiple of 128 in the [K, N] layout) and the
    [N, K] decode path.  Sequential f32 FMAs per group, groups in order.
    """
    M = xf.shape[0]
    for n in prange(n_lo, N):
        for m in range(M):
            acc = np.float32(0.0)
            for g in range(K // G):
                p = np.float32(0.0)
                if trans:
                    s = sc[n // Gn, g]
                    z = zp[n // Gn, g] if has_zp else np.float32(0.0)
                    for k in range(g * G, g * G + G):
                        p = fma32(xf[m, k], _wval(w, n * K + k, bits4, signed) - z, p)
                else:
                    s = sc[g, n // Gn]
                    z = zp[g, n // Gn] if has_zp else np.float32(0.0)
                    for k in range(g * G, g * G + G):
                        p = fma32(xf[m, k], _wval(w, k * N + n, bits4, signed) - z, p)
                acc = fma32(s, p, acc)
            out[m, n - n_lo] = acc


@njit(parallel=True, cache=True)
def _gemv_nk4(xe, xo, xs, w, K, N, G, xm, sc, zp, zmode, out):
    """int4 decode straight from the user's [N, K] packed rows (transpose_b).

    One row per output column; 16 lanes (one f32x16 register) accumulate
    ``x[2j] * lo + x[2j+1] * hi`` over a group (xe/xo: even/odd activations, f32,
    C-contiguous), then the lanes are summed in a fixed order and scaled.  ``G`` must
    be a multiple of 32 (16 bytes per chunk); other groups use the generic kernel.
    (The lane-array form of this loop compiled to scalar code: 8-9.5 ms for a 4096^2
    decode on Zen 3.)
    """
    M = xe.shape[0]
    kb = K // 2
    gb = G // 2
    ng = K // G
    zero = vsplat(np.float32(0.0))
    for n in prange(N):
        lanes = np.empty(16, np.float32)
        for m in range(M):
            acc = np.float32(0.0)
            for g in range(ng):
                v = zero
                for c in range(g * gb, g * gb + gb, 16):
                    b = n * kb + c
                    x = m * kb + c
                    v = vfma(vload(xo, x), vnib_hi(w, b, xm), vfma(vload(xe, x), vnib_lo(w, b, xm), v))
                vstore(lanes, 0, v)
                p = np.float32(0.0)
                for l in range(16):
                    p += lanes[l]
                if zmode == 1:
                    p = p - zp[n, g] * xs[m, g]
                elif zmode == 2:
                    p = p - np.float32(8.0) * xs[m, g]
                acc = fma32(sc[n, g], p, acc)
            out[m, n] = acc


# ------------------------------------------------------------- preparation
@dataclass
class WeightSpec:
    """What the kernels need to know about a compressed weight (logical [K, N])."""

    kind: str  # s4 u4 s8 u8
    K: int
    N: int
    group: int  # G along K (K for per-channel)
    transposed: bool  # stored [N, K] (transpose_b) with scales [N, K/G]
    group_n: int = 1  # columns sharing a scale: scales [K/G, N/group_n] (oneDNN group_shape [G, group_n])


@dataclass
class PreparedWeight:
    """Weights, scales and zero points as the decode kernels address them.

    Block ``b`` (``2 * cbw`` int4 columns, or ``cbw`` int8 columns) of row
    ``k`` starts at byte ``b * wbs + k * wks`` of the flat ``w``; the scales
    (and zero points) of group ``g`` at ``b * sbs + g * sgs`` of the flat
    ``sc`` (``zf``), one per column.  :func:`prepare` makes a blocked copy
    (``wks = cbw``: a block is one contiguous stream); a [K, N] user buffer is
    used as it is (``wks = N / 2``).
    """

    spec: WeightSpec
    w: np.ndarray  # flat uint8 (int8 for the 8-bit kernels)
    wbs: int
    wks: int
    cbw: int  # bytes per block row: 64 (int4 interleaved) or 128 (int8 blocked)
    nblk: int
    sc: np.ndarray  # flat f32
    zf: np.ndarray  # flat f32 zero points (natural-layout s4: + 8; prepared u8: - 128), or a 1-element dummy
    sbs: int
    sgs: int
    zmode: int  # 1: zero points in zf; else the constant zc
    zc: float  # natural-layout s4 without zero points: 8 (nibbles read as q + 8), else 0
    xm: int  # XOR mask of the natural-layout int4 kernels: 0x88 turns s4 nibbles into q + 8
    src: tuple = ()  # (w, scales, zps) as given: the 8-bit prefill reads these
    bounds: tuple | None = None  # (max |scale|, max |zero point|) for :func:`_fast_is_exact`
    table: np.ndarray | None = None  # int4 interleaved layout (wgemv4): nibble -> q lookup table
    dense: tuple | None = None  # (rnd_w, f32 [K, N] dequantized copy) for the prefill: :func:`dense_copy`

    @property
    def blocked(self) -> bool:
        return self.wks == self.cbw


def _unpack4(w, count, signed):
    b = np.asarray(w, np.uint8).reshape(-1)
    q = np.empty(b.size * 2, np.int8)
    q[0::2] = b & 15
    q[1::2] = b >> 4
    q = q[:count]
    if signed:  # two's complement nibble, in place: (n ^ 8) - 8 (np.where's temporaries took ~6x as long)
        q ^= 8
        q -= 8
    return q


def _logical(w, spec: WeightSpec, scales, zps):
    """The user's weight as integers ``q [K, N]`` (int16) and per-column f32 scales and
    zero points ``[K/G, N]`` (groups along N repeated; ``zp`` None without zero points)."""
    K, N, G = spec.K, spec.N, spec.group
    ng = K // G
    bits4 = spec.kind in (S4, U4)
    signed = spec.kind in (S4, S8)
    if bits4:
        q = _unpack4(w, K * N, signed).astype(np.int16)
    else:
        q = np.asarray(w).reshape(-1).astype(np.int16)
    q = q.reshape(N, K).T if spec.transposed else q.reshape(K, N)
    sc = np.asarray(scales, np.float32)
    sc = sc.T if spec.transposed else sc  # -> [ng, N]
    sc = np.repeat(sc.reshape(ng, N // spec.group_n), spec.group_n, axis=1)
    zp = None if zps is None else np.asarray(zps).astype(np.float32)
    if zp is not None:
        zp = np.repeat((zp.T if spec.transposed else zp).reshape(ng, N // spec.group_n), spec.group_n, axis=1)
    return q, sc, zp


def bf16_decode_applies(spec: WeightSpec) -> bool:
    """Can :func:`prepare_bf16` and the ``vdpbf16ps`` decode kernel serve this weight?"""
    return B4.HAVE_BF16 and spec.kind in (S4, U4) and spec.group % 2 == 0


def prepare_bf16(w, spec: WeightSpec, scales, zps=None) -> B4.PairsWeight:
    """Repack a constant int4 weight for the fpmath-bf16 decode kernel
    (:mod:`graph_api.kernels.wgemv4_bf16`); other paths keep reading the user's
    buffers (``src``), so the constant is not stored twice."""
    if spec.kind not in (S4, U4) or spec.group % 2:
        raise ValueError(f"the bf16 pair layout needs s4/u4 weights in groups of an even size, not {spec}")
    q, sc, zp = _logical(w, spec, scales, zps)
    N = spec.N
    Np = -(-N // 128) * 128
    nblk = Np // B4.BLOCK_COLS
    return B4.PairsWeight(spec, B4.pack_pairs(np.pad(q, ((0, 0), (0, Np - N)))),
                          B4.lookup_table(spec.kind == S4), nblk, _per_block(sc, Np, nblk),
                          _per_block(zp, Np, nblk) if zp is not None else np.zeros(1, np.float32),
                          1 if zp is not None else 0, (w, scales, zps), param_bounds(sc, zp))


def prepare(w, spec: WeightSpec, scales, zps=None) -> PreparedWeight:
    """Repack a weight (user layout) into the kernels' layout (int4: interleaved,
    int8: blocked); call once per constant."""
    K, N, G = spec.K, spec.N, spec.group
    ng = K // G
    bits4 = spec.kind in (S4, U4)
    signed = spec.kind in (S4, S8)
    q, sc, zp = _logical(w, spec, scales, zps)  # groups along N: one scale per column in the copy
    Np = -(-N // 128) * 128
    if bits4:  # the interleaved layout of the lookup-table kernels (graph_api.kernels.wgemv4)
        nblk = Np // W4.BLOCK_COLS
        wb, table = W4.pack_interleaved(np.pad(q, ((0, 0), (0, Np - N))), signed)
        wbs, sbs, sgs = W4.block_params(K, G, nblk)
        return PreparedWeight(spec, wb, wbs, W4.ROW_BYTES, W4.ROW_BYTES, nblk, _per_block(sc, Np, nblk),
                              _per_block(zp, Np, nblk) if zp is not None else np.zeros(1, np.float32),
                              sbs, sgs, 1 if zp is not None else 0, 0.0, 0, (w, scales, zps),
                              param_bounds(sc, zp), table)
    # int8 (graph_api.kernels.wgemv8): blocked [nblk, K, 128] signed bytes; u8 as q - 128
    # with zero point z - 128 (q - z unchanged), so one signed kernel serves both
    cols = 128
    nblk = Np // cols
    if not signed:
        q = q - 128
        zp = (zp if zp is not None else np.zeros((ng, N), np.float32)) - np.float32(128)
    wb = np.ascontiguousarray(np.pad(q, ((0, 0), (0, Np - N))).astype(np.int8)
                              .reshape(K, nblk, cols).transpose(1, 0, 2))
    zf = _per_block(zp, Np, nblk) if zp is not None else np.zeros(1, np.float32)
    return PreparedWeight(spec, wb.reshape(-1), K * cols, cols, cols, nblk, _per_block(sc, Np, nblk), zf,
                          ng * cols, cols, 1 if zp is not None else 0, 0.0, 0, (w, scales, zps),
                          param_bounds(sc, zp))


def _per_block(a, Np, nblk):
    """[ng, N] per-column parameters -> flat [nblk, ng, Np/nblk] (columns padded with 0)."""
    ng, N = a.shape
    return np.ascontiguousarray(np.pad(a, ((0, 0), (0, Np - N))).reshape(ng, nblk, Np // nblk)
                                .transpose(1, 0, 2)).reshape(-1)


def natural_chunk(N: int) -> int:
    """Bytes per row chunk for the natural [K, N] int4 layout: the largest
    multiple of 64 dividing N/2 up to 768 (wide chunks avoid the cache-set
    conflicts of reading 64 B from rows N/2 bytes apart); 0 if none."""
    half = N // 2
    if N % 128 or N == 0:
        return 0
    return max(d for d in range(64, min(768, half) + 1, 64) if half % d == 0)


def _natural_blocked(w, spec: WeightSpec, scales, zps):
    """The user's natural [K, N] int4 buffer addressed as blocks (N % 128 == 0), no copy."""
    K, N, G = spec.K, spec.N, spec.group
    cb = natural_chunk(N)
    sc = np.ascontiguousarray(np.asarray(scales).astype(np.float32)).reshape(K // G, N)
    zp = None
    if zps is not None:
        zp = np.ascontiguousarray(np.asarray(zps).astype(np.float32).reshape(K // G, N))
        if spec.kind == S4:
            zp = zp + np.float32(8)  # the nibbles are read XOR 0x88 (u = q + 8)
    zf = zp.reshape(-1) if zp is not None else np.zeros(1, np.float32)
    zc = 8.0 if spec.kind == S4 and zp is None else 0.0
    return PreparedWeight(spec, _flat(w), cb, N // 2, cb, N // (2 * cb), sc.reshape(-1), zf,
                          2 * cb, N, 1 if zp is not None else 0, zc, 0x88 if spec.kind == S4 else 0,
                          (w, scales, zps), param_bounds(sc, zp))


# ------------------------------------------------- inf / NaN / overflow guard
#: partial sums of the fast paths stay below this (2**128 is f32's overflow)
_SAFE = 2.0 ** 120


def param_bounds(scales, zps) -> tuple:
    """(max |scale|, max |zero point|); NaN when a scale is NaN."""
    s = np.asarray(scales, np.float32)
    smax = float(np.max(np.abs(s))) if s.size else 0.0
    z = None if zps is None else np.asarray(zps, np.float64)
    zmax = float(np.max(np.abs(z))) if z is not None and z.size else 0.0
    return smax, zmax


def _fast_is_exact(xf, spec: WeightSpec, scales, zps, prepared, amax=None) -> bool:
    """Do the fast paths compute what the reference computes, inf/NaN included?

    The reference dequantizes in f32 and sums the products in float64, so its
    only infinities and NaNs come from the inputs or from dequantized weights
    that overflow.  The decode kernels sum ``x * u`` unscaled and subtract
    ``z * sum(x)`` (an inf activation gives inf - inf = NaN; |x| ~ 1e37 can
    overflow before the scale shrinks it), and BLAS sums in f32.  They are used
    only when every activation and scale is finite and no partial sum of
    either form can reach f32's range; anything else takes the exact path
    (:func:`_prefill` with float64 sums), a rare case by construction.
    """
    if amax is None:  # max |x| unless the caller found it: one pass, NaN with an inf or a NaN
        from graph_api.kernels.store import abs_max  # (kernels.store imports this module)

        amax = abs_max(xf)
    if prepared is not None and prepared.bounds is not None:
        smax, zmax = prepared.bounds
    else:
        smax, zmax = param_bounds(scales, zps)
    wmax = (16.0 if spec.kind in (S4, U4) else 256.0) + zmax + 8.0  # |u| + |z| (s4: +8)
    K = max(spec.K, 1)
    # the interleaved int4 decode on AVX2 keeps its partial sums scaled by up to W4.SUM_SCALE
    grow = W4.SUM_SCALE if (isinstance(prepared, PreparedWeight) and prepared.table is not None
                            and not HAS_VPERMPS and xf.shape[0] <= DECODE_MAX_M) else 1.0
    return (amax * K * wmax * grow < _SAFE and smax * wmax < _SAFE
            and amax * smax * wmax * K < _SAFE)  # NaN compares False


# ------------------------------------------------------------- entry point
def _ksplits(nblk: int, ng: int) -> int:
    threads = split_threads()  # deterministic mode: the K splits depend on the shapes only
    if nblk >= 4 * threads:
        return 1
    return max(1, min(ng, (4 * threads + nblk - 1) // nblk))


def wmatmul(x, w, spec: WeightSpec, scales=None, zps=None, *, prepared: PreparedWeight | None = None,
            post_ops=(), out=None, out_dtype="f32", rnd_x: int = 0, rnd_w: int = 0,
            act_dtype=None, quantize_out=None):
    """``post_ops(x @ dequant(w))`` -> out [M, N].

    Args:
      x: activations [M, K] (batch dims flattened): float32, float16,
        ml_dtypes.bfloat16, or uint16 bits with ``act_dtype`` "bf16"/"f16".
      w: the user's weight buffer: packed uint8 for s4/u4 (two per byte, low
        nibble first, row-major [K, N], or [N, K] if ``spec.transposed``),
        int8/uint8 for s8/u8.  Ignored when ``prepared`` is given.
      spec: kind, K, N, group size and orientation.
      scales: f32 (or bf16/f16) [K/G, N] ([N, K/G] transposed); zps like scales.
      prepared: result of :func:`prepare` for constant weights (fastest).
      post_ops: epilogue list (see :func:`make_epilogue`).
      out: optional preallocated output (f32, or uint16 for bf16/f16 output).
      out_dtype: "f32", "bf16" or "f16" (TypeCast epilogue; uint16 bits).
      rnd_x, rnd_w: fpmath rounding codes (``bits.rounding_code``) for f32
        activations and, with apply_to_int, for the dequantized weights.
      quantize_out: optional ``(dtype, scales, zps, group)``: a DynamicQuantize
        epilogue (s8/u8/s4/u4, groups along N) applied to the f32 result in a
        second pass (:func:`graph_api.kernels.quantize.quantize`; not fused in
        registers); returns the int8/uint8 or packed int4 array.
    """
    if quantize_out is not None:
        from graph_api.kernels.quantize import quantize
        qdt, qs, qz, qg = quantize_out
        y = wmatmul(x, w, spec, scales, zps, prepared=prepared, post_ops=post_ops,
                    rnd_x=rnd_x, rnd_w=rnd_w, act_dtype=act_dtype)
        return quantize(y, qs, qz, dtype=qdt, group=qg, out=out)
    M, K = x.shape
    N, G = spec.N, spec.group
    okind = {"f32": OUT_F32, "bf16": OUT_BF16, "f16": OUT_F16}[out_dtype]
    if out is None:
        out = np.empty((M, N), np.float32 if okind == 0 else np.uint16)
    if M == 0 or N == 0 or K == 0:  # empty output, or a sum over no terms: 0, then post-ops
        ep = make_epilogue(post_ops, M, N)
        _store_rows(np.zeros((M, N), np.float32), 0, 0, out, okind, ep.ops, ep.fpar, ep.ipar, ep.buf)
        return out
    ng = K // G
    if act_dtype == "f16" and x.dtype == np.uint16:
        xk, kind = x, 2
    else:
        from graph_api.kernels.bits import act_kind
        xk, kind = act_kind(np.ascontiguousarray(x))
    amax = None
    if kind == 0 and rnd_x == 0 and M > DECODE_MAX_M:
        xf, xs = xk, None  # the prefills read f32 activations as given and need no group sums
    else:
        xf = np.empty((M, K), np.float32)
        xs = np.empty((M, ng), np.float32)
        if M * K < 65536:  # max |x| for the overflow guard found in the same pass
            amax = float(_prep_x_serial(xk, kind, rnd_x if kind == 0 else 0, G, xf, xs))
        else:
            _prep_x(xk, kind, rnd_x if kind == 0 else 0, G, xf, xs)
    ep = make_epilogue(post_ops, M, N)
    bits4 = spec.kind in (S4, U4)
    pairs = prepared if isinstance(prepared, B4.PairsWeight) else None
    if pairs is not None:  # the pair stream serves only the bf16 decode; the rest reads the user's buffers
        prepared = None
        w, scales, zps = pairs.src
    if prepared is None and bits4 and not spec.transposed and natural_chunk(N) and rnd_w == 0 \
            and spec.group_n == 1:
        prepared = _natural_blocked(w, spec, scales, zps)
    if not _fast_is_exact(xf, spec, scales, zps, pairs or prepared, amax):
        _prefill(xf, w, spec, scales, zps, prepared, rnd_w, out, okind, ep, exact=True)
        return out
    # fpmath bf16 with apply_to_int and bf16 activations, prefill: the bf16 unit (AMX or
    # AVX512_BF16) on the bf16 weights, packed once per constant weight (_unit_prefill)
    if M > DECODE_MAX_M and rnd_w == RND_BF16 and (kind == 1 or (kind == 0 and rnd_x == RND_BF16)) \
            and bf16_matmul.UNIT:
        _unit_prefill(xf, w, spec, scales, zps, pairs or prepared, out, okind, ep)
        return out
    # prepare()'s copies only (int4 interleaved, int8 blocked; not a per-call view of the
    # user's [K, N] int4 buffer).  After the guard above: f32 sums of huge products that
    # cancel end as a large finite rounding error, not an inf or a NaN that would make
    # gemm_store redo the row in float64 (the reference's exact 0)
    if M > DECODE_MAX_M and isinstance(prepared, PreparedWeight) and (prepared.table is not None or not bits4) \
            and _dense_prefill(xf, prepared, rnd_w, out, okind, ep):
        return out
    # fpmath bf16 with apply_to_int and bf16 activations (f32 ones rounded by rnd_x, or bf16
    # data): vdpbf16ps on exact integer weights, scales on the group sums (wgemv4_bf16's doc)
    if pairs is not None and M <= DECODE_MAX_M and rnd_w == RND_BF16 and B4.HAVE_BF16 \
            and (kind == 1 or (kind == 0 and rnd_x == RND_BF16)):
        S = _ksplits(pairs.nblk, ng)
        part = np.empty((S, M, pairs.nblk * B4.BLOCK_COLS), np.float32)
        xb = np.empty((M, K // 2), np.int32)
        B4.pairs_of(xf, xb)
        B4.gemv(xb, xs, pairs.w, pairs.wbs, pairs.table, pairs.sc, pairs.zf, pairs.sbs, pairs.zmode, G, part)
        finish(part, out, okind, ep)
        return out
    if M <= DECODE_MAX_M and rnd_w == 0 and prepared is not None:
        pw = prepared
        S = _ksplits(pw.nblk, ng)
        cols = pw.nblk * (2 * pw.cbw if bits4 else pw.cbw)
        # one K split, no post-op, f32 out without padding columns: the kernels' sums are the
        # result, written in place (finish would copy them: 16 us of a ~1 ms decode at N = 4096)
        direct = (S == 1 and cols == N and not ep.ops.shape[0] and okind == OUT_F32
                  and out.dtype == np.float32 and out.flags.c_contiguous)
        part = out.reshape(1, M, N) if direct else np.empty((S, M, cols), np.float32)
        args = (xf, xs, pw.w, pw.wbs, pw.wks)
        if pw.table is not None:
            (W4.gemv_m1 if M == 1 else W4.gemv_rows)(xf, xs, pw.w, pw.wbs, pw.table, pw.sc, pw.zf, pw.sbs,
                                                     pw.zmode, G, part)
        elif bits4:
            (_gemv4_m1 if M == 1 else _gemv4_rows)(*args, pw.cbw, np.uint8(pw.xm), pw.sc, pw.zf, pw.sbs,
                                                   pw.sgs, pw.zmode, np.float32(pw.zc), G, part)
        else:
            W8.gemv(xf, xs, pw.w, pw.wbs, pw.sc, pw.zf, pw.sbs, pw.zmode, G, part)
        if not direct:
            finish(part, out, okind, ep)
        return out
    if M <= DECODE_MAX_M and rnd_w == 0 and bits4 and spec.transposed and G % 32 == 0 and spec.group_n == 1:
        sc, zp, has_zp = _scales_zps(spec, scales, zps)
        raw = np.empty((M, N), np.float32)
        xe = np.ascontiguousarray(xf[:, 0::2])
        xo = np.ascontiguousarray(xf[:, 1::2])
        zmode = 1 if has_zp else (2 if spec.kind == S4 else 0)
        if has_zp and spec.kind == S4:
            zp = zp + np.float32(8)  # the nibbles are read XOR 0x88 (u = q + 8)
        _gemv_nk4(xe, xo, xs, _flat(w), K, N, G, np.uint8(0x88 if spec.kind == S4 else 0),
                  sc, zp, zmode, raw)
        finish(raw[None], out, okind, ep)
        return out
    if M <= DECODE_MAX_M and rnd_w == 0:
        sc, zp, has_zp = _scales_zps(spec, scales, zps)
        raw = np.empty((M, N), np.float32)
        _gemv_generic(xf, _flat(w), bits4, spec.kind in (S4, S8), spec.transposed,
                      K, N, G, spec.group_n, sc, zp, has_zp, 0, raw)
        finish(raw[None], out, okind, ep)
        return out
    _prefill(xf, w, spec, scales, zps, prepared, rnd_w, out, okind, ep)
    return out


def _unit_prefill(xf, w, spec: WeightSpec, scales, zps, holder, out, okind, ep) -> None:
    """``ep(xf @ bf16(dequant(W)))`` on the bf16 unit (:mod:`graph_api.kernels.bf16_matmul`):
    the weights dequantized in f32 and rounded to bf16 (the reference's values under bf16 +
    apply_to_int), packed once per constant weight (``holder``, the prepared weight; None:
    per call); ``xf`` holds bf16 values (rounded activations or bf16 data), so the products
    are the reference's, summed in f32."""
    packed = getattr(holder, "bf16_packed", None)  # kept on the prepared weight, freed with it
    if packed is None:
        K, N = spec.K, spec.N
        if isinstance(holder, PreparedWeight) and holder.table is not None:  # int4, interleaved copy
            panel = np.empty((K, -(-N // 128) * 128), np.float32)
            W4.dequant_panel(holder.w, holder.wbs, holder.table, holder.sc, holder.zf, holder.sbs, holder.zmode,
                             spec.group, 0, RND_BF16, panel)
            panel = panel[:, :N]
        else:  # the user's buffers (a prepared int8 weight keeps them)
            if isinstance(holder, PreparedWeight) and w is None:
                w, scales, zps = holder.src
            sc, zp, has_zp = _scales_zps(spec, scales, zps)
            panel = np.empty((K, N), np.float32)
            _dequant_panel(_flat(w), spec.kind in (S4, U4), spec.kind in (S4, S8), spec.transposed, K, N,
                           spec.group, spec.group_n, sc, zp, has_zp, 0, RND_BF16, panel)
        packed = bf16_matmul.pack_b(bf16_matmul.bf16_bits(panel))
        del panel
        if holder is not None:
            holder.bf16_packed = packed
    M = xf.shape[0]
    acc = np.empty((M, spec.N), np.float32)
    bf16_matmul.gemm(bf16_matmul.pack_a(xf), packed, acc, spec.K)
    _store_rows(acc, 0, 0, out, okind, ep.ops, ep.fpar, ep.ipar, ep.buf)


def _flat(w):
    """The user's weight buffer as flat uint8 (s8 too: :func:`_wval` reads the sign)."""
    return np.asarray(w).reshape(-1).view(np.uint8)


def _scales_zps(spec, scales, zps):
    sc = np.ascontiguousarray(np.asarray(scales).astype(np.float32))
    nn = spec.N // spec.group_n
    sh = (nn, spec.K // spec.group) if spec.transposed else (spec.K // spec.group, nn)
    sc = sc.reshape(sh)
    if zps is None:
        return sc, np.zeros((1, 1), np.float32), False
    return sc, np.ascontiguousarray(np.asarray(zps).astype(np.float32)).reshape(sh), True


_scratch = threading.local()  #: per-thread reusable panel and tile buffers (no page faults per call)


def _buffer(name: str, size: int) -> np.ndarray:
    buf = getattr(_scratch, name, None)
    if buf is None or buf.size < size:
        buf = np.empty(size, np.float32)
        setattr(_scratch, name, buf)
    return buf[:size]


#: pipelined prefill: f32 bytes of one thread's dequantized panel (K x width).
#: Measured on one Zen 5 core (K = N = 4096, CPU time): sgemm over 256-column
#: panels ran as fast as one whole-matrix sgemm at M = 128 and 512 and 27%
#: faster at M = 32 (the whole dequantized matrix, 64 MiB, streams from DRAM);
#: dequantizing into 4 MiB panels took 1.9 ms for all 16.8 M weights, into
#: 8 MiB and wider ones 3.2-5.7 ms (the panels no longer stay in L2/L3).
PANEL_TILE_BYTES = 4 << 20


def _drain(panels, run_panel):
    """Run panels from the shared iterator until none is left (one thread:
    Numba kernels single-threaded here, BLAS single-threaded by the caller)."""
    numba.set_num_threads(1)  # thread-local in Numba
    while True:
        item = next(panels, None)  # a list iterator: atomic under the GIL
        if item is None:
            return
        run_panel(*item)


def _prefill(xf, w, spec, scales, zps, prepared, rnd_w, out, okind, ep, exact=False):
    """Dequantize panels of columns (exact f32) and multiply each with one
    sgemm (``exact``: float64 sums rounded once, as the reference MatMul).

    Pipelined (when numpy's OpenBLAS thread count can be set, or with one
    thread): each of the ``numba.get_num_threads()`` threads takes the next
    panel of about ``PANEL_TILE_BYTES`` (full K), dequantizes it into its own
    cache-resident buffer and runs a single-threaded sgemm that writes the
    output's column block; the threads never wait for each other, and one
    thread's dequantization runs beside the other's GEMM.  No thread wake-ups
    per panel: the earlier scheme (a parallel dequantization, then a
    two-thread sgemm per panel) paid both pools' wake-ups per panel and so
    used one 64 MiB panel, whose sgemm read the weights from DRAM again.

    Otherwise (another BLAS, several threads): panels of up to
    ``PANEL_BYTES``, a parallel dequantization, then one multi-threaded sgemm
    each.  Both schemes compute the same products and sums.
    """
    from graph_api.kernels import openblas

    M, K = xf.shape
    N = spec.N
    bits4 = spec.kind in (S4, U4)
    use_blk = prepared is not None and bits4
    unit = 2 * prepared.cbw if use_blk and prepared.table is None else 128  # int4 prepared/natural: whole blocks per panel
    ncols = prepared.nblk * unit if use_blk else -(-N // 128) * 128
    threads = numba.get_num_threads()
    if use_blk and prepared.table is not None and not exact and \
            _prefill_chunks(xf, prepared, N, rnd_w, out, okind, ep, threads):
        return
    pipelined = threads == 1 or openblas.available()
    panel_bytes = PANEL_TILE_BYTES if pipelined else PANEL_BYTES
    step = max(unit, panel_bytes // (4 * max(K, 1)) // unit * unit)
    npanels = -(-ncols // step)
    step = -(-ncols // (npanels * unit)) * unit  # panels of (nearly) equal width
    # the sgemm writes the output's column block itself when nothing follows it
    direct = not exact and okind == OUT_F32 and ep.ops.shape[0] == 0 and ncols == N
    if prepared is not None and not bits4:
        w, scales, zps = prepared.src
    if not use_blk:
        sc, zp, has_zp = _scales_zps(spec, scales, zps)
        wf = _flat(w)
    x64 = xf.astype(np.float64) if exact else None
    pw = prepared

    def run_panel(n0, width):
        pv = _buffer("panel", K * width).reshape(K, width)
        if use_blk and pw.table is not None:
            W4.dequant_panel(pw.w, pw.wbs, pw.table, pw.sc, pw.zf, pw.sbs, pw.zmode, spec.group, n0 // unit,
                             rnd_w, pv)
        elif use_blk:
            _dequant_panel_blk(pw.w, pw.wbs, pw.wks, pw.cbw, np.uint8(pw.xm), pw.sc, pw.zf, pw.sbs, pw.sgs,
                               pw.zmode, np.float32(pw.zc), spec.group, n0 // unit, rnd_w, pv)
        else:
            _dequant_panel(wf, bits4, spec.kind in (S4, S8), spec.transposed, K, N, spec.group, spec.group_n,
                           sc, zp, has_zp, n0, rnd_w, pv)
        if direct:
            np.matmul(xf, pv, out=out[:, n0:n0 + width])
            return
        tv = _buffer("acc", M * width).reshape(M, width)
        if exact:
            with np.errstate(all="ignore"):
                tv[...] = np.matmul(x64, pv.astype(np.float64))
        else:
            np.matmul(xf, pv, out=tv)
        from graph_api.kernels import store  # (kernels.store imports this module)

        store.store_tile(tv, out, n0, okind, ep)  # the row-wise vectorised epilogue store

    panels = [(n0, min(step, ncols - n0)) for n0 in range(0, ncols, step)]
    if pipelined:
        _run_pipelined(panels, run_panel, threads)
    else:
        for item in panels:
            run_panel(*item)


def _run_pipelined(items, run, threads, blas=True):
    """``run(*item)`` for every item, on ``threads`` threads that each take
    the next item when done (Numba kernels and, if ``blas``, numpy's OpenBLAS
    single-threaded in each)."""
    from graph_api.kernels import openblas
    from graph_api.kernels.threads import submit

    workers = min(threads, len(items))
    it = iter(items)
    with openblas.single_threaded() if blas and openblas.available() else contextlib.nullcontext():
        helpers = [submit(_drain, it, run) for _ in range(workers - 1)]
        try:
            _drain(it, run)
        finally:
            numba.set_num_threads(threads)
            for f in helpers:  # a helper still queued behind other work finds no item left
                f.result()


#: chunked prefill (interleaved int4 weights, :func:`_prefill_chunks`): per activation
#: row count below a bound, (columns per work item, K rows per tile, whether the tile
#: product is OpenBLAS's sgemm or the Numba register-blocked kernel).  Measured on one
#: Zen 5 core (CPU time, K = N = 4096, whole prefill, one sgemm on the pre-dequantized
#: matrix as "dense", same process): Numba 512 x 256 tiles (4-row blocks; 8-row blocks
#: took 5-7% less on the products alone): M = 32 12.6 ms (dense 17.9), M = 128 46.0
#: (49.4), M = 256 92.6 (90.5; sgemm tiles 96.1); products of hot tiles
#: alone at M = 512: Numba 205, sgemm 183 (the rows of x no longer stay in L1).  sgemm
#: tiles at M = 512: 1024 x 448 182.6, 2048 x 448 181.8, 512 x 256 184.9, dense 175.1
#: (fewer, deeper steps re-pack the activations and re-read the output block less often).
PREFILL_GEOMETRY_AVX512 = ((384, 512, 256, False), (1 << 62, 1024, 448, True))
#: AVX2 without AVX-512 (16 ymm registers): the Numba kernel's 8 x 32 register block is 32
#: ymm accumulators and spills, so every tile product is sgemm's.  Measured on one Zen 3
#: core (CPU time, K = N = 4096 s4 g128, same process): Numba 512 x 256 tiles M = 32
#: 42.2 ms, M = 128 149.8; sgemm 1024 x 448 tiles 24.3 and 70.0 (256 x 256 and 384 x 512
#: tiles within 8% of that); f32 sgemm on the pre-dequantized matrix 24.4 and 72.1.
PREFILL_GEOMETRY_AVX2 = ((1 << 62, 1024, 448, True),)
PREFILL_GEOMETRY = PREFILL_GEOMETRY_AVX512 if HAS_VPERMPS else PREFILL_GEOMETRY_AVX2


def _prefill_chunks(xf, pw, N, rnd_w, out, okind, ep, threads) -> bool:
    """Prepared int4 weights (interleaved layout): work items of a few hundred
    columns (:data:`PREFILL_GEOMETRY`), each one
    :func:`graph_api.kernels.wgemv4.prefill_chunk` call on one thread (K in
    tiles of a few hundred rows that stay in L2/L3, each multiplied into the
    output columns).  False (nothing done) when the geometry wants OpenBLAS
    and numpy's is not reachable."""
    from graph_api.kernels import openblas

    M, K = xf.shape
    nblk = pw.nblk
    cols, kc, blas = next((c, k, b) for below, c, k, b in PREFILL_GEOMETRY if M < below)
    if blas and not openblas.available():
        return False
    per = max(1, min(cols // W4.BLOCK_COLS, -(-nblk // threads)))  # blocks per item
    direct = (okind == OUT_F32 and ep.ops.shape[0] == 0 and nblk * W4.BLOCK_COLS == N
              and out.dtype == np.float32 and out.flags.c_contiguous)
    fn = openblas.sgemm_address() if blas else 0
    G = pw.spec.group

    def run(b0, nb):
        tile = _buffer("wtile", W4.tile_floats(kc, nb))
        if direct:
            W4.prefill_chunk(xf, pw.w, pw.wbs, pw.table, pw.sc, pw.zf, pw.sbs, pw.zmode, G, b0, nb, kc, rnd_w,
                             tile, out, b0 * W4.BLOCK_COLS, N, fn)
            return
        acc = _buffer("acc", M * nb * W4.BLOCK_COLS).reshape(M, nb * W4.BLOCK_COLS)
        W4.prefill_chunk(xf, pw.w, pw.wbs, pw.table, pw.sc, pw.zf, pw.sbs, pw.zmode, G, b0, nb, kc, rnd_w,
                         tile, acc, 0, nb * W4.BLOCK_COLS, fn)
        from graph_api.kernels import store  # (kernels.store imports this module)

        store.store_tile(acc, out, b0 * W4.BLOCK_COLS, okind, ep)  # the row-wise vectorised epilogue store

    _run_pipelined([(b0, min(per, nblk - b0)) for b0 in range(0, nblk, per)], run, threads, blas)
    return True


# ------------------------------------------------------- dense f32 copies
#: a prepared (constant) weight whose dequantized f32 copy takes at most this many bytes
#: keeps that copy for its prefills (made on the first one): the prefill is then f32 BLAS
#: on it, the dense MatMul's fused row-tile GEMM (:func:`graph_api.kernels.store.gemm_store`).
#: Such weights fit in L2/L3, where the int4 form saves no bandwidth and each prefill
#: would dequantize them again (MiniLM's 384 x 1536, 2.25 MiB in f32).  Larger weights
#: stream from memory; their int4 form reads 8x fewer bytes (:func:`_prefill_chunks`).
DENSE_COPY_BYTES = 8 << 20
#: the bytes all dense copies of the process may hold together (the first ones made keep
#: theirs; a copy is given back when its prepared weight is freed)
DENSE_TOTAL_BYTES = 256 << 20
_dense_lock = threading.Lock()
_dense_held = 0


def _release_dense(nbytes: int) -> None:
    global _dense_held
    with _dense_lock:
        _dense_held -= nbytes


def dense_bytes_held() -> int:
    """Bytes of dense f32 copies alive in the process (see :data:`DENSE_TOTAL_BYTES`)."""
    return _dense_held


def dense_copy(pw: PreparedWeight, rnd_w: int) -> np.ndarray | None:
    """The f32 ``[K, N]`` dequantized weight ``round((q - z) * s)`` of a prepared
    weight (``rnd_w``: the fpmath rounding code of the dequantized weight), made once
    and kept on ``pw``; None when it is larger than :data:`DENSE_COPY_BYTES` or the
    process's copies would exceed :data:`DENSE_TOTAL_BYTES`.  The values are the ones
    every prefill panel holds (the same kernels make them): exact f32 products,
    then the rounding, as the reference DynamicDequantize."""
    global _dense_held
    hit = pw.dense
    if hit is not None and hit[0] == rnd_w:
        return hit[1]
    spec = pw.spec
    K, N = spec.K, spec.N
    nbytes = 4 * K * N
    if nbytes > DENSE_COPY_BYTES or (pw.table is None and spec.kind in (S4, U4)):
        return None  # (int4 without the table: a view of the user's buffer, not prepare()'s copy)
    with _dense_lock:
        if _dense_held + nbytes > DENSE_TOTAL_BYTES:
            return None
        _dense_held += nbytes
    try:
        ncols = -(-N // 128) * 128
        panel = np.empty((K, ncols), np.float32)
        if pw.table is not None:
            W4.dequant_panel(pw.w, pw.wbs, pw.table, pw.sc, pw.zf, pw.sbs, pw.zmode, spec.group, 0, rnd_w, panel)
        else:  # int8: from the user's buffers, as the prefill panels
            w, scales, zps = pw.src
            sc, zp, has_zp = _scales_zps(spec, scales, zps)
            _dequant_panel(_flat(w), False, spec.kind == S8, spec.transposed, K, N, spec.group,
                           spec.group_n, sc, zp, has_zp, 0, rnd_w, panel)
        dense = panel if ncols == N else np.ascontiguousarray(panel[:, :N])
    except BaseException:
        _release_dense(nbytes)
        raise
    weakref.finalize(dense, _release_dense, nbytes)
    pw.dense = (rnd_w, dense)
    return dense


def prefill_runner(xf, spec: WeightSpec, scales, zps, pw, out, ep, head=None):
    """:func:`wmatmul`'s dense-copy prefill (:func:`_dense_prefill`: f32 activations,
    no rounding, f32 output) on these arrays as a callable, for a caller that runs the
    same product on the same memory again and again (the values may change:
    ``CompiledPartition.bind``); None without a dense copy or where the arrays do not
    fit.  The callable first runs the overflow guard (:func:`_fast_is_exact`: it reads
    the activations) and returns False, having written nothing, when it refuses; the
    caller then runs :func:`wmatmul` (its exact path).  ``head``: an f32 [N] row added
    before the epilogue (:func:`graph_api.kernels.store.store`'s, a bias)."""
    M, K = xf.shape
    if not (isinstance(pw, PreparedWeight) and M > DECODE_MAX_M and xf.dtype == np.float32
            and xf.flags.c_contiguous and out.dtype == np.float32 and out.shape == (M, spec.N)):
        return None
    gemm = _dense_gemm(xf, pw, 0, out, OUT_F32, ep, head)
    if gemm is None:
        return None

    def runner() -> bool:
        if not _fast_is_exact(xf, spec, scales, zps, pw):
            return False
        gemm()
        return True

    return runner


def _dense_prefill(xf, pw, rnd_w, out, okind, ep) -> bool:
    """``out = epilogue(xf @ dense_copy(pw))`` by :func:`graph_api.kernels.store.gemm_store`
    (single-threaded sgemm per row tile on each thread, the epilogue store while the
    tile is in cache; f32 sums, K terms; tiles with an inf or a NaN redone in float64);
    False (nothing done) without a dense copy, numpy's OpenBLAS or a C-contiguous ``out``."""
    gemm = _dense_gemm(xf, pw, rnd_w, out, okind, ep)
    if gemm is None:
        return False
    gemm()
    return True


def _dense_gemm(xf, pw, rnd_w, out, okind, ep, head=None):
    """:func:`_dense_prefill`'s product as a :func:`graph_api.kernels.store.gemm_runner`
    (``head``: an f32 [N] row added before the epilogue), or None."""
    from graph_api.kernels import openblas, store  # (kernels.store imports this module)

    if not (out.flags.c_contiguous and openblas.available()):
        return None
    dense = dense_copy(pw, rnd_w)
    if dense is None:
        return None
    M, N = out.shape
    return store.gemm_runner(xf, dense, out.reshape(-1), np.arange(M, dtype=np.int64) * N,
                             np.arange(N, dtype=np.int64), okind, ep, N, store.NO_HEAD if head is None else head,
                             direct=head is None and okind == OUT_F32 and ep.ops.shape[0] == 0)

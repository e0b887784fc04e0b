"""RMSNorm / LayerNorm / SoftMax over the last axis, with an epilogue program.

Formulas (rows ``x`` of length C, statistics accumulated in f64 as the
reference does, the rest in f32)::

    LayerNorm: y = (x - mean) / sqrt(var + eps) * gamma + beta
    RMSNorm:   y = x / sqrt(mean(x^2) + eps) * gamma
    SoftMax:   y = exp(x - max) / sum(exp(x - max))      (exp: bits.exp32)

then ``post_ops`` (``wmatmul.make_epilogue`` program over the [R, C] output)
and an optional bf16/f16 store.  Inputs may be f32 or bf16/f16 bits.
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba

import numpy as np
from numba import njit, prange

from graph_api.kernels.bits import (act_kind, exp32, f32_view, load_f32, vadd64, vlane64, vload8_f64, vmul64, vsplat64,
                                    vsub64)
from graph_api.kernels.store import ep_row, put_dense
from graph_api.kernels.weight_compressed.wmatmul import make_epilogue

LAYER, RMS, SOFTMAX = 0, 1, 2


@njit(inline="always", cache=True)
def _sum64(row, shift, square):
    """sum of ``row - shift`` (or of its square) in f64, as 8 interleaved partial sums
    (lane j sums the elements j, j + 8, ...; one f64x8 register: the lanes are
    independent chains, added in a fixed order at the end)."""
    C = row.shape[0]
    c8 = C - C % 8
    acc = vsplat64(0.0)
    sh = vsplat64(shift)
    for c in range(0, c8, 8):
        d = vsub64(vload8_f64(row, c), sh)
        if square:
            d = vmul64(d, d)
        acc = vadd64(acc, d)
    s0 = vlane64(acc, 0)
    for c in range(c8, C):
        d = np.float64(row[c]) - shift
        s0 += d * d if square else d
    return ((s0 + vlane64(acc, 1)) + (vlane64(acc, 2) + vlane64(acc, 3))) + \
        ((vlane64(acc, 4) + vlane64(acc, 5)) + (vlane64(acc, 6) + vlane64(acc, 7)))


@njit(cache=True)
def _row(src, dst, op, gamma, has_g, beta, has_b, eps):
    """Normalize one f32 row ``src`` into ``dst`` (the same array, or another of its
    length: each element is read before its own index is written)."""
    C = src.shape[0]
    if op == 2:
        mx = src[0]
        for c in range(C):
            mx = max(mx, src[c])
        s = np.float32(0.0)
        for c in range(C):
            dst[c] = exp32(src[c] - mx)
        for c in range(C):
            s += dst[c]
        inv = np.float32(1.0) / s
        for c in range(C):
            dst[c] = dst[c] * inv
    else:
        mean = _sum64(src, 0.0, False) / C if op == 0 else 0.0
        var = _sum64(src, mean, True) / C
        inv = np.float32(1.0 / np.sqrt(var + eps))
        m32 = np.float32(mean)
        # one pass per case, each with the separate f32 roundings of (x - mean) * inv, * gamma, + beta
        # (three passes over the row measured slower)
        if has_g and has_b:
            for c in range(C):
                dst[c] = (src[c] - m32) * inv * gamma[c] + beta[c]
        elif has_g:
            for c in range(C):
                dst[c] = (src[c] - m32) * inv * gamma[c]
        elif has_b:
            for c in range(C):
                dst[c] = (src[c] - m32) * inv + beta[c]
        else:
            for c in range(C):
                dst[c] = (src[c] - m32) * inv


@njit(parallel=True, cache=True)
def _rows(x, kind, R, C, op, gamma, has_g, beta, has_b, eps, okind, ops, fpar, ipar, buf, out, blocks):
    """Normalize the ``R`` rows of ``C`` values of ``x`` into ``out``, then the epilogue.

    ``x`` and ``out`` are always uint16 views (:func:`bits16`), whatever they hold
    (``kind`` / ``okind``: 0 f32, 1 bf16, 2 f16): one compiled signature for every
    input/output type pair (each pair compiled ~7 s of its own, cold).
    """
    step = (R + blocks - 1) // max(blocks, 1)
    has_ep = ops.shape[0] > 0
    # the f32 rows of x / out when kind / okind is 0 (else unused), viewed once per call: a
    # view per row cost ~10% of a 512 x 768 LayerNorm; the even prefix: a half-precision
    # buffer of odd length has no f32 view
    xf = f32_view(x)
    of = f32_view(out)
    for b in prange(blocks):
        row = np.empty(C, np.float32)
        orow = np.empty(C, np.float32)
        for r in range(b * step, min(R, b * step + step)):
            base = r * C
            # f32 in and out: read the input row and write the output row in place
            # (a staging row and its two copies were ~40% of a LayerNorm's time); the
            # epilogue then runs on the output row.  Half-precision input is widened
            # into ``row`` first, half-precision output is stored from it.
            if kind == 0:
                # a slice: no negative-index wraparound, so the loops vectorise
                src = xf[base:base + C]
            else:
                for c in range(C):
                    row[c] = load_f32(x, kind, base + c)
                src = row
            if okind == 0:
                dst = of[base:base + C]
            else:
                dst = row
            _row(src, dst, op, gamma, has_g, beta, has_b, eps)
            if has_ep:  # a call per row even for an empty program costs ~60 ns
                ep_row(dst, r, ops, fpar, ipar, buf, orow, np.int64(0))
            if okind != 0:
                put_dense(row, out, base, okind)


def bits16(a: np.ndarray) -> np.ndarray:
    """A flat contiguous f32 or half-precision-bits array as the uint16 view :func:`_rows` takes."""
    return a.view(np.uint16)


def blocks(R: int) -> int:
    """Row blocks of a call: a few per thread (each block allocates its row buffers once)."""
    return max(1, min(R, 4 * numba.get_num_threads()))


def _run(x, op, gamma=None, beta=None, eps=1e-5, post_ops=(), out=None, out_dtype="f32"):
    x = np.ascontiguousarray(x)
    C = x.shape[-1]
    R = x.size // C
    xv, kind = act_kind(x.reshape(-1))
    okind = {"f32": 0, "bf16": 1, "f16": 2}[out_dtype]
    if out is None:
        out = np.empty(x.shape, np.float32 if okind == 0 else np.uint16)
    ep = make_epilogue(post_ops, R, C)
    g = np.ones(1, np.float32) if gamma is None else np.asarray(gamma, np.float32).reshape(-1)
    b = np.zeros(1, np.float32) if beta is None else np.asarray(beta, np.float32).reshape(-1)
    _rows(bits16(xv), kind, R, C, op, g, gamma is not None, b, beta is not None, float(eps), okind,
          ep.ops, ep.fpar, ep.ipar, ep.buf, bits16(out.reshape(-1)), blocks(R))
    return out


def layer_norm(x, gamma=None, beta=None, eps=1e-5, **kw):
    """LayerNorm over the last axis (see module doc)."""
    return _run(x, LAYER, gamma, beta, eps, **kw)


def rms_norm(x, gamma=None, eps=1e-6, **kw):
    """RMSNorm over the last axis (see module doc)."""
    return _run(x, RMS, gamma, None, eps, **kw)


def softmax(x, **kw):
    """SoftMax over the last axis (see module doc)."""
    return _run(x, SOFTMAX, **kw)

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

from graph_api.kernels.bits import load_f32, act_kind, exp32
from graph_api.kernels.store import ep_row, put_dense
from graph_api.kernels.wmatmul import make_epilogue

LAYER, RMS, SOFTMAX = 0, 1, 2


@njit(inline="always", cache=True)
def _sum64(row, shift, square):
    """sum of ``row - shift`` (or of its square) in f64, as 8 interleaved partial sums
    (independent chains: the loop vectorises without reassociating a single sum)."""
    C = row.shape[0]
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    c8 = C - C % 8
    for c in range(0, c8, 8):
        d0, d1 = np.float64(row[c]) - shift, np.float64(row[c + 1]) - shift
        d2, d3 = np.float64(row[c + 2]) - shift, np.float64(row[c + 3]) - shift
        d4, d5 = np.float64(row[c + 4]) - shift, np.float64(row[c + 5]) - shift
        d6, d7 = np.float64(row[c + 6]) - shift, np.float64(row[c + 7]) - shift
        if square:
            d0, d1, d2, d3, d4, d5, d6, d7 = d0 * d0, d1 * d1, d2 * d2, d3 * d3, d4 * d4, d5 * d5, d6 * d6, d7 * d7
        s0 += d0
        s1 += d1
        s2 += d2
        s3 += d3
        s4 += d4
        s5 += d5
        s6 += d6
        s7 += d7
    for c in range(c8, C):
        d = np.float64(row[c]) - shift
        s0 += d * d if square else d
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@njit(cache=True)
def _row(row, r, op, gamma, has_g, beta, has_b, eps, ops, fpar, ipar, buf, orow):
    """Normalize one f32 row in place, then its epilogue."""
    C = row.shape[0]
    if op == 2:
        mx = row[0]
        for c in range(C):
            mx = max(mx, row[c])
        s = np.float32(0.0)
        for c in range(C):
            row[c] = exp32(row[c] - mx)
        for c in range(C):
            s += row[c]
        inv = np.float32(1.0) / s
        for c in range(C):
            row[c] = row[c] * inv
    else:
        mean = _sum64(row, 0.0, False) / C if op == 0 else 0.0
        var = _sum64(row, mean, True) / C
        inv = np.float32(1.0 / np.sqrt(var + eps))
        m32 = np.float32(mean)
        for c in range(C):
            row[c] = (row[c] - m32) * inv
        if has_g:
            for c in range(C):
                row[c] = row[c] * gamma[c]
        if has_b:
            for c in range(C):
                row[c] = row[c] + beta[c]
    ep_row(row, r, ops, fpar, ipar, buf, orow, np.int64(0))


@njit(parallel=True, cache=True)
def _rows(x, kind, R, C, op, gamma, has_g, beta, has_b, eps, okind, ops, fpar, ipar, buf, out, blocks):
    step = (R + blocks - 1) // max(blocks, 1)
    for b in prange(blocks):
        row = np.empty(C, np.float32)
        orow = np.empty(C, np.float32)
        for r in range(b * step, min(R, b * step + step)):
            base = r * C
            if kind == 0:
                for c in range(C):
                    row[c] = x[base + c]
            else:
                for c in range(C):
                    row[c] = load_f32(x, kind, base + c)
            _row(row, r, op, gamma, has_g, beta, has_b, eps, ops, fpar, ipar, buf, orow)
            put_dense(row, out, base, okind)


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
    _rows(xv, kind, R, C, op, g, gamma is not None, b, beta is not None, float(eps), okind,
          ep.ops, ep.fpar, ep.ipar, ep.buf, out.reshape(-1), blocks(R))
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

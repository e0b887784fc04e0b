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

from graph_api.kernels.numba_setup import numba  # noqa: F401

import numpy as np
from numba import njit, prange

from graph_api.kernels.bits import load_f32, act_kind, exp32, f32_to_bf16, f32_to_f16_bits
from graph_api.kernels.wmatmul import _ep_one, make_epilogue

LAYER, RMS, SOFTMAX = 0, 1, 2


@njit(parallel=True, cache=True)
def _rows(x, kind, R, C, op, gamma, has_g, beta, has_b, eps, okind, ops, fpar, ipar, buf, out):
    for r in prange(R):
        base = r * C
        row = np.empty(C, np.float32)
        for c in range(C):
            row[c] = load_f32(x, kind, base + c)
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
            mean = 0.0
            if op == 0:
                for c in range(C):
                    mean += np.float64(row[c])
                mean /= C
            var = 0.0
            for c in range(C):
                d = np.float64(row[c]) - mean
                var += d * d
            var /= C
            inv = np.float32(1.0 / np.sqrt(var + eps))
            m32 = np.float32(mean)
            for c in range(C):
                v = (row[c] - m32) * inv
                if has_g:
                    v = v * gamma[c]
                if has_b:
                    v = v + beta[c]
                row[c] = v
        for c in range(C):
            v = _ep_one(row[c], r, c, ops, fpar, ipar, buf)
            if okind == 0:
                out[base + c] = v
            elif okind == 1:
                out[base + c] = f32_to_bf16(v)
            else:
                out[base + c] = f32_to_f16_bits(v)


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
          ep.ops, ep.fpar, ep.ipar, ep.buf, out.reshape(-1))
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

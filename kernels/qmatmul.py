"""The store pass of a static int8/u8 MatMul: scales, post-ops and requantization.

The integer products are summed exactly before this pass (the int8 GEMM of
``kernels/igemm.py`` in int32; or f32 BLAS on the zero-point-centred integer
values in K chunks whose sums stay below 2**24, or one f64 GEMM;
``graph_api.kernels.fused.qmatmul_plan``).  Fusing this pass into the int8
GEMM's 64-column tiles was measured slower (1.7 ms against 0.7 ms at
512 x 1536 outputs, one thread): the short row loops pay their alias checks.  For each output
element this pass then computes, in one visit::

    acc[r, n]                                      exact integer (int32 from the int8 GEMM;
                                                   f32, or f64 when the BLAS GEMM ran in f64
                                                   or K chunks were summed in f64)
    v   = f32(acc * colscale[n])                   colscale = src scale * weight scale (f64)
    v   = epilogue(v)                              bias, post-ops (graph_api.postops), f32
    out[roff[r] + coff[n]] = saturate(rne(v / qs[n] + qz[n]))      (okind QUANT: s8/u8)
                           = convert(v)                            (f32 / bf16 / f16 bits)

``v / qs + qz`` is the reference Quantize's f32 formula; rounding is half to
even and NaN stores 0, infinities saturate, as ``graph_api.dtypes.convert``.
Strict f32, no fastmath.
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (configures numba first)

import numpy as np
from numba import njit, prange

from graph_api.kernels.store import SERIAL_BELOW, _put
from graph_api.kernels.weight_compressed.wmatmul import _ep_steps

#: output kinds: the store's f32 / bf16 / f16, and a quantized integer output
OUT_QUANT = 3


@njit(inline="always", cache=True)
def _requant(v, qs, qz, lo, hi):
    """saturate(rne(v / qs + qz)) as a float holding an integer (NaN -> 0)."""
    y = np.rint(v / qs + qz)  # f32 arithmetic, as the reference Quantize; rint: half to even
    y = y if y == y else np.float32(0.0)
    return min(max(y, lo), hi)


@njit(inline="always", cache=True)
def _row(acc, r, colscale, out, base, coff, okind, ops, fpar, ipar, buf, qs, qz, lo, hi, v):
    """Row ``r``: scaled into ``v`` (f32 scratch of length N), the epilogue program run
    over it by ``_ep_steps`` (one compiled call per row: inlined here, the post-op
    evaluator cost ~19 s of compile on an empty cache, ~4x a single inline, through
    this inlined helper), then requantized or converted into ``out``."""
    N = acc.shape[1]
    for n in range(N):
        v[n] = np.float32(acc[r, n] * colscale[n])
    if ops.shape[0]:
        _ep_steps(v, r, np.int64(0), ops, fpar, ipar, buf)
    # the okind test outside the column loop keeps each loop branch-free
    if okind == OUT_QUANT:
        for n in range(N):
            out[base + coff[n]] = _requant(v[n], qs[n], qz[n], lo, hi)
    else:
        for n in range(N):
            _put(out, base + coff[n], v[n], okind)


@njit(parallel=True, cache=True)
def _store_par(acc, colscale, out, roff, coff, okind, ops, fpar, ipar, buf, qs, qz, lo, hi):
    for r in prange(acc.shape[0]):
        v = np.empty(acc.shape[1], np.float32)
        _row(acc, r, colscale, out, roff[r], coff, okind, ops, fpar, ipar, buf, qs, qz, lo, hi, v)


@njit(cache=True)
def _store_ser(acc, colscale, out, roff, coff, okind, ops, fpar, ipar, buf, qs, qz, lo, hi):
    v = np.empty(acc.shape[1], np.float32)
    for r in range(acc.shape[0]):
        _row(acc, r, colscale, out, roff[r], coff, okind, ops, fpar, ipar, buf, qs, qz, lo, hi, v)


def store(acc, colscale, out_flat, roff, coff, okind, ep, qs, qz, lo, hi) -> None:
    """One pass from the exact integer sums ``acc`` [R, N] (int32, f32 or f64) to ``out_flat``.

    ``colscale`` f64 [N]; ``qs``/``qz`` f32 [N] (ignored unless ``okind == OUT_QUANT``);
    ``lo``/``hi`` the integer output range; ``ep`` a ``wmatmul.make_epilogue`` program.
    """
    fn = _store_ser if acc.size < SERIAL_BELOW else _store_par
    fn(acc, colscale, out_flat, roff, coff, okind, ep.ops, ep.fpar, ep.ipar, ep.buf,
       qs, qz, np.float32(lo), np.float32(hi))

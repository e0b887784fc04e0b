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
Strict f32, no fastmath; IEEE divisions (``error_model="numpy"``: Numba's default
tests each divisor for zero, and that branch kept the loops scalar: 1.7 ms against
0.24 ms for 512 x 1536 outputs on one Zen 4 core), and the columns written as
contiguous runs (a scatter through ``coff`` kept them scalar too).
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (configures numba first)

import numpy as np
from numba import njit, prange

from graph_api.kernels.store import SERIAL_BELOW, _put, _put_run
from graph_api.kernels.weight_compressed.wmatmul import _ep_steps

#: output kinds: the store's f32 / bf16 / f16, and a quantized integer output
OUT_QUANT = 3


@njit(inline="always", cache=True, error_model="numpy")
def _requant(v, qs, qz, lo, hi):
    """saturate(rne(v / qs + qz)) as a float holding an integer (NaN -> 0)."""
    y = np.rint(v / qs + qz)  # f32 arithmetic, as the reference Quantize; rint: half to even
    y = y if y == y else np.float32(0.0)
    return min(max(y, lo), hi)


@njit(inline="always", cache=True, error_model="numpy")
def _requant_run(v, n0, n1, out, b, qs, qz, lo, hi):
    """out[b + n] = requant(v[n]) for n in [n0, n1), over slices indexed from 0 (the
    loop vectorises: no scatter, no wraparound test)."""
    src = v[n0:n1]
    dst = out[b + n0:b + n1]
    qsr = qs[n0:n1]
    qzr = qz[n0:n1]
    for n in range(src.shape[0]):
        dst[n] = _requant(src[n], qsr[n], qzr[n], lo, hi)


@njit(inline="always", cache=True, error_model="numpy")
def _row(acc, r, colscale, out, base, coff, run, okind, ops, fpar, ipar, buf, qs, qz, lo, hi, v):
    """Row ``r``: scaled into ``v`` (f32 scratch of length N), the epilogue program run
    over it by ``_ep_steps`` (one compiled call per row: inlined here, the post-op
    evaluator cost ~19 s of compile on an empty cache, ~4x a single inline, through
    this inlined helper), then requantized or converted into ``out``, whose columns
    ``coff`` are contiguous within runs of ``run``."""
    N = acc.shape[1]
    for n in range(N):
        v[n] = np.float32(acc[r, n] * colscale[n])
    if ops.shape[0]:
        _ep_steps(v, r, np.int64(0), ops, fpar, ipar, buf)
    # the okind test outside the column loop keeps each loop branch-free
    if run == 1:  # no contiguous columns: one scatter (a slice per column costs ~20 ns)
        if okind == OUT_QUANT:
            for n in range(N):
                out[base + coff[n]] = _requant(v[n], qs[n], qz[n], lo, hi)
        else:
            for n in range(N):
                _put(out, base + coff[n], v[n], okind)
        return
    for j in range(0, N, run):
        b = base + coff[j] - j
        if okind == OUT_QUANT:
            _requant_run(v, j, j + run, out, b, qs, qz, lo, hi)
        else:
            _put_run(v, j, j + run, out, b, okind)


@njit(parallel=True, cache=True, error_model="numpy")
def _store_par(acc, colscale, out, roff, coff, run, okind, ops, fpar, ipar, buf, qs, qz, lo, hi):
    for r in prange(acc.shape[0]):
        v = np.empty(acc.shape[1], np.float32)
        _row(acc, r, colscale, out, roff[r], coff, run, okind, ops, fpar, ipar, buf, qs, qz, lo, hi, v)


@njit(cache=True, error_model="numpy")
def _store_ser(acc, colscale, out, roff, coff, run, okind, ops, fpar, ipar, buf, qs, qz, lo, hi):
    v = np.empty(acc.shape[1], np.float32)
    for r in range(acc.shape[0]):
        _row(acc, r, colscale, out, roff[r], coff, run, okind, ops, fpar, ipar, buf, qs, qz, lo, hi, v)


def store(acc, colscale, out_flat, roff, coff, okind, ep, qs, qz, lo, hi, run: int = 1) -> None:
    """One pass from the exact integer sums ``acc`` [R, N] (int32, f32 or f64) to ``out_flat``.

    ``colscale`` f64 [N]; ``qs``/``qz`` f32 [N] (ignored unless ``okind == OUT_QUANT``);
    ``lo``/``hi`` the integer output range; ``ep`` a ``wmatmul.make_epilogue`` program;
    ``run``: ``coff`` is contiguous within runs of this many columns (a divisor of N:
    ``store.contiguous_run``), which the loops write as slices.
    """
    fn = _store_ser if acc.size < SERIAL_BELOW else _store_par
    fn(acc, colscale, out_flat, roff, coff, np.int64(run), okind, ep.ops, ep.fpar, ep.ipar, ep.buf,
       qs, qz, np.float32(lo), np.float32(hi))

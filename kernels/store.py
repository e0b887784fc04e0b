"""One pass over a row-major ``[R, N]`` f32 result: post-op chain, conversion,
and a strided store.

``out[roff[r] + coff[n]] = convert(epilogue(acc[r, n]))`` where ``out`` is the
flat destination buffer (f32, or bf16/f16 bits as uint16) and ``roff``/``coff``
are element offsets worked out at compile time.  A reshape, transpose or
reorder of the result after the post-ops is therefore written by this store,
not by a later copy.  The epilogue program is ``graph_api.kernels.wmatmul``'s (codes of
``graph_api.postops``); strict f32, no fastmath.
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (configures numba first)

import numpy as np
from numba import njit, prange

from graph_api.kernels.bits import f32_to_bf16, f32_to_f16_bits
from graph_api.kernels.wmatmul import _ep_one

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


@njit(parallel=True, cache=True)
def _store_par(acc, out, roff, coff, okind, ops, fpar, ipar, buf):
    R, N = acc.shape
    for r in prange(R):
        base = roff[r]
        for n in range(N):
            _put(out, base + coff[n], _ep_one(acc[r, n], r, n, ops, fpar, ipar, buf), okind)


@njit(cache=True)
def _store_ser(acc, out, roff, coff, okind, ops, fpar, ipar, buf):
    R, N = acc.shape
    for r in range(R):
        base = roff[r]
        for n in range(N):
            _put(out, base + coff[n], _ep_one(acc[r, n], r, n, ops, fpar, ipar, buf), okind)


def store(acc2d, out_flat, roff, coff, okind, ep) -> None:
    """Apply epilogue ``ep`` to ``acc2d`` (f32 [R, N]) and store through the offsets."""
    fn = _store_ser if acc2d.size < SERIAL_BELOW else _store_par
    fn(acc2d, out_flat, roff, coff, okind, ep.ops, ep.fpar, ep.ipar, ep.buf)


def element_offsets(shape, strides) -> np.ndarray:
    """Element offset of every index of a strided tensor, as an array of ``shape``."""
    off = np.zeros(tuple(shape), np.int64)
    for axis, (d, s) in enumerate(zip(shape, strides)):
        view = [1] * len(shape)
        view[axis] = d
        off = off + (np.arange(d, dtype=np.int64) * s).reshape(view)
    return off


def separable(off2d: np.ndarray):
    """``(roff, coff)`` with ``off2d == roff[:, None] + coff[None, :]``, or None."""
    roff = np.ascontiguousarray(off2d[:, 0])
    coff = np.ascontiguousarray(off2d[0, :] - off2d[0, 0])
    if off2d.size and not np.array_equal(off2d, roff[:, None] + coff[None, :]):
        return None
    return roff, coff

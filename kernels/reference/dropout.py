"""Dropout with a deterministic counter-based generator.

For element ``i`` (row-major linear index) of the source::

    key  = splitmix64(seed)
    h    = splitmix64((offset + i) ^ key)              (uint64 arithmetic, wrapping)
    u    = ((h >> 40) + 1) * 2^-24                     (in (0, 1], exact in f32)
    mask = u > p                                       (u8 output: 1 kept, 0 dropped)
    dst  = mask ? src / (1 - p) : 0                    (f32 arithmetic)

``splitmix64(z)``: ``z += 0x9E3779B97F4A7C15; z = (z ^ z>>30) * 0xBF58476D1CE4E5B9;
z = (z ^ z>>27) * 0x94D049BB133111EB; return z ^ z>>31``.  Because ``u > 0``,
``p = 0`` keeps everything and ``p = 1`` drops everything.  The mask formula
is oneDNN's (``PRNG > p``) but the random stream is NOT bit-identical with
oneDNN's Philox generator: same seed/offset give different masks here.
"""
from __future__ import annotations

import numpy as np

from graph_api.enums import OpKind

from ._common import f32, finish

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def splitmix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer of a uint64 array (wrapping arithmetic)."""
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def _as_u64(scalar) -> np.ndarray:
    """An s64 host scalar as a 1-element uint64 array (two's complement bits)."""
    return np.asarray(scalar).astype(np.int64).reshape(1).view(np.uint64)


def uniform(seed, offset, count: int) -> np.ndarray:
    """``count`` f32 values in (0, 1] for counters ``offset .. offset+count-1``."""
    key = splitmix64(_as_u64(seed))
    counters = _as_u64(offset) + np.arange(count, dtype=np.uint64)
    h = splitmix64(counters ^ key)
    return ((h >> np.uint64(40)) + np.uint64(1)).astype(np.float32) * np.float32(2.0 ** -24)


def dropout(op, inputs, out_lts, ctx):
    """mask = u > p; dst = mask ? src / (1 - p) : 0 (see the module docstring)."""
    src, seed, offset, prob = inputs
    x = f32(src)
    p = np.float32(np.asarray(prob).reshape(()))
    keep = (uniform(seed, offset, x.size) > p).reshape(x.shape)
    with np.errstate(all="ignore"):
        dst = np.where(keep, x / (np.float32(1) - p), np.float32(0))
    outs = [finish(dst, out_lts[0])]
    if len(out_lts) > 1:
        outs.append(finish(keep.astype(np.uint8), out_lts[1]))
    return outs


DROPOUT = {OpKind.Dropout: dropout}

"""K, V and Q widened to f32 for the f32 prefill kernel (:func:`attention._widened_prefill`):
bf16/f16 bits exactly, int8/int4 dequantized ``(n - z) * s`` as the kernels do."""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (numba: configured first)

import numpy as np
from numba import njit, prange

from graph_api import working_memory
from graph_api.kernels.bits import bf16_to_f32, f16_bits_to_f32, round_code
from graph_api.kernels.sdpa.operands import KINDS, KV, kv_args
from graph_api.kernels.sdpa.tiled import widen_run


@njit(cache=True)
def _prep_q(q, kind, rnd, qf):
    B, H, Sq, D = qf.shape
    for bh in range(B * H):
        b = bh // H
        h = bh % H
        for i in range(Sq):
            for d in range(D):
                if kind == 0:
                    qf[b, h, i, d] = round_code(np.float32(q[b, h, i, d]), rnd)
                elif kind == 1:
                    qf[b, h, i, d] = bf16_to_f32(q[b, h, i, d])
                else:
                    qf[b, h, i, d] = f16_bits_to_f32(q[b, h, i, d])


def q_f32(qk, qkind, rnd):
    """Q as f32 (bf16/f16 bits widened exactly; f32 rounded by ``rnd``)."""
    if qkind == 1:
        return widen_half(qk, 1)
    if qkind == 2:
        return widen_half(qk, 2)
    if rnd == 0:
        return np.ascontiguousarray(qk, dtype=np.float32)
    qf = working_memory.empty(qk.shape, np.float32, "the f32 widening of Q")
    _prep_q(qk, qkind, rnd, qf)
    return qf


def widen_half(bits, kind):
    """bf16 (``kind`` 1) or f16 (2) bits, uint16 of any shape, as a new f32 array, exactly:
    :func:`widen_run` over the bytes (one compiled pass: numpy took 2.0 ms for
    ``astype(np.uint32) << 16`` of 2 M bf16 values and 4.7 ms for float16's ``astype``)."""
    out = working_memory.empty(bits.shape, np.float32, "an f32 widening")
    widen_run(np.ascontiguousarray(bits).reshape(-1).view(np.uint8), np.int64(0), np.int64(kind),
               out.reshape(-1))
    return out


def widen(kv: KV, bh0: int, bh1: int, shape) -> KV:
    """The (batch, head) pairs ``bh0 .. bh1`` (flat, consecutive in storage) of a K/V
    operand as an f32 KV of ``shape``: integers dequantized by :func:`_widen_ints` into
    ``[S, D]`` rows; f32 (a view) and bf16/f16 (widened exactly) in the stored layout
    (a K stored ``[D, S]`` is then copied to rows by :func:`sdpa`)."""
    B, H, S, D = kv.shape
    kind = KINDS[kv.kind]
    n = S * D
    flat = np.asarray(kv.data).reshape(-1)
    if kind == 0:
        x = flat[bh0 * n:bh1 * n]
    elif kind == 1:
        x = widen_half(flat.view(np.uint16)[bh0 * n:bh1 * n], 1)
    elif kind == 2:
        x = widen_half(flat.view(np.uint16)[bh0 * n:bh1 * n], 2)
    else:
        buf, _, ktr, G, sc, has_sc, zp, has_zp = kv_args(kv)
        x = working_memory.empty((bh1 - bh0) * n, np.float32, "a chunk of widened K/V")
        _widen_ints(buf.view(np.uint8), kind, G, sc, has_sc, zp, has_zp, ktr, bh0, bh1 - bh0, S, D, x)
        return KV(x.reshape(shape), "f32", tuple(shape))
    B2, H2 = shape[:2]
    stored = (B2, H2, D, S) if kv.transposed else (B2, H2, S, D)
    return KV(x.reshape(stored), "f32", tuple(shape), kv.transposed)


@njit(inline="always", cache=True)
def _int_row(buf, kind, e0, o):
    """o[c] = the stored s8/u8/s4/u4 integer (``kind`` 3..6) at flat index ``e0 + c``,
    as f32 (``buf`` the bytes; 4-bit: two a byte, the even index in the low nibble)."""
    L = o.shape[0]
    if kind >= 5 and e0 % 2 == 0 and L % 2 == 0:  # whole bytes
        src = buf[e0 >> 1:(e0 + L) >> 1]
        for j in range(L // 2):
            lo = np.int32(src[j] & 15)
            hi = np.int32(src[j] >> 4)
            if kind == 5:  # two's complement nibbles
                lo -= (lo & 8) << 1
                hi -= (hi & 8) << 1
            o[2 * j] = np.float32(lo)
            o[2 * j + 1] = np.float32(hi)
    elif kind >= 5:  # a row starting mid-byte (odd S, K stored [D, S])
        for c in range(L):
            e = e0 + c
            n = np.int32(buf[e >> 1] >> 4) if e & 1 else np.int32(buf[e >> 1] & 15)
            if kind == 5:
                n -= (n & 8) << 1
            o[c] = np.float32(n)
    else:
        src = buf[e0:e0 + L]
        for c in range(L):
            n = np.int32(src[c])
            if kind == 3:
                n -= (n & 128) << 1
            o[c] = np.float32(n)


@njit(parallel=True, cache=True)
def _widen_ints(buf, kind, G, sc, has_sc, zp, has_zp, ktr, bh0, nbh, S, D, out):
    """out [nbh, S, D] = the stored s8/u8/s4/u4 values (``kind`` 3..6, ``buf`` the bytes)
    of the (batch, head) pairs ``bh0 .. bh0 + nbh`` dequantized as the kernels do,
    ``(n - z) * s`` in f32 (``z``, ``s`` of the element's group along D).  The stored
    rows are ``(bh, s)`` over d, or with ``ktr`` (K stored [D, S]) ``(bh, d)`` over s,
    written 8 at a time as columns of the pair's [S, D] rows (from L1: a numpy
    transpose of the f32 copy cost ~7x the whole widening).  Each row: the integers,
    then the zero points and the scales in passes of their own (loops without
    branches or divisions vectorise)."""
    ng = D // G
    L = S if ktr else D
    rows = D if ktr else S  # stored rows of a (batch, head) pair
    for hb in prange(nbh):
        tmp = np.empty((8, L), np.float32)  # 8 rows over s, then written as 8 columns
        for rr in range(rows):
            r = hb * rows + rr
            o = tmp[rr % 8] if ktr else out[r * L:r * L + L]
            _int_row(buf, kind, bh0 * S * D + r * L, o)
            if ktr:  # row (bh, d): its group's zero points and scales run along s
                p0 = ((bh0 + hb) * ng + rr // G) * S
                if has_zp:
                    zr = zp[p0:p0 + S]
                    for c in range(L):
                        o[c] = o[c] - zr[c]
                if has_sc:
                    sr = sc[p0:p0 + S]
                    for c in range(L):
                        o[c] = o[c] * sr[c]
                if rr % 8 == 7 or rr == rows - 1:  # columns d0 .. rr of the [S, D] rows
                    d0 = rr - rr % 8
                    nd = rr - d0 + 1
                    dst = out[hb * S * D:(hb + 1) * S * D]
                    for c in range(S):
                        for i in range(nd):
                            dst[c * D + d0 + i] = tmp[i, c]
            else:  # row (bh, s): one zero point and scale per group of G along the row
                p0 = (bh0 * S + r) * ng
                for g in range(ng):
                    og = o[g * G:g * G + G]
                    if has_zp:
                        z = zp[p0 + g]
                        for c in range(G):
                            og[c] = og[c] - z
                    if has_sc:
                        sg = sc[p0 + g]
                        for c in range(G):
                            og[c] = og[c] * sg

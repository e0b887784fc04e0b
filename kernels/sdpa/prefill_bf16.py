"""bf16 attention prefill on AVX512_BF16 (``vdpbf16ps``): both products on the bf16 unit.

For bf16 Q, K and V whose probabilities the graph rounds to bf16 (its SoftMax output is
bf16, the ``pv_matmul`` input), per batch ``b``, query head ``h``, KV head ``h // rep``::

    s[i, j] = (q[i] . k[j]) * scale  (or / scale)  + mask[b, h, i, j]   (-inf where causal hides j)
    e[i, j] = exp(s[i, j] - max_j s[i, :])                 f32, the f32 prefill's exact two-pass softmax
    p[i, j] = bf16(e[i, j] * (1 / sum_j e[i, j]))           the probabilities, rounded to bf16
    out[i]  = sum_j p[i, j] v[j]

Both products multiply bf16 values exactly and sum in f32 (the bf16 GEMM's micro-kernel,
:mod:`graph_api.kernels.dpbf16_gemm`, on its packed layouts): ``q . k`` are the
reference's products, and the probabilities enter ``P V`` rounded to bf16 as the
reference's bf16 SoftMax output (or, for f32 probabilities, as fpmath bf16 rounds the
MatMul's input).  Scores and the softmax stay f32 where the reference rounds bf16
scores (kernels/sdpa/plan.py's numerics).  f32 Q/K/V under fpmath bf16 enter as their
bf16 roundings (the caller converts them).

A work item is one (batch, query head), as :mod:`.prefill`: K is packed once per item
as the GEMM's B operand ``Kᵀ`` (panels of 32 keys), V as ``B`` (panels of 32 columns
of D, K pairs interleaved); each block of 32 query rows is packed as A, its score rows
(only the positions the block sees) computed 32 x 32 at a time, softmax'd in place,
rounded into A's layout and multiplied by V.  D a multiple of 32; S up to
:data:`prefill.MAX_S`.
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401 (numba: configured first)

import numpy as np
from numba import njit

from graph_api.kernels.amx import _bf16_rne
from graph_api.kernels.bits import bits_from_f32
from graph_api.kernels.dpbf16_gemm import AVAILABLE as _DPBF16
from graph_api.kernels.dpbf16_gemm import _block
from graph_api.kernels.sdpa.prefill import MAX_S, SP_PAD, _scaled_softmax_rows

#: query rows per block (one packed A block of the GEMM)
QB = 32
#: the host may run this kernel (AVX512_BF16; AMX hosts have it too)
AVAILABLE = _DPBF16
_STEP = 2048  # bytes of one 32-deep step of a packed 32-row block or 32-column panel


def usable(D: int, S: int, Sq: int) -> bool:
    """The host has the unit, D is a multiple of 32, a prefill of at least one block of
    query rows over at most MAX_S keys (the operands: bf16 bits, K ``[S, D]``, a mask
    contiguous along the keys, are the caller's to give)."""
    return AVAILABLE and D % 32 == 0 and 0 < S <= MAX_S and Sq >= QB


@njit(inline="always", cache=True)
def _pack_kt(kb, kbase, ks, S, D, kpack):
    """``kpack`` <- Kᵀ as the GEMM's B (``amx.pack_b`` of the [D, S] matrix): per panel of
    32 keys, per 32-deep step of D, halves of 16 keys, rows of D pairs."""
    dsteps = D // 32
    for n in range(S):
        krow = kb[kbase + n * ks:kbase + n * ks + D]
        base = (n // 32) * dsteps * 1024 + ((n % 32) // 16) * 512 + 2 * (n % 16)
        for s in range(dsteps):
            for kk in range(16):
                o = base + s * 1024 + kk * 32
                kpack[o] = krow[s * 32 + 2 * kk]
                kpack[o + 1] = krow[s * 32 + 2 * kk + 1]


@njit(inline="always", cache=True)
def _pack_v(vb, vbase, vs, S, D, ksteps, vpack32):
    """``vpack32`` (the uint32 view of the packed bf16) <- V [S, D] as the GEMM's B
    (``amx.pack_b``): per panel of 32 columns of D, per 32-deep step of keys, halves of
    16 columns, rows of key pairs; one 32-bit word holds keys ``(2i, 2i + 1)`` of a
    column, so each half row is 16 contiguous words (a vector store)."""
    for t0 in range(0, S, 2):
        r0 = vb[vbase + t0 * vs:vbase + t0 * vs + D]
        r1 = vb[vbase + (t0 + 1) * vs:vbase + (t0 + 1) * vs + D] if t0 + 1 < S else r0[:0]
        row = (t0 // 32) * 512 + ((t0 % 32) // 2) * 16
        for p in range(D // 32):
            for h in range(2):
                dst = vpack32[p * ksteps * 512 + row + h * 256:p * ksteps * 512 + row + h * 256 + 16]
                lo = r0[p * 32 + h * 16:p * 32 + h * 16 + 16]
                if t0 + 1 < S:
                    hi = r1[p * 32 + h * 16:p * 32 + h * 16 + 16]
                    for j in range(16):
                        dst[j] = np.uint32(lo[j]) | (np.uint32(hi[j]) << np.uint32(16))
                else:  # the last key of an odd S: its pair is the zero padding
                    for j in range(16):
                        dst[j] = np.uint32(lo[j])


@njit(nogil=True, cache=True, error_model="numpy")
def prefill_items(ids, qb, qstr, Hq, Sq, D, kb, kstr, vb, vstr, Hkv, S, scale, smul, mflat, mstr, has_mask,
                  causal, obuf, ostr):
    """Work items ``b * Hq + h`` of the module formula.  Q, K, V: flat uint16 bf16 bits
    read through the element strides of their first three axes (rows contiguous), as
    :func:`prefill.prefill_items` reads f32; the output f32 rows in ``obuf`` (``ostr``);
    mask element ``(b, h, i, j)`` at ``mflat[b*mstr[0] + h*mstr[1] + i*mstr[2] + j]``;
    causal 0 none, 1 top-left, 2 bottom-right."""
    rep = Hq // Hkv
    coff = S - Sq if causal == 2 else 0
    ksteps = (S + 31) // 32
    dsteps = D // 32
    Sp = ksteps * 32 + SP_PAD  # score row stride: not a power of two (cache sets)
    kpack = np.zeros(ksteps * 32 * D, np.uint16)  # keys past S stay 0
    vpack = np.zeros(ksteps * 32 * D, np.uint16)
    qpack = np.zeros(QB * D, np.uint16)
    ppack = np.zeros(QB * ksteps * 32, np.uint16)
    sc = np.empty(QB * Sp, np.float32)
    acc = np.empty(QB * D, np.float32)
    lsum = np.empty(QB, np.float32)
    rmx = np.empty(QB, np.float32)
    part = np.empty(16, np.float32)
    kp, vp, qp, pp = kpack.ctypes.data, vpack.ctypes.data, qpack.ctypes.data, ppack.ctypes.data
    scp, accp = sc.ctypes.data, acc.ctypes.data
    packed = -1
    for it in ids:
        b = it // Hq
        h = it % Hq
        kv = b * Hkv + h // rep
        if kv != packed:  # heads of one KV group dealt to this thread in a row share the packs
            _pack_kt(kb, b * kstr[0] + (h // rep) * kstr[1], kstr[2], S, D, kpack)
            _pack_v(vb, b * vstr[0] + (h // rep) * vstr[1], vstr[2], S, D, ksteps, vpack.view(np.uint32))
            packed = kv
        for i0 in range(0, Sq, QB):
            nq = min(QB, Sq - i0)
            for r in range(QB):  # Q rows as A (rows past nq: zeros, finite scores never stored)
                base = (r // 16) * 512 + (r % 16) * 32
                if r < nq:
                    qo = b * qstr[0] + h * qstr[1] + (i0 + r) * qstr[2]
                    qrow = qb[qo:qo + D]
                    for s in range(dsteps):
                        qpack[base + s * 1024:base + s * 1024 + 32] = qrow[s * 32:s * 32 + 32]
                else:
                    for s in range(dsteps):
                        qpack[base + s * 1024:base + s * 1024 + 32] = 0
            n = S  # positions any row of the block sees
            if causal != 0:
                n = max(0, min(S, i0 + nq + coff))
            ntc = (n + 31) // 32 * 32
            for p in range(ntc // 32):
                _block(qp, kp + p * dsteps * _STEP, dsteps, scp + p * 128, Sp * 4, scp + p * 128, Sp * 4, 0)
            _scaled_softmax_rows(sc, Sp, nq, n, ntc, scale, smul, mflat,
                                 b * mstr[0] + h * mstr[1] + i0 * mstr[2], mstr[2], has_mask, part,
                                 rmx, lsum, i0 + coff + 1 if causal != 0 else n)
            for r in range(QB):  # probabilities as A, rounded to bf16 (rows past nq: zeros)
                base = (r // 16) * 512 + (r % 16) * 32
                if r < nq:
                    inv = np.float32(1.0) / lsum[r]  # all -inf scores: 0 * inf = NaN, as 0 / 0
                    for s in range(ntc // 32):  # 32 contiguous values a step: the loop vectorises
                        src = sc[r * Sp + s * 32:r * Sp + s * 32 + 32]
                        dst = ppack[base + s * 1024:base + s * 1024 + 32]
                        for t in range(32):
                            dst[t] = _bf16_rne(bits_from_f32(src[t] * inv))
                else:
                    for s in range(ntc // 32):
                        ppack[base + s * 1024:base + s * 1024 + 32] = 0
            for p in range(dsteps):
                _block(pp, vp + p * ksteps * _STEP, ntc // 32, accp + p * 128, D * 4, accp + p * 128, D * 4, 0)
            for r in range(nq):
                o = b * ostr[0] + h * ostr[1] + (i0 + r) * ostr[2]
                if lsum[r] == 0:  # every score -inf: 0 / 0, as the f32 kernels (the plan decides)
                    obuf[o:o + D] = np.nan
                else:
                    obuf[o:o + D] = acc[r * D:r * D + D]

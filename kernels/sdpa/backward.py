"""SDPA training backward: dQ, dK, dV (and dS) of one attention, per (batch, query head).

Formula, per work item (batch ``b``, query head ``h``, KV head ``h // rep``), for a block
of query rows ``i`` and every key position ``j`` (all f32)::

    s[i, j]  = (q[i] . k[j]) * scale  (or / scale)       (causal: fill where j > i + offset)
    s[i, j] += mask[b, h, i, j]
    p[i, j]  = exp(s[i, j] - stats[i])                     (stats: the forward's max + ln(sum))
    dp[i, j] = do[i] . v[j]
    ds[i, j] = p[i, j] * (drop_dp(dp[i, j]) - corr[i])     (corr[i] = sum_d o[i, d] do[i, d], given)
    dv[j]   += round_p(drop_p(p[i, j])) * do[i]            (summed over i)
    dk[j]   += round_ds(ds[i, j] * gscale) * q[i]          (or / gscale; summed over i)
    dq[i]    = sum_j round_ds(ds[i, j] * gscale) * k[j]

``round_p`` / ``round_ds`` are the graph's TypeCasts (rounding codes of
:mod:`graph_api.kernels.bits`), ``drop_*`` its Dropouts (the reference's
counter-based generator, :func:`dropout_keep`), each optional.  ``ds`` before the
scale may be written out (the End'ed dS, "dMask").

Blocking: the scores of ``QB`` query rows against all keys (``QB x S`` f32, two
blocks: P and dS, in L2 at S = 512) are made by two GEMMs (``Q K^T``, ``dO V^T``),
turned into P and dS' in one pass, and used by three GEMMs (``dV += P^T dO``,
``dK += dS'^T Q``, ``dQ = dS' K``) before the next rows: no ``Sq x S`` tensor is
ever written to memory.  The GEMMs are numpy's OpenBLAS ``cblas_sgemm`` called
from the compiled code (:mod:`.openblas`, one thread per call; the work items
run on ``numba.get_num_threads()`` threads), or, where that library is not
found, a plain f32 loop (:func:`gemm_loop`).  Both sum in f32: the error of an
entry is at most ``n * 2**-24 * sum |terms|`` for a sum of ``n`` terms.

Splits: a head's query rows may be dealt to ``nsplit`` items (when there are
fewer heads than threads); each writes its own dK/dV partial sums, which the
caller adds.
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401

import numpy as np
from numba import njit

from graph_api.kernels.bits import exp32, round_bf16, round_f16, round_tf32
from graph_api.kernels.openblas import sgemm_t

QB = 64  #: query rows per block: two 64 x 512 f32 blocks (256 KiB) stay in L2
NEG_INF = np.float32(-np.inf)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@njit(inline="always", cache=True)
def splitmix64(z):
    """The splitmix64 finalizer (uint64, wrapping), as kernels/reference/dropout.py."""
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@njit(inline="always", cache=True)
def dropout_keep(key, counter, prob):
    """The reference Dropout's keep decision for one element: ``u > p`` with
    ``u = ((splitmix64(counter ^ key) >> 40) + 1) * 2**-24`` (``key = splitmix64(seed)``,
    ``counter = offset + linear index``)."""
    h = splitmix64(counter ^ key)
    u = np.float32((h >> np.uint64(40)) + np.uint64(1)) * np.float32(2.0 ** -24)
    return u > prob


@njit(cache=True, nogil=True, error_model="numpy")
def gemm_loop(ta, tb, m, n, k, a, a_off, lda, b, b_off, ldb, beta, c, c_off, ldc):
    """``C = op(A) @ op(B) + beta * C`` in f32 loops, :func:`openblas.sgemm_t`'s arguments
    (the kernel's GEMM where numpy's OpenBLAS is not found)."""
    for i in range(m):
        co = c_off + i * ldc
        if beta == 0:
            for j in range(n):
                c[co + j] = np.float32(0.0)
        for p in range(k):
            x = a[a_off + p * lda + i] if ta else a[a_off + i * lda + p]
            if tb:
                for j in range(n):
                    c[co + j] += x * b[b_off + j * ldb + p]
            else:
                bo = b_off + p * ldb
                for j in range(n):
                    c[co + j] += x * b[bo + j]


@njit(inline="always", cache=True)
def _mm(blas, ta, tb, m, n, k, a, a_off, lda, b, b_off, ldb, beta, c, c_off, ldc):
    if blas != 0:
        sgemm_t(blas, ta, tb, m, n, k, a, a_off, lda, b, b_off, ldb, beta, c, c_off, ldc)
    else:
        gemm_loop(ta, tb, m, n, k, a, a_off, lda, b, b_off, ldb, beta, c, c_off, ldc)


@njit(inline="always", cache=True)
def _round_row(a, o, n, rnd):
    """a[o:o+n] rounded by code ``rnd`` (one loop per code: each vectorises)."""
    if rnd == 1:
        for j in range(n):
            a[o + j] = round_bf16(a[o + j])
    elif rnd == 2:
        for j in range(n):
            a[o + j] = round_f16(a[o + j])
    elif rnd == 3:
        for j in range(n):
            a[o + j] = round_tf32(a[o + j])


@njit(inline="always", cache=True)
def _dropout_row(a, o, n, key, counter0, prob):
    """The reference Dropout of a[o:o+n], element j at counter ``counter0 + j``."""
    inv = np.float32(1.0) - prob
    for j in range(n):
        a[o + j] = a[o + j] / inv if dropout_keep(key, counter0 + np.uint64(j), prob) else np.float32(0.0)


@njit(inline="always", cache=True)
def _probs_row(pb, o, S, scale, smul, jmax, cfill, mflat, m0, ms, has_mask, st):
    """pb[o:o+S]: scores -> P = exp(scale(s) [causal fill] [+ mask] - st), in the graph's order."""
    if smul:
        for j in range(S):
            pb[o + j] = pb[o + j] * scale
    else:
        for j in range(S):
            pb[o + j] = pb[o + j] / scale
    for j in range(jmax, S):  # the causal Select comes before the masks
        pb[o + j] = cfill
    if has_mask:
        if ms == 1:
            for j in range(S):
                pb[o + j] = pb[o + j] + mflat[m0 + j]
        else:
            for j in range(S):
                pb[o + j] = pb[o + j] + mflat[m0 + j * ms]
    for j in range(S):
        pb[o + j] = exp32(pb[o + j] - st)


@njit(inline="always", cache=True)
def _grads_row(pb, sb, o, S, cr, counter0, gscale, gmul, p_rnd, ds_rnd, p_drop, p_key, p_off,
               p_prob, dp_drop, dp_key, dp_off, dp_prob, want_ds, ds_out, ds_o):
    """sb[o:o+S]: dP -> round(scale(P * (drop(dP) - cr))); then pb[o:o+S]: P -> round(drop(P))."""
    if dp_drop:
        _dropout_row(sb, o, S, dp_key, dp_off + counter0, dp_prob)
    for j in range(S):
        sb[o + j] = pb[o + j] * (sb[o + j] - cr)
    if want_ds:
        for j in range(S):
            ds_out[ds_o + j] = sb[o + j]
    if gmul:
        for j in range(S):
            sb[o + j] = sb[o + j] * gscale
    else:
        for j in range(S):
            sb[o + j] = sb[o + j] / gscale
    _round_row(sb, o, S, ds_rnd)
    if p_drop:
        _dropout_row(pb, o, S, p_key, p_off + counter0, p_prob)
    _round_row(pb, o, S, p_rnd)


@njit(cache=True, nogil=True, error_model="numpy")
def backward_items(ids, q, k, v, do, stats, corr, Hq, rep, Sq, S, D, nsplit,
                   scale, smul, gscale, gmul, mflat, mstr, has_mask, causal, offset, cfill,
                   p_rnd, ds_rnd, p_drop, p_key, p_off, p_prob, dp_drop, dp_key, dp_off, dp_prob,
                   want_ds, ds_out, dq, dk, dv, blas):
    """The work items ``ids`` (item = (query head ``b * Hq + h``) * nsplit + split) of the
    module docstring's formula.  Arrays are flat f32: q, do, dq ``[B*Hq, Sq, D]``; k, v
    ``[B*Hkv, S, D]``; stats, corr ``[B*Hq*Sq]``; dk, dv ``[nsplit, B*Hq, S, D]``; ds_out
    ``[B*Hq, Sq, S]`` when ``want_ds``; the mask a flat buffer + element strides
    ``[B, Hq, Sq, S]`` (0 on broadcast dims); ``causal``: scores ``j > i + offset`` are
    ``cfill`` (before the mask is added)."""
    rows = min(QB, Sq)
    pb = np.empty(rows * S, np.float32)
    sb = np.empty(rows * S, np.float32)
    nblk = -(-Sq // rows)
    per = -(-nblk // nsplit)
    heads = dk.size // (nsplit * S * D)
    for item in ids:
        head = item // nsplit
        split = item - head * nsplit
        b = head // Hq
        h = head - b * Hq
        kvo = (b * (Hq // rep) + h // rep) * S * D
        qo = head * Sq * D
        po = (split * heads + head) * S * D  # this split's dK/dV
        first = True
        for blk in range(split * per, min(nblk, (split + 1) * per)):
            i0 = blk * rows
            m = min(rows, Sq - i0)
            _mm(blas, 0, 1, m, S, D, q, qo + i0 * D, D, k, kvo, D, np.float32(0.0), pb, 0, S)
            _mm(blas, 0, 1, m, S, D, do, qo + i0 * D, D, v, kvo, D, np.float32(0.0), sb, 0, S)
            for r in range(m):
                i = i0 + r
                row = head * Sq + i
                jmax = S
                if causal:
                    jmax = min(S, max(0, i + offset + 1))
                m0 = b * mstr[0] + h * mstr[1] + i * mstr[2]
                _probs_row(pb, r * S, S, scale, smul, jmax, cfill, mflat, m0, mstr[3], has_mask,
                           stats[row])
                _grads_row(pb, sb, r * S, S, corr[row], np.uint64(row) * np.uint64(S), gscale, gmul,
                           p_rnd, ds_rnd, p_drop, p_key, p_off, p_prob, dp_drop, dp_key, dp_off,
                           dp_prob, want_ds, ds_out, row * S)
            beta = np.float32(0.0) if first else np.float32(1.0)
            first = False
            _mm(blas, 1, 0, S, D, m, pb, 0, S, do, qo + i0 * D, D, beta, dv, po, D)
            _mm(blas, 1, 0, S, D, m, sb, 0, S, q, qo + i0 * D, D, beta, dk, po, D)
            _mm(blas, 0, 0, m, D, S, sb, 0, S, k, kvo, D, np.float32(0.0), dq, qo + i0 * D, D)
        if first:  # a split with no rows (more splits than blocks): zero partial sums
            for t in range(S * D):
                dk[po + t] = np.float32(0.0)
                dv[po + t] = np.float32(0.0)


def _dropout_args(drop):
    """(on, key, offset, prob) kernel arguments of ``drop`` = (seed, offset, prob) or None."""
    from graph_api.kernels.reference.dropout import _as_u64, splitmix64 as splitmix64_np

    if drop is None:
        return False, np.uint64(0), np.uint64(0), np.float32(0.0)
    seed, offset, prob = drop
    return (True, splitmix64_np(_as_u64(seed))[0], _as_u64(offset)[0],
            np.float32(np.asarray(prob).reshape(())))


def backward(q, k, v, do, stats, corr, *, scale=1.0, scale_mode="mul", grad_scale=1.0,
             grad_scale_mode="mul", mask=None, causal_offset=None, causal_fill=-np.inf, p_rnd=0, ds_rnd=0,
             p_dropout=None, dp_dropout=None, want_ds=False, dq=None, splits=None, use_blas=True):
    """dQ, per-query-head dK and dV, and dS (or None) of the module docstring's formula.

    Args:
        q, do: f32 ``[B, Hq, Sq, D]``; k, v: f32 ``[B, Hkv, S, D]`` (Hq a multiple of Hkv).
        stats, corr: f32 ``[B, Hq, Sq]``.
        scale, grad_scale: the score scale and the dS scale, each multiplied or divided by.
        mask: an additive f32 mask broadcastable to ``[B, Hq, Sq, S]``, or None.
        causal_offset: scores of keys ``j > i + causal_offset`` are ``causal_fill``, before
            the mask is added (None: no causal mask).
        p_rnd, ds_rnd: rounding codes of P (for dV) and of the scaled dS (for dK, dQ).
        p_dropout, dp_dropout: (seed, offset, prob) of a Dropout of P / of dP, or None.
        want_ds: also return dS (before the scale), f32 ``[B, Hq, Sq, S]``.
        dq: where to write dQ (f32 C-contiguous ``[B, Hq, Sq, D]``), or None.
        splits: query-row splits per head (None: enough items for the threads).
        use_blas: numpy's OpenBLAS for the GEMMs when found (False: the f32 loops).

    Returns:
        ``(dq, dk, dv, ds)``: dk/dv ``[B, Hq, S, D]`` (per query head; GQA sums them).
    """
    from graph_api.kernels import openblas
    from graph_api.kernels.sdpa.operands import flat_mask
    from graph_api.kernels.threads import run_items, split_threads

    B, Hq, Sq, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    heads = B * Hq
    nblk = -(-Sq // min(QB, Sq))
    threads = split_threads()  # deterministic mode: the dK/dV partial sums depend on the shapes only
    if splits is None:
        splits = 1 if heads >= 2 * threads else min(nblk, -(-2 * threads // heads))
    nsplit = max(1, int(splits))
    blas = use_blas and openblas.available()
    if dq is None:
        dq = np.empty((B, Hq, Sq, D), np.float32)
    dk = np.empty((nsplit, B, Hq, S, D), np.float32)
    dv = np.empty((nsplit, B, Hq, S, D), np.float32)
    ds = np.empty((B, Hq, Sq, S), np.float32) if want_ds else np.empty(1, np.float32)
    mflat, mstr = flat_mask(None if mask is None else np.broadcast_to(
        np.asarray(mask, np.float32), np.broadcast_shapes(np.shape(mask), (1, 1, Sq, S))))
    flat = lambda a: np.ascontiguousarray(a, np.float32).reshape(-1)  # noqa: E731
    pd, dd = _dropout_args(p_dropout), _dropout_args(dp_dropout)
    args = (flat(q), flat(k), flat(v), flat(do), flat(stats), flat(corr), Hq, Hq // Hkv, Sq, S, D,
            nsplit, np.float32(scale), scale_mode == "mul", np.float32(grad_scale),
            grad_scale_mode == "mul", mflat, mstr, mask is not None, causal_offset is not None,
            int(causal_offset or 0), np.float32(causal_fill), int(p_rnd), int(ds_rnd), *pd, *dd, bool(want_ds),
            ds.reshape(-1), dq.reshape(-1), dk.reshape(-1), dv.reshape(-1),
            openblas.sgemm_address() if blas else 0)
    work = 5 * heads * Sq * S * D
    if blas:
        with openblas.single_threaded():
            run_items(backward_items, heads * nsplit, *args, work=work)
    else:
        run_items(backward_items, heads * nsplit, *args, work=work)
    if nsplit > 1:
        dk, dv = dk.sum(axis=0, dtype=np.float32), dv.sum(axis=0, dtype=np.float32)
    else:
        dk, dv = dk[0], dv[0]
    return dq, dk, dv, (ds if want_ds else None)

"""The numpy merge step: the split partials ``(m, l, acc)`` of the work items
combined by log-sum-exp in a fixed order, SoftMax's row stats, and the f32 result
stored as f32 or bf16/f16 bits."""
from __future__ import annotations

import numpy as np

from graph_api import working_memory
from graph_api.kernels import store
from graph_api.kernels.sdpa.operands import NEG_INF
from graph_api.kernels.weight_compressed.wmatmul import make_epilogue


#: the epilogue of no post-ops: :func:`store.store_tile` then only converts
_NO_POST_OPS = make_epilogue((), 1, 1)


def store_out(res, okind, out):
    """``out`` (made when None) = the f32 result ``res`` [B, H, Sq, D] as f32, or as
    bf16/f16 bits rounded to nearest even (NaN kept quiet) in one compiled pass
    (:func:`store.store_tile`, already compiled for bf16/f16 MatMul outputs): numpy's
    rounding made ~6 temporaries of the whole result, 20-50 ms at 32 x 512 x 128."""
    if out is None:
        out = working_memory.empty(res.shape, np.float32 if okind == 0 else np.uint16, "the SDPA result")
    if okind == 0:
        out[...] = res
        return out
    D = res.shape[-1]
    direct = out.flags.c_contiguous
    dest = out if direct else working_memory.empty(res.shape, np.uint16, "the SDPA result")
    store.store_tile(np.ascontiguousarray(res).reshape(-1, D), dest.reshape(-1, D), np.int64(0), okind,
                     _NO_POST_OPS)
    if not direct:
        out[...] = dest
    return out


def row_stats(rmax, rsum):
    """SoftMax's stats ``max + ln(sum)`` of rows with f32 score max and sum of
    ``exp(s - max)``, evaluated in float64 and rounded once to f32 (the reference's
    formula on the kernel's f32 scores); -inf + ln 0 = -inf for an all -inf row."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (rmax.astype(np.float64) + np.log(rsum.astype(np.float64))).astype(np.float32)


def merged_stats(pm, pl, Hkv, Sq, qt, nsplit, B, Hq):
    """[B, Hq, Sq] stats from the split partials (row max ``pm``, sum ``pl`` relative to
    it): M = max over splits, L = sum_sp pl exp(pm - M), stats = M + ln L, in float64 and
    rounded once to f32 as :func:`row_stats` (rows laid out as in :func:`merge_partials`)."""
    rep = Hq // Hkv
    nqt = -(-Sq // qt)
    rows = pm.shape[1]
    with np.errstate(all="ignore"):  # rows past a short last tile hold unset partials (unused)
        pm = pm.reshape(B * Hkv * nqt, nsplit, rows).astype(np.float64)
        pl = pl.reshape(B * Hkv * nqt, nsplit, rows).astype(np.float64)
        mx = pm.max(axis=1)
        w = np.where(pm == -np.inf, 0.0, np.exp(pm - mx[:, None]))
        total = (pl * w).sum(axis=1)
        st = (mx + np.log(total)).astype(np.float32).reshape(B, Hkv, nqt, rows)
    res = np.empty((B, Hq, Sq), np.float32)
    for qi in range(nqt):
        nq = min(qt, Sq - qi * qt)
        res[:, :, qi * qt:qi * qt + nq] = st[:, :, qi, :rep * nq].reshape(B, Hq, nq)
    return res


def merge_partials(pm, pl, pacc, Hkv, Sq, qt, nsplit, vperm, okind, out):
    """Combine the split partials (log-sum-exp in split order) into out [B, Hq, Sq, D].

    Item ``((b * Hkv + hk) * nqt + qi) * nsplit + sp``, row ``(hq - hk * rep) * nq + i``;
    a split whose rows saw no finite score (m = -inf) has weight 0.  numpy, in f32
    (a few hundred values per row: not worth a compiled kernel).
    """
    B, Hq, _, D = out.shape
    rep = Hq // Hkv
    nqt = -(-Sq // qt)
    items, rows = pm.shape
    if vperm:  # d permuted (even d, then odd d) by the int4 V tile
        half = D // 2
        pacc = np.stack([pacc[..., :half], pacc[..., half:]], axis=-1).reshape(items, rows, D)
    pm = pm.reshape(B * Hkv * nqt, nsplit, rows)
    mx = pm.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        w = np.where(pm == NEG_INF, np.float32(0), np.exp(pm - mx)).astype(np.float32)
        den = working_memory.zeros((B * Hkv * nqt, rows), np.float32, "the SDPA merge denominators")
        o = working_memory.zeros((B * Hkv * nqt, rows, D), np.float32, "the SDPA merged result")
        pl = pl.reshape(B * Hkv * nqt, nsplit, rows)
        pa = pacc.reshape(B * Hkv * nqt, nsplit, rows, D)
        for sp in range(nsplit):
            den += pl[:, sp] * w[:, sp]
            o += pa[:, sp] * w[:, sp, :, None]
        o /= den[..., None]
    # rows of item (b, hk, qi): (head in group j, query i of the tile) -> out[b, hk*rep + j, qi*qt + i]
    o = o.reshape(B, Hkv, nqt, rows, D)
    res = working_memory.empty((B, Hq, Sq, D), np.float32, "the SDPA merged result")
    for qi in range(nqt):
        nq = min(qt, Sq - qi * qt)
        res[:, :, qi * qt:qi * qt + nq] = o[:, :, qi, :rep * nq].reshape(B, Hq, nq, D)
    store_out(res, okind, out)

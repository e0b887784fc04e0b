"""The SDPA entry: :func:`sdpa` picks the kernel for the operands (the f32 prefill
kernel, K/V widened first where they are not f32; the compressed decode; the
register-blocked or the tiled kernel), runs its work items on the thread pool and
merges the partials; :func:`prefill_runner` binds the f32 prefill to fixed memory."""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # numba: configured first

import numpy as np

from graph_api import working_memory
from graph_api.kernels.sdpa import decode_bf16, prefill, prefill_bf16
from graph_api.kernels.bits import RND_BF16, act_kind
from graph_api.kernels.sdpa.blocked import attend_blocked
from graph_api.kernels.sdpa.decode import decode_items
from graph_api.kernels.sdpa.decode_avx2 import stage_params
from graph_api.kernels.sdpa.merge import merge_partials, merged_stats, row_stats, store_out
from graph_api.kernels.sdpa.operands import CAUSAL, DT, KINDS, KV, flat_mask, kv_args
from graph_api.kernels.sdpa.tiled import QT, attend_tiles
from graph_api.kernels.sdpa.widen import q_f32, widen
from graph_api.kernels.threads import run_claimed, run_items, split_threads


def _vec_ok(kind, G, D, transposed, S):
    """Whether the vectorised tile loaders (:func:`_vrows` / :func:`_vkt`) apply."""
    if D % 16:
        return False
    if transposed:
        return kind < 5 or S % 2 == 0
    return G % 32 == 0 if kind >= 5 else G % 16 == 0


def _decode_ok(kk, vk, ktr, kG, vG, khs, vhs, D, S, Sq, rnd):
    """Whether the compressed decode kernel (:func:`_dec_item`) takes these operands."""
    if kk != vk or kk < 3 or not ktr or rnd != 0 or D % 64 or Sq > 8:
        return False
    if kk >= 5:  # int4 as a uint16 view: whole 4-value elements per K row and per head
        return S % 4 == 0 and vG % 32 == 0
    return vG % 16 == 0


def sdpa(q, k: KV, v: KV, *, scale=None, scale_mode="mul", mask=None, causal=None,
         out=None, out_dtype="f32", q_dtype=None, rnd: int = 0, kv_splits: int | None = None,
         stats=None, prob_quant=None, score_rnd: int = 0, bf16_dot: bool = False, bf16_probs: bool = False):
    """Attention ``softmax(q k^T * scale + mask) v`` -> [B, Hq, Sq, D].

    Args:
      q: [B, Hq, Sq, D] float32 / float16 / bfloat16 (or uint16 bits with
        ``q_dtype`` "bf16"/"f16").
      k, v: :class:`KV` operands (Hq must be a multiple of their H).
      scale: scalar (default 1/sqrt(D)); ``scale_mode`` "mul" or "div".
      mask: additive f32 mask broadcastable to [B, Hq, Sq, S] (any strides).
      causal: None, "top_left" or "bottom_right".
      out: optional preallocated output (f32 or uint16 for bf16/f16).
      rnd: fpmath rounding code applied to f32 Q, K and V values.
      kv_splits: override the KV split count (decode).
      stats: optional f32 [B, Hq, Sq] output: each row's ``max + ln(sum exp(s - max))``
        of the scores (SoftMax's stats, see :func:`row_stats`); -inf for a row
        whose every score is -inf.
      prob_quant: the parameters of :func:`prefill._quantize_row` (quantize scale,
        zero point, integer range, dequantize scale, zero point, s8/u8 or f8 rounding):
        the normalised probabilities pass that Quantize -> Dequantize pair before
        ``P V``.  ``score_rnd``: rounding code of the scores after the product, the
        scale and the mask (half-precision score ops of the quantized form).  Only the
        exact two-pass kernel has them: f32 Q/K/V, K not transposed, no rounding,
        f32 output, D a multiple of 16, S <= prefill.MAX_S (any Sq).
      bf16_dot: the partition's fpmath mode is bf16 with ``apply_to_int``: the products
        may take bf16 inputs (Q, the probabilities, K/V values).  With ``rnd`` bf16,
        int4/int8 decode then runs :mod:`graph_api.kernels.sdpa.decode_bf16` (``vdpbf16ps``)
        where the CPU has AVX512_BF16, else the path that rounds the inputs.
      bf16_probs: the graph rounds the probabilities to bf16 before ``P V`` (its SoftMax
        output is bf16): with bf16 Q/K/V, a prefill may then run both products on the bf16
        unit (:mod:`graph_api.kernels.sdpa.prefill_bf16`).
    """
    B, Hq, Sq, D = q.shape
    _, Hkv, S, _ = k.shape
    if q_dtype == "f16" and q.dtype == np.uint16:
        qk, qkind = q, 2
    else:
        qk, qkind = act_kind(q)  # (views: the prefill kernel reads strided f32 rows as they are)
    if scale is None:
        scale = 1.0 / np.sqrt(D)
    kk, vk, ktr = KINDS[k.kind], KINDS[v.kind], int(k.transposed)
    if mask is not None:
        m = np.asarray(mask).astype(np.float32)
        m = m.reshape((1,) * (4 - m.ndim) + m.shape)
        has_mask = True
    else:
        has_mask = False
    # every kernel reads the mask as a flat buffer + strides (0 on broadcast axes):
    # one compiled signature with or without a mask, whatever its shape and layout
    mflat, mstr = flat_mask(m if has_mask else None)
    okind = {"f32": 0, "bf16": 1, "f16": 2}[out_dtype]
    if ktr and Sq >= prefill.QB and prefill.usable(qkind, kk, vk, 0, D, S, Sq, rnd, okind):
        # f32 K stored [D, S]: one [S, D] copy (S * D moves next to >= 64 * S * D flops of
        # scores) runs it on the prefill kernel, and the tiled kernel, ~13 s of compile on
        # an empty cache (~2.7 s for the prefill kernel), is not compiled for f32 prefill
        k = KV(np.ascontiguousarray(np.asarray(k.data).reshape(B, Hkv, D, S).swapaxes(2, 3)), "f32", k.shape)
        ktr = 0
    if bf16_probs and prob_quant is None and stats is None and prefill_bf16.usable(D, S, Sq):
        ops = _bf16_operands(qk, qkind, k, v, rnd)
        if ops is not None:
            if has_mask and mstr[3] != 1:  # a mask broadcast along the keys: the kernel reads rows
                mflat, mstr = flat_mask(np.broadcast_to(m, m.shape[:3] + (S,)))
            return _bf16_prefill(*ops, scale, scale_mode, mflat, mstr, has_mask, causal, okind, out)
    if (prob_quant is None and rnd == 0 and (qkind, kk, vk) != (0, 0, 0) and Sq >= prefill.QB
            and prefill.usable(0, 0, 0, 0, D, S, Sq, 0, 0)):
        return _widened_prefill(qk if qkind == 0 else q_f32(qk, qkind, 0), k, v, m if has_mask else None,
                                okind, out, stats, scale=scale, scale_mode=scale_mode, causal=causal)
    if prob_quant is not None:
        assert prefill.usable(qkind, kk, vk, ktr, D, S, 9, rnd, okind), "prob_quant operands"
    assert score_rnd == 0 or prob_quant is not None, "score rounding: the quantized form only"
    if prob_quant is not None or prefill.usable(qkind, kk, vk, ktr, D, S, Sq, rnd, okind):
        if out is None:
            out = working_memory.empty((B, Hq, Sq, D), np.float32, "the SDPA result")
        direct = out.dtype == np.float32 and out.strides[-1] == 4 and min(out.strides) >= 0
        dest = out if direct else working_memory.empty((B, Hq, Sq, D), np.float32, "the SDPA f32 result")
        rows = B * Hq * Sq if stats is not None else 1
        rmax, rsum = np.empty(rows, np.float32), np.empty(rows, np.float32)
        args, work = _prefill_call(qk, k, v, scale, scale_mode, mflat, mstr, has_mask, causal, dest,
                                   stats is not None, rmax, rsum, prob_quant, score_rnd)
        run_items(*args, work=work)
        if not direct:
            out[...] = dest
        if stats is not None:
            stats[...] = row_stats(rmax, rsum).reshape(B, Hq, Sq)
        return out
    qf = q_f32(np.ascontiguousarray(qk), qkind, rnd)
    kb, kk, ktr, kG, ksc, khs, kzp, khz = kv_args(k)
    vb, vk, _, vG, vsc, vhs, vzp, vhz = kv_args(v)
    qt = Sq if Sq <= 8 else QT
    nqt = -(-Sq // qt)
    threads = split_threads()  # deterministic mode: the K/V splits depend on the shapes only
    if kv_splits is None:
        base = B * Hkv * nqt
        kv_splits = 1 if base >= 4 * threads else max(1, min(-(-S // 256), -(-8 * threads // base)))
    nsplit = int(kv_splits)
    items = B * Hkv * nqt * nsplit
    rows = (Hq // Hkv) * qt
    work = 2 * B * Hq * Sq * S * D
    pm = working_memory.empty((items, rows), np.float32, "the SDPA split maxima")
    pl = working_memory.empty((items, rows), np.float32, "the SDPA split sums")
    pacc = working_memory.empty((items, rows, D), np.float32, "the SDPA split partial results")
    fastk = kk >= 5 and ktr == 1 and S % 2 == 0 and rnd >= 0
    vperm = vk >= 5 and D % 2 == 0 and (vG % 2 == 0)
    kperm = kk >= 5 and ktr == 0 and D % 2 == 0 and (kG % 2 == 0)
    dec = None
    if stats is None:  # stats: the tiled kernels' partials
        if bf16_dot and rnd == RND_BF16 and decode_bf16.usable(kk, vk, ktr, kG, vG, D, S, Sq):
            dec = decode_bf16.dec_items  # fpmath bf16: vdpbf16ps (Q and p * sv rounded to bf16)
        elif _decode_ok(kk, vk, ktr, kG, vG, khs, vhs, D, S, Sq, rnd):
            dec = decode_items
    if dec is not None:
        four = kk >= 5
        if not khs:
            ksc = np.ones(B * Hkv * S * (D // kG), np.float32)
        if not vhs:
            vsc = np.ones(B * Hkv * S * (D // vG), np.float32)
        kzs, vzs = int(khz), int(vhz)
        if not khz:
            kzp = np.zeros(DT, np.float32)
        if four:  # int4 bytes as uint16: the kernel tells int4 from 8-bit by the itemsize
            kb, vb = kb.view(np.uint16), vb.view(np.uint16)
        else:  # int8 / uint8 as stored (the loads take the sign from the dtype)
            kb, vb = np.asarray(k.data).reshape(-1), np.asarray(v.data).reshape(-1)
        args = (qf, kb, ksc, kzp, kzs, vb, vsc, vzp, vzs, kk in (3, 5), kG, vG,
                Hkv, S, np.float32(scale), scale_mode == "mul", mflat, mstr, has_mask,
                CAUSAL[causal], nsplit, pm, pl, pacc)
        if dec is decode_items:  # + the staged tiles' dtype and int4 staging parameters
            run_claimed(dec, items, *args, np.empty(0, np.uint8 if kk == 4 else np.int8),
                         np.array(stage_params(k.kind), np.int64), work=work)
        else:
            run_items(dec, items, *args, work=work)
        if dec is decode_bf16.dec_items:  # merged, reordered and written back compiled
            res = working_memory.empty((B, Hq, Sq, D), np.float32, "the SDPA f32 result")
            decode_bf16.merge(pm, pl, pacc, Hkv, nsplit, four, res)
            return store_out(res, okind, out)
        if nsplit == 1:
            # one split per item: :func:`merge_partials`'s weights are all 1 (0 for a row that saw
            # no finite score, whose acc and sum are 0: 0/0 either way), so its result is
            # acc / l; this skips its ~40 us of numpy steps (decode_bf16.merge, compiled,
            # would cost ~2 s more of compile on an empty cache)
            with np.errstate(invalid="ignore", divide="ignore"):
                res = (pacc / pl[..., None]).reshape(B, Hq, Sq, D)
            return store_out(res, okind, out)
        vperm = False
    elif D % 16 == 0:
        run_items(attend_blocked, items, qf, kb, kk, ktr, kG, ksc, khs, kzp, khz, vb, vk, vG, vsc, vhs,
                vzp, vhz, rnd,
                Hkv, S, np.float32(scale), scale_mode == "mul", mflat, mstr, has_mask,
                CAUSAL[causal], qt, nsplit, fastk, kperm, vperm,
                _vec_ok(kk, kG, D, ktr, S), _vec_ok(vk, vG, D, 0, S), pm, pl, pacc, work=work)
    else:
        run_items(attend_tiles, items, qf, kb, kk, ktr, kG, ksc, khs, kzp, khz, vb, vk, vG, vsc, vhs,
                   vzp, vhz, rnd,
              Hkv, S, np.float32(scale), scale_mode == "mul", mflat, mstr, has_mask,
              CAUSAL[causal], qt, nsplit, fastk, vperm, pm, pl, pacc, work=work)
    if out is None:
        out = working_memory.empty((B, Hq, Sq, D), np.float32 if okind == 0 else np.uint16, "the SDPA result")
    merge_partials(pm, pl, pacc, Hkv, Sq, qt, nsplit, vperm, okind, out)
    if stats is not None:
        stats[...] = merged_stats(pm, pl, Hkv, Sq, qt, nsplit, B, Hq)
    return out


#: f32 bytes of K and V widened at a time by :func:`_widened_prefill` (batches, or KV heads
#: of one batch, in chunks of at most this)
WIDEN_BYTES = 32 << 20


def _widened_prefill(qf, k: KV, v: KV, mask, okind, out, stats, **kw):
    """:func:`sdpa` of a prefill (``Sq >= QB`` query rows) whose K/V are stored as
    bf16/f16 or int8/int4 with grouped scales (or whose Q is bf16/f16), with no fpmath
    rounding: K and V widened to f32 once per call (:func:`widen`, exact conversion and
    the kernels' dequantization ``(n - z) * s``), then the f32 prefill kernel.

    The tiled kernel dequantizes each K/V tile again for every tile of query rows, so
    it dequantized K and V ``Sq / QT`` times (S = 2048, s4 K/V: 2.3x the f32 time);
    here a K/V element is converted once for all the ``rep * Sq`` rows that read it.
    The f32 copies take at most :data:`WIDEN_BYTES` at a time (batches, or KV heads of
    one batch, in chunks).  ``out`` f32, or bf16/f16 bits rounded once from the f32
    result as the other kernels round it."""
    B, Hq, Sq, D = qf.shape
    _, Hkv, S, _ = k.shape
    rep = Hq // Hkv
    res = out if okind == 0 and out is not None else working_memory.empty((B, Hq, Sq, D), np.float32, "the SDPA f32 result")
    per_head = 2 * S * D * 4
    hc = max(1, min(Hkv, WIDEN_BYTES // per_head))
    bc = max(1, WIDEN_BYTES // (per_head * Hkv)) if hc == Hkv else 1
    for b0 in range(0, B, bc):
        b1 = min(B, b0 + bc)
        for h0 in range(0, Hkv, hc):
            h1 = min(Hkv, h0 + hc)
            part = (b1 - b0, h1 - h0, S, D)
            kf, vf = (widen(kv, b0 * Hkv + h0, (b1 - 1) * Hkv + h1, part) for kv in (k, v))
            qs = (slice(b0, b1), slice(h0 * rep, h1 * rep))
            ms = None if mask is None else mask[b0:b1 if mask.shape[0] > 1 else 1,
                                                h0 * rep:h1 * rep if mask.shape[1] > 1 else 1]
            sdpa(qf[qs], kf, vf, mask=ms, out=res[qs], stats=None if stats is None else stats[qs], **kw)
    return res if okind == 0 else store_out(res, okind, out)


def _bf16_operands(qk, qkind, k: KV, v: KV, rnd):
    """Q, K, V as bf16 bits [B, H, S, D] (uint16; views of bf16 data, roundings of f32 data
    under ``rnd`` bf16), or None when an operand is neither."""
    from graph_api.kernels.amx import bf16_bits

    if qkind == 1:
        q16 = qk
    elif qkind == 0 and rnd == RND_BF16:
        q16 = bf16_bits(qk)
    else:
        return None
    kv16 = []
    for kv in (k, v):
        data = _data4(kv) if not kv.transposed else \
            np.asarray(kv.data).reshape(kv.shape[:2] + (kv.shape[3], kv.shape[2])).swapaxes(2, 3)
        if kv.kind == "bf16":
            kv16.append(data.view(np.uint16))
        elif kv.kind == "f32" and rnd == RND_BF16:
            kv16.append(bf16_bits(data))
        else:
            return None
    return (q16, *kv16)


def _bf16_prefill(q16, k16, v16, scale, scale_mode, mflat, mstr, has_mask, causal, okind, out):
    """:func:`sdpa` of bf16 Q/K/V bits on :mod:`.prefill_bf16` (both products on the bf16 unit)."""
    B, Hq, Sq, D = q16.shape
    _, Hkv, S, _ = k16.shape
    res = out if okind == 0 and out is not None and _row_strided(out) else \
        working_memory.empty((B, Hq, Sq, D), np.float32, "the SDPA f32 result")
    args = (prefill_bf16.prefill_items, B * Hq, *_rows16(q16), Hq, Sq, D, *_rows16(k16), *_rows16(v16),
            Hkv, S, np.float32(scale), scale_mode == "mul", mflat, mstr, has_mask, CAUSAL[causal],
            *_flat_out(res))
    run_items(*args, work=2 * B * Hq * Sq * S * D)
    if res is out:
        return out
    return store_out(res, okind, out)


def _rows16(a):
    """(flat buffer, element strides of the first three axes) of a 4-D uint16 array: its
    own memory when the rows are contiguous, else a C-order copy."""
    if not (a.strides[-1] == 2 and min(a.strides) >= 0):
        a = np.ascontiguousarray(a)
    st = [s // 2 for s in a.strides]
    span = 1 + sum((n - 1) * s for n, s in zip(a.shape, st)) if a.size else 0
    return np.lib.stride_tricks.as_strided(a, shape=(span,), strides=(2,)), np.array(st[:3], np.int64)


#: the prefill kernel's probability-quantize parameters when there is none (see _quantize_row)
_NO_PROB_QUANT = (1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0)


def _prefill_call(q, k: KV, v: KV, scale, scale_mode, mflat, mstr, has_mask, causal, dest, want_rows,
                  rmax, rsum, prob_quant=None, score_rnd=0):
    """(:func:`threads.run_items`' arguments for the ``sdpa.prefill`` work-item kernel, its work) over
    f32 Q/K/V (rows read through their strides) into the row-strided f32 ``dest``."""
    B, Hq, Sq, D = q.shape
    _, Hkv, S, _ = k.shape
    fn = prefill.kernel(prob_quant is not None, score_rnd, has_mask, mstr[3])
    args = (fn, B * Hq, *_rows(q), Hq, Sq, D, *_rows(_data4(k)), *_rows(_data4(v)),
            Hkv, S, np.float32(scale), scale_mode == "mul", mflat, mstr, has_mask, CAUSAL[causal],
            *_flat_out(dest), want_rows, rmax, rsum,
            np.asarray(prob_quant if prob_quant is not None else _NO_PROB_QUANT, np.float32), score_rnd)
    return args, 2 * B * Hq * Sq * S * D


def prefill_runner(q, k: KV, v: KV, *, scale, scale_mode="mul", mask=None, out=None):
    """:func:`sdpa` on the f32 prefill kernel as a callable on these arrays, for a caller
    that runs the same attention on the same memory again and again (the values may
    change between calls: ``CompiledPartition.bind``); None unless every argument is
    the caller's memory itself, nothing converted or copied per call: f32 Q, K ``[S, D]``,
    V and output ``out`` [B, Hq, Sq, D] whose rows are contiguous (any strides above:
    heads of a [B, S, H, D] buffer), a C-contiguous f32 additive mask (or None); no
    causal mask."""
    B, Hq, Sq, D = q.shape
    _, Hkv, S, _ = k.shape
    if not (k.kind == v.kind == "f32" and prefill.usable(0, 0, 0, int(k.transposed), D, S, Sq, 0, 0)
            and out is not None and all(_row_strided(a) for a in (q, _data4(k), _data4(v), out))):
        return None
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.float32 or not mask.flags.c_contiguous:
            return None
        mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    unused = np.empty(1, np.float32)
    args, work = _prefill_call(q, k, v, scale, scale_mode, *flat_mask(mask), mask is not None, None, out,
                               False, unused, unused)

    def runner() -> None:
        run_items(*args, work=work)

    return runner


def _row_strided(a) -> bool:
    """A 4-D f32 array whose rows (last axis) are contiguous, with non-negative strides."""
    return a.dtype == np.float32 and a.ndim == 4 and a.strides[-1] == 4 and min(a.strides) >= 0


def _data4(kv: KV) -> np.ndarray:
    """An f32 K/V operand's storage as [B, H, S, D] (a view where the storage allows)."""
    d = np.asarray(kv.data)
    return d if d.shape == tuple(kv.shape) else d.reshape(kv.shape)


def _rows(a):
    """(flat buffer, element strides of the first three axes) of a 4-D f32 array for the
    prefill kernel: its own memory when the rows are contiguous, else a C-order copy."""
    return _flat_out(a if _row_strided(a) else np.ascontiguousarray(a, dtype=np.float32))


def _flat_out(out):
    """A 4-D f32 array with a contiguous last axis and non-negative strides as (a flat
    C-contiguous view from its first element, element strides of its first three axes):
    one compiled signature for a dense output and for a strided view of the next layout."""
    st = [s // 4 for s in out.strides]
    span = 1 + sum((n - 1) * s for n, s in zip(out.shape, st)) if out.size else 0
    flat = np.lib.stride_tricks.as_strided(out, shape=(span,), strides=(4,))
    return flat, np.array(st[:3], np.int64)

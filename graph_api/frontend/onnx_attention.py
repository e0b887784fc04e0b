"""Attention ops as the SDPA op chain the project's SDPA patterns match
(``patterns/library/sdpa.py``; ``samples/04_sdpa.py`` builds the same chain by hand)::

    Q [B,Hq,S,D] ─┐                                 (GQA: Q [B,Hkv,G,S,D], K/V [B,Hkv,1,L,D])
    K [B,Hkv,L,D] ┴ MatMul(transpose_b) ─ Multiply(scale) ─ [Tanh ─ Multiply(softcap)]?
        ─ [causal: Select(GenIndex(row) [+ s_kv - s_q] >= GenIndex(col), S, -inf)]?
        ─ [Add(mask) | Select(bool mask, S, -inf)]? ─ SoftMax(axis -1, inf_as_zero) ─┐
    V ──────────────────────────────────────────────────────────────── MatMul ─┴
        ─ [StaticTranspose ─ StaticReshape]? (3-D outputs [B, S, Hq*D])

* ``ai.onnx::Attention`` (opset 23): 3-D or 4-D Q/K/V, ``is_causal`` (aligned at the past
  length: query ``i`` sees keys ``j <= i + past``), ``attn_mask`` (bool: keep where true;
  float: added), ``past_key``/``past_value`` (``present = Concat(past, new)``), ``scale``,
  ``softcap``, GQA (fewer K/V heads).  ``qk_matmul_output`` is not produced (Unimplemented).
* ``com.microsoft::MultiHeadAttention``: 3-D Q/K/V, ``num_heads``, optional packed ``bias``,
  ``attention_bias`` (added), ``past_key``/``past_value``, ``unidirectional`` (causal).
  ``key_padding_mask`` is not supported.
* ``com.microsoft::GroupQueryAttention``: 3-D Q/K/V, ``num_heads``/``kv_num_heads``, always
  causal, ``past_key``/``past_value`` concatenated (the buffer is not shared).  A host guard
  checks at run time that ``total_sequence_length`` is past + new and every ``seqlens_k`` is
  ``total - 1`` (no padded rows): other values raise ``InvalidArguments`` instead of giving
  numbers computed for another mask.  ``do_rotary``, ``local_window_size``, packed QKV and
  ``smooth_softmax`` are Unimplemented.

GQA runs in the 5-D form (one K/V read per head group); the scale multiplies the scores.
"""
from __future__ import annotations

import numpy as np

from ..dtypes import DataType as DT
from ..errors import InvalidArguments, Unimplemented
from .onnx_ops import _floats, _target


def _heads_first(ctx, x, heads: int, head: int):
    """[B, S, H*D] -> [B, H, S, D]."""
    b = ctx.b
    x = b.static_reshape(x, shape=[0, 0, heads, head], special_zero=True)
    return b.static_transpose(x, order=[0, 2, 1, 3])


def _s32(ctx, value: int):
    return ctx.constant(np.array([value], np.int32), DT.s32)


def sdpa(ctx, q, k, v, *, hq: int, hkv: int, d: int, dv: int, scale: float, causal, mask=None,
         softcap: float = 0.0, out3d: bool):
    """The SDPA chain; ``causal`` is None, 0 (top-left) or an offset (int, or a Value s32 [1]
    holding ``s_kv - s_q``); ``mask`` (Value, "add" | "bool") is broadcastable to [B,Hq,S,L].
    q: [B,Hq,S,D]; k: [B,Hkv,L,D]; v: [B,Hkv,L,Dv].  Returns [B,Hq,S,Dv] or [B,S,Hq*Dv]."""
    b = ctx.b
    dt = q.dtype
    group = hq // hkv
    if group > 1:
        q = b.static_reshape(q, shape=[0, hkv, group, -1, d], special_zero=True)
        k = b.static_reshape(k, shape=[0, hkv, 1, -1, d], special_zero=True)
        v = b.static_reshape(v, shape=[0, hkv, 1, -1, dv], special_zero=True)
    s = b.matmul(q, k, transpose_b=True)
    if softcap > 0:
        s = b.multiply(s, ctx.constant(np.array([scale / softcap], np.float32), dt))
        s = b.multiply(b.tanh(s), ctx.constant(np.array([softcap], np.float32), dt))
    else:
        s = b.multiply(s, ctx.constant(np.array([scale], np.float32), dt))
    neg_inf = ctx.constant(np.array([-np.inf], np.float32), dt)
    if causal is not None:
        row = b.gen_index(s, axis=-2, out_dtype=DT.s32)
        col = b.gen_index(s, axis=-1, out_dtype=DT.s32)
        if not (isinstance(causal, int) and causal == 0):
            offset = _s32(ctx, causal) if isinstance(causal, int) else causal
            row = b.subtract(b.add(row, offset), _s32(ctx, 0))  # row + s_kv - s_q
        s = b.select(b.greater_equal(row, col), s, neg_inf)
    if mask is not None:
        value, kind = mask
        if group > 1 and value.shape is not None and len(value.shape) >= 3:
            mb, heads, ms, ml = (1,) * (4 - len(value.shape)) + tuple(value.shape)
            if heads not in (1, hq):
                raise ctx.fail(Unimplemented, f"attention mask of shape {list(value.shape)} does not "
                                              f"broadcast over {hq} heads")
            dims = [mb, 1, 1, ms, ml] if heads == 1 else [mb, hkv, group, ms, ml]
            if sum(x < 0 for x in dims) > 1:
                raise ctx.fail(Unimplemented, f"attention mask of shape {list(value.shape)}: its 5-D GQA "
                                              f"form needs all but one dim known")
            value = b.static_reshape(value, shape=dims, special_zero=False)
        s = b.add(s, value) if kind == "add" else b.select(value, s, neg_inf)
    p = b.softmax(s, axis=-1, mode="inf_as_zero")
    o = b.matmul(p, v)
    if group > 1 and not out3d:
        return b.static_reshape(o, shape=[0, hq, -1, dv], special_zero=True)
    if out3d:
        order = [0, 3, 1, 2, 4] if group > 1 else [0, 2, 1, 3]
        o = b.static_transpose(o, order=order)
        return b.static_reshape(o, shape=[0, 0, hq * dv], special_zero=True)
    return o


def _known(dim) -> bool:
    return dim is not None and dim >= 0


def _past_offset(ctx, past_index: int):
    """s_kv - s_q for bottom-right causal attention: the past length (known, or read from
    the past tensor's shape by a host step)."""
    shape = ctx.shape(past_index)
    if shape is not None and _known(shape[2]):
        return int(shape[2])
    name = ctx.name(past_index)
    out = ctx.imp.host_step(lambda ins: [np.array([np.shape(ins[0])[2]], np.int32)], [name],
                            [(np.dtype(np.int32), (1,))], f"{name}/past_length")
    return ctx.imp.value(out[0])


def _attention(ctx):
    """ai.onnx::Attention (opset 23+)."""
    outs = list(ctx.node.output)
    if len(outs) > 3 and outs[3]:
        raise ctx.fail(Unimplemented, "the qk_matmul_output output is not produced")
    if not _floats(ctx, 0, 1, 2):
        return False
    if ctx.has(6) and ctx.name(6):
        raise ctx.fail(Unimplemented, "nonpad_kv_seqlen is not supported")
    qs, ks, vs = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if qs is None or ks is None or vs is None:
        return False
    dt = _target(ctx, 0, 1, 2)
    b = ctx.b
    q, k, v = ctx.value(0), ctx.value(1), ctx.value(2)
    if len(qs) == 3:
        hq, hkv = int(ctx.attr("q_num_heads", 0)), int(ctx.attr("kv_num_heads", 0))
        if not hq or not hkv or not all(_known(x[2]) for x in (qs, ks, vs)):
            return False
        d, dv = qs[2] // hq, vs[2] // hkv
        q, k, v = _heads_first(ctx, q, hq, d), _heads_first(ctx, k, hkv, d), _heads_first(ctx, v, hkv, dv)
        out3d = True
    else:
        hq, hkv, d, dv = qs[1], ks[1], qs[3], vs[3]
        if not all(_known(x) for x in (hq, hkv, d, dv)):
            return False
        out3d = False
    if hq % hkv:
        raise ctx.fail(InvalidArguments, f"{hq} query heads are not a multiple of {hkv} K/V heads")
    causal = None
    if ctx.has(4) != ctx.has(5):
        raise ctx.fail(InvalidArguments, "past_key and past_value come together")
    if ctx.has(4):
        k = b.concat(ctx.value(4, dt), k, axis=2)
        v = b.concat(ctx.value(5, dt), v, axis=2)
    if ctx.attr("is_causal", 0):
        causal = _past_offset(ctx, 4) if ctx.has(4) else 0
    mask = None
    if ctx.has(3):
        md = ctx.dtype(3)
        kind = "bool" if md is not None and np.dtype(md) == np.bool_ else "add"
        mv = ctx.value(3, dt if kind == "add" else None)
        mask = (mv, kind)
    scale = ctx.attr("scale")
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    y = sdpa(ctx, q, k, v, hq=hq, hkv=hkv, d=d, dv=dv, scale=scale, causal=causal, mask=mask,
             softcap=float(ctx.attr("softcap", 0.0)), out3d=out3d)
    return ctx.out(y, k, v)


def _split_bias(ctx, x, bias, start: int, width: int):
    return ctx.b.add(x, ctx.constant(bias[start:start + width]))


def _multi_head_attention(ctx):
    """com.microsoft::MultiHeadAttention (3-D Q/K/V)."""
    if ctx.has(4):
        raise ctx.fail(Unimplemented, "key_padding_mask is not supported")
    if not ctx.has(1) or not ctx.has(2):
        raise ctx.fail(Unimplemented, "packed QKV / packed KV forms are not supported")
    qs, ks, vs = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if qs is None or ks is None or vs is None or len(qs) != 3 or len(ks) != 3:
        raise ctx.fail(Unimplemented, "only 3-D query, key and value are supported")
    if not _floats(ctx, 0, 1, 2):
        return False
    h = int(ctx.attr("num_heads"))
    d, dv = qs[2] // h, vs[2] // h
    q, k, v = ctx.value(0), ctx.value(1), ctx.value(2)
    if ctx.has(3):
        bias = ctx.const(3)
        if bias is None:
            raise ctx.fail(Unimplemented, "a run-time bias is not supported")
        q = _split_bias(ctx, q, bias, 0, qs[2])
        k = _split_bias(ctx, k, bias, qs[2], ks[2])
        v = _split_bias(ctx, v, bias, qs[2] + ks[2], vs[2])
    q, k, v = _heads_first(ctx, q, h, d), _heads_first(ctx, k, h, d), _heads_first(ctx, v, h, dv)
    dt = _target(ctx, 0)
    past = ctx.has(6)
    if past:
        k = ctx.b.concat(ctx.value(6, dt), k, axis=2)
        v = ctx.b.concat(ctx.value(7, dt), v, axis=2)
    causal = (_past_offset(ctx, 6) if past else 0) if ctx.attr("unidirectional", 0) else None
    mask = (ctx.value(5, dt), "add") if ctx.has(5) else None
    scale = ctx.attr("scale", 0.0)
    scale = 1.0 / np.sqrt(d) if not scale else float(scale)
    y = sdpa(ctx, q, k, v, hq=h, hkv=h, d=d, dv=dv, scale=scale, causal=causal, mask=mask, out3d=True)
    return ctx.out(y, k, v)


def _group_query_attention(ctx):
    """com.microsoft::GroupQueryAttention without rotary, packed QKV or a shared KV buffer."""
    for attr in ("do_rotary", "smooth_softmax"):
        if ctx.attr(attr, 0):
            raise ctx.fail(Unimplemented, f"{attr}=1 is not supported")
    if int(ctx.attr("local_window_size", -1)) != -1:
        raise ctx.fail(Unimplemented, "local_window_size (sliding window) is not supported")
    if not ctx.has(1) or not ctx.has(2):
        raise ctx.fail(Unimplemented, "packed QKV is not supported")
    if any(ctx.has(i) for i in range(7, 12)):
        raise ctx.fail(Unimplemented, "cos/sin caches, position_ids, attention_bias and head_sink "
                                      "are not supported")
    qs, ks, vs = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if qs is None or ks is None or vs is None or len(qs) != 3 or not _floats(ctx, 0, 1, 2):
        return False
    hq, hkv = int(ctx.attr("num_heads")), int(ctx.attr("kv_num_heads"))
    d = qs[2] // hq
    q = _heads_first(ctx, ctx.value(0), hq, d)
    k = _heads_first(ctx, ctx.value(1), hkv, d)
    v = _heads_first(ctx, ctx.value(2), hkv, d)
    dt = _target(ctx, 0)
    past = ctx.has(3)
    label = ctx.node.name or ctx.node.output[0]
    new = qs[1] if _known(qs[1]) else None
    ctx.imp.host_step(_gqa_guard(label, new), [ctx.name(5), ctx.name(6), ctx.name(3) if past else ""],
                      [], f"{label}/length_guard")
    if past:
        k = ctx.b.concat(ctx.value(3, dt), k, axis=2)
        v = ctx.b.concat(ctx.value(4, dt), v, axis=2)
    causal = _past_offset(ctx, 3) if past else 0
    scale = ctx.attr("scale", 0.0)
    scale = 1.0 / np.sqrt(d) if not scale else float(scale)
    y = sdpa(ctx, q, k, v, hq=hq, hkv=hkv, d=d, dv=d, scale=scale, causal=causal, out3d=True,
             softcap=float(ctx.attr("softcap", 0.0)))
    return ctx.out(y, k, v)


def _gqa_guard(label: str, new: int | None):
    def check(ins):
        seqlens, total, past = ins
        old = 0 if past is None else np.shape(past)[2]
        total = int(np.asarray(total).reshape(-1)[0])
        if (new is not None and total != old + new) or np.any(np.asarray(seqlens).reshape(-1) != total - 1):
            raise InvalidArguments(
                f"GroupQueryAttention {label}: total_sequence_length {total} with {old} past and {new} "
                f"new positions and seqlens_k {np.asarray(seqlens).reshape(-1).tolist()}; this importer "
                f"takes unpadded batches only (every seqlens_k = past + new - 1)")
        return []
    return check


#: com.microsoft ops (ai.onnx's Attention is registered in onnx_ops)
MAPPERS = {
    "MultiHeadAttention": _multi_head_attention,
    "GroupQueryAttention": _group_query_attention,
}

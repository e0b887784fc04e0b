"""K and V operands of an SDPA partition, as ``graph_api.kernels.sdpa`` reads them.

Which tensor feeds K or V (through DynamicDequantize [-> TypeCast] for
compressed caches), its memory layout read off the strides (dense
``[..,S,D]`` or ``[..,D,S]``; packed int4 passed as bytes with no copy),
grouped scales/zero points along the head dimension, and the fpmath
rounding codes each operand accepts.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K
from graph_api.kernels.bits import RND_BF16, RND_F16, RND_NONE, RND_TF32, rounding_code

_FLOATS = {DataType.f32: "f32", DataType.bf16: "bf16", DataType.f16: "f16"}
_INTS = {DataType.s4: "s4", DataType.u4: "u4", DataType.s8: "s8", DataType.u8: "u8"}
_TYPE_RND = {DataType.bf16: RND_BF16, DataType.f16: RND_F16}
_ANY_RND = frozenset({RND_NONE, RND_BF16, RND_F16, RND_TF32})
#: rounding codes that leave stored bf16 / f16 values unchanged
_KEEPS = {DataType.bf16: frozenset({RND_NONE, RND_BF16, RND_TF32}),
          DataType.f16: frozenset({RND_NONE, RND_F16, RND_TF32})}


def _dense(shape, strides) -> bool:
    """Row-major dense, ignoring the strides of size-1 dims."""
    expected = 1
    for d, s in reversed(list(zip(shape, strides))):
        if d != 1 and s != expected:
            return False
        expected *= d
    return True


def _swap(t: tuple) -> tuple:
    return tuple(t[:-2]) + (t[-1], t[-2])


def _compose(codes) -> int | None:
    """One rounding code equal to applying ``codes`` in turn, or None."""
    code = RND_NONE
    for c in codes:
        if c in (RND_NONE, code) or (c == RND_TF32 and code in (RND_BF16, RND_F16)):
            continue  # tf32 keeps bf16/f16 values
        if code != RND_NONE:
            return None
        code = c
    return code


# ====================================================================== K / V operands
@dataclass
class Operand:
    """K or V as the kernel reads it.

    ``data_id`` holds the stored values (the integer tensor when compressed);
    ``swapped``: the MatMul sees it as ``[.., D, S]``; ``packed``: int4 memory
    order from the strides ("bhsd"/"bhds"); ``rnd``: the rounding codes that
    give the reference MatMul's input values.
    """

    data_id: int
    kind: str
    swapped: bool
    rnd: frozenset
    packed: str | None = None
    group: int = 0
    scale_id: int | None = None
    zp_id: int | None = None


def _group(deq, src_lt, scale_lt, d_axis: int):
    """Group size along D, or a reason."""
    from graph_api.kernels.reference.quant import group_shape

    qtype = deq.attrs.get("qtype", "per_tensor")
    shape, D = src_lt.shape, src_lt.shape[d_axis]
    if qtype == "per_tensor":
        return D if scale_lt.nelems() == 1 else f"per_tensor scales of {scale_lt.nelems()} values"
    if qtype != "per_group":
        return f"{qtype} scales (only per_group along the head size, or per_tensor)"
    gs = group_shape(deq, shape, scale_lt.shape)
    d = d_axis % len(shape)
    if len(gs) != len(shape) or any(g != 1 for i, g in enumerate(gs) if i != d) or D % gs[d]:
        return f"group_shape {list(gs)} does not group along the head size (dim {d}) only"
    expected = tuple(D // gs[d] if i == d else n for i, n in enumerate(shape))
    if tuple(scale_lt.shape) != expected:
        return f"scales shape {list(scale_lt.shape)}, expected {list(expected)}"
    return gs[d]


def _compressed(request, deq_id, cast_id, swapped, allow_bhds):
    """The Operand of a DynamicDequantize [-> TypeCast] K or V, or a reason."""
    lts, ops = request.lts, {op.id: op for op in request.ops}
    deq = ops[deq_id]
    if deq.kind != K.DynamicDequantize:
        return f"{deq.kind.name} K/V"
    src = lts[deq.inputs[0].id]
    if src.dtype not in _INTS:
        return f"{src.dtype.name} compressed data"
    group = _group(deq, src, lts[deq.inputs[1].id], -2 if swapped else -1)
    if isinstance(group, str):
        return group
    zp_id = deq.inputs[2].id if len(deq.inputs) > 2 else None
    if zp_id is not None and lts[zp_id].nelems() not in (1, lts[deq.inputs[1].id].nelems()):
        return f"zero points of shape {list(lts[zp_id].shape)}"
    packed = None
    if src.dtype in (DataType.s4, DataType.u4):
        canon = (_swap(src.shape), _swap(src.strides)) if swapped else (src.shape, src.strides)
        if _dense(*canon):
            packed = "bhsd"
        elif allow_bhds and _dense(_swap(canon[0]), _swap(canon[1])):
            packed = "bhds"
        else:
            return f"int4 data with strides {list(src.strides)} is dense in neither [.., S, D] " \
                   f"nor{' [.., D, S]' if allow_bhds else ''} order"
    types = [lts[deq.outputs[0].id].dtype] + ([lts[ops[cast_id].outputs[0].id].dtype] if cast_id else [])
    code = _compose([_TYPE_RND.get(t, RND_NONE) for t in types]
                    + [rounding_code(request.fpmath, for_int_weights=True)])
    if code is None:
        return f"dequantized values rounded twice ({', '.join(t.name for t in types)}, fpmath {request.fpmath})"
    return Operand(src.id, _INTS[src.dtype], swapped, frozenset({code}), packed, group,
                   deq.inputs[1].id, zp_id)


def _float_operand(request, tid, swapped):
    dt = request.lts[tid].dtype
    if dt not in _FLOATS:
        return f"{dt.name} K/V"
    rnd = _KEEPS.get(dt) or frozenset({rounding_code(request.fpmath)})
    return Operand(tid, _FLOATS[dt], swapped, rnd)


def _params(array, op: Operand, transposed: bool, shape4):
    """Scales or zero points in the kernel's layout ([B,H,S,D/G] or [B,H,D/G,S])."""
    B, H, S, D = shape4
    ng = D // op.group
    a = np.asarray(array)
    if a.size == 1:
        return np.broadcast_to(a.reshape(1, 1, 1, 1), (B, H, ng, S) if transposed else (B, H, S, ng))
    canon = np.swapaxes(a, -1, -2) if op.swapped else a  # [.., S, ng]
    if transposed:
        return np.swapaxes(canon, -1, -2).reshape(B, H, ng, S)
    return canon.reshape(B, H, S, ng)


def make_kv(op: Operand, inputs, fetch, shape4, allow_bhds: bool):
    """A ``graph_api.kernels.sdpa.KV`` for this execute's tensors (no copy when the layout allows)."""
    from graph_api.kernels import sdpa as SD

    if op.packed:
        data, transposed = inputs[op.data_id].get_data_handle(), op.packed == "bhds"
    else:
        x = fetch(inputs, op.data_id)
        canon = np.swapaxes(x, -1, -2) if op.swapped else x  # [.., S, D]
        if canon.flags.c_contiguous:
            data, transposed = canon, False
        elif allow_bhds and np.swapaxes(canon, -1, -2).flags.c_contiguous:
            data, transposed = np.swapaxes(canon, -1, -2), True
        elif op.kind == "f32" and canon.ndim == 4 and canon.strides[-1] == 4 and min(canon.strides) >= 0:
            data, transposed = canon, False  # rows contiguous: the f32 prefill kernel reads them in place
        else:
            data, transposed = np.ascontiguousarray(canon), False
    scales = zps = None
    if op.scale_id is not None:
        scales = _params(inputs[op.scale_id].numpy(), op, transposed, shape4)
        if op.zp_id is not None:
            zps = _params(inputs[op.zp_id].numpy(), op, transposed, shape4)
    return SD.KV(data, op.kind, tuple(shape4), transposed, op.group, scales, zps)


# ====================================================================== compile

"""The op table: one :class:`OpSchema` row per forward op kind of oneDNN Graph.

Rows are data built by a few small constructors (``unary``, ``binary``,
``reduce``, ...); ``OP_SCHEMAS`` at the bottom maps each :class:`OpKind` to its
row.  Ports, type variables, attribute kinds, defaults and choices follow
oneDNN's ``op_def.hpp``; the constraint functions mirror ``op_def_constraint``
(they run after the generic checks and raise :class:`InvalidGraphOp`).  Shape
inference lives in :mod:`graph_api.shapes`.

Deliberate differences from oneDNN are marked "Extension" or "Deviation" where
they are made (int4 DynamicQuantize, the RFC ``groups`` form, Reduce* with a
2nd axes input, f8 zps of static Quantize, qtype/rounding_type choices).
"""
from __future__ import annotations

import math

import numpy as np

from . import composite, dot_algorithm, indexing_maps, shapes
from .dtypes import DataType as DT
from .enums import OpKind
from .errors import InvalidGraphOp, op_label
from .schema import ANY_TYPE, REQUIRED, Attr, OpSchema, Port

# ------------------------------------------------------------- dtype sets
FLOATS = frozenset({DT.f32, DT.bf16, DT.f16})
FLOATS_S32 = FLOATS | {DT.s32}
F32 = frozenset({DT.f32})
NORM_AUX = frozenset({DT.f32, DT.bf16})  # gamma/beta/mean/variance of LayerNorm, BatchNorm...
INT8 = frozenset({DT.u8, DT.s8})
INT4 = frozenset({DT.s4, DT.u4})
F8 = frozenset({DT.f8_e5m2, DT.f8_e4m3})
QUANT_ZPS = frozenset({DT.u4, DT.s4, DT.u8, DT.s8, DT.s32})
S32_MIN, S32_MAX = -(2**31), 2**31 - 1
END_TYPES = frozenset({DT.f32, DT.f16, DT.bf16, DT.s8, DT.u8, DT.s32, DT.undef})

# ------------------------------------------------------- shared attributes
AUTO_BROADCAST = Attr("auto_broadcast", "string", "numpy", ("none", "numpy"))
DATA_FORMAT = Attr("data_format", "string", "NXC", ("NCX", "NXC"))
AUTO_PAD = Attr("auto_pad", "string", "None", ("None", "SAME_UPPER", "SAME_LOWER", "VALID"))
EPSILON = Attr("epsilon", "f32", 1e-5)
KEEP_STATS = Attr("keep_stats", "bool", True)
USE_AFFINE = Attr("use_affine", "bool", True)
BEGIN_NORM_AXIS = Attr("begin_norm_axis", "s64", -1)
# oneDNN writes 12-entry list defaults (DNNL_MAX_NDIMS) for these; shapes.py cuts them.
TWELVE_ONES = tuple([1] * shapes.MAX_NDIMS)
TWELVE_ZEROS = tuple([0] * shapes.MAX_NDIMS)


def _required(name: str, kind: str, choices: tuple | None = None) -> Attr:
    return Attr(name, kind, REQUIRED, choices)


def _bound(name: str) -> Attr:
    """Clamp's min/max: +-inf is a one-sided clip (oneDNN's clip_v2 takes any
    alpha <= beta); NaN fails that comparison, so oneDNN refuses it."""
    return Attr(name, "f32", REQUIRED, infinite=True)


def _conv_attrs(weights_formats: tuple[str, ...]) -> tuple[Attr, ...]:
    """SET_CONV_COMMON_ATTRS / SET_CONVTRANSPOSE_COMMON_ATTRS (first format = default)."""
    return (_required("strides", "s64[]"), _required("pads_begin", "s64[]"),
            _required("pads_end", "s64[]"), _required("dilations", "s64[]"), AUTO_PAD,
            Attr("groups", "s64", 1), DATA_FORMAT,
            Attr("weights_format", "string", weights_formats[0], weights_formats))


def _pool_attrs() -> tuple[Attr, ...]:
    # Deviation: oneDNN leaves rounding_type unchecked (anything but "ceil" floors).
    return (_required("strides", "s64[]"), _required("pads_begin", "s64[]"),
            _required("pads_end", "s64[]"), _required("kernel", "s64[]"), DATA_FORMAT,
            Attr("rounding_type", "string", "floor", ("floor", "ceil")), AUTO_PAD)


# ------------------------------------------------------------ constraints
def _fail(op, message: str) -> InvalidGraphOp:
    return InvalidGraphOp(f"{op_label(op)}: {message}")


def port_count_sets(inputs=None, outputs=None):
    """oneDNN's ``set_num_inputs({1, 3})``: only these counts (not the range between)."""

    def check_counts(op):
        for what, allowed, given in (("inputs", inputs, len(op.inputs)),
                                     ("outputs", outputs, len(op.outputs))):
            if allowed is not None and given not in allowed:
                raise _fail(op, f"got {given} {what}, expected one of {sorted(allowed)}")

    return check_counts


def check_pads(op):
    """Conv/pool ``pads_begin`` and ``pads_end`` hold non-negative values."""
    for name in ("pads_begin", "pads_end"):
        if any(p < 0 for p in op.attrs[name]):
            raise _fail(op, f"{name}={op.attrs[name]} must be non-negative")


def check_pool_pads(op):
    """AvgPool/MaxPool: ``pads_begin`` non-negative; ``pads_end`` may be negative.

    Extension: oneDNN's ``check_pads`` rejects a negative ``pads_end`` at
    add_op, yet its benchdnn input ``avgpool_3d_chain_fusion.json`` carries
    one; here it means the last windows stop short of the end of the source
    (rows past ``size + pads_end`` are never read).
    """
    if any(p < 0 for p in op.attrs["pads_begin"]):
        raise _fail(op, f"pads_begin={op.attrs['pads_begin']} must be non-negative")


def check_maxpool_dilations(op):
    """MaxPool ``dilations`` has one entry per kernel dim (the 12-ones default passes)."""
    dilations, kernel = op.attrs["dilations"], op.attrs["kernel"]
    if list(dilations) == list(TWELVE_ONES):
        return
    if len(dilations) != len(kernel):
        raise _fail(op, f"dilations={dilations} has {len(dilations)} entries, "
                        f"expected {len(kernel)} (as kernel={kernel})")


def _aux_needs_bf16_src(op, aux_lt, what: str):
    src = op.inputs[0].dtype
    if aux_lt.dtype == DT.bf16 and src != DT.bf16:
        raise _fail(op, f"{what} (tensor {aux_lt.id}) is bf16 but src is {src.name}; "
                        f"bf16 {what} needs a bf16 src")


def check_bn_data_type(op):
    """BatchNorm: bf16 statistics/affine inputs only with a bf16 src (oneDNN reads input 2)."""
    _aux_needs_bf16_src(op, op.inputs[2], "input 2")


def check_norm_data_type(op):
    """LayerNorm/GroupNorm/RMSNorm: a bf16 gamma (or stats output) needs a bf16 src."""
    if len(op.inputs) > 1:
        _aux_needs_bf16_src(op, op.inputs[1], "gamma")
    elif len(op.outputs) > 1:
        _aux_needs_bf16_src(op, op.outputs[1], "mean")


def check_keep_stats_outputs(op):
    """LayerNorm/GroupNorm with ``keep_stats=true`` must declare dst, mean and variance."""
    if op.attrs["keep_stats"] and len(op.outputs) != 3:
        raise _fail(op, f"keep_stats=true needs 3 outputs (dst, mean, variance), "
                        f"given {len(op.outputs)}; set keep_stats=false for dst only")


def check_matmul_dtype(op):
    """MatMul: dst may differ from src only by being f32 (xf16 in, f32 out)."""
    src, dst = op.inputs[0].dtype, op.outputs[0].dtype
    if src != dst and dst != DT.f32:
        raise _fail(op, f"src {src.name} with dst {dst.name} is not supported; "
                        f"dst must be {src.name} or f32")


# Extensions (seeds 000 and 001): MatMul precision algorithm and indexing maps.
DOT_ATTRS = [Attr("algorithm", "string|dict"), Attr("indexing_maps", "string[]")]


def check_dot_attrs(op):
    """``algorithm`` (dot_algorithm) and ``indexing_maps`` (indexing_maps): checked,
    written in canonical form; default maps are dropped."""

    if "algorithm" in op.attrs:
        op.attrs["algorithm"] = dot_algorithm.check_algorithm(op, op.attrs["algorithm"])
        if op.attrs.get("accumulation_mode") in ("f16", "s32"):
            raise _fail(op, f"accumulation_mode {op.attrs['accumulation_mode']} conflicts with "
                            f"the algorithm, which fixes the accumulator")
    if "indexing_maps" in op.attrs:
        maps = indexing_maps.check_attr(op, op.attrs["indexing_maps"])
        if maps is None:
            del op.attrs["indexing_maps"]
        else:
            op.attrs["indexing_maps"] = maps
    if op.kind == K.BatchReduceMatMul and "indexing_maps" not in op.attrs:
        indexing_maps.loop_sizes(op, indexing_maps.default(op.kind.name, True), op.inputs[0].shape,
                                 op.inputs[1].shape, op.outputs[0].shape if op.outputs else None)


def check_softmax_dtype(op):
    """SoftMax: when src and dst differ one of them is f32 (no bf16 <-> f16)."""
    src, dst = op.inputs[0].dtype, op.outputs[0].dtype
    if src != dst and DT.f32 not in (src, dst):
        raise _fail(op, f"src {src.name} with dst {dst.name} is not supported; "
                        f"dst must be {src.name} or f32")


def check_typecast_data_type(op):
    """TypeCast: src and dst differ, and bf16 <-> f16 is not a supported cast."""
    src, dst = op.inputs[0].dtype, op.outputs[0].dtype
    if src == dst:
        raise _fail(op, f"src and dst are both {src.name}; TypeCast must change the data type")
    if {src, dst} == {DT.bf16, DT.f16}:
        raise _fail(op, f"{src.name} -> {dst.name} is not supported; cast through f32")


def check_clamp_bounds(op):
    """Clamp/ClampBackward: ``min <= max`` in f32, oneDNN's clip rule (``beta >=
    alpha`` in ``math::is_eltwise_ok``, checked when the primitive is made);
    a NaN bound fails it there, and is refused with the attribute check here."""
    with np.errstate(over="ignore"):  # 1e39 is +inf in f32
        lo, hi = np.float32(op.attrs["min"]), np.float32(op.attrs["max"])
    if not hi >= lo:
        raise _fail(op, f"min={op.attrs['min']!r} is above max={op.attrs['max']!r}; "
                        f"Clamp needs min <= max")


def check_interpolate_sizes_scales(op):
    """Interpolate: exactly one of the ``sizes`` and ``scales`` attributes is given."""
    has_sizes, has_scales = bool(op.attrs.get("sizes")), bool(op.attrs.get("scales"))
    if has_sizes == has_scales:
        given = "both" if has_sizes else "neither"
        raise _fail(op, f"exactly one of the attributes sizes and scales must be given, given {given}")


def check_reduce_axes(op):
    """Reduce*: the axes come from the attribute or from a 2nd input, not both.

    Deviation: oneDNN counts the inserted default ``axes=[]`` as "given", which
    rejects every 2-input op; here an empty ``axes`` means "not given", so the
    2-input form works.  A 1-input op with empty axes is accepted (as oneDNN
    does; its backend then leaves the op unsupported).
    """
    if len(op.inputs) == 2 and op.attrs["axes"]:
        raise _fail(op, f"axes given both as attribute {op.attrs['axes']} and as input 1 "
                        f"(tensor {op.inputs[1].id}); give exactly one")


def check_static_quant(op):
    """Quantize/Dequantize: scale/zp counts, and no zps with f8.

    per_tensor takes exactly one scale; zps (if any) has as many entries as
    scales.  Deviation: oneDNN's code checks the f8 rule on the src twice (a
    copy-paste slip), so an f8 Quantize with zps slips through; the documented
    rule (no zps with f8 on either side) is applied here.
    """
    scales, zps = op.attrs["scales"], op.attrs.get("zps")
    if not scales:
        raise _fail(op, "scales must not be empty")
    if op.attrs["qtype"] == "per_tensor" and len(scales) != 1 and op.attrs.get("mask") is None:
        raise _fail(op, f"qtype=per_tensor takes exactly 1 scale, given {len(scales)}")
    src = op.inputs[0].shape
    if op.attrs["qtype"] == "per_channel" and src is not None:
        _check_axis(op, len(src))
    check_quant_mask(op)
    if zps is None:
        return
    # Deviation: zps is s64[] in oneDNN but its primitives hold zero points as s32;
    # values beyond s32 are refused here rather than wrapped.
    outside = [z for z in zps if not S32_MIN <= z <= S32_MAX]
    if outside:
        raise _fail(op, f"zps entry {outside[0]} is outside the s32 range [{S32_MIN}, {S32_MAX}]")
    f8_side = [lt for lt in (op.inputs[0], op.outputs[0]) if lt.dtype in F8]
    if f8_side:
        raise _fail(op, f"zps are not supported for f8 quantization "
                        f"(tensor {f8_side[0].id} is {f8_side[0].dtype.name}); drop zps")
    if len(zps) != len(scales):
        raise _fail(op, f"zps has {len(zps)} entries, expected {len(scales)} (one per scale)")


def _check_axis(op, rank: int) -> None:
    """A quantization ``axis`` must name a src dim: [-rank, rank-1], never wrapped."""
    axis = op.attrs["axis"]
    if not -rank <= axis < rank:
        raise _fail(op, f"axis={axis} is out of range for rank-{rank} src; "
                        f"expected [{-rank}, {rank - 1}]")


def check_static_quant_shapes(op, in_shapes):
    """At compile: per_channel ``axis`` against the concrete src rank, and the
    scale count against the dim it names (1 scale is shared by every channel).

    Example: oneDNN's int8 inference example dequantizes XIO (KH, KW, I, O)
    conv weights with ``axis=1`` and O scales; dim 1 is KW, so the scales do
    not fit and this says so instead of the kernel failing to reshape them.
    """
    src = in_shapes[0]
    if op.attrs["qtype"] != "per_channel" or src is None:
        return
    _check_axis(op, len(src))
    channels, count = src[op.attrs["axis"] % len(src)], len(op.attrs["scales"])
    if count != 1 and channels != shapes.UNKNOWN and count != channels:
        raise _fail(op, f"per_channel has {count} scales but src dim {op.attrs['axis']} "
                        f"(axis) of {list(src)} is {channels}; give {channels} scales or 1")


# ----------------------------------------- quantization masks (oneDNN RFC 2026-08)
def mask_dims(mask: int, rank: int) -> list[int]:
    """The src dims a quantization ``mask`` selects (bit d set: scales vary along dim d)."""
    return [d for d in range(rank) if mask >> d & 1]


def check_quant_mask(op):
    """The ``mask`` attribute of the quantization ops (oneDNN branch lvtao/main/quant-mask):
    bit ``d`` set means the scales (and zps) vary along src dim ``d``.  As oneDNN: mask >= 0,
    no bit at or above the src rank, qtype per_tensor (the default); a dynamic op's scales
    are packed, one dim per set bit with that src dim's size, zps shaped as the scales.
    Extension: static Quantize/Dequantize take a mask too, their ``scales`` list holding
    the packed tensor in row-major order.  Not here: mask with group_shape (refused)."""
    check_quant_mask_shapes(op, [lt.shape for lt in op.inputs])


def check_quant_mask_shapes(op, in_shapes):
    """:func:`check_quant_mask` on given input shapes (at compile: the concrete ones)."""
    mask = op.attrs.get("mask")
    if mask is None:
        return
    if mask < 0:
        raise _fail(op, f"mask={mask} must be non-negative")
    if op.attrs["qtype"] != "per_tensor":
        raise _fail(op, f"mask={mask} needs qtype per_tensor (the default), given qtype={op.attrs['qtype']}; "
                        f"the mask alone says where the scales vary")
    if op.attrs.get("group_shape") or op.attrs.get("groups"):
        raise _fail(op, f"mask={mask} with group_shape/groups is not supported by this runtime; "
                        f"use qtype=per_group with group_shape")
    src = in_shapes[0]
    if src is None:
        return
    if mask >> len(src):
        raise _fail(op, f"mask={mask} selects dims outside the rank-{len(src)} src "
                        f"(bits 0..{len(src) - 1} only)")
    want = [src[d] for d in mask_dims(mask, len(src))]
    if op.kind in (OpKind.Quantize, OpKind.Dequantize):
        count = len(op.attrs["scales"])
        if shapes.is_known(want) and count != math.prod(want):
            raise _fail(op, f"mask={mask} selects src dims {mask_dims(mask, len(src))} of {list(src)}: "
                            f"scales must hold {math.prod(want)} values, given {count}")
        zps = op.attrs.get("zps")
        if zps and len(zps) != count:
            raise _fail(op, f"zps has {len(zps)} entries, expected {count} (one per scale)")
        return
    for name, shape in (("scales", in_shapes[1]), ("zps", in_shapes[2] if len(in_shapes) > 2 else None)):
        if shape is None:
            continue
        if len(shape) != len(want) or any(_dims_clash(a, b) for a, b in zip(shape, want)):
            raise _fail(op, f"mask={mask} selects src dims {mask_dims(mask, len(src))} of {list(src)}: "
                            f"{name} must be {want}, given {list(shape)}")


def check_f8_zps(op):
    """f8 quantization takes no zero points (oneDNN's rule, on either side)."""
    f8_side = [lt for lt in (op.inputs[0], op.outputs[0]) if lt.dtype in F8]
    if f8_side and len(op.inputs) > 2:
        raise _fail(op, f"zps are not supported for f8 quantization "
                        f"(tensor {f8_side[0].id} is {f8_side[0].dtype.name}); drop input 2 (zps)")


# ----------------------------------------- dynamic quantization constraints
def _quant_int_lt(op):
    """The integer side: src of DynamicDequantize, dst of DynamicQuantize."""
    return op.inputs[0] if op.kind == OpKind.DynamicDequantize else op.outputs[0]


def _rfc_group_shape(op, axes, groups):
    """group_shape equivalent to the int4 RFC's ``axis`` list + ``groups``.

    ``groups[i]`` is the number of groups along dim ``axes[i]``, so the group
    size there is ``src[axes[i]] // groups[i]``.  Dims not listed are not
    quantized along (one group spans the whole dim), as the dims other than
    ``axis`` in per_channel quantization.
    """
    src = op.inputs[0].shape
    if not shapes.is_known(src):
        raise _fail(op, f"axis={axes} with groups={groups} needs the src shape at add_op to derive "
                        f"group_shape, given {list(src) if src is not None else '?'}; "
                        f"give group_shape instead")
    if len(groups) != len(axes):
        raise _fail(op, f"groups={groups} has {len(groups)} entries, expected {len(axes)} "
                        f"(one per axis entry {axes})")
    rank = len(src)
    dims = []
    for a in axes:
        if not -rank <= a < rank:
            raise _fail(op, f"axis entry {a} is out of range for rank-{rank} src; "
                            f"expected [{-rank}, {rank - 1}]")
        dims.append(a % rank)
    if len(set(dims)) != len(dims):
        raise _fail(op, f"axis={axes} names a dim twice")
    group_shape = list(src)
    for d, g in zip(dims, groups):
        if g < 1 or src[d] % g:
            raise _fail(op, f"groups entry {g} for dim {d} does not divide src dim {src[d]}")
        group_shape[d] = src[d] // g
    return group_shape


def normalize_quant_groups(op):
    """Accept the int4 RFC's attribute form and rewrite it into oneDNN's.

    The RFC gives ``axis`` as a list and ``groups`` (s64[]) as the number of
    groups along each listed dim.  oneDNN has an s64 ``axis`` and a
    ``group_shape`` (group size per dim).  After this runs the op carries only
    the oneDNN form: ``group_shape`` is derived for per_group (see
    :func:`_rfc_group_shape`), ``axis`` becomes its first entry (oneDNN keeps
    axis but ignores it for per_group) and ``groups`` is dropped (the RFC
    ignores it unless per_group).  Later code only ever sees ``group_shape``,
    and only with per_group: oneDNN reads ``group_shape`` only for per_group
    (its ``check_dyn_quant_dequant_scales_zps``) and benchdnn's
    ``harness_mha_all`` turns a per_group op per_tensor or per_channel with
    ``--op-attrs`` and keeps the group_shape, so with another qtype it is dropped.
    """
    if op.attrs["qtype"] != "per_group":
        op.attrs.pop("group_shape", None)
    axis, groups = op.attrs["axis"], op.attrs.get("groups")
    if groups is None and not isinstance(axis, list):
        return
    axes = axis if isinstance(axis, list) else [axis]
    if not axes:
        raise _fail(op, "axis=[] is empty; expected at least one dim")
    per_group = op.attrs["qtype"] == "per_group"
    if per_group and groups is not None:
        if "group_shape" in op.attrs:
            raise _fail(op, f"give either group_shape={op.attrs['group_shape']} or "
                            f"groups={groups}, not both")
        op.attrs["group_shape"] = _rfc_group_shape(op, axes, groups)
    elif len(axes) != 1 and not (per_group and "group_shape" in op.attrs):
        raise _fail(op, f"axis={axes} lists {len(axes)} dims but qtype={op.attrs['qtype']} "
                        f"quantizes along one; several dims need qtype=per_group with groups")
    op.attrs["axis"] = axes[0]
    op.attrs.pop("groups", None)


def _check_quant_mode(op, rank):
    """qtype vs group_shape vs the integer type (int4 needs groups, per the RFC)."""
    qtype, group_shape = op.attrs["qtype"], op.attrs.get("group_shape") or []
    int_lt = _quant_int_lt(op)
    if int_lt.dtype in INT4 and qtype != "per_group":
        raise _fail(op, f"{int_lt.dtype.name} tensor {int_lt.id} needs qtype=per_group with "
                        f"group_shape (int4 without groups), given qtype={qtype}")
    if qtype == "per_group" and not group_shape:
        raise _fail(op, "qtype=per_group needs a non-empty group_shape (or axis list + groups)")
    if group_shape and qtype != "per_group":
        raise _fail(op, f"group_shape={group_shape} needs qtype=per_group, given qtype={qtype}")
    if rank is None:
        return
    if qtype == "per_channel":
        _check_axis(op, rank)
    if qtype == "per_group":
        if rank < 2:
            raise _fail(op, f"per_group quantization needs src rank >= 2, given {rank}")
        if len(group_shape) != rank or any(g < 1 for g in group_shape):
            raise _fail(op, f"group_shape={group_shape} must hold {rank} positive entries "
                            f"(one per src dim)")


def _dims_clash(a, b) -> bool:
    return shapes.UNKNOWN not in (a, b) and a != b


def _check_per_channel_sizes(op, src, scales, zps):
    axis = op.attrs["axis"] % len(src)
    channels = src[axis]
    full = tuple(channels if d == axis else 1 for d in range(len(src)))
    if scales is not None:
        if len(scales) == 1:
            if _dims_clash(scales[0], channels):
                raise _fail(op, f"per_channel scales {list(scales)} must hold src dim {axis} "
                                f"= {channels} values")
        elif len(scales) != len(src) or any(_dims_clash(s, f) for s, f in zip(scales, full)):
            raise _fail(op, f"per_channel scales {list(scales)} must be [{channels}] "
                            f"(or {list(full)})")
    if zps is not None and scales is not None and any(d not in (1, shapes.UNKNOWN) for d in zps):
        if len(zps) != len(scales) or any(_dims_clash(z, s) for z, s in zip(zps, scales)):
            raise _fail(op, f"zps {list(zps)} must hold 1 value or match scales {list(scales)}")


def _check_per_group_sizes(op, src, scales, zps):
    group_shape = op.attrs["group_shape"]
    for d, (s, g) in enumerate(zip(src, group_shape)):
        if s != shapes.UNKNOWN and s % g:
            raise _fail(op, f"group_shape[{d}]={g} does not divide src dim {d} = {s}")
    if scales is not None:
        expected = [shapes.UNKNOWN if s == shapes.UNKNOWN else s // g
                    for s, g in zip(src, group_shape)]
        if len(scales) != len(src) or any(_dims_clash(a, e) for a, e in zip(scales, expected)):
            raise _fail(op, f"per_group scales {list(scales)} must be {expected} "
                            f"(src {list(src)} / group_shape {group_shape})")
    if zps is not None and scales is not None:
        if len(zps) != len(scales) or any(_dims_clash(z, s) for z, s in zip(zps, scales)):
            raise _fail(op, f"per_group zps {list(zps)} must have the scales shape {list(scales)}")


def _check_per_tensor_sizes(op, scales, zps):
    for name, shape in (("scales", scales), ("zps", zps)):
        if shape is not None and any(d not in (1, shapes.UNKNOWN) for d in shape):
            raise _fail(op, f"per_tensor {name} {list(shape)} must hold exactly 1 value")


def check_dynamic_quant(op):
    """DynamicQuantize/DynamicDequantize: qtype, group_shape and scale/zp shapes.

    per_tensor: 1 scale (and 1 zp).  per_channel: ``src.shape[axis]`` scales;
    zps 1 or as many.  per_group: scales and zps shaped ``src / group_shape``
    dim by dim (same rank as src, rank >= 2).  Size checks are skipped where
    dims are unknown.
    """
    check_dynamic_quant_shapes(op, [lt.shape for lt in op.inputs])


def check_dynamic_quant_shapes(op, in_shapes):
    """:func:`check_dynamic_quant` on given input shapes (at compile: the concrete ones)."""
    src = in_shapes[0]
    _check_quant_mode(op, None if src is None else len(src))
    if src is None:
        return
    if op.attrs.get("mask") is not None:
        return check_quant_mask_shapes(op, in_shapes)
    scales = in_shapes[1]
    zps = in_shapes[2] if len(in_shapes) > 2 else None
    qtype = op.attrs["qtype"]
    if qtype == "per_tensor":
        _check_per_tensor_sizes(op, scales, zps)
    elif qtype == "per_channel":
        _check_per_channel_sizes(op, src, scales, zps)
    else:
        _check_per_group_sizes(op, src, scales, zps)


# ------------------------------------------------------------ row builders
def _ports(*specs) -> tuple[Port, ...]:
    """``"src:T"``, ``"gamma:T2?"`` (optional), ``"src_i:T*"`` (variadic)."""
    ports = []
    for spec in specs:
        name, type_var = spec.split(":")
        optional, variadic = "?" in type_var, "*" in type_var
        ports.append(Port(name, type_var.rstrip("?*"), optional=optional, variadic=variadic))
    return tuple(ports)


def row(kind: OpKind, inputs, outputs, type_vars, infer, attrs=(), constraints=(), doc="",
        **extra) -> OpSchema:
    """One OpSchema; ``inputs``/``outputs`` are ``_ports`` spec strings."""
    return OpSchema(kind=kind, inputs=_ports(*inputs), outputs=_ports(*outputs),
                    type_vars=dict(type_vars), infer_shapes=infer, attrs=tuple(attrs),
                    constraints=tuple(constraints), doc=doc, **extra)


def unary(kind: OpKind, *attrs: Attr, constraints=(), doc: str = "") -> OpSchema:
    """1 input, 1 output, same T in {f32, bf16, f16}, same shape."""
    return row(kind, ["src:T"], ["dst:T"], {"T": FLOATS}, shapes.identity, attrs, constraints, doc=doc)


def binary(kind: OpKind, types=FLOATS, same_type: bool = True, doc: str = "") -> OpSchema:
    """Element-wise binary op with ``auto_broadcast``.

    ``same_type=False`` gives each port its own type variable (Add, Subtract,
    Multiply, Divide accept mixed f32/xf16 per port, as oneDNN's T1/T2/T3).
    """
    t0, t1, t2 = ("T", "T", "T") if same_type else ("T1", "T2", "T3")
    return row(kind, [f"src_0:{t0}", f"src_1:{t1}"], [f"dst:{t2}"],
               {t0: types, t1: types, t2: types}, shapes.elementwise, [AUTO_BROADCAST], doc=doc)


def reduce(kind: OpKind, doc: str) -> OpSchema:
    """Reduce*: src T1 (+ optional s32 axes tensor) -> dst T1; ``axes=[]``, ``keep_dims=false``."""
    return row(kind, ["src:T1", "axes:T2?"], ["dst:T1"], {"T1": FLOATS, "T2": frozenset({DT.s32})},
               shapes.reduce, [Attr("axes", "s64[]", ()), Attr("keep_dims", "bool", False)],
               [check_reduce_axes], doc=doc)


def static_quant(kind: OpKind, src_types, dst_types, doc: str) -> OpSchema:
    """Quantize/Dequantize with scales/zps given as attributes."""
    # Deviation: oneDNN does not restrict the qtype string; only these two are meaningful.
    attrs = [Attr("qtype", "string", "per_tensor", ("per_tensor", "per_channel")),
             Attr("axis", "s64", 1), _required("scales", "f32[]"), Attr("zps", "s64[]"), Attr("mask", "s64")]
    return row(kind, ["src:T1"], ["dst:T2"], {"T1": src_types, "T2": dst_types}, shapes.identity,
               attrs, [check_static_quant], doc=doc,
               compile_checks=(check_static_quant_shapes, check_quant_mask_shapes))


# axis is s64 in oneDNN; the int4 RFC form passes a list (plus ``groups``), see
# normalize_quant_groups.
DYNAMIC_QUANT_ATTRS = (
    Attr("qtype", "string", "per_tensor", ("per_tensor", "per_channel", "per_group")),
    Attr("axis", "s64|s64[]", 1), Attr("group_shape", "s64[]"), Attr("groups", "s64[]"),
    Attr("mask", "s64"))


def dynamic_quant(kind: OpKind, inputs, outputs, type_vars, doc: str) -> OpSchema:
    """DynamicQuantize/DynamicDequantize: scales (and zps) are input tensors."""
    return row(kind, inputs, outputs, type_vars, shapes.identity, DYNAMIC_QUANT_ATTRS,
               [check_f8_zps, check_quant_mask, normalize_quant_groups, check_dynamic_quant], doc=doc,
               compile_checks=(check_dynamic_quant_shapes,))


def norm(kind: OpKind, inputs, outputs, aux_types, attrs, infer, counts=None, doc="") -> OpSchema:
    """LayerNorm/GroupNorm/RMSNorm: src/dst T1 in {f32, bf16, f16}, aux T2."""
    constraints = [check_norm_data_type]
    if counts:
        constraints[:0] = [port_count_sets(inputs=counts, outputs=counts)]
    if any(a.name == "keep_stats" for a in attrs):
        constraints.append(check_keep_stats_outputs)
    return row(kind, inputs, outputs, {"T1": FLOATS, "T2": aux_types}, infer, attrs, constraints,
               doc=doc)


# -------------------------------------------------------------- the table
K = OpKind

_ELEMENTWISE = [
    unary(K.Abs, doc="|x|"),
    unary(K.Clamp, _bound("min"), _bound("max"), constraints=[check_clamp_bounds],
          doc="min(max(x, min), max)"),
    unary(K.Elu, _required("alpha", "f32"), doc="x > 0 ? x : alpha * (exp(x) - 1)"),
    unary(K.Exp, doc="exp(x)"),
    unary(K.GELU, Attr("mode", "string", "gelu_erf", ("gelu_erf", "gelu_tanh")),
          doc="0.5 x (1 + erf(x / sqrt 2)), or the tanh approximation"),
    unary(K.HardSigmoid, _required("alpha", "f32"), _required("beta", "f32"),
          doc="max(0, min(1, alpha x + beta))"),
    unary(K.HardSwish, doc="x * min(max(x + 3, 0), 6) / 6"),
    unary(K.LeakyReLU, _required("alpha", "f32"), doc="x >= 0 ? x : alpha x"),
    unary(K.Log, doc="ln x"),
    unary(K.Mish, doc="x tanh(softplus(x))"),
    unary(K.Pow, _required("beta", "f32"), doc="x ^ beta"),
    unary(K.Reciprocal, doc="1 / x"),
    unary(K.ReLU, doc="max(x, 0)"),
    unary(K.Round, doc="round half away from zero"),
    unary(K.Sigmoid, doc="1 / (1 + exp(-x))"),
    unary(K.SoftPlus, Attr("beta", "f32", 1.0), doc="ln(1 + exp(beta x)) / beta"),
    unary(K.Sqrt, doc="sqrt x"),
    unary(K.Square, doc="x * x"),
    unary(K.Tanh, doc="tanh x"),
    unary(K.Reorder, doc="same values, another layout (no dtype change)"),
    binary(K.Add, FLOATS_S32, same_type=False, doc="a + b"),
    binary(K.Subtract, FLOATS_S32, same_type=False, doc="a - b"),
    binary(K.Multiply, FLOATS, same_type=False, doc="a * b"),
    binary(K.Divide, FLOATS, same_type=False, doc="a / b"),
    binary(K.Maximum, doc="max(a, b)"),
    binary(K.Minimum, doc="min(a, b)"),
    binary(K.SquaredDifference, doc="(a - b)^2"),
    row(K.GreaterEqual, ["src_0:T1", "src_1:T1"], ["dst:T2"],
        {"T1": FLOATS_S32, "T2": frozenset({DT.boolean})}, shapes.elementwise, [AUTO_BROADCAST],
        doc="a >= b -> boolean"),
    row(K.Select, ["cond:T1", "src_0:T2", "src_1:T2"], ["dst:T2"],
        {"T1": frozenset({DT.boolean}), "T2": FLOATS}, shapes.select, [AUTO_BROADCAST],
        doc="cond ? src_0 : src_1; src_0/src_1 broadcast, then cond one-way"),
    row(K.BiasAdd, ["src:T", "bias:T"], ["dst:T"], {"T": FLOATS}, shapes.bias_add, [DATA_FORMAT],
        doc="src + bias along the channel dim of data_format"),
    row(K.PReLU, ["src:T", "slope:T"], ["dst:T"], {"T": FLOATS}, shapes.prelu,
        [DATA_FORMAT, Attr("per_channel_broadcast", "bool", True)],
        doc="x >= 0 ? x : slope x"),
    row(K.TypeCast, ["src:T1"], ["dst:T2"], {"T1": FLOATS, "T2": FLOATS}, shapes.identity,
        constraints=[check_typecast_data_type], doc="round to nearest even"),
    row(K.GenIndex, ["src:T1"], ["dst:T2"], {"T1": FLOATS, "T2": frozenset({DT.s32})},
        shapes.gen_index, [_required("axis", "s64")], doc="dst[idx] = idx[axis]"),
    row(K.Dropout, ["src:T", "seed:T_seed", "offset:T_offset", "probability:T_p"],
        ["dst:T", "mask:T_mask?"],
        {"T": FLOATS, "T_seed": frozenset({DT.s64}), "T_offset": frozenset({DT.s64}),
         "T_p": F32, "T_mask": frozenset({DT.u8})}, shapes.identity,
        doc="mask = philox(seed, offset) > p; dst = mask * src / (1 - p)"),
]

_LAYOUT = [
    row(K.StaticReshape, ["src:T"], ["dst:T"], {"T": FLOATS}, shapes.static_reshape,
        [_required("shape", "s64[]"), _required("special_zero", "bool")],
        doc="one -1 inferred; special_zero: 0 copies the src dim"),
    row(K.StaticTranspose, ["src:T"], ["dst:T"], {"T": FLOATS}, shapes.static_transpose,
        [_required("order", "s64[]")], doc="dst.shape[i] = src.shape[order[i]]"),
    row(K.Concat, ["src_i:T*"], ["dst:T"], {"T": FLOATS}, shapes.concat,
        [_required("axis", "s64")], max_inputs=64, doc="1..64 inputs joined along axis"),
    reduce(K.ReduceL1, "sum |x|"),
    reduce(K.ReduceL2, "sqrt(sum x^2)"),
    reduce(K.ReduceMax, "max"),
    reduce(K.ReduceMean, "mean"),
    reduce(K.ReduceMin, "min"),
    reduce(K.ReduceProd, "product"),
    reduce(K.ReduceSum, "sum"),
]

_MATMUL_SOFTMAX_NORMS = [
    row(K.MatMul, ["src:T", "weights:T", "bias:T?"], ["dst:T1"], {"T": FLOATS, "T1": FLOATS},
        shapes.matmul,
        [Attr("transpose_a", "bool", False), Attr("transpose_b", "bool", False),
         Attr("accumulation_mode", "string", "strict",
              ("strict", "relaxed", "any", "f32", "s32", "f16"))] + DOT_ATTRS,
        [check_matmul_dtype, check_dot_attrs],
        doc="[..., M, K] x [..., K, N] (+ bias) -> [..., M, N]; extensions: algorithm, "
            "indexing_maps"),
    # Extension (linalg batch_reduce_matmul, seed 001): the batch is summed into one tile.
    row(K.BatchReduceMatMul, ["src:T", "weights:T", "bias:T?"], ["dst:T1"],
        {"T": FLOATS, "T1": FLOATS}, shapes.batch_reduce_matmul,
        [Attr("accumulation_mode", "string", "strict", ("strict", "relaxed", "any", "f32"))]
        + DOT_ATTRS, [check_matmul_dtype, check_dot_attrs],
        doc="sum_b [B, M, K] x [B, K, N] (+ bias) -> [M, N]; algorithm, indexing_maps"),
    row(K.SoftMax, ["src:T1"], ["dst:T2", "stats:T3?"], {"T1": FLOATS, "T2": FLOATS, "T3": F32},
        shapes.softmax,
        [Attr("axis", "s64", 1), Attr("mode", "string", "none", ("none", "inf_as_zero"))],
        [check_softmax_dtype],
        doc="exp(x - max) / sum exp(x - max) along axis (default 1!); stats = max + log(sum)"),
    row(K.LogSoftmax, ["src:T"], ["dst:T"], {"T": FLOATS}, shapes.softmax,
        [Attr("axis", "s64", -1)], doc="x - max - log(sum exp(x - max)) along axis"),
    norm(K.LayerNorm, ["src:T1", "gamma:T2?", "beta:T2?"], ["dst:T1", "mean:T2?", "variance:T2?"],
         NORM_AUX, [KEEP_STATS, BEGIN_NORM_AXIS, USE_AFFINE, EPSILON], shapes.layer_norm,
         counts={1, 3}, doc="normalize over dims begin_norm_axis.. (keep_stats: 3 outputs)"),
    norm(K.GroupNorm, ["src:T1", "gamma:T2?", "beta:T2?"], ["dst:T1", "mean:T2?", "variance:T2?"],
         NORM_AUX, [KEEP_STATS, _required("groups", "s64"), USE_AFFINE, EPSILON, DATA_FORMAT],
         shapes.group_norm, counts={1, 3}, doc="normalize over each group of channels"),
    norm(K.RMSNorm, ["src:T1", "gamma:T2?"], ["dst:T1"], FLOATS, [BEGIN_NORM_AXIS, EPSILON],
         shapes.rms_norm, doc="gamma * x / sqrt(mean(x^2) + eps) over dims begin_norm_axis.."),
    row(K.BatchNormInference, ["src:T1", "gamma:T2", "beta:T2", "mean:T2", "variance:T2"],
        ["dst:T1"], {"T1": FLOATS, "T2": NORM_AUX}, shapes.batch_norm,
        [_required("epsilon", "f32"), DATA_FORMAT], [check_bn_data_type],
        doc="gamma (x - mean) / sqrt(variance + eps) + beta, per channel"),
    row(K.BatchNormForwardTraining, ["src:T1", "mean:T2", "variance:T2", "gamma:T2?", "beta:T2?"],
        ["dst:T1", "running_mean:T2", "running_variance:T2", "batch_mean:T2", "batch_variance:T2"],
        {"T1": FLOATS, "T2": NORM_AUX}, shapes.batch_norm,
        [_required("epsilon", "f32"), Attr("momentum", "f32"), DATA_FORMAT], [check_bn_data_type],
        doc="batch statistics; running stats updated with momentum"),
]

_CNN = [
    row(K.Convolution, ["src:T", "weights:T", "bias:T?"], ["dst:T"], {"T": FLOATS},
        shapes.convolution, _conv_attrs(("XIO", "OIX")), [check_pads],
        doc="out = (x + pb + pe - ((k-1) d + 1)) // s + 1"),
    row(K.ConvTranspose, ["src:T", "weights:T", "bias:T?"], ["dst:T"], {"T": FLOATS},
        shapes.conv_transpose,
        _conv_attrs(("XOI", "IOX")) + (Attr("output_padding", "s64[]", TWELVE_ZEROS),),
        [check_pads], doc="out = s (x - 1) + (k-1) d + 1 + output_padding - pb - pe"),
    row(K.AvgPool, ["src:T"], ["dst:T"], {"T": FLOATS}, shapes.pooling,
        _pool_attrs() + (_required("exclude_pad", "bool"),), [check_pool_pads],
        doc="window mean; exclude_pad leaves padding out of the count"),
    row(K.MaxPool, ["src:T"], ["dst:T"], {"T": FLOATS}, shapes.pooling,
        _pool_attrs() + (Attr("dilations", "s64[]", TWELVE_ONES),),
        [check_pool_pads, check_maxpool_dilations], doc="window max"),
    row(K.Interpolate, ["src:T1", "sizes:T2?"], ["dst:T1"],
        {"T1": FLOATS, "T2": frozenset({DT.s32})}, shapes.interpolate,
        [_required("mode", "string", ("nearest", "linear", "bilinear", "trilinear")),
         Attr("sizes", "s64[]"), Attr("scales", "f32[]"),
         Attr("coordinate_transformation_mode", "string", "half_pixel",
              ("half_pixel", "align_corners")), DATA_FORMAT],
        [check_interpolate_sizes_scales], doc="resize the spatial dims (sizes or scales)"),
]

_QUANT = [
    static_quant(K.Quantize, F32, INT8 | F8, "dst = round(src / scale + zp), saturated"),
    static_quant(K.Dequantize, INT8 | F8, F32, "dst = (src - zp) * scale"),
    # dst has the scales' dtype: one type variable T2 for both.
    dynamic_quant(K.DynamicDequantize, ["src:T1", "scales:T2", "zps:T3?"], ["dst:T2"],
                  {"T1": INT8 | INT4 | F8, "T2": FLOATS, "T3": QUANT_ZPS},
                  "dst = (src - zp) * scale"),
    # Extension (int4 RFC): oneDNN takes f32 src/scales, zps {u8, s8, s32}, dst {u8, s8} and
    # no group_shape; here src/scales may also be bf16/f16, dst/zps s4/u4, and per_group works.
    # Extension (issue 34): f8_e4m3/f8_e5m2 on the quantized side of both dynamic ops
    # (oneDNN's static Quantize/Dequantize take them; its dynamic ones do not yet), no zps.
    # src and scales share T1, as in oneDNN.
    dynamic_quant(K.DynamicQuantize, ["src:T1", "scales:T1", "zps:T2?"], ["dst:T3"],
                  {"T1": FLOATS, "T2": QUANT_ZPS, "T3": INT8 | INT4 | F8},
                  "dst = round(src / scale + zp), saturated"),
]

_GRAPH = [
    row(K.End, ["src:T"], [], {"T": END_TYPES}, shapes.end,
        doc="marks a tensor as a graph output; no outputs"),
    row(K.Wildcard, ["src:any*?"], ["dst:any*?"], {"any": ANY_TYPE}, shapes.wildcard,
        max_inputs=64, max_outputs=64,
        doc="a framework op oneDNN does not know; never supported, no shape inference"),
]

# Extension: Composite is not a oneDNN op (StableHLO's composite, seed 002).  Its own
# attributes are open (checked against its decomposition), its ports typed by it.
_COMPOSITE = [
    composite.CompositeSchema(
        kind=K.Composite, inputs=_ports("src_i:any*?"), outputs=_ports("dst_i:any*"),
        type_vars={"any": ANY_TYPE}, infer_shapes=composite.infer_shapes,
        attrs=(_required("name", "string"), Attr("version", "s64", composite.DEFAULT_VERSION)),
        constraints=(composite.check_composite,), max_inputs=64, max_outputs=64,
        doc="a named op with a reference decomposition (extension; docs/composite.md)"),
]

# ------------------------------------------------- backward (training) ops
# Rows follow oneDNN's op_def.hpp: "src/dst" ports read the forward dst when
# ``use_dst`` is true (the default), else the forward src.
USE_DST = Attr("use_dst", "bool", True)
S32 = frozenset({DT.s32})


def check_softmax_bwd_dtype(op):
    """SoftMaxBackward: diff_src is f32 or the data type of diff_dst."""
    diff_dst, diff_src = op.inputs[0].dtype, op.outputs[0].dtype
    if diff_src not in (diff_dst, DT.f32):
        raise _fail(op, f"diff_dst {diff_dst.name} with diff_src {diff_src.name} is not "
                        f"supported; diff_src must be {diff_dst.name} or f32")


def check_ln_bwd_use_affine(op):
    """LayerNormBackward with ``use_affine=true`` declares diff_src, diff_gamma, diff_beta."""
    if op.attrs["use_affine"] and len(op.outputs) != 3:
        raise _fail(op, f"use_affine=true needs 3 outputs (diff_src, diff_gamma, diff_beta), "
                        f"given {len(op.outputs)}; set use_affine=false for diff_src only")


def shape_given(attr: str, port: int):
    """oneDNN's check_avgpool_bwd_input_shape / check_conv_bwd_*_shape: a shape
    comes from input ``port`` or from attribute ``attr``.

    Deviation: oneDNN counts its 12-zero default as "given"; a shape of zeros
    cannot be computed with, so here it must be set.
    """

    def check(op):
        if len(op.inputs) <= port and not any(op.attrs.get(attr) or []):
            raise _fail(op, f"{attr} must be given as an attribute when input {port} is absent")

    check.__doc__ = f"{attr} as attribute or input {port}"
    return check


def eltwise_bwd(kind: OpKind, *attrs: Attr, first: str = "src", constraints=(),
                doc: str = "") -> OpSchema:
    """(src or src/dst, diff_dst) -> diff_src, one T in {f32, bf16, f16}."""
    return row(kind, [f"{first}:T", "diff_dst:T"], ["diff_src:T"], {"T": FLOATS},
               shapes.eltwise_backward, attrs, constraints, doc=doc)


def pool_bwd_attrs(*extra: Attr) -> tuple[Attr, ...]:
    return (_required("strides", "s64[]"), _required("pads_begin", "s64[]"),
            _required("pads_end", "s64[]"), _required("kernel", "s64[]"), AUTO_PAD,
            DATA_FORMAT) + extra


_BACKWARD = [
    eltwise_bwd(K.AbsBackward, doc="dy * sign(x)"),
    eltwise_bwd(K.ClampBackward, _bound("min"), _bound("max"), USE_DST, first="src/dst",
                constraints=[check_clamp_bounds], doc="dy where min < v < max, else 0"),
    eltwise_bwd(K.EluBackward, _required("alpha", "f32"), USE_DST, first="src/dst",
                doc="dy * (x > 0 ? 1 : alpha e^x)  (use_dst: d > 0 ? 1 : d + alpha)"),
    eltwise_bwd(K.GELUBackward, Attr("mode", "string", "gelu_erf", ("gelu_erf", "gelu_tanh")),
                doc="dy * d/dx gelu(x)"),
    eltwise_bwd(K.HardSigmoidBackward, _required("alpha", "f32"), _required("beta", "f32"),
                doc="dy * alpha where 0 < alpha x + beta < 1, else 0"),
    eltwise_bwd(K.HardSwishBackward, doc="dy * (x/3 + 1/2) inside (-3, 3); dy above, 0 below"),
    eltwise_bwd(K.MishBackward, doc="dy * (tanh sp + x sigmoid(x) (1 - tanh^2 sp)), sp = softplus"),
    eltwise_bwd(K.ReLUBackward, USE_DST, first="src/dst", doc="dy where v > 0, else 0"),
    eltwise_bwd(K.SigmoidBackward, USE_DST, first="src/dst", doc="dy * s (1 - s)"),
    eltwise_bwd(K.SoftPlusBackward, Attr("beta", "f32", 1.0), doc="dy * sigmoid(beta x)"),
    eltwise_bwd(K.SqrtBackward, USE_DST, first="src/dst", doc="dy / (2 sqrt x)"),
    eltwise_bwd(K.TanhBackward, USE_DST, first="src/dst", doc="dy * (1 - t^2)"),
    row(K.SoftMaxBackward, ["diff_dst:T1", "dst:T1"], ["diff_src:T2"], {"T1": FLOATS, "T2": FLOATS},
        shapes.softmax_backward, [Attr("axis", "s64", 1)], [check_softmax_bwd_dtype],
        doc="dst * (dy - sum(dy * dst)) along axis"),
    row(K.LogSoftmaxBackward, ["diff_dst:T", "dst:T"], ["diff_src:T"], {"T": FLOATS},
        shapes.softmax_backward, [Attr("axis", "s64", -1)],
        doc="dy - exp(dst) * sum(dy) along axis"),
    row(K.BiasAddBackward, ["diff_dst:T"], ["diff_bias:T"], {"T": FLOATS},
        shapes.bias_add_backward, [DATA_FORMAT], doc="sum of dy over all but the channel dim"),
    row(K.PReLUBackward, ["src:T", "slope:T", "diff_dst:T"], ["diff_src:T", "diff_slope:T"],
        {"T": FLOATS}, shapes.prelu_backward, [DATA_FORMAT],
        doc="dx = dy * (x > 0 ? 1 : slope); dslope = sum of dy * (x > 0 ? 0 : x) to slope's shape"),
    row(K.BatchNormTrainingBackward, ["src:T1", "diff_dst:T1", "mean:T2", "variance:T2", "gamma:T2?"],
        ["diff_src:T1", "diff_gamma:T2?", "diff_beta:T2?"], {"T1": FLOATS, "T2": NORM_AUX},
        shapes.batch_norm_backward, [_required("epsilon", "f32"), DATA_FORMAT],
        [port_count_sets(inputs={4, 5}, outputs={1, 2, 3}), check_bn_data_type],
        doc="per channel, with the given mean/variance"),
    row(K.LayerNormBackward,
        ["src:T1", "diff_dst:T1", "mean:T2", "variance:T2", "gamma:T2?", "beta:T2?"],
        ["diff_src:T1", "diff_gamma:T2?", "diff_beta:T2?"], {"T1": FLOATS, "T2": NORM_AUX},
        shapes.norm_backward, [BEGIN_NORM_AXIS, USE_AFFINE, EPSILON],
        [port_count_sets(inputs={4, 5, 6}, outputs={1, 3}), check_ln_bwd_use_affine],
        doc="over dims begin_norm_axis.., with the given mean/variance"),
    row(K.ConvolutionBackwardData, ["diff_dst:T1", "weights:T1", "dst_shape:T2?"], ["diff_src:T1"],
        {"T1": FLOATS, "T2": S32}, shapes.conv_backward_data,
        _conv_attrs(("XIO", "OIX")) + (Attr("output_padding", "s64[]", TWELVE_ZEROS),
                                       Attr("dst_shape", "s64[]", TWELVE_ZEROS)),
        [shape_given("dst_shape", 2), check_pads],
        doc="gradient of Convolution w.r.t. src; dst_shape is the forward src shape"),
    row(K.ConvolutionBackwardWeights, ["src:T1", "diff_dst:T1", "weights_shape:T2?"],
        ["diff_weights:T1"], {"T1": FLOATS, "T2": S32}, shapes.conv_backward_weights,
        _conv_attrs(("XIO", "OIX")) + (Attr("weights_shape", "s64[]", TWELVE_ZEROS),),
        [shape_given("weights_shape", 2), check_pads],
        doc="gradient of Convolution w.r.t. weights"),
    row(K.ConvTransposeBackwardData, ["diff_dst:T", "weights:T"], ["diff_src:T"], {"T": FLOATS},
        shapes.conv_transpose_backward_data, _conv_attrs(("XOI", "IOX")), [check_pads],
        doc="gradient of ConvTranspose w.r.t. src: a Convolution of diff_dst"),
    row(K.ConvTransposeBackwardWeights, ["src:T1", "diff_dst:T1", "weights_shape:T2?"],
        ["diff_weights:T1"], {"T1": FLOATS, "T2": S32}, shapes.conv_backward_weights,
        _conv_attrs(("XOI", "IOX")) + (Attr("weights_shape", "s64[]", TWELVE_ZEROS),),
        [shape_given("weights_shape", 2), check_pads],
        doc="gradient of ConvTranspose w.r.t. weights"),
    row(K.AvgPoolBackward, ["diff_dst:T", "src_shape:T1?"], ["diff_src:T"], {"T": FLOATS, "T1": S32},
        shapes.pool_backward,
        pool_bwd_attrs(_required("exclude_pad", "bool"), Attr("src_shape", "s64[]", TWELVE_ZEROS)),
        [shape_given("src_shape", 1), check_pads],
        doc="each dy spread evenly over its window (divisor as AvgPool)"),
    row(K.MaxPoolBackward, ["src:T", "diff_dst:T"], ["diff_src:T"], {"T": FLOATS},
        shapes.pool_backward, pool_bwd_attrs(Attr("dilations", "s64[]", TWELVE_ONES)),
        [check_pads, check_maxpool_dilations], doc="each dy to the first max of its window"),
    row(K.InterpolateBackward, ["src:T1", "diff_dst:T1", "sizes:T2?"], ["diff_src:T1"],
        {"T1": FLOATS, "T2": S32}, shapes.interpolate_backward,
        [_required("mode", "string", ("nearest", "linear", "bilinear", "trilinear")),
         Attr("coordinate_transformation_mode", "string", "half_pixel",
              ("half_pixel", "align_corners")),
         Attr("sizes", "s64[]"), Attr("scales", "f32[]"), DATA_FORMAT],
        [check_interpolate_sizes_scales], doc="transpose of Interpolate's linear map"),
]


ROWS: tuple[OpSchema, ...] = tuple(_ELEMENTWISE + _LAYOUT + _MATMUL_SOFTMAX_NORMS + _CNN
                                   + _QUANT + _GRAPH + _BACKWARD + _COMPOSITE)

#: The op table ``Graph.add_op`` verifies against.
OP_SCHEMAS: dict[OpKind, OpSchema] = {schema.kind: schema for schema in ROWS}
assert len(OP_SCHEMAS) == len(ROWS), "an op kind has two rows"

#: Forward op kinds (every kind but the ...Backward... ones): all have a row.
FORWARD_KINDS = frozenset(k for k in OpKind if "Backward" not in k.name)

"""Shape inference for every forward op: ``fn(op, in_shapes) -> list[out_shape]``.

``in_shapes`` holds one entry per op input: a tuple of ints, ``None`` when the
rank is unknown, ``-1`` for an unknown dim.  Each function returns one shape
per *declared* output (``len(op.outputs)``), using ``None``/-1 for what cannot
be inferred, and raises :class:`InvalidShape` naming the op when the inputs
disagree.  Attributes are read from ``op.attrs`` (the schema has already
written the defaults).  The functions never modify the op: auto-padding is
computed on the fly (:func:`conv_pads`), not written back as oneDNN does.

Formulas follow oneDNN's ``shape_infer.cpp``:

* numpy broadcast: align right, each dim equal or 1;
* convolution: ``out = (x + pb + pe - ((k - 1) * d + 1)) // s + 1``;
* conv transpose: ``out = s * (x - 1) + (k - 1) * d + 1 + out_pad - pb - pe``;
* pooling: as convolution, with ``ceil`` instead of floor for
  ``rounding_type="ceil"``.
"""
from __future__ import annotations

import math

import numpy as np

from . import indexing_maps
from .errors import InvalidShape, op_label

UNKNOWN = -1
MAX_NDIMS = 12  # oneDNN writes 12-entry defaults for dilations/output_padding


# ------------------------------------------------------------------ helpers
def _fail(op, message: str) -> InvalidShape:
    return InvalidShape(f"{op_label(op)}: {message}")


def _show(shape) -> str:
    return "?" if shape is None else str(list(shape))


def is_known(shape) -> bool:
    """Rank and every dim known."""
    return shape is not None and UNKNOWN not in shape


def normalize_axis(op, axis: int, rank: int, what: str = "axis") -> int:
    """``axis`` in [-rank, rank-1] -> [0, rank-1]; InvalidShape otherwise."""
    if not -rank <= axis < rank:
        raise _fail(op, f"{what}={axis} is out of range for a rank-{rank} input; "
                        f"expected [{-rank}, {rank - 1}]")
    return axis + rank if axis < 0 else axis


def _merge_dim(a: int, b: int):
    """The common value of two dims that must be equal; None if they clash."""
    if a == UNKNOWN:
        return b
    if b == UNKNOWN or a == b:
        return a
    return None


def same_shape(op, shapes, what: str):
    """Shapes that must be identical, merged (unknown dims filled in)."""
    known = [s for s in shapes if s is not None]
    if not known:
        return None
    merged = list(known[0])
    for shape in known[1:]:
        if len(shape) != len(merged):
            raise _fail(op, f"{what} must have identical shapes, given "
                            f"{', '.join(_show(s) for s in shapes)}")
        for i, d in enumerate(shape):
            m = _merge_dim(merged[i], d)
            if m is None:
                raise _fail(op, f"{what} must have identical shapes, given "
                                f"{', '.join(_show(s) for s in shapes)}")
            merged[i] = m
    return tuple(merged)


def _broadcast_dim(a: int, b: int):
    if a == b or b == 1:
        return a
    if a == 1:
        return b
    if a == UNKNOWN:  # b is known and not 1, so a must be b (or 1)
        return b
    if b == UNKNOWN:
        return a
    return None


def broadcast(op, a, b, what: str = "inputs"):
    """numpy broadcast of two shapes (unknown dims allowed)."""
    if a is None or b is None:
        return None
    rank = max(len(a), len(b))
    pa = (1,) * (rank - len(a)) + tuple(a)
    pb = (1,) * (rank - len(b)) + tuple(b)
    out = []
    for x, y in zip(pa, pb):
        d = _broadcast_dim(x, y)
        if d is None:
            raise _fail(op, f"{what} {_show(a)} and {_show(b)} are not numpy-broadcastable "
                            f"(right-aligned dims must be equal or 1)")
        out.append(d)
    return tuple(out)


def check_one_way(op, target, src, what: str) -> None:
    """``src`` must broadcast into ``target`` without changing it (right-aligned)."""
    if target is None or src is None:
        return
    ok = len(src) <= len(target) and all(
        s in (1, UNKNOWN) or t in (UNKNOWN, s) for s, t in zip(reversed(src), reversed(target)))
    if not ok:
        raise _fail(op, f"{what} shape {_show(src)} does not broadcast one-way to {_show(target)} "
                        f"(right-aligned dims must be equal or 1)")


def _product(dims) -> int:
    return math.prod(dims) if dims else 1


# ------------------------------------------------------------ simple ops
def identity(op, in_shapes):
    """Every output has the shape of input 0 (unary ops, casts, quant ops, Dropout)."""
    return [in_shapes[0]] * len(op.outputs)


def end(op, in_shapes):
    """End has no outputs."""
    return []


def wildcard(op, in_shapes):
    """Wildcard cannot infer anything: its outputs keep their declared shapes."""
    return [lt.shape for lt in op.outputs]


def gen_index(op, in_shapes):
    """GenIndex: same shape as src; ``axis`` must be a dim of src."""
    src = in_shapes[0]
    if src is not None:
        normalize_axis(op, op.attrs["axis"], len(src))
    return [src]


def elementwise(op, in_shapes):
    """Binary ops: numpy broadcast, or identical shapes for ``auto_broadcast="none"``."""
    a, b = in_shapes[0], in_shapes[1]
    if op.attrs.get("auto_broadcast", "numpy") == "none":
        return [same_shape(op, [a, b], "inputs (auto_broadcast=none)")]
    return [broadcast(op, a, b)]


def select(op, in_shapes):
    """Select: src_0/src_1 broadcast to the output, then cond broadcasts one-way into it."""
    cond, a, b = in_shapes
    if op.attrs.get("auto_broadcast", "numpy") == "none":
        return [same_shape(op, [cond, a, b], "cond, src_0 and src_1 (auto_broadcast=none)")]
    out = broadcast(op, a, b, "src_0 and src_1")
    check_one_way(op, out, cond, "cond")
    return [out]


# ------------------------------------------------------------------ MatMul
def _swap_last_two(shape, transpose: bool):
    if not transpose or len(shape) < 2:
        return tuple(shape)  # a transpose means nothing for rank-1 operands
    return tuple(shape[:-2]) + (shape[-1], shape[-2])


def matmul(op, in_shapes):
    """MatMul: ``[..., M, K] x [..., K, N] -> broadcast(batch) + [M, N]``.

    Rank-1 src acts as ``[1, K]`` and rank-1 weights as ``[K, 1]``; the added 1
    is removed from the result (1-D x 1-D gives shape ``()``).  The optional
    bias must broadcast one-way into dst.
    """
    if "indexing_maps" in op.attrs:
        return _matmul_with_maps(op, in_shapes)
    src, wei = in_shapes[0], in_shapes[1]
    if src is None or wei is None:
        return [None]
    if not src or not wei:
        raise _fail(op, f"src {_show(src)} and weights {_show(wei)} must have rank >= 1")
    a = _swap_last_two(src, op.attrs.get("transpose_a", False))
    b = _swap_last_two(wei, op.attrs.get("transpose_b", False))
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if _merge_dim(a2[-1], b2[-2]) is None:
        raise _fail(op, f"K mismatch: src {_show(src)} gives K={a2[-1]}, weights {_show(wei)} "
                        f"give K={b2[-2]} (after transpose_a/transpose_b)")
    batch = broadcast(op, a2[:-2], b2[:-2], "batch dims of src and weights")
    out = list(batch) + [a2[-2], b2[-1]]
    if len(b) == 1:
        del out[-1]
    if len(a) == 1:
        del out[-2 if len(b) != 1 else -1]
    out = tuple(out)
    if len(in_shapes) > 2:
        check_one_way(op, out, in_shapes[2], "bias")
    return [out]


def _matmul_with_maps(op, in_shapes):
    """MatMul/BatchReduceMatMul through their indexing maps (graph_api.indexing_maps)."""

    maps = indexing_maps.maps_of(op) or indexing_maps.default(op.kind.name, True)
    declared = op.outputs[0].shape if op.outputs else None
    out = indexing_maps.output_shape(op, maps, in_shapes[0], in_shapes[1], declared)
    if out is not None and len(in_shapes) > 2:
        check_one_way(op, out, in_shapes[2], "bias")
    return [out]


def batch_reduce_matmul(op, in_shapes):
    """BatchReduceMatMul: ``[B, M, K] x [B, K, N] -> [M, N]`` (or through its maps)."""
    return _matmul_with_maps(op, in_shapes)


# ------------------------------------------------------------ layout ops
def reduce(op, in_shapes):
    """Reduce*: reduced dims become 1 (``keep_dims``) or are removed.

    With axes given as a 2nd input tensor (empty ``axes`` attr) only the rank
    can be known, from the length of that 1-D tensor.
    """
    src = in_shapes[0]
    axes = op.attrs.get("axes", [])
    keep = op.attrs.get("keep_dims", False)
    if src is None:
        return [None]
    if not axes:
        if keep:
            return [(UNKNOWN,) * len(src)]
        if len(in_shapes) > 1 and is_known(in_shapes[1]) and len(in_shapes[1]) == 1:
            count = in_shapes[1][0]
            if count > len(src):
                raise _fail(op, f"axes input {_show(in_shapes[1])} names {count} dims, "
                                f"src {_show(src)} has only {len(src)}")
            return [(UNKNOWN,) * (len(src) - count)]
        return [None]
    norm = [normalize_axis(op, a, len(src), "axes entry") for a in axes]
    if len(set(norm)) != len(norm):
        raise _fail(op, f"axes {axes} name a dim twice")
    if keep:
        return [tuple(1 if i in norm else d for i, d in enumerate(src))]
    return [tuple(d for i, d in enumerate(src) if i not in norm)]


def static_reshape(op, in_shapes):
    """StaticReshape: one -1 is inferred; ``special_zero`` makes 0 copy the src dim."""
    src = in_shapes[0]
    shape = list(op.attrs["shape"])
    special_zero = op.attrs["special_zero"]
    if any(d < -1 for d in shape):
        raise _fail(op, f"shape {shape} has entries below -1")
    if shape.count(-1) > 1:
        raise _fail(op, f"shape {shape} has more than one -1")
    infer_at = shape.index(-1) if -1 in shape else None
    out = []
    for i, d in enumerate(shape):
        if d == 0 and special_zero:
            if src is not None and i >= len(src):
                raise _fail(op, f"shape {shape}: special_zero copies src dim {i}, "
                                f"but src {_show(src)} has rank {len(src)}")
            d = UNKNOWN if src is None else src[i]
        out.append(d)
    others = [d for i, d in enumerate(out) if i != infer_at]
    if not is_known(src) or UNKNOWN in others:
        return [tuple(out)]
    total, rest = _product(src), _product(others)
    if infer_at is not None:
        if rest == 0 or total % rest:
            raise _fail(op, f"cannot reshape src {_show(src)} ({total} elements) to {shape}")
        out[infer_at] = total // rest
    elif total != rest:
        raise _fail(op, f"cannot reshape src {_show(src)} ({total} elements) to {shape} "
                        f"({rest} elements)")
    return [tuple(out)]


def static_transpose(op, in_shapes):
    """StaticTranspose: ``dst[i] = src[order[i]]``; negative entries count from the end."""
    src = in_shapes[0]
    if src is None:
        return [None]
    rank = len(src)
    order = op.attrs["order"] or list(range(rank - 1, -1, -1))  # empty order reverses
    if len(order) != rank:
        raise _fail(op, f"order {order} has {len(order)} entries, src {_show(src)} has rank {rank}")
    norm = [normalize_axis(op, a, rank, "order entry") for a in order]
    if len(set(norm)) != rank:
        raise _fail(op, f"order {order} is not a permutation of the {rank} src dims")
    return [tuple(src[a] for a in norm)]


def concat(op, in_shapes):
    """Concat: same rank, equal dims except along ``axis``, which is summed."""
    known = [s for s in in_shapes if s is not None]
    if not known:
        return [None]
    rank = len(known[0])
    if any(len(s) != rank for s in known):
        raise _fail(op, f"inputs must have the same rank, given {', '.join(_show(s) for s in in_shapes)}")
    axis = normalize_axis(op, op.attrs["axis"], rank)
    out = list(known[0])
    for shape in known[1:]:
        for i, d in enumerate(shape):
            if i != axis:
                m = _merge_dim(out[i], d)
                if m is None:
                    raise _fail(op, f"inputs must match except along axis {axis}, given "
                                    f"{', '.join(_show(s) for s in in_shapes)}")
                out[i] = m
    along = [None if s is None else s[axis] for s in in_shapes]
    out[axis] = UNKNOWN if None in along or UNKNOWN in along else sum(along)
    return [tuple(out)]


# ------------------------------------------------------- softmax and norms
def softmax(op, in_shapes):
    """SoftMax/LogSoftmax: dst = src; the optional stats output has dim ``axis`` = 1."""
    src = in_shapes[0]
    if src is None:
        return [None] * len(op.outputs)
    axis = normalize_axis(op, op.attrs["axis"], len(src))
    stats = tuple(1 if i == axis else d for i, d in enumerate(src))
    return [src, stats][:len(op.outputs)]


def _begin_norm_axis(op, src) -> int:
    return normalize_axis(op, op.attrs.get("begin_norm_axis", -1), len(src), "begin_norm_axis")


def layer_norm(op, in_shapes):
    """LayerNorm: dst = src; mean/variance = ``src[:begin_norm_axis]``.

    gamma/beta must broadcast into the normalized dims ``src[begin_norm_axis:]``.
    """
    src = in_shapes[0]
    if src is None:
        return [None] * len(op.outputs)
    bna = _begin_norm_axis(op, src)
    for name, shape in zip(("gamma", "beta"), in_shapes[1:]):
        check_one_way(op, src[bna:], shape, name)
    stats = tuple(src[:bna])
    return [src, stats, stats][:len(op.outputs)]


def rms_norm(op, in_shapes):
    """RMSNorm: dst = src; gamma broadcasts into the normalized dims."""
    src = in_shapes[0]
    if src is None:
        return [None]
    bna = _begin_norm_axis(op, src)
    if len(in_shapes) > 1:
        check_one_way(op, src[bna:], in_shapes[1], "gamma")
    return [src]


# ------------------------------------------------ data/weights formats
def split_data(op, shape):
    """(N, C, spatial) of a src/dst shape under ``data_format`` (NCX or NXC)."""
    if len(shape) < 2:
        raise _fail(op, f"src {_show(shape)} must have rank >= 2 (N, C, spatial...)")
    if op.attrs.get("data_format", "NXC") == "NCX":
        return shape[0], shape[1], tuple(shape[2:])
    return shape[0], shape[-1], tuple(shape[1:-1])


def join_data(op, n, c, spatial):
    if op.attrs.get("data_format", "NXC") == "NCX":
        return (n, c) + tuple(spatial)
    return (n,) + tuple(spatial) + (c,)


def split_weights(op, shape):
    """(O, I, spatial) of a weights shape under ``weights_format``.

    OIX/IOX put the channel dims first, XIO/XOI last (as oneDNN's
    ``canonicalize``).
    """
    if len(shape) < 3:
        raise _fail(op, f"weights {_show(shape)} must have rank >= 3 (O, I and spatial dims)")
    fmt = op.attrs["weights_format"]
    if fmt == "OIX":
        return shape[0], shape[1], tuple(shape[2:])
    if fmt == "IOX":
        return shape[1], shape[0], tuple(shape[2:])
    if fmt == "XIO":
        return shape[-1], shape[-2], tuple(shape[:-2])
    return shape[-2], shape[-1], tuple(shape[:-2])  # XOI


def _channels(op, shape):
    return split_data(op, shape)[1]


def _spatial_attr(op, name: str, count: int, allow_empty: bool = False):
    """A per-spatial-dim list attr; oneDNN's 12-entry defaults are cut to ``count``."""
    value = list(op.attrs.get(name, []))
    if allow_empty and not value:
        return [0] * count
    if len(value) == MAX_NDIMS and count < MAX_NDIMS:
        value = value[:count]  # the schema default (12 entries), as oneDNN reads it
    if len(value) != count:
        raise _fail(op, f"{name}={list(op.attrs.get(name, []))} has {len(value)} entries, "
                        f"expected {count} (one per spatial dim)")
    return value


def _auto_pad_1d(size, stride, kernel, dilation, auto_pad, deconv):
    if auto_pad == "VALID":
        return 0, 0
    effective = (kernel - 1) * dilation + 1
    if deconv or size % stride == 0:
        total = effective - stride
    else:
        total = effective - size % stride
    total = max(total, 0)
    begin = (total + 1) // 2 if auto_pad == "SAME_LOWER" else total // 2
    return begin, total - begin


def conv_pads(op, src_spatial, kernel_spatial, strides, dilations, deconv=False):
    """Effective (pads_begin, pads_end): the attrs, or derived from ``auto_pad``.

    SAME_UPPER/SAME_LOWER pad ``(k-1)*d+1 - s`` in total (``- x % s`` when the
    stride does not divide the size, convolution only), the odd extra at the end
    (UPPER) or the beginning (LOWER); VALID pads nothing.  Unknown sizes give
    None (not -1: a pooling ``pads_end`` may be -1).
    """
    count = len(src_spatial)
    begin = _spatial_attr(op, "pads_begin", count, allow_empty=True)
    end_ = _spatial_attr(op, "pads_end", count, allow_empty=True)
    auto_pad = op.attrs.get("auto_pad", "None")
    if auto_pad == "None":
        return begin, end_
    begin, end_ = [], []
    for x, k, s, d in zip(src_spatial, kernel_spatial, strides, dilations):
        if UNKNOWN in (x, k) and auto_pad != "VALID":
            b, e = None, None
        else:
            b, e = _auto_pad_1d(x, s, k, d, auto_pad, deconv)
        begin.append(b)
        end_.append(e)
    return begin, end_


def _window_out(x, k, s, d, pb, pe, ceil=False):
    if UNKNOWN in (x, k) or None in (pb, pe):
        return UNKNOWN
    span = x + pb + pe - ((k - 1) * d + 1)
    return (-(-span // s) if ceil else span // s) + 1


def _check_positive(op, name, values):
    if any(v <= 0 for v in values):
        raise _fail(op, f"{name}={values} must be positive")


# --------------------------------------------------- convolution family
def convolution(op, in_shapes):
    """Convolution: ``dst = [N, O, out_x...]`` in ``data_format``.

    src channels must equal weights I * groups; the optional bias is ``[O]``.
    """
    src, wei = in_shapes[0], in_shapes[1]
    if src is None or wei is None:
        return [None]
    if len(src) != len(wei) or len(src) < 3:
        raise _fail(op, f"src {_show(src)} and weights {_show(wei)} must have the same rank >= 3")
    n, c, x = split_data(op, src)
    o, i, k = split_weights(op, wei)
    groups = op.attrs.get("groups", 1)
    if groups < 1:
        raise _fail(op, f"groups={groups} must be positive")
    if UNKNOWN not in (c, i) and c != i * groups:
        raise _fail(op, f"src has {c} channels, expected weights input channels {i} x "
                        f"groups {groups} = {i * groups}")
    strides = _spatial_attr(op, "strides", len(x))
    dilations = _spatial_attr(op, "dilations", len(x))
    _check_positive(op, "strides", strides)
    _check_positive(op, "dilations", dilations)
    pb, pe = conv_pads(op, x, k, strides, dilations)
    out_x = [_window_out(*args) for args in zip(x, k, strides, dilations, pb, pe)]
    if len(in_shapes) > 2 and in_shapes[2] is not None:
        same_shape(op, [in_shapes[2], (o,)], "bias and [weights O]")
    return [join_data(op, n, o, out_x)]


def conv_transpose(op, in_shapes):
    """ConvTranspose: ``out_x = s*(x-1) + (k-1)*d + 1 + output_padding - pb - pe``.

    Output channels are weights O x groups (weights hold O per group).
    """
    src, wei = in_shapes[0], in_shapes[1]
    if src is None or wei is None:
        return [None]
    if len(src) != len(wei) or len(src) < 3:
        raise _fail(op, f"src {_show(src)} and weights {_show(wei)} must have the same rank >= 3")
    n, c, x = split_data(op, src)
    o, i, k = split_weights(op, wei)
    groups = op.attrs.get("groups", 1)
    if groups < 1:
        raise _fail(op, f"groups={groups} must be positive")
    # weights I counts all input channels, O those of one group (oneDNN's canonical
    # (OCg, IC, K...)); the reference reads src channel g*ICg + c with weights column g*ICg + c
    if UNKNOWN not in (c, i) and c != i:
        raise _fail(op, f"src has {c} channels, expected the weights input channels {i}")
    if c != UNKNOWN and c % groups:
        raise _fail(op, f"src channels {c} do not split into groups={groups}")
    strides = _spatial_attr(op, "strides", len(x))
    dilations = _spatial_attr(op, "dilations", len(x))
    _check_positive(op, "strides", strides)
    _check_positive(op, "dilations", dilations)
    out_pad = _spatial_attr(op, "output_padding", len(x), allow_empty=True)
    pb, pe = conv_pads(op, x, k, strides, dilations, deconv=True)
    out_x = []
    for xi, ki, s, d, op_, b, e in zip(x, k, strides, dilations, out_pad, pb, pe):
        known = UNKNOWN not in (xi, ki) and None not in (b, e)
        out_x.append(s * (xi - 1) + (ki - 1) * d + 1 + op_ - b - e if known else UNKNOWN)
    out_c = UNKNOWN if o == UNKNOWN else o * groups
    if len(in_shapes) > 2 and in_shapes[2] is not None:
        same_shape(op, [in_shapes[2], (out_c,)], "bias and [output channels]")
    return [join_data(op, n, out_c, out_x)]


def pooling(op, in_shapes):
    """AvgPool/MaxPool: window arithmetic per spatial dim; N and C unchanged."""
    src = in_shapes[0]
    if src is None:
        return [None]
    if len(src) < 3:
        raise _fail(op, f"src {_show(src)} must have rank >= 3 (N, C and spatial dims)")
    n, c, x = split_data(op, src)
    kernel = _spatial_attr(op, "kernel", len(x))
    strides = _spatial_attr(op, "strides", len(x))
    dilations = _spatial_attr(op, "dilations", len(x)) if "dilations" in op.attrs else [1] * len(x)
    _check_positive(op, "kernel", kernel)
    _check_positive(op, "strides", strides)
    _check_positive(op, "dilations", dilations)
    pb, pe = conv_pads(op, x, kernel, strides, dilations)
    ceil = op.attrs.get("rounding_type", "floor") == "ceil"
    out_x = [_window_out(*args, ceil=ceil) for args in zip(x, kernel, strides, dilations, pb, pe)]
    return [join_data(op, n, c, out_x)]


def _scaled_dim(op, src, d: int, scale: float) -> int:
    """``int(d * scale)`` in f32, as oneDNN; a product that is no size (negative,
    past int64, or not finite: add_op refuses NaN/inf scales, and a finite
    scale may still overflow f32) is InvalidShape before any conversion."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.float32(d) * np.float32(scale)
    if not 0 <= out < 2.0**63:
        raise _fail(op, f"scales={op.attrs['scales']} give {float(out)!r} for a spatial dim {d} of "
                        f"src {_show(src)}; expected a size in [0, 2^63)")
    return int(out)


def interpolate(op, in_shapes):
    """Interpolate: spatial dims from ``sizes``, or ``floor(x * scales)`` (f32 math)."""
    src = in_shapes[0]
    if src is None:
        return [None]
    n, c, x = split_data(op, src)
    sizes, scales = op.attrs.get("sizes") or [], op.attrs.get("scales") or []
    given = sizes or scales
    if given and len(given) != len(x):
        name = "sizes" if sizes else "scales"
        raise _fail(op, f"{name}={given} has {len(given)} entries, expected {len(x)} "
                        f"(one per spatial dim of src {_show(src)})")
    if sizes:
        out_x = list(sizes)
    elif scales:
        out_x = [UNKNOWN if d == UNKNOWN else _scaled_dim(op, src, d, s) for d, s in zip(x, scales)]
    else:  # sizes come from the 2nd input's data
        out_x = [UNKNOWN] * len(x)
    for d, (i, o) in enumerate(zip(x, out_x)):
        if i == 0 and o not in (0, UNKNOWN):  # oneDNN leaves such a dst unwritten
            raise _fail(op, f"spatial dim {d} of src {_show(src)} is empty but the output's "
                            f"is {o}: nothing to interpolate from")
    return [join_data(op, n, c, out_x)]


def _check_channel_vectors(op, in_shapes, names, channels):
    for name, shape in zip(names, in_shapes):
        if shape is not None:
            same_shape(op, [shape, (channels,)], f"{name} and [src channels]")


def batch_norm(op, in_shapes):
    """BatchNorm*: dst = src; gamma/beta/mean/variance and the stats are ``[C]``."""
    src = in_shapes[0]
    if src is None:
        return [None] + [None] * (len(op.outputs) - 1)
    c = _channels(op, src)
    names = (("gamma", "beta", "mean", "variance") if op.kind.name == "BatchNormInference"
             else ("mean", "variance", "gamma", "beta"))
    _check_channel_vectors(op, in_shapes[1:], names, c)
    return [src] + [(c,)] * (len(op.outputs) - 1)


def group_norm(op, in_shapes):
    """GroupNorm: dst = src; mean/variance ``[N, groups]``; gamma/beta ``[C]``."""
    src = in_shapes[0]
    if src is None:
        return [None] * len(op.outputs)
    n, c, _ = split_data(op, src)
    groups = op.attrs["groups"]
    if groups < 1 or (c != UNKNOWN and c % groups):
        raise _fail(op, f"groups={groups} must be positive and divide the {c} src channels")
    _check_channel_vectors(op, in_shapes[1:], ("gamma", "beta"), c)
    stats = (n, groups)
    return [src, stats, stats][:len(op.outputs)]


def bias_add(op, in_shapes):
    """BiasAdd: dst = src; bias is ``[C]`` with C from ``data_format``."""
    src, bias = in_shapes
    if src is not None:
        if bias is not None and len(bias) != 1:
            raise _fail(op, f"bias {_show(bias)} must be 1-D")
        _check_channel_vectors(op, [bias], ["bias"], _channels(op, src))
    return [src]


def prelu(op, in_shapes):
    """PReLU: dst = src; slope is ``[C]`` (per_channel_broadcast) or broadcasts one-way."""
    src, slope = in_shapes
    if src is None or slope is None:
        return [src]
    per_channel = op.attrs.get("per_channel_broadcast", True)
    if per_channel and len(slope) == 1 and len(src) >= 2:
        c = _channels(op, src)
        if _merge_dim(slope[0], c) is not None or slope[0] == 1:
            return [src]
    check_one_way(op, src, slope, "slope")
    return [src]


# ================================================= backward (training) ops
# oneDNN's ``infer_*_bwd/bprop_output_shape``: a gradient has the shape of the
# forward tensor it belongs to.  Attributes that name a shape (``dst_shape``,
# ``weights_shape``, ``src_shape``) default to oneDNN's 12 zeros = not given.
def _shape_attr(op, name: str):
    """A shape attribute, or None when it holds oneDNN's all-zero default."""
    value = op.attrs.get(name) or []
    return tuple(value) if value and any(value) else None


def _declared(op, index: int = 0):
    lt = op.outputs[index] if index < len(op.outputs) else None
    return None if lt is None else lt.shape


def eltwise_backward(op, in_shapes):
    """*Backward of element-wise ops and SoftMax/LogSoftmax: diff_src = the
    shape both inputs share (src or dst, and diff_dst)."""
    return [same_shape(op, in_shapes[:2], "src/dst and diff_dst")]


def softmax_backward(op, in_shapes):
    """SoftMax/LogSoftmaxBackward: as eltwise_backward, with ``axis`` in range."""
    shape = same_shape(op, in_shapes[:2], "diff_dst and dst")
    if shape is not None:
        normalize_axis(op, op.attrs["axis"], len(shape))
    return [shape]


def _check_groups(op, weights):
    """Convolution*Backward: the weights' output channels O split into ``groups``
    (the input side is checked against src by :func:`convolution`)."""
    if weights is None:
        return
    o = split_weights(op, weights)[0]
    groups = op.attrs["groups"]
    if groups < 1 or (o != UNKNOWN and o % groups):
        raise _fail(op, f"weights output channels {o} do not split into groups={groups}")


def bias_add_backward(op, in_shapes):
    """BiasAddBackward: diff_bias = ``[C]`` of diff_dst under ``data_format``."""
    diff_dst = in_shapes[0]
    return [None if diff_dst is None else (_channels(op, diff_dst),)]


def prelu_backward(op, in_shapes):
    """PReLUBackward: diff_src = src (= diff_dst); diff_slope = slope."""
    src, slope, diff_dst = in_shapes
    src = same_shape(op, [src, diff_dst], "src and diff_dst")
    if src is None or slope is None:
        return [src, slope]
    if len(slope) == 1 and len(src) >= 2:  # per channel (the data_format's C) or one value
        c = _channels(op, src)
        if UNKNOWN not in (slope[0], c) and slope[0] not in (1, c):
            raise _fail(op, f"1-D slope {_show(slope)} must have 1 or the {c} src channels")
    else:
        check_one_way(op, src, slope, "slope")
    return [src, slope]


def norm_backward(op, in_shapes):
    """LayerNormBackward: diff_src = src; diff_gamma/diff_beta = ``src[begin_norm_axis:]``."""
    src = same_shape(op, in_shapes[:2], "src and diff_dst")
    if src is None:
        return [None] * len(op.outputs)
    bna = _begin_norm_axis(op, src)
    for name, shape in zip(("mean", "variance"), in_shapes[2:4]):
        if shape is not None:
            same_shape(op, [shape, tuple(src[:bna])], f"{name} and src[:begin_norm_axis]")
    for name, shape in zip(("gamma", "beta"), in_shapes[4:]):
        check_one_way(op, src[bna:], shape, name)
    aux = tuple(src[bna:])
    return [src, aux, aux][:len(op.outputs)]


def batch_norm_backward(op, in_shapes):
    """BatchNormTrainingBackward: diff_src = src; diff_gamma/diff_beta = ``[C]``."""
    src = same_shape(op, in_shapes[:2], "src and diff_dst")
    if src is None:
        return [None] * len(op.outputs)
    c = _channels(op, src)
    _check_channel_vectors(op, in_shapes[2:], ("mean", "variance", "gamma"), c)
    return [src] + [(c,)] * (len(op.outputs) - 1)


def _checked_forward(op, fwd, src, out, what: str):
    """The forward ``fwd(op, [src...])`` output must agree with ``out`` (diff_dst)."""
    if src is None or out is None or not is_known(src):
        return
    same_shape(op, [fwd, out], f"the forward output of src {_show(src)} and {what}")


def pool_backward(op, in_shapes):
    """MaxPoolBackward: diff_src = src.  AvgPoolBackward: diff_src =
    ``src_shape`` (attribute, or unknown dims when given as an s32 input).
    diff_dst must be what the forward pooling of that shape gives."""
    if op.kind.name == "MaxPoolBackward":
        src, diff_dst = in_shapes
    else:
        diff_dst = in_shapes[0]
        src = _shape_attr(op, "src_shape") if len(in_shapes) == 1 else None
        if src is None and diff_dst is not None:
            src = (UNKNOWN,) * len(diff_dst)
    if src is not None and is_known(src):
        _checked_forward(op, pooling(op, [src])[0], src, diff_dst, "diff_dst")
    return [src]


def conv_backward_data(op, in_shapes):
    """ConvolutionBackwardData: diff_src = ``dst_shape`` (attribute, else the
    declared output); diff_dst must be the forward Convolution's output."""
    diff_dst, wei = in_shapes[0], in_shapes[1]
    _check_groups(op, wei)
    shape = _shape_attr(op, "dst_shape") if len(in_shapes) == 2 else None
    shape = shape or _declared(op)
    if shape is None and wei is not None:
        shape = (UNKNOWN,) * len(wei)
    if is_known(shape) and wei is not None:
        _checked_forward(op, convolution(op, [shape, wei])[0], shape, diff_dst, "diff_dst")
    return [shape]


def conv_backward_weights(op, in_shapes):
    """Convolution/ConvTransposeBackwardWeights: diff_weights = ``weights_shape``
    (attribute, else the declared output); diff_dst must match the forward op."""
    src, diff_dst = in_shapes[0], in_shapes[1]
    shape = _shape_attr(op, "weights_shape") if len(in_shapes) == 2 else None
    shape = shape or _declared(op)
    if shape is None and src is not None:
        shape = (UNKNOWN,) * len(src)
    if op.kind.name == "ConvolutionBackwardWeights":
        _check_groups(op, shape)
    if is_known(shape) and src is not None:
        fwd = convolution if op.kind.name == "ConvolutionBackwardWeights" else conv_transpose
        _checked_forward(op, fwd(op, [src, shape])[0], src, diff_dst, "diff_dst")
    return [shape]


def conv_transpose_backward_data(op, in_shapes):
    """ConvTransposeBackwardData: diff_src = the Convolution of diff_dst by the
    weights (channels = weights I), as oneDNN's ``infer_convtranspose_ncx_oix``."""
    diff_dst, wei = in_shapes
    if diff_dst is None or wei is None:
        return [None]
    if len(diff_dst) != len(wei) or len(diff_dst) < 3:
        raise _fail(op, f"diff_dst {_show(diff_dst)} and weights {_show(wei)} must have the same "
                        f"rank >= 3")
    n, c, x = split_data(op, diff_dst)
    o, i, k = split_weights(op, wei)
    groups = op.attrs["groups"]
    if UNKNOWN not in (c, o) and (groups < 1 or c != o * groups):
        raise _fail(op, f"diff_dst has {c} channels, expected weights O {o} x groups {groups}")
    if i != UNKNOWN and i % groups:
        raise _fail(op, f"weights input channels {i} do not split into groups={groups}")
    strides = _spatial_attr(op, "strides", len(x))
    dilations = _spatial_attr(op, "dilations", len(x))
    _check_positive(op, "strides", strides)
    _check_positive(op, "dilations", dilations)
    pb, pe = conv_pads(op, x, k, strides, dilations)
    out_x = [_window_out(*args) for args in zip(x, k, strides, dilations, pb, pe)]
    return [join_data(op, n, i, out_x)]


def interpolate_backward(op, in_shapes):
    """InterpolateBackward: diff_src = src (oneDNN's infer_identity_output_shape).

    diff_dst keeps src's batch and channel dims; its spatial sizes are its own:
    as oneDNN's resampling primitive, the gradient's factors come from the
    diff_dst and src sizes, not from ``sizes``/``scales`` (benchdnn runs
    ``17 * 1.235294 -> 21``, which floor rounding of the forward would make 20)."""
    src, diff_dst = in_shapes[0], in_shapes[1]
    if src is not None and diff_dst is not None and is_known(src):
        if len(diff_dst) != len(src):
            raise _fail(op, f"src {_show(src)} and diff_dst {_show(diff_dst)} must have the same rank")
        same_shape(op, [split_data(op, src)[:2], split_data(op, diff_dst)[:2]],
                   f"the batch and channel dims of src {_show(src)} and diff_dst {_show(diff_dst)}")
    return [src]

"""Data movement and bookkeeping ops: TypeCast, Reorder, StaticReshape,
StaticTranspose, Concat, GenIndex, End and Wildcard."""
from __future__ import annotations

import numpy as np

from graph_api.enums import OpKind
from graph_api.errors import Unimplemented, op_label

from ._common import f32, finish, norm_axis


def type_cast(op, inputs, out_lts, ctx):
    """dst = convert(src): exact widening, round-to-nearest-even narrowing."""
    return [finish(f32(inputs[0]), out_lts[0])]


def reorder(op, inputs, out_lts, ctx):
    """dst = src (a copy: layouts are dense row-major here)."""
    return [finish(np.array(inputs[0], copy=True), out_lts[0])]


def reshape_target(src_shape, shape, special_zero: bool) -> list[int]:
    """The StaticReshape output shape: 0 copies the src dim when
    ``special_zero`` (else it is a 0-size dim); one -1 takes the rest."""
    dims = [int(d) for d in shape]
    for i, d in enumerate(dims):
        if d == 0 and special_zero:
            dims[i] = src_shape[i]
    if -1 in dims:
        known = int(np.prod([d for d in dims if d != -1]))
        dims[dims.index(-1)] = int(np.prod(src_shape)) // known if known else 0
    return dims


def static_reshape(op, inputs, out_lts, ctx):
    """dst = src reshaped (row-major) to ``shape`` (see :func:`reshape_target`)."""
    src = inputs[0]
    target = reshape_target(np.shape(src), op.attrs["shape"], op.attrs.get("special_zero", False))
    return [finish(np.reshape(src, target), out_lts[0])]


def static_transpose(op, inputs, out_lts, ctx):
    """dst.shape[i] = src.shape[order[i]] (negative order entries count from
    the end; an empty order reverses the dims)."""
    src = np.asarray(inputs[0])
    order = [norm_axis(int(a), src.ndim) for a in op.attrs.get("order") or []]
    return [finish(np.transpose(src, order or None), out_lts[0])]


def concat(op, inputs, out_lts, ctx):
    """dst = the inputs joined along ``axis``."""
    axis = norm_axis(int(op.attrs["axis"]), np.ndim(inputs[0]))
    return [finish(np.concatenate([f32(x) for x in inputs], axis=axis), out_lts[0])]


def gen_index(op, inputs, out_lts, ctx):
    """dst[i_0, ..., i_r] = i_axis (s32), same shape as src."""
    shape = np.shape(inputs[0])
    axis = norm_axis(int(op.attrs["axis"]), len(shape))
    index = np.arange(shape[axis], dtype=np.int64).reshape(
        [-1 if d == axis else 1 for d in range(len(shape))])
    return [finish(np.broadcast_to(index, shape), out_lts[0])]


def end(op, inputs, out_lts, ctx):
    """End consumes its input and produces nothing."""
    return []


def wildcard(op, inputs, out_lts, ctx):
    """Wildcard stands for a framework op: it has no semantics to execute."""
    raise Unimplemented(
        f"{op_label(op)}: Wildcard is a placeholder for a framework op and cannot be "
        f"executed; run that op outside the graph")


MISC = {
    OpKind.TypeCast: type_cast,
    OpKind.Reorder: reorder,
    OpKind.StaticReshape: static_reshape,
    OpKind.StaticTranspose: static_transpose,
    OpKind.Concat: concat,
    OpKind.GenIndex: gen_index,
    OpKind.End: end,
    OpKind.Wildcard: wildcard,
}

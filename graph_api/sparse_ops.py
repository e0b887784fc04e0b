"""The closed world of sparse ops (seed 003): which ops take sparse operands or results.

Sparsity is a property of the logical tensor, not an op: an op in
:data:`SPARSE_OPS` may have sparse inputs and outputs (its output encoding is
whatever the user declares on the output logical tensor; nothing is inferred);
any other op touching a sparse tensor is rejected at ``add_op`` (its own
logical tensors) or ``finalize`` (encodings declared elsewhere on the same
tensor id) with :class:`~graph_api.errors.Unimplemented` naming the op and the
encoding.  Semantics and kernels: ``docs/sparse.md``, ``graph_api.kernels.sparse_ops``.
"""
from __future__ import annotations

from .enums import OpKind as K
from .errors import Unimplemented, op_label
from .sparse_encoding import DENSE, VAR

#: zero-preserving unary ops of the opset (f(0) = 0): they map stored values only
ZERO_PRESERVING_UNARY = frozenset({K.Abs, K.Sqrt, K.Tanh, K.ReLU, K.Square, K.Round})
#: element-wise binary ops: union (Add, Subtract) or intersection (Multiply) of the patterns
ELEMENTWISE_BINARY = frozenset({K.Add, K.Subtract, K.Multiply})
REDUCTIONS = frozenset({K.ReduceSum, K.ReduceMax})
RESHAPING = frozenset({K.StaticReshape, K.StaticTranspose, K.Concat})
#: the seed's ``convert``: dense <-> sparse, encoding -> encoding (TypeCast also changes the type)
CONVERSIONS = frozenset({K.Reorder, K.TypeCast})


def _matmul(op, encodings) -> str | None:
    if len(encodings) > 2 and encodings[2] is not None:
        return "a sparse bias is not supported (the bias input must be dense)"
    for port, enc in enumerate(encodings[:2]):
        if enc is None or enc.rank <= 2:
            continue
        batch = enc.levels[:enc.rank - 2]
        if [(lv.dim, lv.op, lv.format) for lv in batch] != [(d, VAR, DENSE) for d in range(enc.rank - 2)]:
            return (f"input {port}: the batch dimensions of a sparse MatMul operand must be the "
                    f"leading dense levels, got {enc}")
    return None


def _always(op, encodings) -> None:
    return None


#: op kind -> rule(op, encodings of inputs then outputs) returning why not, or None
SPARSE_OPS = {
    K.MatMul: _matmul,
    **{k: _always for k in ZERO_PRESERVING_UNARY | ELEMENTWISE_BINARY | REDUCTIONS | RESHAPING | CONVERSIONS},
}


def check(op, encoding_of) -> None:
    """Unimplemented when ``op`` touches a sparse tensor outside the closed world.

    ``encoding_of(lt)`` gives the encoding the graph knows for a logical tensor."""
    encodings = [encoding_of(lt) for lt in list(op.inputs) + list(op.outputs)]
    sparse = [(lt.id, enc) for lt, enc in zip(list(op.inputs) + list(op.outputs), encodings) if enc is not None]
    if not sparse:
        return
    tid, enc = sparse[0]
    rule = SPARSE_OPS.get(op.kind)
    if rule is None:
        supported = ", ".join(sorted(k.name for k in SPARSE_OPS))
        raise Unimplemented(f"{op_label(op)}: tensor {tid} is sparse ({enc}); {op.kind.name} does not take "
                            f"sparse tensors (the sparse ops: {supported})")
    reason = rule(op, encodings[:len(op.inputs)])
    if reason:
        raise Unimplemented(f"{op_label(op)} with sparse tensor {tid} ({enc}): {reason}")

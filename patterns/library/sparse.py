"""Sparse patterns (seed 003): a MatMul with a sparse operand and its epilogue.

Sparse tensors take part in these patterns only: the partitioner keeps ops
touching a sparse tensor out of every other pattern (their kernels are dense),
so a sparse MatMul is either this partition or a single op, and its dense
post-ops fuse here as they would after a dense MatMul.
"""
from __future__ import annotations

from graph_api.enums import OpKind as K

from ..pattern import Cond, In, Node, Pattern
from .common import post_ops


def _has_sparse_operand(op, graph) -> bool:
    return any(graph.tensors.get(lt.id, lt).encoding is not None for lt in op.inputs[:2])


SPARSE_OPERAND = Cond("input 0 or 1 is sparse", _has_sparse_operand)

SPARSE_MATMUL_POST_OPS = Pattern("sparse_matmul_post_ops", 8.8, [
    Node("matmul", K.MatMul, when=[SPARSE_OPERAND]),
    Node("bias", K.BiasAdd, [In("matmul", 0)], optional=True),
    post_ops("bias"),
], doc="""A sparse-operand MatMul (SpMM) with bias and element-wise post-ops.

    matmul (sparse input 0 or 1) ─ [bias]? ─ {swish | unary | binary}*0..20

Roles: matmul, bias, post_ops (list).""", min_ops=1)

#: the patterns that may take ops touching sparse tensors
SPARSE_PATTERN_NAMES = frozenset({SPARSE_MATMUL_POST_OPS.name})


def sparse_op_ids(graph) -> dict[int, str]:
    """Ops with a sparse input or output: {op id: reason}, for the partitioner."""
    enc = lambda lt: graph.tensors.get(lt.id, lt).encoding
    return {op.id: "an op with sparse tensors (only sparse patterns take it)" for op in graph.ops.values()
            if any(enc(lt) is not None for lt in list(op.inputs) + list(op.outputs))}

"""Canonicalisation by construction (seed 001): layout producers folded into MatMul maps.

A ``StaticTranspose`` or a broadcast-only ``StaticReshape`` (one that only
inserts size-1 dims) feeding a MatMul or BatchReduceMatMul joins its
partition, and the plan reads the producer's *source* through the folded
``indexing_maps`` (strided views, no copy).  The matcher's escape rule leaves
a producer with other users alone; :func:`graph_api.indexing_maps.folded_maps`
says whether the composed maps obey the seed's rules (a transpose moving the
batch dim does not fold).  :func:`folded_matmul` gives the rewritten MatMul
(maps equal to the default dropped), as the plan computes it.
"""
from __future__ import annotations

from graph_api import indexing_maps
from graph_api.enums import OpKind as K

from ..pattern import Check, In, Node, Pattern
from .matmul import _epilogue

FOLDABLE = frozenset({K.StaticTranspose, K.StaticReshape})
DOTS = frozenset({K.MatMul, K.BatchReduceMatMul})


def folds_of(bindings: dict, ops: dict) -> dict:
    """Input port -> folded producer op, from a match's bindings."""
    return {port: ops[bindings[role]] for port, role in ((0, "a_fold"), (1, "b_fold"))
            if bindings.get(role) is not None}


def folded_matmul(graph, bindings: dict):
    """The MatMul of a ``matmul_indexing_maps`` match rewritten to read the
    folds' sources (None if not foldable)."""
    shape_of = lambda lt: graph.tensors.get(lt.id, lt).shape
    return indexing_maps.folded_matmul(graph.ops[bindings["matmul"]],
                                       folds_of(bindings, graph.ops), shape_of)


def _foldable(bindings, graph) -> bool:
    return bool(folds_of(bindings, graph.ops)) and folded_matmul(graph, bindings) is not None


MATMUL_INDEXING_MAPS = Pattern("matmul_indexing_maps", 9.0, [
    Node("a_fold", FOLDABLE, optional=True, via=None),
    Node("b_fold", FOLDABLE, optional=True, via=None),
    Node("matmul", DOTS, [In("a_fold", 0), In("b_fold", 1)]),
] + _epilogue("matmul"), [Check("a transpose or unit reshape folds into the maps", _foldable)],
    doc="""StaticTranspose / unit-dim StaticReshape folded into MatMul indexing maps.

    [a_fold (StaticTranspose|StaticReshape)]? ─┐
    [b_fold (StaticTranspose|StaticReshape)]? ─┴ matmul (MatMul|BatchReduceMatMul)
      ─ [bias]? ─ {swish | unary | binary}*0..20 ─ [select]? ─ [out_cast]?

At least one fold, and the composed maps obey the seed's rules.  Roles:
a_fold, b_fold, matmul, bias, post_ops (list), select, out_cast.""")

"""Grouped MatMul (mixture of experts): unconnected expert instances as one partition.

oneDNN's grouped-GEMM RFC (rfcs/20251203-grouped-gemm-support) computes, for
each expert ``i``, ``dst[i] = src[i] @ wei[i]`` with its own token count
``M_i`` (0 allowed) and the same ``K`` and ``N`` for every expert.  Its Graph
API form (branch lvtao/main/gmm-poc: examples/graph/grouped_matmul.cpp and the
``grouped_matmul`` pass of patterns/gmm.cpp, priority 25) is a graph of
independent MatMuls that one group pattern takes as one partition.

Extensions (oneDNN's pass takes 2..8 plain MatMuls): an expert may also be a
weight-compressed MatMul (s4/u4/s8/u8 ``DynamicDequantize`` weights, the
``matmul_compressed`` form) or a whole gated MLP (the ``gated_mlp`` pattern:
SwiGLU experts), and a group holds up to :data:`MAX_EXPERTS` experts.  Experts
must agree on everything but the token count where the graph knows it (the
check below); concrete shapes that disagree at compile raise ``InvalidShape``.
"""
from __future__ import annotations

from graph_api.enums import OpKind as K

from ..pattern import Check, Group, In, Node, Pattern, in_dtype
from .common import INT4, INT8
from .mlp import GATED_MLP

#: the most experts one grouped partition takes (oneDNN's PoC: 8; MoE layers use up to 256)
MAX_EXPERTS = 256

EXPERT_MATMUL = Pattern("expert_matmul", 25.0, [
    Node("wei_dequant", K.DynamicDequantize, optional=True, via=None, when=[in_dtype(0, *(INT8 + INT4))]),
    Node("matmul", K.MatMul, [In("wei_dequant", 1)]),
], min_ops=1, doc="""One expert of a grouped MatMul (a template of ``grouped_matmul``).

    [W_int, scales[, zps] ─ wei_dequant (DynamicDequantize s4/u4/s8/u8)]? ─┐
    src (this expert's M tokens) ─────────────────────────────────── matmul

Roles: wei_dequant, matmul.""")


def expert_op_ids(bindings: dict) -> list[int]:
    """Op ids of one expert's bindings, roles in name order."""
    def flat(value):
        if isinstance(value, int):
            return [value]
        if isinstance(value, (list, tuple)):
            return [i for v in value for i in flat(v)]
        return []
    return [i for role in sorted(bindings) for i in flat(bindings[role])]


def token_tensors(ops) -> set[int]:
    """Ids of the tensors of one expert that have its token count as leading dims: the
    MatMuls' outside first inputs (src) and everything computed from them."""
    inside = {lt.id for op in ops for lt in op.outputs}
    tokens = {op.inputs[0].id for op in ops if op.kind == K.MatMul and op.inputs[0].id not in inside}
    changed = True  # ops come in role-name order, not producers first: repeat until stable
    while changed:
        changed = False
        for op in ops:
            if any(lt.id in tokens for lt in op.inputs) and any(lt.id not in tokens for lt in op.outputs):
                tokens |= {lt.id for lt in op.outputs}
                changed = True
    return tokens


def expert_signature(ops, lts: dict) -> list:
    """Per op of one expert: kind, attributes, and (dtype, dims) of every input and
    output, a token tensor's leading dims left out; unknown dims are None."""
    tokens = token_tensors(ops)

    def dims(lt):
        lt = lts.get(lt.id, lt)
        if lt.shape is None:
            return lt.dtype, None
        shape = tuple(None if d < 0 else d for d in lt.shape)
        return lt.dtype, shape[-1:] if lt.id in tokens else shape

    return [(op.kind, repr(sorted(op.attrs.items())), [dims(lt) for lt in op.inputs],
             [dims(lt) for lt in op.outputs]) for op in ops]


def _signature(bindings: dict, graph) -> list:
    return expert_signature([graph.ops[i] for i in expert_op_ids(bindings)], graph.tensors)


def _agree(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_agree(x, y) for x, y in zip(a, b))
    return a is None or b is None or a == b


def _experts_agree(experts: list, graph) -> bool:
    first = _signature(experts[0], graph)
    return all(_agree(first, _signature(b, graph)) for b in experts[1:])


GROUPED_MATMUL = Group("grouped_matmul", 25.0, (GATED_MLP, EXPERT_MATMUL), 2, MAX_EXPERTS, [
    Check("the experts agree on op kinds, attributes, dtypes and every dim but the token count",
          _experts_agree),
], doc="""Grouped MatMul / mixture of experts (oneDNN gmm-poc's grouped_matmul pass, extended).

    expert 0:  src_0 [M_0, K] ─ MatMul(W_0 [K, N]) ─ dst_0 [M_0, N]
    expert 1:  src_1 [M_1, K] ─ MatMul(W_1 [K, N]) ─ dst_1 [M_1, N]
      ...      (2..256 unconnected experts, the whole graph, one template:
                expert_matmul ([DynamicDequantize]? -> MatMul) or gated_mlp)

Roles: template (the experts' pattern name), experts (list: each expert's
bindings of its template's roles, in topological order).""")

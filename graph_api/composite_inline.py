"""The backend's choice per Composite op at ``get_partitions``: fast kernel or inlining.

For every Composite op (nested ones too, once their caller is inlined)::

    reference path forced (composite.use_reference / GRAPH_API_COMPOSITE_REFERENCE=1)?  -> inline
    debug partition policy (every op on its own)?                                       -> inline
    no fast kernel registered for name/version (kernels.composite.FAST_COMPOSITES)?      -> inline
    the fast kernel refuses the shapes known in the graph?                              -> inline
    otherwise                                                   -> keep: one partition running it

Inlining copies the decomposition's ops into an *expanded* graph: ports become the
composite's own tensors, inner tensors and ops get fresh ids (above every id of the
graph), constants become constant tensors whose values the partitions that read them
carry (``graph.bound_constants``).  The expanded graph is partitioned like any graph,
so inlined ops fuse with their neighbours.  Every choice is a :class:`Decision`,
logged in verbose mode and listed by ``graph.explain_partitions()``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from . import backend
from .composite import NAME, VERSION, resolve
from .config import log, settings
from .enums import OpKind, PartitionPolicy
from .errors import op_label
from .logical_tensor import LogicalTensor
from .op import Op


@dataclass
class Decision:
    """What the backend did with one Composite op."""

    op_id: int
    label: str  # 'op 5 (Composite "g")'
    composite: str  # "'gelu_tanh' v1"
    inlined: bool
    reason: str
    inside: int | None = None  # the composite op this one was inlined from
    op_ids: list[int] = field(default_factory=list)  # ops it became in the expanded graph

    def __str__(self) -> str:
        where = f" (inside composite op {self.inside})" if self.inside is not None else ""
        if self.inlined:
            return (f"composite {self.composite}{where}: inlined as ops {self.op_ids} "
                    f"(partitioned like any sub-graph) because {self.reason}")
        return f"composite {self.composite}{where}: one partition running {self.reason}"


@dataclass
class Expansion:
    graph: object
    decisions: list[Decision]


def decide(op, tensors, policy) -> tuple[bool, str]:
    """(keep as one fast partition?, why) for one Composite op."""
    key = (op.attrs[NAME], op.attrs[VERSION])
    if settings.composite_reference:
        return False, "the reference path is forced (composite.use_reference / GRAPH_API_COMPOSITE_REFERENCE)"
    if policy == PartitionPolicy.debug:
        return False, "the debug policy puts every op on its own"
    native = backend.fast_composite(key)
    if native is None:
        return False, f"no fast kernel is registered for '{key[0]}' v{key[1]}"
    lts = [tensors.get(lt.id, lt) for lt in op.inputs]
    refusal = native.suits(op, lts)
    if refusal:
        return False, f"its fast kernel ({native.what}) does not suit these shapes: {refusal}"
    return True, native.what


class _Expander:
    def __init__(self, graph, policy):
        self.graph, self.policy = graph, policy
        # a new graph of the same class (graph.py imports this module: no import back)
        self.new = type(graph)(graph.engine_kind, graph.fpmath.mode, graph.fpmath.apply_to_int)
        self.op_ids = itertools.count(max(graph.ops) + 1)
        self.tensor_ids = itertools.count(max(graph.tensors) + 1)
        self.bound: dict = {}
        self.decisions: list[Decision] = []

    def run(self) -> Expansion:
        for op in self.graph.ops.values():
            if op.kind == OpKind.Composite:
                self.place(op, self.graph.tensors, None)
            else:
                self.new.add_op(op)
        self.new.finalize()
        self.new.bound_constants = self.bound
        self.new.composite_decisions = self.decisions
        for d in self.decisions:
            log(f"composite,{d.label},{'inlined' if d.inlined else 'kept'},{d}")
        return Expansion(self.new, self.decisions)

    def place(self, op, tensors, inside) -> list[int]:
        dec = resolve(op)
        keep, reason = decide(op, tensors, self.policy)
        decision = Decision(op.id, op_label(op), f"'{dec.name}' v{dec.version}", not keep, reason, inside)
        self.decisions.append(decision)
        if keep:
            self.new.add_op(op)
            decision.op_ids = [op.id]
            return [op.id]
        outer = [tensors.get(lt.id, lt) for lt in op.inputs + op.outputs]
        known = dec.infer(op, [lt.shape for lt in outer[:len(op.inputs)]])
        mapping = {port.id: lt for port, lt in zip(dec.inputs + dec.outputs, outer)}
        for tid, const in dec.constants.items():
            fresh = next(self.tensor_ids)
            mapping[tid] = LogicalTensor(fresh, const.lt.dtype, const.lt.shape, property=const.lt.property)
            self.bound[fresh] = const.array(op.attrs)

        def lt_of(lt):
            if lt.id not in mapping:
                inferred = known.get(lt.id, lt)
                mapping[lt.id] = LogicalTensor(next(self.tensor_ids), inferred.dtype, inferred.shape)
            return mapping[lt.id]

        made = []
        for inner in dec.verified_ops:
            copy = Op(next(self.op_ids), inner.kind, [lt_of(lt) for lt in inner.inputs],
                      [lt_of(lt) for lt in inner.outputs], f"{op.name}/{inner.name}",
                      {k: (list(v) if isinstance(v, list) else v) for k, v in inner.attrs.items()})
            if copy.kind == OpKind.Composite:
                lts = {lt.id: lt for lt in copy.inputs + copy.outputs}
                made += self.place(copy, lts, op.id)
            else:
                self.new.add_op(copy)
                made.append(copy.id)
        decision.op_ids = made
        return made


def expand(graph, policy=PartitionPolicy.fusion) -> Expansion:
    """The graph with each Composite op kept or inlined (the graph itself when it has none)."""
    if not any(op.kind == OpKind.Composite for op in graph.ops.values()):
        return Expansion(graph, [])
    return _Expander(graph, policy).run()

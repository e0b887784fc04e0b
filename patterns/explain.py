"""Why an op was not fused: the nearest pattern and the condition that failed.

For every op left in a single-op partition, each pattern that has a node of
the op's kind is tried again, anchored at the op and at the ops downstream of
it (a pattern's anchor is its last op), with the fused partitions in place.
The matcher's :class:`~patterns.matcher.Trace` keeps the furthest point each
attempt reached (ops bound) and the first condition that failed there; the
attempt that got furthest while involving the op is reported.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from graph_api.errors import op_label

from .matcher import Trace
from .partitioner import find_fusion, fuse

#: how far downstream of an op its pattern's anchor is looked for
DOWNSTREAM_HOPS = 30


@dataclass
class Explanation:
    """The nearest miss for one unfused op."""

    op_id: int
    op_kind: str
    pattern: str | None = None
    anchor: int | None = None
    matched: tuple = ()
    reason: str = ""

    def __str__(self) -> str:
        if self.pattern is None:
            return self.reason
        got = f"{len(self.matched)} op(s) matched" if self.matched else "nothing matched"
        return f"nearest pattern '{self.pattern}' (anchored at op {self.anchor}, {got}): {self.reason}"


class Explanations(dict):
    """op id -> :class:`Explanation`, for ops in single-op partitions."""

    def __str__(self) -> str:
        return "\n".join(f"op {op_id} ({e.op_kind}): {e}" for op_id, e in sorted(self.items()))


def _attempt(graph, pattern, anchor, owner, taken) -> tuple[Trace, object]:
    trace = Trace()
    match = find_fusion(graph, pattern, anchor, owner, taken, trace)
    return trace, match


def explain_op(graph, op_id: int, patterns, owner: dict, taken: dict) -> Explanation:
    op = graph.ops[op_id]
    result = Explanation(op_id, op.kind.name)
    candidates = [p for p in patterns if op.kind in p.op_kinds()]
    if not candidates:
        result.reason = f"no pattern has a {op.kind.name} op"
        return result
    reach = nx.single_source_shortest_path_length(graph.nx, op_id, cutoff=DOWNSTREAM_HOPS)
    anchors = sorted(reach, key=lambda a: (reach[a], a))
    best_key = None
    for pattern in candidates:
        kinds = pattern.anchor_kinds()
        for anchor in anchors:
            if anchor in taken or graph.ops[anchor].kind not in kinds:
                continue
            trace, match = _attempt(graph, pattern, anchor, owner, taken)
            if match is not None and op_id in match.op_ids:
                reason = (f"would match now ({len(match.op_ids)} ops); an earlier pattern or "
                          f"fusion order left it out")
                key = (2, len(match.op_ids))
                found = (pattern.name, anchor, tuple(sorted(match.op_ids)), reason)
            elif trace.reason is not None:
                involved = op_id in trace.ops or anchor == op_id
                key = (1 if involved else 0, trace.score)
                found = (pattern.name, anchor, tuple(sorted(trace.ops)), trace.reason)
            else:
                continue
            if best_key is None or key > best_key:
                best_key = key
                result.pattern, result.anchor, result.matched, result.reason = found
    if result.pattern is None:
        result.reason = f"no pattern that has a {op.kind.name} op can end at {op_label(op)} or below it"
    return result


def explain(graph, patterns=None) -> Explanations:
    """Explanations for every op of ``graph`` left in a single-op partition."""
    if patterns is None:
        from .library import PATTERNS as patterns
    topo = graph.topological_op_ids()
    fusions, taken = fuse(graph, patterns, topo)
    owner = {op_id: ("fusion", i) for i, f in enumerate(fusions) for op_id in f.op_ids}
    result = Explanations()
    for op_id in topo:
        if op_id not in taken:
            result[op_id] = explain_op(graph, op_id, patterns, owner, taken)
    return result

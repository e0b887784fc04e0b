"""Why an op was not fused: the nearest pattern and the condition that failed.

For every op left in a single-op partition, each pattern that has a node of
the op's kind is tried again, anchored at the op and at the ops downstream of
it (a pattern's anchor is its last op), with the ops that higher-priority
patterns (and the same pattern) had claimed when it ran.  The matcher's
:class:`~patterns.matcher.Trace`, focused on the op, keeps the furthest point
each attempt reached while involving the op (ops bound) and the condition
that failed there; the attempt that got furthest is reported, higher
priority first on ties.
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


def explain_op(graph, op_id: int, patterns, claimed: dict) -> Explanation:
    """``claimed``: op id -> (pattern rank, fusion key) of the partitioning."""
    op = graph.ops[op_id]
    result = Explanation(op_id, op.kind.name)
    candidates = [(rank, p) for rank, p in enumerate(patterns) if op.kind in p.op_kinds()]
    if not candidates:
        result.reason = f"no pattern has a {op.kind.name} op"
        return result
    reach = nx.single_source_shortest_path_length(graph.nx, op_id, cutoff=DOWNSTREAM_HOPS)
    anchors = sorted(reach, key=lambda a: (reach[a], a))
    best = None
    for rank, pattern in candidates:
        # what the partitioner saw when this pattern ran
        taken = {o: patterns[r].name for o, (r, _) in claimed.items() if r <= rank}
        owner = {o: key for o, (r, key) in claimed.items() if r <= rank}
        kinds = pattern.anchor_kinds()
        for anchor in anchors:
            if anchor in taken or graph.ops[anchor].kind not in kinds:
                continue
            trace = Trace(focus=op_id)
            match = find_fusion(graph, pattern, anchor, owner, taken, trace)
            if match is not None and op_id in match.op_ids:
                score = 1e6
                found = (tuple(sorted(match.op_ids)),
                         f"matches ({len(match.op_ids)} ops) but the fusion order left it out")
            elif trace.involved:
                score, found = trace.score, (tuple(sorted(trace.ops)), trace.reason)
            else:
                continue
            if best is None or score > best:
                best = score
                result.pattern, result.anchor = pattern.name, anchor
                result.matched, result.reason = found
    if result.pattern is None:
        result.reason = f"no pattern that has a {op.kind.name} op can end at {op_label(op)} or below it"
    return result


def explain(graph, patterns=None) -> Explanations:
    """Explanations for every op of ``graph`` left in a single-op partition."""
    if patterns is None:
        from .library import PATTERNS as patterns
    topo = graph.topological_op_ids()
    fusions, _ = fuse(graph, patterns, topo)
    rank = {p.name: i for i, p in enumerate(patterns)}
    claimed = {op_id: (rank[f.pattern.name], ("fusion", i))
               for i, f in enumerate(fusions) for op_id in f.op_ids}
    result = Explanations()
    for op_id in topo:
        if op_id not in claimed:
            result[op_id] = explain_op(graph, op_id, patterns, claimed)
    return result

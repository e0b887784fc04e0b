"""Why an op was not fused: the nearest pattern and the condition that failed.

For every op left in a single-op partition, each pattern that has a node of
the op's kind is tried again, anchored at the op and at the ops a few steps
downstream of it (a pattern's anchor is its last op), with the ops that
higher-priority patterns (and the same pattern) had claimed when it ran.  The
matcher's :class:`~graph_api.patterns.matcher.Trace` keeps every dead end: how many ops
were bound (repeated post-ops count a quarter) and which condition failed.
The reported miss is the dead end involving the op that ranks highest: a
condition failing on the op itself (or its output leaking) first, then the
most ops bound, less a quarter per step between the op and the anchor;
higher-priority patterns win ties.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from graph_api.errors import op_label

from .library import PATTERNS
from .pattern import Group
from .library.sparse import SPARSE_PATTERN_NAMES, sparse_op_ids
from .matcher import Trace
from .partitioner import find_fusion, fuse

#: how far downstream of an op its pattern's anchor is looked for
DOWNSTREAM_HOPS = 24


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


class _Attempts:
    """Match attempts (pattern rank, anchor) -> (trace, match), each run once,
    with the claims the partitioner had made when that pattern ran."""

    def __init__(self, graph, patterns, claimed: dict):
        self.graph, self.patterns, self.claimed = graph, patterns, claimed
        self.cache: dict = {}

    def taken(self, rank: int) -> tuple[dict, dict]:
        taken = {o: self.patterns[r].name for o, (r, _) in self.claimed.items() if r <= rank}
        owner = {o: key for o, (r, key) in self.claimed.items() if r <= rank}
        return taken, owner

    def get(self, rank: int, anchor: int):
        key = (rank, anchor)
        if key not in self.cache:
            taken, owner = self.taken(rank)
            trace = Trace()
            match = find_fusion(self.graph, self.patterns[rank], anchor, owner, taken, trace)
            self.cache[key] = (trace, match)
        return self.cache[key]


def explain_op(graph, op_id: int, attempts: _Attempts) -> Explanation:
    op = graph.ops[op_id]
    result = Explanation(op_id, op.kind.name)
    patterns = attempts.patterns
    # a Group takes a whole graph or nothing (no near miss to explain per op)
    candidates = [rank for rank, p in enumerate(patterns) if op.kind in p.op_kinds() and not isinstance(p, Group)]
    if not candidates:
        result.reason = f"no pattern has a {op.kind.name} op"
        return result
    reach = nx.single_source_shortest_path_length(graph.nx, op_id, cutoff=DOWNSTREAM_HOPS)
    anchors = sorted(reach, key=lambda a: (reach[a], a))
    best = None
    for rank in candidates:
        pattern = patterns[rank]
        kinds = pattern.anchor_kinds()
        for anchor in anchors:
            if anchor in attempts.claimed and attempts.claimed[anchor][0] <= rank \
                    or graph.ops[anchor].kind not in kinds:
                continue
            trace, match = attempts.get(rank, anchor)
            if match is not None and op_id in match.op_ids:
                score = 1e6
                found = (tuple(sorted(match.op_ids)),
                         f"matches ({len(match.op_ids)} ops) but the fusion order left it out")
            else:
                note = trace.best(op_id)
                if note is None:
                    continue
                score = note.rank(op_id) - 0.25 * reach[anchor]
                found = (tuple(sorted(note.ops)), note.reason)
            if best is None or score > best:
                best = score
                result.pattern, result.anchor = pattern.name, anchor
                result.matched, result.reason = found
    if result.pattern is None:
        result.reason = f"no pattern that has a {op.kind.name} op can end at {op_label(op)} or below it"
    return result


def explain(graph, patterns=None) -> Explanations:
    """Explanations for every op of ``graph`` left in a single-op partition.

    Composite ops are decided before partitioning, by the runtime
    (``graph_api.backend.explain_partitions`` adds :func:`composites`)."""
    return _explain_ops(graph, patterns)


def composites(decisions) -> Explanations:
    """Composite ops: kept as one partition (which fast kernel) or inlined (why),
    keyed by the composite's op id (nested ones: the id it had once its caller
    was inlined)."""
    result = Explanations()
    for decision in decisions:
        result[decision.op_id] = Explanation(decision.op_id, "Composite", reason=str(decision))
    return result


def _explain_ops(graph, patterns=None) -> Explanations:
    patterns = PATTERNS if patterns is None else patterns
    if not sparse_op_ids(graph):  # sparse patterns are no near miss of a graph without sparse tensors
        patterns = [p for p in patterns if p.name not in SPARSE_PATTERN_NAMES]
    topo = graph.topological_op_ids()
    fusions, _ = fuse(graph, patterns, topo)
    rank = {p.name: i for i, p in enumerate(patterns)}
    claimed = {op_id: (rank[f.pattern.name], ("fusion", i))
               for i, f in enumerate(fusions) for op_id in f.op_ids}
    attempts = _Attempts(graph, patterns, claimed)
    result = Explanations()
    for op_id in topo:
        if op_id not in claimed:
            result[op_id] = explain_op(graph, op_id, attempts)
    return result

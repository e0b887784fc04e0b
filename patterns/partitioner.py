"""Cuts a finalized graph into partitions.

Patterns run in priority order (``graph_api.patterns.library.PATTERNS``, highest
first); each one is tried anchored at every op not yet taken, in reverse
topological order, and the first acceptable match claims its ops.  A match is
acceptable when

* its whole-match checks pass and it has at least ``pattern.min_ops`` ops;
* no intermediate tensor escapes: every output of a matched op that is used
  outside the match or is a graph output must be allowed by the pattern (the
  anchor's outputs, node ``escape`` ports such as SoftMax stats, tensors an
  End op of the match marks as outputs);
* contracting it into one node keeps the partition graph acyclic (checked
  with networkx on the graph condensed by the partitions chosen so far).

A :class:`~graph_api.patterns.pattern.Group` (the grouped MatMul) runs at its
priority like a pattern: :func:`find_group` takes the whole graph as its
template's instances, each found by :func:`find_fusion`, or nothing.

Ops no pattern takes become single-op partitions; ``PartitionPolicy.debug``
gives single-op partitions only.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from graph_api.config import log
from graph_api.enums import OpKind, PartitionPolicy
from graph_api.errors import op_label

from .library import PATTERNS
from .library.sparse import SPARSE_PATTERN_NAMES, sparse_op_ids
from .matcher import Match, Trace, iter_matches, weight
from .pattern import Group

#: matches tried per (pattern, anchor) before giving up on that anchor
MAX_CANDIDATES = 64


@dataclass
class Fusion:
    """One partition-to-be: op ids in topological order, the pattern that took
    them (None for a single op) and the pattern's role bindings."""

    op_ids: list[int]
    pattern: object = None
    bindings: dict = field(default_factory=dict)


def escaping(graph, match: Match) -> tuple[str, int] | None:
    """(why the match leaks an intermediate tensor, the leaking op) or None.

    A tensor an End op of the match consumes is a declared output (dMask of
    SDPA backward), so it may leave too.
    """
    ops = match.op_ids
    outputs = set(graph.output_ids)
    for op_id in sorted(ops):
        op = graph.ops[op_id]
        allowed = match.escape.get(op_id, ())
        for port, lt in enumerate(op.outputs):
            if port in allowed or any(graph.ops[c].kind == OpKind.End and c in ops
                                      for c, _ in graph.consumers.get(lt.id, [])):
                continue
            users = [c for c, _ in graph.consumers.get(lt.id, []) if c not in ops]
            if users:
                return (f"intermediate tensor {lt.id} ({op_label(op)} as '{match.roles[op_id]}') "
                        f"is also used by op {users[0]} outside the match"), op_id
            if lt.id in outputs:
                return (f"intermediate tensor {lt.id} ({op_label(op)} as '{match.roles[op_id]}') "
                        f"is a graph output"), op_id
    return None


def cycle(graph, owner: dict, match: Match) -> str | None:
    """Why contracting the match would make the partition graph cyclic, or None."""
    new = ("new",)
    group = lambda op_id: new if op_id in match.op_ids else owner.get(op_id, op_id)
    condensed = nx.DiGraph()
    for u, v in graph.nx.edges():
        gu, gv = group(u), group(v)
        if gu != gv:
            condensed.add_edge(gu, gv)
    if new not in condensed or nx.is_directed_acyclic_graph(condensed):
        return None
    loop = nx.find_cycle(condensed, new)
    via = next((g for g, _ in loop if g != new), None)
    return f"fusing would create a cycle through {via if not isinstance(via, int) else f'op {via}'}"


def accept(graph, match: Match) -> tuple[str | None, float, int | None]:
    """(reason the match is rejected or None, how far it got, the op at fault)
    for explanations; everything but the cycle check, which depends on the
    other partitions."""
    size = weight(match.roles.values())
    for check in match.pattern.checks:
        if not check.fn(match.bindings, graph):
            return f"whole-match condition '{check.text}' fails", size + 0.25, None
    if len(match.op_ids) < match.pattern.min_ops:
        return (f"only {len(match.op_ids)} op matched, a fusion needs {match.pattern.min_ops}",
                size - 0.5, None)
    leak = escaping(graph, match)
    if leak:
        return leak[0], size, leak[1]
    return None, size, None


def find_fusion(graph, pattern, anchor: int, owner: dict, taken: dict,
                trace: Trace | None = None) -> Match | None:
    """The biggest acceptable match of ``pattern`` anchored at ``anchor``
    (the first one found among equals: greedy choices come first)."""
    candidates = []
    for n, match in enumerate(iter_matches(graph, pattern, anchor, taken, trace, leak_free=True)):
        if n >= MAX_CANDIDATES:
            break
        reason, score, subject = accept(graph, match)
        if reason is None:
            candidates.append(match)
        elif trace is not None:
            trace.note(score, reason, match.op_ids, pattern.name, anchor, subject)
    candidates.sort(key=lambda m: -len(m.op_ids))  # stable: first found among equals
    for match in candidates:
        reason = cycle(graph, owner, match)
        if reason is None:
            return match
        if trace is not None:
            trace.note(weight(match.roles.values()) + 0.5, reason, match.op_ids, pattern.name, anchor)
    return None


def find_group(graph, group: Group, topo: list[int], taken: dict) -> tuple | str:
    """(template, instance matches in topological order) when the whole graph is
    ``group.min..max`` unconnected instances of one of ``group.templates``, else
    why not (oneDNN's group matching, branch gmm-poc: a group covers the graph)."""
    if taken or len(graph.ops) < group.min:
        return f"a {group.name} group takes the whole graph, {group.min} or more experts"
    position = {op_id: i for i, op_id in enumerate(topo)}
    why = f"the graph is not {group.min}..{group.max} instances of one template"
    for template in group.templates:
        anchors = template.anchor_kinds()
        claimed: dict[int, str] = {}
        matches = []
        for anchor in reversed(topo):
            if anchor in claimed or graph.ops[anchor].kind not in anchors:
                continue
            match = find_fusion(graph, template, anchor, {}, claimed)
            if match is None:
                break
            matches.append(match)
            claimed.update(dict.fromkeys(match.op_ids, template.name))
        if len(claimed) != len(graph.ops) or not group.min <= len(matches) <= group.max:
            continue
        owner = {op_id: n for n, m in enumerate(matches) for op_id in m.op_ids}
        if any(owner[u] != owner[v] for u, v in graph.nx.edges()):
            why = f"instances of {template.name} are connected"
            continue
        matches.sort(key=lambda m: min(position[o] for o in m.op_ids))
        experts = [m.bindings for m in matches]
        failed = next((c for c in group.checks if not c.fn(experts, graph)), None)
        if failed is not None:
            why = f"whole-group condition '{failed.text}' fails"
            continue
        return template, matches
    return why


def _region_kinds(graph) -> dict[int, frozenset]:
    """Op id -> the op kinds of its weakly connected part of the graph: every op
    a match anchored there can bind lies in that part."""
    kinds = {}
    for part in nx.weakly_connected_components(graph.nx):
        found = frozenset(graph.ops[op_id].kind for op_id in part)
        kinds.update(dict.fromkeys(part, found))
    return kinds


def fuse(graph, patterns, topo: list[int]) -> tuple[list[Fusion], dict]:
    """Greedy by priority over ops in reverse topological order."""
    owner: dict[int, object] = {}  # op id -> fusion key
    taken: dict[int, str] = {}  # op id -> pattern name
    fusions: list[Fusion] = []
    position = {op_id: i for i, op_id in enumerate(topo)}
    sparse = sparse_op_ids(graph)  # seed 003: ops on sparse tensors join sparse patterns only
    region_kinds = _region_kinds(graph)
    for pattern in patterns:
        if isinstance(pattern, Group):
            found = find_group(graph, pattern, topo, {**sparse, **taken})
            if isinstance(found, str):
                continue
            template, matches = found
            key = ("fusion", len(fusions))
            ops = [o for m in matches for o in m.op_ids]
            for op_id in ops:
                owner[op_id] = key
                taken[op_id] = pattern.name
            bindings = {"template": template.name, "experts": [m.bindings for m in matches]}
            fusions.append(Fusion(sorted(ops, key=position.get), pattern, bindings))
            continue
        anchors = pattern.anchor_kinds()
        required = pattern.required_kinds()
        blocked = taken if not sparse or pattern.name in SPARSE_PATTERN_NAMES else {**sparse, **taken}
        for anchor in reversed(topo):
            if anchor in blocked or graph.ops[anchor].kind not in anchors:
                continue
            # the search would walk every reading of a long post-op chain before it
            # learns that, say, no Convolution exists at all
            if any(kinds.isdisjoint(region_kinds[anchor]) for kinds in required):
                continue
            match = find_fusion(graph, pattern, anchor, owner, blocked)
            if match is None:
                continue
            key = ("fusion", len(fusions))
            for op_id in match.op_ids:
                owner[op_id] = key
                taken[op_id] = blocked[op_id] = pattern.name
            fusions.append(Fusion(sorted(match.op_ids, key=position.get), pattern, match.bindings))
    return fusions, taken


def ordered(graph, fusions: list[Fusion], topo: list[int]) -> list[Fusion]:
    """The order ``Graph.get_partitions`` gives: topological, ties by first op."""
    owner = {op_id: i for i, f in enumerate(fusions) for op_id in f.op_ids}
    condensed = nx.DiGraph()
    condensed.add_nodes_from(range(len(fusions)))
    for u, v in graph.nx.edges():
        if owner[u] != owner[v]:
            condensed.add_edge(owner[u], owner[v])
    position = {op_id: i for i, op_id in enumerate(topo)}
    first = {i: min(position[o] for o in f.op_ids) for i, f in enumerate(fusions)}
    return [fusions[i] for i in nx.lexicographical_topological_sort(condensed, key=first.get)]


def partition_graph(graph, policy, patterns=None) -> list[Fusion]:
    """Fusions covering every op of the finalized ``graph`` exactly once."""
    topo = graph.topological_op_ids()
    if policy == PartitionPolicy.debug:
        fusions = [Fusion([op_id]) for op_id in topo]
    else:
        fusions, taken = fuse(graph, PATTERNS if patterns is None else patterns, topo)
        fusions += [Fusion([op_id]) for op_id in topo if op_id not in taken]
    fusions = ordered(graph, fusions, topo)
    for pid, fusion in enumerate(fusions):
        name = fusion.pattern.name if fusion.pattern is not None else "single op"
        ops = ";".join(f"{graph.ops[o].kind.name}#{o}" for o in fusion.op_ids)
        log(f"partition,partition {pid},{name},{len(fusion.op_ids)} ops,{ops}")
    return fusions

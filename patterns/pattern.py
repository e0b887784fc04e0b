"""Patterns as small data graphs: nodes, edges, optional groups, repetition.

A :class:`Pattern` is a list of nodes, producers first, the last one being the
*sink* the matcher is anchored at.  Every node names a *role* (the key of the
match's ``bindings``) and says:

* ``kinds``: the op kinds it accepts (an alternation: ``{Multiply, Divide}``);
* ``inputs``: edges from other pattern nodes, :class:`In` ``(src, port)``; a
  port may be a tuple of accepted ports (Select's 1-or-2) and ``swap=True``
  also accepts the other operand of a commutative binary op (Add, Multiply,
  Maximum, Minimum).  Ports not listed are free: their tensors come from
  outside the match;
* ``optional``: ``True`` or a group name (all nodes of a group are present or
  absent together; a dotted sub-group ``"causal.br"`` is absent whenever its
  parent ``"causal"`` is).  An absent node passes its ``via`` input through:
  its consumers see the tensor of ``via`` (default: its first edge's source),
  or a free tensor when ``via`` is None;
* ``when``: predicates on the op (:class:`Cond`: dtypes, attributes, ranks);
* ``escape``: output ports whose tensors may also be used outside the
  partition (SoftMax stats, LayerNorm mean/variance, extra outputs).

:class:`Input` is a tensor placeholder (no op): two edges from one Input must
see the same tensor (the gated MLP's shared ``src``).  :class:`Repeat` is a
repeated chain ``{body}*min..max`` (at most :data:`MAX_REPETITION`), each
repetition one of several small :class:`Body` graphs entered at :data:`ENTRY`;
``Repeat(min=1, max=1)`` is an alternation of sub-graphs.  A :class:`Group` is
not a graph but a partition-level grouping: unconnected instances of template
patterns (the experts of a grouped MatMul) as one partition.

Whole-match conditions (:class:`Check`) see the bindings.  The matcher is in
:mod:`graph_api.patterns.matcher`, the partitioner in :mod:`graph_api.patterns.partitioner`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from graph_api.dtypes import DataType
from graph_api.enums import OpKind, PropertyType

#: the longest repeated chain a pattern may declare (oneDNN's MAX_REPETITION)
MAX_REPETITION = 20
#: the source name of a body edge coming from the chain entering the repetition
ENTRY = "<entry>"
#: binary kinds whose two operands may be swapped when matching
COMMUTATIVE = frozenset({OpKind.Add, OpKind.Multiply, OpKind.Maximum, OpKind.Minimum})


@dataclass(frozen=True)
class Cond:
    """A predicate on one op: ``fn(op, graph) -> bool`` plus the text shown
    when it fails (explanations, tests)."""

    text: str
    fn: Callable = field(compare=False)

    def __call__(self, op, graph) -> bool:
        return bool(self.fn(op, graph))


@dataclass(frozen=True)
class Check:
    """A condition on a whole match: ``fn(bindings, graph) -> bool``."""

    text: str
    fn: Callable = field(compare=False)


@dataclass(frozen=True)
class In:
    """An edge: output ``src_port`` of node ``src`` enters input ``port``."""

    src: str
    port: int | tuple = 0
    src_port: int = 0
    swap: bool = False

    def ports(self, kind: OpKind) -> tuple[int, ...]:
        ports = self.port if isinstance(self.port, tuple) else (self.port,)
        if self.swap and kind in COMMUTATIVE:
            ports = ports + tuple(1 - p for p in ports if p in (0, 1) and 1 - p not in ports)
        return ports


_FIRST = "<first input>"


@dataclass(frozen=True)
class Node:
    """One op of the pattern (see the module docstring)."""

    name: str
    kinds: frozenset
    inputs: tuple = ()
    optional: bool | str = False
    via: str | None = _FIRST
    when: tuple = ()
    escape: tuple = ()

    def __post_init__(self):
        kinds = self.kinds
        if isinstance(kinds, OpKind):
            kinds = (kinds,)
        object.__setattr__(self, "kinds", frozenset(kinds))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "when", tuple(self.when))
        if self.via == _FIRST:
            object.__setattr__(self, "via", self.inputs[0].src if self.inputs else None)

    @property
    def group(self) -> str | None:
        return self.optional if isinstance(self.optional, str) else None

    def via_edge(self) -> In | None:
        return next((e for e in self.inputs if e.src == self.via), None)

    def label(self) -> str:
        kinds = "|".join(sorted(k.name for k in self.kinds))
        return f"'{self.name}' ({kinds})"


@dataclass(frozen=True)
class Input:
    """A tensor placeholder: every edge from it must carry the same tensor."""

    name: str
    optional: bool = True
    kinds: frozenset = frozenset()
    inputs: tuple = ()
    escape: tuple = ()

    @property
    def group(self) -> None:
        return None


@dataclass(frozen=True)
class Body:
    """One alternative of a repetition: nodes (the last is the exit) whose
    edges from :data:`ENTRY` take the chain coming into this repetition."""

    name: str
    nodes: tuple

    def __post_init__(self):
        object.__setattr__(self, "nodes", tuple(self.nodes))


@dataclass(frozen=True)
class Repeat:
    """``{bodies}*min..max`` on a chain fed by node ``via`` (None: free)."""

    name: str
    bodies: tuple
    min: int = 0
    max: int = MAX_REPETITION
    via: str | None = None
    via_port: int = 0
    optional: bool = False
    inputs: tuple = ()
    escape: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "bodies", tuple(self.bodies))
        if not 0 <= self.min <= self.max <= MAX_REPETITION:
            raise ValueError(f"repeat {self.name!r}: need 0 <= min <= max <= {MAX_REPETITION}")
        if self.via is not None:
            object.__setattr__(self, "inputs", (In(self.via, 0, self.via_port),))

    @property
    def group(self) -> None:
        return None


@dataclass(frozen=True)
class Pattern:
    """A fusion pattern: ``nodes`` producers first, the last one the sink.

    ``priority`` mirrors oneDNN's pass priorities (higher runs first);
    ``doc`` holds the ASCII diagram and the role names.
    """

    name: str
    priority: float
    nodes: tuple
    checks: tuple = ()
    doc: str = ""
    min_ops: int = 2

    def __post_init__(self):
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "checks", tuple(self.checks))
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"pattern {self.name}: duplicate node names")
        known = set(names)
        for node in self.nodes:
            for edge in node.inputs:
                if edge.src not in known:
                    raise ValueError(f"pattern {self.name}: node {node.name!r} reads unknown {edge.src!r}")
            for body in getattr(node, "bodies", ()):
                local = {n.name for n in body.nodes} | {ENTRY}
                for n in body.nodes:
                    for edge in n.inputs:
                        if edge.src not in local:
                            raise ValueError(f"pattern {self.name}: body {body.name!r} reads {edge.src!r}")

    @property
    def sink(self):
        return self.nodes[-1]

    def node(self, name: str):
        return next(n for n in self.nodes if n.name == name)

    def anchor_kinds(self) -> frozenset:
        """Op kinds the anchor (last op of a match) can have: the sink's, and
        those of the nodes an absent optional sink passes through to."""
        kinds: set = set()
        todo, seen = [self.sink], set()
        while todo:
            node = todo.pop()
            if node.name in seen:
                continue
            seen.add(node.name)
            if isinstance(node, Repeat):
                for body in node.bodies:
                    kinds |= body.nodes[-1].kinds
                if node.min == 0 and node.via:
                    todo.append(self.node(node.via))
                continue
            kinds |= node.kinds
            if node.optional and node.via:
                todo.append(self.node(node.via))
        return frozenset(kinds)

    def required_kinds(self) -> tuple:
        """The kind sets of the nodes every match binds (not optional, outside
        repetitions): a graph region that lacks one of them cannot match."""
        return tuple(n.kinds for n in self.nodes if isinstance(n, Node) and not n.optional)

    def op_kinds(self) -> frozenset:
        kinds: set = set()
        for node in self.nodes:
            kinds |= getattr(node, "kinds", frozenset())
            for body in getattr(node, "bodies", ()):
                for n in body.nodes:
                    kinds |= n.kinds
        return frozenset(kinds)


@dataclass(frozen=True)
class Group:
    """``{template}*min..max``: unconnected instances of one pattern as one partition.

    oneDNN's ``pb_graph_t::append_group(template, min, max)`` (branch
    lvtao/main/gmm-poc, commit 49219738cf: a group node matches disconnected
    instances of a template graph).  As there, a group forms only when its
    instances are *the whole graph*: ``min..max`` instances of one of
    ``templates`` (tried in order, biggest first), matched by the one matcher
    (:func:`graph_api.patterns.partitioner.find_fusion`), every op in exactly one
    instance, no tensor passing from one instance to another.  ``checks`` are
    :class:`Check` s on the list of the instances' bindings.  The partition's
    bindings are ``{"template": name, "experts": [bindings per instance]}``,
    instances in the graph's topological order.
    """

    name: str
    priority: float
    templates: tuple
    min: int = 2
    max: int = 1024
    checks: tuple = ()
    doc: str = ""

    def __post_init__(self):
        object.__setattr__(self, "templates", tuple(self.templates))
        object.__setattr__(self, "checks", tuple(self.checks))
        if not 1 <= self.min <= self.max:
            raise ValueError(f"group {self.name!r}: need 1 <= min <= max")

    def op_kinds(self) -> frozenset:
        return frozenset().union(*(t.op_kinds() for t in self.templates))

    def anchor_kinds(self) -> frozenset:
        return frozenset().union(*(t.anchor_kinds() for t in self.templates))

    def required_kinds(self) -> tuple:
        return ()


# ---------------------------------------------------------------- predicates
def _names(dtypes_: Iterable) -> str:
    return "/".join(d.name for d in dtypes_)


def _lt(graph, lt):
    return graph.tensors.get(lt.id, lt)


def in_dtype(port: int, *allowed: DataType) -> Cond:
    """Input ``port`` has one of the data types (a missing port fails)."""
    allowed_set = frozenset(allowed)
    return Cond(f"input {port} is {_names(allowed)}",
                lambda op, g: port < len(op.inputs) and _lt(g, op.inputs[port]).dtype in allowed_set)


def out_dtype(port: int, *allowed: DataType) -> Cond:
    allowed_set = frozenset(allowed)
    return Cond(f"output {port} is {_names(allowed)}",
                lambda op, g: port < len(op.outputs) and _lt(g, op.outputs[port]).dtype in allowed_set)


def all_inputs_dtype(*allowed: DataType, ports=(0, 1)) -> Cond:
    allowed_set = frozenset(allowed)
    return Cond(f"inputs {'/'.join(map(str, ports))} are {_names(allowed)}",
                lambda op, g: all(p < len(op.inputs) and _lt(g, op.inputs[p]).dtype in allowed_set
                                  for p in ports))


def attr_is(name: str, *values) -> Cond:
    text = "/".join(map(str, values))
    return Cond(f"attribute {name} is {text}", lambda op, g: op.attrs.get(name) in values)


def n_inputs(*counts: int) -> Cond:
    return Cond(f"has {'/'.join(map(str, counts))} inputs", lambda op, g: len(op.inputs) in counts)


def axis_is_last(offset: int) -> Cond:
    """Attribute ``axis`` names dim ``rank - offset`` of input 0 (e.g. 1: last)."""
    def fn(op, g):
        shape = _lt(g, op.inputs[0]).shape
        axis = op.attrs.get("axis")
        if shape is None or not isinstance(axis, int):
            return False
        return axis % len(shape) == len(shape) - offset if shape else False
    return Cond(f"axis is the {'last' if offset == 1 else f'{offset}th from last'} dim", fn)


def input_is_external_const(port: int) -> Cond:
    """Input ``port`` is constant or has no producer (a graph input)."""
    def fn(op, g):
        lt = _lt(g, op.inputs[port])
        return lt.id not in g.producer or lt.property == PropertyType.constant
    return Cond(f"input {port} is constant or a graph input", fn)


def fed_by(port: int, kinds) -> Cond:
    """Input ``port`` is produced by an op of one of ``kinds``."""
    kinds = frozenset(kinds)
    names = "|".join(sorted(k.name for k in kinds))

    def fn(op, g):
        prod = g.producer.get(op.inputs[port].id) if port < len(op.inputs) else None
        return prod is not None and g.ops[prod[0]].kind in kinds
    return Cond(f"input {port} comes from {names}", fn)


def present(*roles: str) -> Check:
    """At least one of the (optional) roles is bound."""
    return Check(f"one of {', '.join(roles)} is present",
                 lambda b, g: any(b.get(r) not in (None, []) for r in roles))


def requires(role: str, needed: str) -> Check:
    """If ``role`` is bound, ``needed`` is bound too."""
    return Check(f"{role} only together with {needed}",
                 lambda b, g: b.get(role) in (None, []) or b.get(needed) not in (None, []))

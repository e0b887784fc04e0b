"""The one generic matcher: a pattern anchored at an op, walking producers.

Matching starts from the pattern's sink with the obligation "the sink's output
is tensor T" (T = the anchor op's first output) and works through obligations
``(node, tensor, producer port)``: a node is either *present* (the producer of
the tensor has one of its kinds, passes its predicates, and each of its edges
becomes a new obligation on that op's input) or, when optional, *absent* (the
obligation passes to its ``via`` node on the same tensor).  A repetition
unrolls one body per step, greedily (longest first).  Edges into commutative
binary ops may take either operand.  Every choice point backtracks, so
:func:`iter_matches` yields all matches, biggest choices first.

Repetitions stay polynomial: a body's own operands (the swish's Sigmoid, the
int8 sum's Dequantize) are checked before the chain below it, and a repetition
step whose search yielded nothing is remembered as dead (see
:meth:`_Matcher.dead_key`); a post-op chain with k ambiguous Sigmoid+Multiply
pairs otherwise costs 3^k walks of the chain below.

Nodes not reachable upward from the sink (extra outputs, e.g. SDPA backward's
dK/dV MatMuls) are matched afterwards, in declaration order, among the
consumers of an already matched producer.

For the partitioner (``leak_free``), a state is dropped as soon as an op that
reads a matched op's internal output is neither matched nor an ancestor of a
pending tensor: no completion could take it in, so every one would leak.
Otherwise the matches that leak come first (a greedy reading of the tail, a
SmoothQuant scale taking a swish's Multiply, leaves its Sigmoid outside) and
fill the partitioner's 64 candidates with rejects: an int8 MatMul with 8
swishes and a Quantize formed 4 partitions instead of oneDNN's 1.

Nothing here knows about a particular pattern; the partitioner decides which
match to take (escaping intermediates, cycles).
"""
from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass

from graph_api.enums import OpKind
from graph_api.errors import op_label

from .pattern import ENTRY, In, Input, Node, Pattern, Repeat

SKIP = "absent"
_REPEAT = "repeat"
#: matcher steps allowed per anchor before giving up (a guard, never hit in practice)
STEP_LIMIT = 200_000
#: matcher steps taken since import, over all anchors (tests bound the search with it, not with time)
steps_taken = 0


class _OutOfSteps(Exception):
    pass


@dataclass
class Match:
    """One way a pattern covers ops of a graph."""

    pattern: Pattern
    anchor: int
    bindings: dict
    roles: dict  # op id -> node name (repetition instances as 'post_ops[2].op')
    escape: dict  # op id -> output ports allowed to be used outside

    @property
    def op_ids(self) -> set:
        return set(self.roles)


@dataclass(frozen=True)
class Note:
    """One dead end of a match attempt."""

    score: float  # ops bound when it failed (a repeated post-op counts 1/4)
    reason: str
    ops: frozenset = frozenset()
    pattern: str | None = None
    anchor: int | None = None
    subject: int | None = None  # the op a condition failed on (a near miss)

    def rank(self, focus: int | None = None) -> float:
        """Ops bound, +0.5 for a near miss, +100 when the near miss is ``focus``."""
        if self.subject is None:
            return self.score
        return self.score + (100 if self.subject == focus else 0.5)

    def involves(self, op_id: int) -> bool:
        return op_id in self.ops or op_id in (self.subject, self.anchor)


class Trace:
    """Every dead end of some match attempts (for explanations and tests)."""

    def __init__(self):
        self.notes: list[Note] = []

    def note(self, score: float, reason: str, ops=(), pattern=None, anchor=None, subject=None) -> None:
        self.notes.append(Note(score, reason, frozenset(ops), pattern, anchor, subject))

    def best(self, focus: int | None = None) -> Note | None:
        """The furthest dead end (involving ``focus`` if given); the last among
        equals (after optional nodes were tried, the required one failed)."""
        best = None
        for note in self.notes:
            if focus is not None and not note.involves(focus):
                continue
            if best is None or note.rank(focus) >= best.rank(focus):
                best = note
        return best

    @property
    def reason(self) -> str | None:
        best = self.best()
        return None if best is None else best.reason


def weight(roles) -> float:
    """How much of a pattern a set of bound roles is: repetition steps count 1/4."""
    return sum(0.25 if "[" in role else 1.0 for role in roles)


class _State:
    __slots__ = ("env", "out", "used", "groups", "nodes", "counts", "inst", "bits", "need")

    def __init__(self):
        self.env: dict = {}  # node name -> op id | SKIP | _REPEAT | "input"
        self.out: dict = {}  # (ref, producer port) -> tensor id, for absent nodes/inputs/repeats
        self.used: dict = {}  # op id -> node name
        self.groups: dict = {}  # optional group -> present?
        self.nodes: dict = {}  # instantiated repetition nodes
        self.counts: dict = {}  # repeat name -> repetitions taken
        self.inst: dict = {}  # (repeat name, i) -> instance node names
        self.bits = 0  # the used ops as _Ancestry bits
        self.need = 0  # bits of the ops that read a used op's output that may not leave the match

    def copy(self) -> "_State":
        new = _State.__new__(_State)
        new.env, new.out, new.used = dict(self.env), dict(self.out), dict(self.used)
        new.groups, new.nodes = dict(self.groups), dict(self.nodes)
        new.counts, new.inst = dict(self.counts), dict(self.inst)
        new.bits, new.need = self.bits, self.need
        return new


def _walk(by_name: dict, start: str, follow, avoid: str | None = None) -> set:
    """Names reached from ``start`` through ``follow(node) -> source names``, not through ``avoid``."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name not in seen and name != avoid:
            seen.add(name)
            todo += follow(by_name[name])
    return seen


def _sources(node) -> list:
    return [e.src for e in node.inputs] + ([node.via] if isinstance(node, Repeat) and node.via else [])


def _maybe_downward(pattern: Pattern) -> frozenset:
    """Nodes :meth:`_Matcher.downward` may bind (among the consumers of a
    matched tensor) once the upward walk is done: nodes with inputs that a
    match may leave unvisited (off the path every match walks from the sink
    through required edges and the ``via`` of absent nodes) and whose input
    nodes can have a tensor without them (reachable another way, or such a
    node themselves).  An int8 MatMul's residual TypeCast is not one: only it
    leads to its Dequantize, so unvisited it has no tensor to look below."""
    by_name = {n.name: n for n in pattern.nodes}

    def must(node):
        if isinstance(node, Node):
            edge = node.via_edge()  # what skip() follows when the node is absent
            return [e.src for e in node.inputs] if not node.optional else [edge.src] if edge else []
        return _sources(node)

    walked = _walk(by_name, pattern.sink.name, must)
    candidates = {n.name for n in pattern.nodes if isinstance(n, Node) and n.inputs and n.name not in walked}
    found: set = set()

    def has_tensor(name, reached) -> bool:
        node = by_name[name]
        if name in reached or name in found:
            return True
        # an absent node stands for its via's tensor
        return isinstance(node, Node) and bool(node.optional) and node.via is not None \
            and node.via != name and has_tensor(node.via, reached)

    while True:
        more = set()
        for name in candidates - found:
            reached = _walk(by_name, pattern.sink.name, _sources, avoid=name)
            if any(has_tensor(src, reached) for src in _sources(by_name[name])):
                more.add(name)
        if not more:
            return frozenset(found)
        found |= more


class _Ancestry:
    """Per graph: op ids as bits and, per tensor, the bits of the ops it depends on."""

    def __init__(self, graph):
        # not the graph itself: the cache below holds this only while the graph lives
        self.producer, self.ops = graph.producer, graph.ops
        self.consumers = graph.consumers
        self.bits: dict = {}  # op id -> 1 << dense index
        self.masks: dict = {}  # tensor id -> bits of its producer and that op's ancestors
        self.near: dict = {}  # tensor id -> bits of those ops and of every op reading their outputs

    def bit(self, op_id) -> int:
        b = self.bits.get(op_id)
        if b is None:
            b = self.bits[op_id] = 1 << len(self.bits)
        return b

    def of(self, tid) -> int:
        self.of_near(tid)
        return self.masks[tid]

    def of_near(self, tid) -> int:
        """Bits of the ops ``tid`` depends on and of their consumers (:meth:`of` fills both)."""
        masks, near, producer, ops = self.masks, self.near, self.producer, self.ops
        stack = [tid]
        while stack:  # iterative post-order: graphs can be deeper than Python's recursion
            t = stack[-1]
            if t in masks:
                stack.pop()
                continue
            prod = producer.get(t)
            if prod is None:
                masks[t] = near[t] = 0
                stack.pop()
                continue
            op = ops[prod[0]]
            inputs = [lt.id for lt in op.inputs]
            pending = [i for i in inputs if i not in masks]
            if pending:
                stack += pending
                continue
            mask = self.bit(prod[0])
            around = mask
            for lt in op.outputs:
                for c, _ in self.consumers.get(lt.id, ()):
                    around |= self.bit(c)
            for i in inputs:
                mask |= masks[i]
                around |= near[i]
            masks[t], near[t] = mask, around
            stack.pop()
        return near[tid]


_ANCESTRY: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _ancestry(graph) -> _Ancestry:
    found = _ANCESTRY.get(graph)
    if found is None:
        found = _ANCESTRY[graph] = _Ancestry(graph)
    return found


class _Matcher:
    def __init__(self, graph, pattern: Pattern, taken: dict, trace: Trace | None, anchor: int,
                 leak_free: bool = False):
        self.graph = graph
        self.leak_free = leak_free
        self.pattern = pattern
        self.taken = taken
        self.trace = trace
        self.anchor = anchor
        self.by_name = {n.name: n for n in pattern.nodes}
        self.steps = 0
        self.dead: set = set()  # dead_key()s of repetition steps whose search yielded nothing
        self.maybe_downward = None  # _maybe_downward(pattern), once a repetition or a leak needs it
        self.ancestry = _ancestry(graph)
        self.outputs = set(graph.output_ids)

    # ------------------------------------------------------------ helpers
    def node(self, st: _State, name):
        return st.nodes.get(name) or self.by_name[name]

    def fail(self, st: _State, reason: str, subject: int | None = None) -> None:
        """Note a dead end; ``subject`` is the op a condition failed on."""
        if self.trace is not None:
            self.trace.note(weight(st.used.values()), reason, st.used, self.pattern.name,
                            self.anchor, subject)

    def op_problem(self, st: _State, node: Node, op) -> tuple[str | None, int | None]:
        """(why ``op`` cannot be ``node`` or None, the op if it was a near miss)."""
        if op.kind not in node.kinds:
            return f"node {node.label()} cannot be {op_label(op)}", None
        if op.id in self.taken:
            return f"{op_label(op)} is already in a '{self.taken[op.id]}' partition", op.id
        if op.id in st.used:
            return f"{op_label(op)} is already matched as '{st.used[op.id]}'", None
        for cond in node.when:
            if not cond(op, self.graph):
                return f"{op_label(op)} as '{node.name}': condition '{cond.text}' fails", op.id
        return None, None

    @staticmethod
    def forced(st: _State, node) -> bool | None:
        """Group decision for ``node``: True/False once its group (or, for a
        dotted sub-group 'a.b', its parent 'a' being absent) decided it."""
        group = node.group
        if not group:
            return None
        if group in st.groups:
            return st.groups[group]
        parent = group.rpartition(".")[0]
        while parent:
            if st.groups.get(parent) is False:
                return False
            parent = parent.rpartition(".")[0]
        return None

    def value(self, st: _State, ref, port: int):
        """The tensor a (possibly absent) node stands for, or None if unknown/free."""
        for _ in range(10_000):
            if (ref, port) in st.out:
                return st.out[(ref, port)]
            if isinstance(ref, tuple):
                return None
            bound = st.env.get(ref)
            if isinstance(bound, int):
                outs = self.graph.ops[bound].outputs
                return outs[port].id if port < len(outs) else None
            if bound != SKIP:
                return None
            node = self.node(st, ref)
            edge = node.via_edge() if isinstance(node, Node) else None
            if edge is None:
                return None
            ref, port = edge.src, edge.src_port
        return None

    def upward_only(self, st: _State) -> bool:
        """True once the rest of the search binds only producers of pending
        tensors and their ancestors (no node :func:`_maybe_downward` names is
        unresolved)."""
        if self.maybe_downward is None:
            self.maybe_downward = _maybe_downward(self.pattern)
        return all(name in st.env for name in self.maybe_downward)

    def leaks(self, node: Node, op):
        """Outputs of ``op`` bound as ``node`` that may not leave the match:
        ``[(tensor id, consumer ids)]``; an empty consumer list is a graph output.

        The anchor's outputs and the node's ``escape`` ports may leave; so may a
        tensor an End op reads (when the End is in the match, see
        :func:`~graph_api.patterns.partitioner.escaping`; left to the partitioner).
        """
        if op.id == self.anchor or not self.leak_free:
            return []
        found = []
        for port, lt in enumerate(op.outputs):
            if port in node.escape:
                continue
            users = self.graph.consumers.get(lt.id, [])
            if any(self.graph.ops[c].kind == OpKind.End for c, _ in users):
                continue
            if users:
                found.append((lt.id, [c for c, _ in users]))
            elif lt.id in self.outputs:
                found.append((lt.id, []))
        return found

    def leaking(self, st: _State, todo: tuple) -> int | None:
        """Bits of the ops that read a used op's internal output and can no
        longer join the match (every completion of ``st`` would be rejected by
        :func:`~graph_api.patterns.partitioner.escaping`), or None."""
        open_ = st.need & ~st.bits
        if not open_ or not self.upward_only(st):
            return None
        for _, tid, _ in todo:
            open_ &= ~self.ancestry.of(tid)
            if not open_:
                return None
        return open_

    def leak_reason(self, st: _State, bits: int) -> tuple[str, int]:
        """The first used op (by id) whose output one of ``bits`` reads, as the partitioner words it."""
        for op_id in sorted(st.used):
            op = self.graph.ops[op_id]
            for tid, users in self.leaks(self.node(st, st.used[op_id]), op):
                for c in users:
                    if self.ancestry.bit(c) & bits:
                        return (f"intermediate tensor {tid} ({op_label(op)} as '{st.used[op_id]}') "
                                f"is also used by op {c} outside the match"), op_id
        raise AssertionError("leaking bits read no used op's output")

    def dead_key(self, st: _State, todo: tuple) -> tuple:
        """Everything the search from ``(st, todo)`` can depend on, to remember dead ends.

        Two states with equal keys search alike (up to role names), so one
        that yielded nothing yields nothing again.  Left out of the key: the
        finished repetition instances (only a result lists them) and the used
        ops the search cannot reach.  It binds only the producers of pending
        tensors and their ancestors, unless a node :func:`_maybe_downward`
        names is still unresolved (then :meth:`downward` may bind a consumer
        anywhere and every used op counts).  So reading a swish as a swish or
        as a lone binary Multiply (its Sigmoid outside) leaves the same search
        below it, searched once.
        """
        local, tuples, todo_refs = set(), set(), [ref for ref, _, _ in todo]
        while todo_refs:
            ref = todo_refs.pop()
            if isinstance(ref, tuple):
                tuples.add(ref)
            elif ref not in self.by_name and ref not in local:
                local.add(ref)
                node = st.nodes[ref]
                todo_refs += [e.src for e in node.inputs] + ([node.via] if node.via else [])
        used = st.bits
        if self.upward_only(st):
            # pruning leaks also reads whether the consumers of those ops are used
            around = self.ancestry.of_near if self.leak_free else self.ancestry.of
            reach = 0
            for _, tid, _ in todo:
                reach |= around(tid)
            used &= reach
        return (todo,
                frozenset((k, v) for k, v in st.env.items() if k in self.by_name),
                tuple((ref, st.env.get(ref), st.nodes[ref]) for ref in sorted(local)),
                frozenset(item for item in st.out.items()
                          if item[0][0] in self.by_name or item[0][0] in local or item[0][0] in tuples),
                frozenset(st.groups.items()), used, st.need & ~st.bits, self.anchor in st.used)

    # ------------------------------------------------------------ search
    def solve(self, st: _State, todo: tuple):
        self.steps += 1
        if self.steps > STEP_LIMIT:
            raise _OutOfSteps
        leak = self.leaking(st, todo)
        if leak:
            self.fail(st, *self.leak_reason(st, leak))
            return
        if not todo:
            node = self.next_unresolved(st)
            if node is None:
                yield st
            else:
                yield from self.downward(st, node)
            return
        (ref, tid, port), rest = todo[0], todo[1:]
        if isinstance(ref, tuple):
            # the same step pending twice (swish: Sigmoid and Multiply both read the
            # chain) is one obligation: once this one holds, the copy holds too
            rest = tuple(ob for ob in rest if ob != todo[0])
            key = self.dead_key(st, ((ref, tid, port),) + rest)
            if key in self.dead:
                return
            found = False
            for done in self.repeat_step(st, ref, tid, port, rest):
                found = True
                yield done
            if not found:  # searched to the end (an early close or _OutOfSteps skips this)
                self.dead.add(key)
            return
        node = self.node(st, ref)
        bound = st.env.get(ref)
        if isinstance(bound, int):
            if self.graph.producer.get(tid) == (bound, port):
                yield from self.solve(st, rest)
            else:
                prod = self.graph.producer.get(tid)
                self.fail(st, f"node '{ref}' is op {bound}, but tensor {tid} comes from elsewhere",
                          prod[0] if prod else None)
            return
        if (ref, port) in st.out:
            if st.out[(ref, port)] == tid:
                yield from self.solve(st, rest)
            else:
                self.fail(st, f"'{ref}' must be one tensor, found {st.out[(ref, port)]} and {tid}")
            return
        if isinstance(node, Input):
            new = st.copy()
            new.env[ref] = "input"
            new.out[(ref, port)] = tid
            yield from self.solve(new, rest)
            return
        if isinstance(node, Repeat):
            new = st.copy()
            new.env[ref] = _REPEAT
            new.out[(ref, port)] = tid
            yield from self.solve(new, (((ref, 0), tid, port),) + rest)
            return
        if bound == SKIP:
            yield from self.skip(st, node, tid, port, rest)
            return
        forced = self.forced(st, node)
        if forced is not False:
            yield from self.present(st, node, tid, port, rest)
        if node.optional and forced is not True:
            yield from self.skip(st, node, tid, port, rest)

    def present(self, st, node: Node, tid, port, rest):
        prod = self.graph.producer.get(tid)
        if prod is None:
            self.fail(st, f"node {node.label()} has no op to match: tensor {tid} is a graph input")
            return
        if prod[1] != port:
            self.fail(st, f"node {node.label()}: tensor {tid} is output {prod[1]} of op {prod[0]}, not {port}",
                      prod[0])
            return
        op = self.graph.ops[prod[0]]
        problem, near = self.op_problem(st, node, op)
        if problem:
            self.fail(st, problem, near)
            return
        yield from self.bind(st, node, op, rest)

    def bind(self, st, node: Node, op, rest):
        need = 0
        for tid, users in self.leaks(node, op):
            if not users:
                self.fail(st, f"intermediate tensor {tid} ({op_label(op)} as '{node.name}') is a graph output",
                          op.id)
                return
            for c in users:
                need |= self.ancestry.bit(c)
        found = False
        for ports in self.assignments(node, op):
            found = True
            new = st.copy()
            new.env[node.name] = op.id
            new.used[op.id] = node.name
            new.bits |= self.ancestry.bit(op.id)
            new.need |= need
            if node.group:
                new.groups[node.group] = True
            todo = tuple((e.src, op.inputs[p].id, e.src_port) for e, p in zip(node.inputs, ports))
            # a body's own operands before the chain below it (stable sort: repetition
            # steps last): a wrong reading of a swish or an int8 sum then fails at once,
            # not after every way of matching the rest of the chain.  The library's body
            # operands are required nodes with one reading each, so matches come in the
            # same order as before
            todo = tuple(sorted(todo, key=lambda ob: isinstance(ob[0], tuple)))
            yield from self.solve(new, todo + rest)
        if not found:
            self.fail(st, f"{op_label(op)} as '{node.name}': has too few inputs for the pattern's edges")

    @staticmethod
    def assignments(node: Node, op):
        choices = [[p for p in e.ports(op.kind) if p < len(op.inputs)] for e in node.inputs]
        for ports in itertools.product(*choices):
            if len(set(ports)) == len(ports):
                yield ports

    def skip(self, st, node: Node, tid, port, rest):
        new = st.copy()
        new.env[node.name] = SKIP
        new.out[(node.name, port)] = tid
        if node.group:
            new.groups[node.group] = False
        edge = node.via_edge()
        todo = rest if edge is None else ((edge.src, tid, edge.src_port),) + rest
        yield from self.solve(new, todo)

    def repeat_step(self, st, ref, tid, port, rest):
        name, i = ref
        rep: Repeat = self.node(st, name)
        key = (ref, port)
        if key in st.out:
            if st.out[key] == tid:
                yield from self.solve(st, rest)
            else:
                self.fail(st, f"repetition '{name}' step {i} must be one tensor")
            return
        if i < rep.max:
            for body in rep.bodies:
                new = st.copy()
                new.out[key] = tid
                exit_name = self.instantiate(new, rep, body, i)
                yield from self.solve(new, ((exit_name, tid, port),) + rest)
        if i >= rep.min:
            new = st.copy()
            new.out[key] = tid
            new.counts[name] = i
            todo = rest if rep.via is None else ((rep.via, tid, rep.via_port),) + rest
            yield from self.solve(new, todo)
        else:
            self.fail(st, f"repetition '{name}' needs at least {rep.min} ops, found {i}")

    @staticmethod
    def instantiate(st: _State, rep: Repeat, body, i: int) -> str:
        names = {n.name: f"{rep.name}[{i}].{n.name}" for n in body.nodes}

        def ref(src):
            return (rep.name, i + 1) if src == ENTRY else names[src]

        for n in body.nodes:
            inputs = tuple(In(ref(e.src), e.port, e.src_port, e.swap) for e in n.inputs)
            via = None if n.via is None else ref(n.via)
            st.nodes[names[n.name]] = Node(names[n.name], n.kinds, inputs, n.optional, via,
                                           n.when, n.escape)
        st.inst[(rep.name, i)] = tuple(names[n.name] for n in body.nodes)
        return names[body.nodes[-1].name]

    # ------------------------------------------------------------ nodes off the sink's tree
    def next_unresolved(self, st: _State):
        for node in self.pattern.nodes:
            if node.name not in st.env:
                return node
        return None

    def downward(self, st: _State, node):
        if not isinstance(node, Node):
            if isinstance(node, Repeat) and node.min > 0:
                self.fail(st, f"repetition '{node.name}' is not connected to the match")
                return
            new = st.copy()
            new.env[node.name] = SKIP
            yield from self.solve(new, ())
            return
        forced = self.forced(st, node)
        if forced is not False:
            edge, tid = None, None
            for edge in node.inputs:
                tid = self.value(st, edge.src, edge.src_port)
                if tid is not None:
                    break
            if tid is None:
                if not node.optional:
                    self.fail(st, f"required node {node.label()} has no matched producer")
            else:
                for consumer, port in self.graph.consumers.get(tid, []):
                    op = self.graph.ops[consumer]
                    if port not in edge.ports(op.kind):
                        continue
                    problem, near = self.op_problem(st, node, op)
                    if problem:
                        self.fail(st, problem, near)
                        continue
                    yield from self.bind(st, node, op, ())
                if not node.optional:
                    self.fail(st, f"no consumer of tensor {tid} matches required node {node.label()}")
        if node.optional and forced is not True:
            new = st.copy()
            new.env[node.name] = SKIP
            if node.group:
                new.groups[node.group] = False
            yield from self.solve(new, ())

    # ------------------------------------------------------------ results
    def to_match(self, st: _State) -> Match:
        bindings = {}
        for node in self.pattern.nodes:
            if isinstance(node, Input):
                continue
            if isinstance(node, Repeat):
                ops = []
                for i in reversed(range(st.counts.get(node.name, 0))):
                    ops.extend(st.env[inst] for inst in st.inst[(node.name, i)])
                bindings[node.name] = ops
            else:
                bound = st.env.get(node.name)
                bindings[node.name] = bound if isinstance(bound, int) else None
        escape = {}
        for op_id, name in st.used.items():
            ports = tuple(self.node(st, name).escape)
            if op_id == self.anchor:
                ports = tuple(range(len(self.graph.ops[op_id].outputs)))
            escape[op_id] = ports
        return Match(self.pattern, self.anchor, bindings, dict(st.used), escape)


def iter_matches(graph, pattern: Pattern, anchor: int, taken: dict | None = None,
                 trace: Trace | None = None, leak_free: bool = False):
    """Every match of ``pattern`` whose last op is ``anchor`` (biggest choices first).

    ``taken`` maps op ids already in a fused partition to that partition's
    pattern name; those ops are never matched.  Failures are noted in ``trace``.
    ``leak_free`` leaves out matches whose intermediates escape (the
    partitioner rejects them), pruned as soon as an op that reads one can no
    longer join the match; the others come in the same order.  A tensor an End
    op reads is left to the partitioner.
    """
    op = graph.ops[anchor]
    if not op.outputs:
        return
    matcher = _Matcher(graph, pattern, taken or {}, trace, anchor, leak_free)
    start = ((pattern.sink.name, op.outputs[0].id, 0),)
    global steps_taken
    try:
        for st in matcher.solve(_State(), start):
            if anchor in st.used:
                yield matcher.to_match(st)
    except _OutOfSteps:
        if trace is not None:
            trace.note(0, f"pattern {pattern.name}: search budget exhausted at op {anchor}",
                       (anchor,), pattern.name, anchor)
    finally:
        steps_taken += matcher.steps

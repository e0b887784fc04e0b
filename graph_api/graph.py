"""``Graph``: ops connected by logical-tensor ids, finalized into a networkx DAG."""
from __future__ import annotations

import networkx as nx

from . import backend, dump, json_io
from .composite_inline import expand
from .enums import EngineKind, FPMathMode, GraphDumpMode, PartitionPolicy, PropertyType, parse_enum
from .errors import GraphError, InvalidArguments, InvalidGraph, Status, op_label
from .fpmath import FPMath
from .infer import propagate
from .logical_tensor import UNKNOWN_DIM, LogicalTensor
from .op import Op
from .opset import OP_SCHEMAS
from .schema import verify_op
from . import sparse_ops



def _compatible(a: LogicalTensor, b: LogicalTensor) -> bool:
    """Two uses of one tensor id agree: same dtype/property, shapes not clashing."""
    prop = lambda lt: PropertyType.variable if lt.property == PropertyType.undef else lt.property
    if a.dtype != b.dtype or prop(a) != prop(b):
        return False
    if a.shape is None or b.shape is None:
        return True
    if len(a.shape) != len(b.shape):
        return False
    return all(x == y or UNKNOWN_DIM in (x, y) for x, y in zip(a.shape, b.shape))


def _more_concrete(a: LogicalTensor, b: LogicalTensor) -> LogicalTensor:
    if a.shape is None:
        return b
    if b.shape is None:
        return a
    return a if sum(d >= 0 for d in a.shape) >= sum(d >= 0 for d in b.shape) else b


class Graph:
    """A oneDNN graph: add ops, ``finalize()``, ``get_partitions()``.

    After finalize, ``graph.nx`` is a networkx MultiDiGraph whose nodes are op
    ids (node attribute ``op``) and whose edges run producer -> consumer with
    key = tensor id and attributes ``lt``, ``src_port``, ``dst_port``.
    """

    def __init__(self, engine_kind=EngineKind.cpu, fpmath_mode=FPMathMode.strict, apply_to_int=False):
        self.engine_kind = parse_enum(EngineKind, engine_kind, "engine kind")
        self.fpmath = FPMath.make(fpmath_mode, apply_to_int)
        self.ops: dict[int, Op] = {}
        self.nx: nx.MultiDiGraph | None = None
        self.tensors: dict[int, LogicalTensor] = {}
        self.producer: dict[int, tuple[int, int]] = {}
        self.consumers: dict[int, list[tuple[int, int]]] = {}
        self.input_ids: list[int] = []
        self.output_ids: list[int] = []
        self._finalized = False

    # ------------------------------------------------------------ building
    def set_fpmath_mode(self, mode, apply_to_int: bool = False) -> None:
        if self._finalized:
            raise InvalidGraph("set_fpmath_mode: the graph is already finalized")
        self.fpmath = FPMath.make(mode, apply_to_int)

    def get_fpmath_mode(self) -> tuple[FPMathMode, bool]:
        return self.fpmath.mode, self.fpmath.apply_to_int

    def add_op(self, op: Op, allow_exception: bool = True):
        """Verify ``op`` against its schema and store a copy with defaults.

        As in oneDNN, an op whose id is already in the graph is ignored.
        With ``allow_exception=False`` the error's status is returned instead.
        """
        try:
            if not isinstance(op, Op):
                raise InvalidArguments(f"add_op needs an Op, got {type(op).__name__}")
            if self._finalized:
                raise InvalidGraph(f"add_op({op_label(op)}): the graph is already finalized")
            if op.id in self.ops:
                return Status.success
            stored = op.copy()
            verify_op(stored, OP_SCHEMAS)
            sparse_ops.check(stored, lambda lt: lt.encoding)  # the closed world of sparse ops
            self.ops[op.id] = stored
            return Status.success
        except GraphError as err:
            if allow_exception:
                raise
            return err.status

    def is_finalized(self) -> bool:
        return self._finalized

    # ------------------------------------------------------------ finalize
    def finalize(self) -> None:
        """Connect ops by tensor id, check consistency and acyclicity, infer shapes."""
        if self._finalized:
            return
        if not self.ops:
            raise InvalidGraph("finalize: the graph has no ops")
        tensors, producer, consumers = {}, {}, {}
        for op in self.ops.values():
            for port, lt in enumerate(op.inputs):
                self._record(tensors, lt, op)
                consumers.setdefault(lt.id, []).append((op.id, port))
            for port, lt in enumerate(op.outputs):
                self._record(tensors, lt, op)
                if lt.id in producer:
                    other = self.ops[producer[lt.id][0]]
                    raise InvalidGraph(
                        f"tensor {lt.id} is produced by both {op_label(other)} and {op_label(op)}")
                producer[lt.id] = (op.id, port)
        graph = nx.MultiDiGraph()
        for op in self.ops.values():
            graph.add_node(op.id, op=op)
        for tid, (src, src_port) in producer.items():
            for dst, dst_port in consumers.get(tid, []):
                graph.add_edge(src, dst, key=tid, lt=tensors[tid], src_port=src_port, dst_port=dst_port)
        if not nx.is_directed_acyclic_graph(graph):
            cycle = nx.find_cycle(graph)
            path = " -> ".join(f"op {u}" for u, *_ in cycle)
            raise InvalidGraph(f"the graph has a cycle: {path} -> op {cycle[0][0]}")
        self.nx, self.producer, self.consumers = graph, producer, consumers
        order = {op_id: i for i, op_id in enumerate(self.ops)}
        self._topo = list(nx.lexicographical_topological_sort(graph, key=order.get))
        seen = set()
        self.input_ids = [lt.id for op in self.ops.values() for lt in op.inputs
                          if lt.id not in producer and not (lt.id in seen or seen.add(lt.id))]
        # outputs: tensors nobody consumes, and tensors an End op marks as outputs
        self.output_ids = [tid for tid in producer
                           if not consumers.get(tid)
                           or any(self.ops[c].kind.name == "End" for c, _ in consumers[tid])]
        known = {tid: tensors[tid] for tid in self.input_ids}
        for tid, lt in tensors.items():
            known.setdefault(tid, lt)
        self.tensors = propagate([self.ops[i] for i in self._topo], known, OP_SCHEMAS)
        for op in self.ops.values():  # sparse encodings declared on another use of a tensor id
            sparse_ops.check(op, lambda lt: self.tensors[lt.id].encoding)
        self._finalized = True

    def _record(self, tensors, lt, op):
        seen = tensors.get(lt.id)
        if seen is None:
            tensors[lt.id] = lt
        elif not _compatible(seen, lt) or None not in (seen.encoding, lt.encoding) and seen.encoding != lt.encoding:
            raise InvalidGraph(
                f"tensor {lt.id} is used with different metadata: {seen!r} and {lt!r} (at {op_label(op)})")
        else:
            # a sparse encoding declared on any use of the tensor id holds for all of them
            merged = _more_concrete(seen, lt)
            encoding = seen.encoding or lt.encoding
            tensors[lt.id] = merged if merged.encoding == encoding else merged.with_encoding(encoding)

    def topological_op_ids(self) -> list[int]:
        self._require_finalized("topological_op_ids")
        return list(self._topo)

    def _require_finalized(self, what: str) -> None:
        if not self._finalized:
            raise InvalidGraph(f"{what}: the graph must be finalized first")

    # ------------------------------------------------------------ partitions
    def get_partitions(self, policy=PartitionPolicy.fusion):
        """Partitions covering every op once, in topological order of the fused graph."""
        from .partition import Partition  # partition.py builds on Graph: the one upward reference

        self._require_finalized("get_partitions")
        policy = parse_enum(PartitionPolicy, policy, "partition policy")
        dumping = dump.enabled(GraphDumpMode.graph)
        if dumping:
            dump.dump_graph(self)
        graph = self._with_composites_decided(policy)
        fusions = backend.partition_graph(graph, policy)
        owner = {op_id: i for i, f in enumerate(fusions) for op_id in f.op_ids}
        assert len(owner) == len(graph.ops), "a partitioner must cover every op exactly once"
        condensed = nx.DiGraph()
        condensed.add_nodes_from(range(len(fusions)))
        for u, v in graph.nx.edges():
            if owner[u] != owner[v]:
                condensed.add_edge(owner[u], owner[v])
        position = {op_id: i for i, op_id in enumerate(graph._topo)}
        first = {i: min(position[o] for o in f.op_ids) for i, f in enumerate(fusions)}
        order = list(nx.lexicographical_topological_sort(condensed, key=first.get))
        partitions = [Partition(pid, graph, fusions[i]) for pid, i in enumerate(order)]
        if dumping:
            dump.dump_partitioning(graph, partitions)
        return partitions

    def _with_composites_decided(self, policy) -> "Graph":
        """Extension (Composite ops): this graph, or a copy in which each Composite op
        is either kept (it has a fast kernel) or replaced by its decomposition's ops;
        partitions then refer to that copy (``graph_api.composite_inline``)."""
        if not any(op.kind.name == "Composite" for op in self.ops.values()):
            return self
        return expand(self, policy).graph

    # ------------------------------------------------------------ JSON
    @staticmethod
    def from_json(path_or_text, finalize: bool = True) -> "Graph":
        """A graph from oneDNN graph JSON: a path, the text or a parsed dict (see json_io)."""
        return json_io.from_json(path_or_text, finalize)

    def to_json(self) -> str:
        """This graph as oneDNN graph JSON text (see json_io)."""
        return json_io.to_json(self)

    def explain_partitions(self):
        """Why ops were not fused: for each op in a single-op partition, the
        nearest pattern and the condition that failed (``graph_api.patterns.explain``)."""
        self._require_finalized("explain_partitions")
        expansion = expand(self)
        return backend.explain_partitions(expansion.graph, expansion.decisions)

    # ------------------------------------------------------------ inspection
    def get_ops(self) -> list[Op]:
        return list(self.ops.values())

    def get_input_ports(self) -> list[LogicalTensor]:
        self._require_finalized("get_input_ports")
        return [self.tensors[t] for t in self.input_ids]

    def get_output_ports(self) -> list[LogicalTensor]:
        self._require_finalized("get_output_ports")
        return [self.tensors[t] for t in self.output_ids]

    def __str__(self) -> str:
        head = f"graph(engine={self.engine_kind.name}, fpmath={self.fpmath}, ops={len(self.ops)})"
        order = self._topo if self._finalized else list(self.ops)
        lines = [head]
        for op_id in order:
            op = self.ops[op_id]
            if self._finalized:
                op = _with_known(op, self.tensors)
            lines.append("  " + repr(op))
        return "\n".join(lines)


def _with_known(op: Op, tensors) -> Op:
    view = op.copy()
    view.inputs = [tensors.get(lt.id, lt) for lt in op.inputs]
    view.outputs = [tensors.get(lt.id, lt) for lt in op.outputs]
    return view

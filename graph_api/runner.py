"""Running a whole graph: compile and execute its partitions in order.

This is what the samples, the command line and the conformance tests use; it
is plain public API (compile + execute per partition) with tensors passed
from one partition to the next.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from . import dtypes
from .config import log
from .engine import Engine, Stream
from .enums import LayoutType, OpKind, PartitionPolicy, PropertyType
from .errors import InvalidArguments, Unimplemented
from .logical_tensor import LogicalTensor, dense_strides
from .memory import check_graph
from .tensor import Tensor, make_scalar_tensor, self_overlapping
from .config import get_memory_budget, settings


@dataclass
class PartitionRun:
    """What happened to one partition: for tables and verbose output."""

    partition: object
    compiled: object = None
    compile_ms: float = 0.0
    execute_ms: float = 0.0


@dataclass
class GraphRun:
    outputs: dict[int, np.ndarray]
    partitions: list[PartitionRun] = field(default_factory=list)


def _input_lt(port: LogicalTensor, value) -> LogicalTensor:
    if isinstance(value, Tensor):
        return value.get_logical_tensor()
    if port.property == PropertyType.host_scalar:
        return port
    shape = tuple(value.shape)
    strides = port.strides if (port.shape == shape and port.strides is not None) else dense_strides(shape)
    return LogicalTensor(port.id, port.dtype, shape, strides, property=port.property, encoding=port.encoding)


def _shape_of(port: LogicalTensor, value) -> tuple:
    if isinstance(value, Tensor):
        return tuple(value.get_logical_tensor().shape)
    if port.property == PropertyType.host_scalar:
        return port.shape
    # sparse feeds (SparseStorage, scipy.sparse) have a shape but are not arrays
    return tuple(value.shape) if hasattr(value, "shape") else tuple(np.shape(value))


def _tensor(lt: LogicalTensor, value, engine) -> Tensor:
    if isinstance(value, Tensor):
        return value
    if lt.property == PropertyType.host_scalar:
        return make_scalar_tensor(lt, value)
    if lt.encoding is not None:  # sparse: dense array, SparseStorage or scipy.sparse matrix
        return Tensor(lt, engine, value)
    value = np.asarray(value)
    if value.dtype != dtypes.numpy_dtype(lt.dtype):
        value = dtypes.convert(value, lt.dtype)
    tensor = Tensor(lt, engine, value)
    # a self-overlapping input layout (a broadcast view) holds only values that
    # agree wherever elements share memory; anything else would be lost silently
    if self_overlapping(tensor.lt.shape, tensor.lt.strides) and np.ascontiguousarray(tensor.numpy()).tobytes() != \
            np.ascontiguousarray(value).tobytes():
        raise InvalidArguments(
            f"run_graph: input tensor {lt.id} has a self-overlapping layout (shape {list(lt.shape)}, "
            f"strides {list(lt.strides)}); the given values differ where its elements share memory")
    return tensor


#: single-op partitions that only re-describe their input's memory: run as views when possible
VIEW_KINDS = {OpKind.StaticReshape, OpKind.StaticTranspose, OpKind.Reorder}


def _view(part, compiled, produced: dict, graph_outputs, engine) -> Tensor | None:
    """The output of a lone StaticReshape / StaticTranspose / Reorder (same type) as a
    zero-copy strided view of its input, when that input is memory this graph
    allocated and the layout allows it (numpy's rules: a reshape of a strided
    tensor may need a copy); else None and the partition runs.  A graph output
    keeps the layout it was compiled for, so it is a view only when that layout
    is the view's."""
    if len(part.ops) != 1 or part.ops[0].kind not in VIEW_KINDS:
        return None
    op = part.ops[0]
    src = produced.get(op.inputs[0].id)
    out_lt = compiled.query_logical_tensor(op.outputs[0].id)
    if src is None or src.packed or not src.is_direct() or src.lt.dtype != out_lt.dtype:
        return None
    if src.lt.encoding is not None or out_lt.encoding is not None:  # a convert between storages
        return None
    x = src.numpy()
    if op.kind == OpKind.StaticTranspose:
        y = np.transpose(x, [int(o) % x.ndim for o in op.attrs["order"]]) if x.ndim else x
    else:
        try:
            y = np.reshape(x, tuple(out_lt.shape), copy=False)
        except ValueError:  # this layout needs a copy
            return None
    strides = tuple(s // y.itemsize for s in y.strides)
    if any(s < 0 for s in strides) or y.__array_interface__["data"][0] != x.__array_interface__["data"][0]:
        return None
    if out_lt.id in graph_outputs and not all(a == b for d, a, b in zip(y.shape, strides, out_lt.strides) if d > 1):
        return None
    lt = LogicalTensor(out_lt.id, out_lt.dtype, tuple(y.shape), strides, LayoutType.strided, out_lt.property)
    return Tensor(lt, engine, src.buffer, offset=0)


class CompiledGraph:
    """Every partition of a graph compiled for the shapes of one set of feeds.

    Built once (compile per partition, in order, each input's concrete logical
    tensor taken from the feed or from the producing partition's compiled
    output); every partition output is allocated once and the same ``Tensor``
    is handed to the consuming partitions, so nothing is copied between
    partitions.  Constant inputs fed as the same arrays stay prepared inside
    the kernels (weights converted/repacked once, keyed by buffer address).

    A lone StaticReshape / StaticTranspose / Reorder between partitions is
    a zero-copy view (:func:`_view`) and does not run; the partitions reading
    it are compiled for its strides.

    Calling it returns the graph's outputs as arrays that are *reused* by the
    next call (copy what you keep).
    """

    def __init__(self, graph, feeds: dict, policy=PartitionPolicy.fusion, partitions=None):
        if not graph.is_finalized():
            graph.finalize()
        self.graph = graph
        self.partitions = graph.get_partitions(policy) if partitions is None else list(partitions)
        self.engine = Engine()
        self.stream = Stream(self.engine)
        self.input_lts: dict[int, LogicalTensor] = {}
        for tid in graph.input_ids:
            if tid not in feeds:
                raise InvalidArguments(
                    f"run_graph: no value for graph input tensor {tid} ({graph.tensors[tid]!r})")
            self.input_lts[tid] = _input_lt(graph.tensors[tid], feeds[tid])
        # the whole graph's memory need against the budget, before anything compiles
        check_graph(graph, self.partitions, {tid: _shape_of(graph.tensors[tid], feeds[tid]) for tid in graph.input_ids})
        produced: dict[int, Tensor] = {}
        self.steps = []
        #: indexes of steps whose output is a view of their input (nothing runs)
        self.views: set[int] = set()
        self.compile_ms = []
        for part in self.partitions:
            if not part.is_supported():
                raise Unimplemented(
                    f"run_graph: partition {part.id} is not supported: {part.unsupported_reason()}")
            in_lts = [produced[t].lt if t in produced else self.input_lts[t] for t in part.input_ids]
            start = time.perf_counter()
            # part.graph: the graph the partition was cut from (with Composite ops inlined)
            compiled = part.compile(in_lts, [part.graph.tensors[t] for t in part.output_ids], self.engine)
            self.compile_ms.append((time.perf_counter() - start) * 1e3)
            view = _view(part, compiled, produced, set(graph.output_ids), self.engine)
            if view is not None:
                self.views.add(len(self.steps))
                log(f"view,partition {part.id},{part.get_kind()},tensor {view.lt.id} is a view of "
                    f"tensor {part.input_ids[0]} with strides {list(view.lt.strides)}: not run")
                outs = [view]
            else:
                outs = [Tensor(compiled.query_logical_tensor(t), self.engine) for t in part.output_ids]
            for t in outs:
                produced[t.lt.id] = t
            self.steps.append((part, compiled, list(part.input_ids), outs))
        self.produced = produced
        self.feed_key = _feed_key(self.input_lts)
        #: input id -> (the array fed last, the Tensor viewing it), reused while the same array is fed
        self._wrapped: dict[int, tuple] = {}
        #: one scratchpad for every step (the steps run one at a time): no allocation per execute
        need = max((c.scratch_bytes for _, c, _, _ in self.steps), default=0)
        self.scratchpad = Tensor(LogicalTensor(0, dtypes.DataType.u8, [need], dense_strides([need])),
                                 self.engine, np.empty(need, np.uint8)) if need else None
        #: (what the runners were bound for, one callable per step that runs)
        self._runners: tuple = (None, [], {})

    def _input_tensors(self, feeds) -> dict[int, Tensor]:
        tensors = {}
        wrapped = self._wrapped
        for tid, lt in self.input_lts.items():
            if tid not in feeds:
                raise InvalidArguments(f"run_graph: no value for graph input tensor {tid}")
            value = feeds[tid]
            last = wrapped.get(tid)
            if last is not None and last[0] is value:  # the same array again: its Tensor is a view of it
                tensors[tid] = last[1]
                continue
            tensor = tensors[tid] = _tensor(lt, value, self.engine)
            if isinstance(value, np.ndarray) and tensor.is_view_of(value):
                wrapped[tid] = (value, tensor)
            else:
                wrapped.pop(tid, None)
        return tensors

    def run(self, feeds: dict, repeat: int = 1) -> list[float]:
        """Execute every partition; returns the best execute time of each (ms)."""
        tensors = self._input_tensors(feeds)
        tensors.update(self.produced)
        times = []
        for i, (part, compiled, in_ids, outs) in enumerate(self.steps):
            if i in self.views:
                times.append(0.0)
                continue
            ins = [tensors[t] for t in in_ids]
            best = float("inf")
            for _ in range(max(1, repeat)):
                start = time.perf_counter()
                compiled.execute(self.stream, ins, outs, self.scratchpad)
                best = min(best, (time.perf_counter() - start) * 1e3)
            times.append(best)
        return times

    def __call__(self, feeds: dict) -> dict[int, np.ndarray]:
        for runner in self._bound_steps(self._input_tensors(feeds)):
            runner()
        return {tid: self.produced[tid].numpy() for tid in self.graph.output_ids if tid in self.produced}

    def _bound_steps(self, inputs: dict[int, Tensor]) -> list:
        """One callable per step that runs (``CompiledPartition.bind``: the checks and
        the plans' per-call Python work done once).  A step is bound again only when
        one of *its* graph inputs is another Tensor than last time (another array was
        fed): the steps that read only intermediates and constants keep their binding
        (a decode step feeds new small arrays to a few of its partitions on every call).
        Every step is bound again when the checking/verbose switches changed."""
        switches = (settings.check, settings.verbose)
        last_switches, runners, last_inputs = self._runners
        changed = None if last_switches != switches or len(last_inputs) != len(inputs) else \
            {tid for tid, t in inputs.items() if last_inputs.get(tid) is not t}
        if changed is not None and not changed:
            return runners
        tensors = dict(inputs)
        tensors.update(self.produced)
        active = [(compiled, in_ids, outs) for i, (part, compiled, in_ids, outs) in enumerate(self.steps)
                  if i not in self.views]
        runners = [compiled.bind(self.stream, [tensors[t] for t in in_ids], outs, self.scratchpad)
                   if changed is None or not changed.isdisjoint(in_ids) else runners[j]
                   for j, (compiled, in_ids, outs) in enumerate(active)]
        self._runners = (switches, runners, dict(inputs))
        return runners


def _feed_key(input_lts) -> tuple:
    return tuple((tid, lt.key()) for tid, lt in sorted(input_lts.items()))


def compile_graph(graph, feeds: dict, policy=PartitionPolicy.fusion, partitions=None) -> CompiledGraph:
    """A :class:`CompiledGraph`, reused for the same graph, policy, partitions and
    feed shapes/dtypes (and the same verbose/check/reference switches)."""

    if not graph.is_finalized():
        graph.finalize()
    lts = {tid: _input_lt(graph.tensors[tid], feeds[tid]) for tid in graph.input_ids if tid in feeds}
    # partitions are keyed by what they are (get_partitions makes new objects each call)
    parts = None if partitions is None else list(partitions)
    which = None if parts is None else tuple(
        (p.id, tuple(sorted(p.get_ops())), p.pattern_name, str(p.fpmath)) for p in parts)
    # the budget is part of the key: a lowered budget checks the graph again
    key = (str(policy), which, _feed_key(lts), settings.reference, get_memory_budget())
    cache = graph.__dict__.setdefault("_compiled_graphs", {})
    compiled = cache.get(key)
    if compiled is None:
        if len(cache) > 8:
            cache.clear()
        compiled = cache[key] = CompiledGraph(graph, feeds, policy, parts)
    return compiled


def run_graph(graph, feeds: dict, policy=PartitionPolicy.fusion, partitions=None,
              repeat: int = 1) -> GraphRun:
    """Execute every partition of ``graph`` on ``feeds`` (tensor id -> array or Tensor).

    Feeding ``Tensor`` objects avoids re-packing int4 data on every call and
    lets constant-weight kernels reuse what they prepared for that memory.
    The compiled partitions and their preallocated outputs are kept with the
    graph (:func:`compile_graph`) and reused by the next call with the same
    shapes.

    Raises:
        OutOfMemory: the graph needs more than the memory budget
            (:mod:`graph_api.memory`), before any partition compiles.

    Returns every tensor that crosses a partition boundary or leaves the graph,
    as logical numpy arrays keyed by id (copies), plus per-partition timings.
    """
    for tid in graph.input_ids if graph.is_finalized() else ():
        if tid not in feeds:
            raise InvalidArguments(f"run_graph: no value for graph input tensor {tid} ({graph.tensors[tid]!r})")
    compiled = compile_graph(graph, feeds, policy, partitions)
    times = compiled.run(feeds, repeat)
    values: dict[int, np.ndarray] = {}
    for tid in graph.input_ids:
        value = feeds[tid]
        values[tid] = value if isinstance(value, Tensor) else np.asarray(value)
    runs = []
    for (part, comp, _, outs), ms, cms in zip(compiled.steps, times, compiled.compile_ms):
        for t in outs:
            values[t.lt.id] = t.numpy().copy() if not t.packed else t.numpy()
        runs.append(PartitionRun(part, comp, cms, ms))
    return GraphRun(values, runs)

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
from .engine import Engine, Stream
from .enums import PartitionPolicy, PropertyType
from .errors import InvalidArguments, Unimplemented
from .logical_tensor import LogicalTensor, dense_strides
from .memory import check_graph
from .tensor import Tensor, make_scalar_tensor, self_overlapping


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
    return LogicalTensor(port.id, port.dtype, shape, strides, property=port.property)


def _shape_of(port: LogicalTensor, value) -> tuple:
    if isinstance(value, Tensor):
        return tuple(value.get_logical_tensor().shape)
    return port.shape if port.property == PropertyType.host_scalar else tuple(np.shape(value))


def _tensor(lt: LogicalTensor, value, engine) -> Tensor:
    if isinstance(value, Tensor):
        return value
    if lt.property == PropertyType.host_scalar:
        return make_scalar_tensor(lt, value)
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


def run_graph(graph, feeds: dict, policy=PartitionPolicy.fusion, partitions=None,
              repeat: int = 1) -> GraphRun:
    """Execute every partition of ``graph`` on ``feeds`` (tensor id -> array or Tensor).

    Feeding ``Tensor`` objects avoids re-packing int4 data on every call and
    lets constant-weight kernels reuse what they prepared for that memory.

    Raises:
        OutOfMemory: the graph needs more than the memory budget
            (:mod:`graph_api.memory`), before any partition compiles.

    Returns every tensor that crosses a partition boundary or leaves the graph,
    as logical numpy arrays keyed by id, plus per-partition timings.
    """
    if not graph.is_finalized():
        graph.finalize()
    if partitions is None:
        partitions = graph.get_partitions(policy)
    engine, stream = Engine(), None
    stream = Stream(engine)
    values: dict[int, np.ndarray] = {}
    for tid in graph.input_ids:
        if tid not in feeds:
            raise InvalidArguments(f"run_graph: no value for graph input tensor {tid} ({graph.tensors[tid]!r})")
        value = feeds[tid]
        values[tid] = value if isinstance(value, Tensor) else np.asarray(value)
    check_graph(graph, partitions, {tid: _shape_of(graph.tensors[tid], v) for tid, v in values.items()})
    runs = []
    for part in partitions:
        if not part.is_supported():
            raise Unimplemented(f"run_graph: partition {part.id} is not supported: {part.unsupported_reason()}")
        # part.graph: the graph the partition was cut from (with Composite ops inlined)
        in_lts = [_input_lt(part.graph.tensors[t], values[t]) for t in part.input_ids]
        out_lts = [part.graph.tensors[t] for t in part.output_ids]
        start = time.perf_counter()
        compiled = part.compile(in_lts, out_lts, engine)
        compile_ms = (time.perf_counter() - start) * 1e3
        ins = [_tensor(lt, values[lt.id], engine) for lt in in_lts]
        outs = [Tensor(compiled.query_logical_tensor(t), engine) for t in part.output_ids]
        best = float("inf")
        for _ in range(max(1, repeat)):
            start = time.perf_counter()
            compiled.execute(stream, ins, outs)
            best = min(best, (time.perf_counter() - start) * 1e3)
        for t in outs:
            values[t.lt.id] = t.numpy().copy() if not t.packed else t.numpy()
        runs.append(PartitionRun(part, compiled, compile_ms, best))
    return GraphRun(values, runs)

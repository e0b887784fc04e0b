"""The seam between the runtime (graph, partition) and the layers below it.

``Graph`` and ``Partition`` reach the pattern matcher and the kernel registry
only through these functions, as oneDNN's interface reaches its backends
through one backend object: partition a graph, compile a partition's request
into a plan, run the reference plan.

Compiling does all the work oneDNN does at compile, Numba specialisation
included: :func:`compile_plan` runs a second plan, built from the same
request, once on placeholder inputs of the compiled shapes and types, so every
Numba kernel the plan calls is compiled (or loaded from the on-disk cache)
before the user's first ``execute``.  A separate plan instance, because plans
keep caches keyed by input buffer addresses (packed constant weights) that
the placeholders must not seed.  The same run measures the scratch memory an
execution takes (:mod:`graph_api.kernels.scratch`).  A request warmed before
in this process (same ops, attributes, tensors and fpmath) is not run again.
When the placeholders do not suit the plan (values that shape the result,
such as a Reduce axes tensor), the warm-up is skipped and verbose mode says so.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from . import dtypes
from .config import log
from .enums import PartitionPolicy
from .tensor import Tensor
from graph_api.kernels import scratch
from graph_api.kernels.plan import CompileRequest, ComposedPlan
from graph_api.kernels.registry import select_plan
from graph_api.kernels.scratch import arena as scratch_arena
from graph_api.patterns import explain as pattern_explain
from graph_api.kernels import composite as composite_kernels
from graph_api.kernels.composite import FAST_COMPOSITES
from graph_api.patterns.partitioner import partition_graph

__all__ = ["CompileRequest", "Compiled", "compile_plan", "explain_partitions", "fast_composite",
           "partition_graph", "reference_plan", "scratch_arena"]

#: placeholder values the warm-up run feeds, by dtype kind: nonzero and in range for every
#: op (no division by zero, log of a positive number, a dropout probability inside (0, 1))
_PLACEHOLDER = {"float": 0.5, "int": 1, "bool": True}
#: requests warmed in this process -> scratch bytes they measured (oldest dropped first)
_WARMED: OrderedDict = OrderedDict()
_WARMED_LIMIT = 4096


def _partition_native(ops, fpmath):
    """A composite's native ops as a finalized graph, partitioned (for
    :mod:`graph_api.kernels.composite`, which may not import the runtime)."""
    from .graph import Graph  # graph imports this module: Graph exists only once both are loaded

    graph = Graph(fpmath_mode=fpmath.mode, apply_to_int=fpmath.apply_to_int)
    for op in ops:
        graph.add_op(op)
    graph.finalize()
    fusions = partition_graph(graph, PartitionPolicy.fusion)
    return fusions, graph.tensors, [graph.ops[i] for i in graph.topological_op_ids()]


composite_kernels.partition_native = _partition_native


@dataclass
class Compiled:
    """A plan for a request and the scratch bytes one execution of it takes."""

    plan: object
    scratch_bytes: int


def explain_partitions(graph, decisions=(), patterns=None) -> pattern_explain.Explanations:
    """Why ops of ``graph`` (Composite ops already decided) were not fused, and what
    became of each Composite op (``decisions``: inlined, or kept for its fast kernel)."""
    result = pattern_explain.explain(graph, patterns)
    result.update(pattern_explain.composites(decisions))
    return result


def fast_composite(key: tuple):
    """The fast kernel registered for a Composite (name, version), or None."""
    return FAST_COMPOSITES.get(key)


def reference_plan(request: CompileRequest) -> ComposedPlan:
    """The unfused numpy reference of a request (ground truth, check mode)."""
    return ComposedPlan(request)


def compile_plan(request: CompileRequest, label: str) -> Compiled:
    """The plan the registry selects, with its Numba kernels specialised now.

    ``label`` names the partition in verbose lines.
    """
    plan = select_plan(request)
    if isinstance(plan, ComposedPlan):  # numpy only: nothing to specialise, no scratch
        return Compiled(plan, 0)
    key = _signature(request)
    measured = _WARMED.get(key)
    if measured is None:
        start = time.perf_counter()
        log(f"compile,{label},warm-up,kernel={plan.name},specialising kernels for the compiled shapes")
        with scratch.counting() as arena:
            try:
                _run_on_placeholders(select_plan(request), request)
            except MemoryError:  # the budget's OutOfMemory (or the system's): it would not run either
                raise
            except Exception as why:  # noqa: BLE001 - placeholder values, not the user's: see below
                # inputs whose values shape the result (a Reduce axes tensor) may reject the
                # placeholders; the real inputs are checked at execute, where kernels that the
                # warm-up missed then compile, and intermediates come from numpy
                log(f"compile,{label},warm-up skipped,kernel={plan.name},{type(why).__name__}: {why}")
                return Compiled(plan, 0)
        measured = arena.requested
        _WARMED[key] = measured
        if len(_WARMED) > _WARMED_LIMIT:
            _WARMED.popitem(last=False)
        log(f"compile,{label},warm-up done,kernel={plan.name},scratch {measured} bytes,"
            f"{(time.perf_counter() - start) * 1e3:.3f} ms")
    return Compiled(plan, scratch.bytes_needed(measured))


def _signature(request: CompileRequest) -> tuple:
    """What a plan's kernels depend on: ops with attributes, every tensor, fpmath."""
    ops = tuple((op.kind, tuple(sorted((k, repr(v)) for k, v in op.attrs.items())),
                 tuple(lt.id for lt in op.inputs), tuple(lt.id for lt in op.outputs))
                for op in request.ops)
    lts = tuple(sorted((tid, lt.key()) for tid, lt in request.lts.items()))
    return (request.pattern, ops, lts, tuple(request.input_ids), tuple(request.output_ids),
            request.fpmath, repr(sorted(request.bindings.items(), key=repr)))


def _placeholder(lt) -> Tensor:
    info = dtypes.info(lt.dtype)
    # a sparse tensor's placeholder holds no non-zeros: its storage is built from the dense
    # placeholder, and a full one (every element stored) took seconds to build at 4096 x 4096
    # while the kernels compile for the same index and value types either way
    fill = 0 if lt.encoding is not None else _PLACEHOLDER[info.kind]
    values = np.full(lt.shape, fill, info.np_dtype)
    return Tensor(lt, None, values)


def _run_on_placeholders(plan, request: CompileRequest) -> None:
    inputs = {tid: _placeholder(request.lts[tid]) for tid in request.input_ids}
    outputs = {tid: Tensor(request.lts[tid]) for tid in request.output_ids}
    plan.execute(inputs, outputs)

"""The memory budget: refuse work whose tensors cannot fit, before allocating them.

What a partition needs (checked by ``Partition.compile`` for the concrete shapes)::

    inputs + outputs        as ``Tensor`` stores them (the strided span; s4/u4 packed)
    + intermediates         as the plan holds them (logical numpy arrays; s4/u4 one byte)
    + prepared constants    an f32 copy of every constant input: the most a kernel
                            prepares from a constant (the blocked int4 copy is an
                            eighth of it, the dense f32 weight copy equals it)

What a whole graph needs (``run_graph`` and the command line, before filling or
compiling anything): every tensor that crosses a partition boundary or leaves
the graph (``run_graph`` keeps them all), plus the largest set of intermediates
of any one partition (freed when it finishes), plus every prepared constant
(compiled partitions keep theirs).

What a plan allocates beyond those tensors while it compiles or runs (scratch
intermediates, staging copies, widened K/V chunks, the filler's buffers) goes
through :func:`empty` inside a :class:`working` block: each allocation is
checked against the budget on top of the bytes already counted and the bytes
the block still holds, and running out, by the budget or by the system, is
:class:`OutOfMemory` naming the partition (or the tensor being filled) and the
bytes.  Any other ``MemoryError`` inside a block (a numpy temporary in a
reference step) becomes ``OutOfMemory`` naming it too; only an allocation
outside every block can still be a bare ``MemoryError``.  The budget itself is
read in :mod:`graph_api.config`.  The working-memory part (:class:`working`,
:func:`empty`, ...) lives in :mod:`graph_api.working_memory` and is re-exported here.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import dtypes
from .config import MEMORY_BUDGET_ENV, get_memory_budget
from .enums import LayoutType, PropertyType
from .errors import GraphError, OutOfMemory
from .logical_tensor import dense_strides
from .opset import OP_SCHEMAS
from .infer import propagate
from .working_memory import (_human, current_label, empty, nbytes_of, reserve, track, working,  # noqa: F401
                             zeros)  # (re-exported: the runtime allocates through graph_api.memory)

_F32_BYTES = 4


@dataclass
class Need:
    """Bytes by kind; ``total`` is what is checked against the budget."""

    inputs: int = 0
    outputs: int = 0
    intermediates: int = 0
    constants: int = 0

    @property
    def total(self) -> int:
        return self.inputs + self.outputs + self.intermediates + self.constants

    def describe(self) -> str:
        return (f"inputs {_human(self.inputs)}, outputs {_human(self.outputs)}, "
                f"intermediates {_human(self.intermediates)}, prepared constants {_human(self.constants)}")


def stored_bytes(lt) -> int:
    """Bytes of a ``Tensor`` holding ``lt`` (0 when the shape is not known)."""
    if not lt.is_shape_known():
        return 0
    if lt.layout != LayoutType.strided or lt.strides is None:
        lt = lt.with_shape(lt.shape, dense_strides(lt.shape), LayoutType.strided)
    return max(lt.size_in_bytes(), 0)


def array_bytes(lt) -> int:
    """Bytes of ``lt`` as a logical numpy array (0 when the shape is not known)."""
    if not lt.is_shape_known():
        return 0
    np_dtype = dtypes.info(lt.dtype).np_dtype
    return lt.nelems() * (1 if np_dtype is None else np_dtype.itemsize)


def prepared_bytes(lt) -> int:
    """The f32 copy a kernel may prepare from a constant input."""
    if lt.property != PropertyType.constant or not lt.is_shape_known():
        return 0
    return lt.nelems() * _F32_BYTES


def partition_need(lts: dict, input_ids, output_ids) -> Need:
    """What one partition needs for the concrete logical tensors ``lts`` (id -> lt)."""
    inputs, outputs = set(input_ids), set(output_ids)
    need = Need()
    for tid, lt in lts.items():
        if tid in inputs:
            need.inputs += stored_bytes(lt)
            need.constants += prepared_bytes(lt)
        elif tid in outputs:
            need.outputs += stored_bytes(lt)
        else:
            need.intermediates += array_bytes(lt)
    return need


def _refuse(what: str, need: Need, budget: int) -> OutOfMemory:
    return OutOfMemory(
        f"{what} needs {need.total:,} bytes ({_human(need.total)}: {need.describe()}), "
        f"more than the memory budget of {budget:,} bytes ({_human(budget)}); "
        f"raise it with {MEMORY_BUDGET_ENV} or graph_api.set_memory_budget()")


def check_partition(label: str, lts: dict, input_ids, output_ids) -> Need:
    """Raise :class:`OutOfMemory` when partition ``label`` needs more than the budget."""
    need = partition_need(lts, input_ids, output_ids)
    budget = get_memory_budget()
    if budget is not None and need.total > budget:
        raise _refuse(label, need, budget)
    return need


def graph_need(graph, partitions, tensors: dict) -> Need:
    """What running every partition in turn needs (see the module doc).

    ``tensors`` maps id -> logical tensor with the shapes the run will use;
    tensors whose shape is unknown count nothing (their partition's compile
    checks them once it knows).
    """
    need = Need()
    kept = list(graph.input_ids)
    largest_intermediates = 0
    for part in partitions:
        kept += part.output_ids
        inputs, outputs = set(part.input_ids), set(part.output_ids)
        inner = {lt.id for op in part.ops for lt in list(op.inputs) + list(op.outputs)}
        # tensors the graph does not list (an inlined Composite's insides) count at compile
        largest_intermediates = max(largest_intermediates, sum(
            array_bytes(tensors[t]) for t in inner - inputs - outputs if t in tensors))
        need.constants += sum(prepared_bytes(tensors[t]) for t in part.input_ids if t in tensors)
    seen: set[int] = set()
    for tid in kept:
        if tid not in seen and tid in tensors:
            seen.add(tid)
            if tid in graph.input_ids:
                need.inputs += stored_bytes(tensors[tid])
            else:
                need.outputs += stored_bytes(tensors[tid])
    need.intermediates = largest_intermediates
    return need


def concrete_tensors(graph, input_shapes: dict) -> dict:
    """The graph's logical tensors with the given input shapes propagated; the
    graph's own tensors where propagation fails (compile reports that)."""

    known = dict(graph.tensors)
    try:
        for tid, shape in input_shapes.items():
            lt = known[tid]
            if lt.shape != tuple(shape) and lt.property != PropertyType.host_scalar:
                known[tid] = lt.with_shape(tuple(shape))
        return propagate([graph.ops[i] for i in graph.topological_op_ids()], known, OP_SCHEMAS)
    except GraphError:
        return dict(graph.tensors)


def check_graph(graph, partitions, input_shapes: dict | None = None) -> Need:
    """Raise :class:`OutOfMemory` when running ``graph`` needs more than the budget."""
    tensors = concrete_tensors(graph, input_shapes or {})
    need = graph_need(graph, partitions, tensors)
    budget = get_memory_budget()
    if budget is not None and need.total > budget:
        raise _refuse(f"the graph ({len(graph.ops)} ops, {len(partitions)} partitions)", need, budget)
    return need

"""``Partition`` (a set of ops to compile together) and ``CompiledPartition``."""
from __future__ import annotations

import itertools
import time
import weakref

import numpy as np

from . import backend, dump
from .check import compare
from .config import log, settings
from .engine import Engine, Stream
from .dtypes import DataType
from .enums import EngineKind, GraphDumpMode, LayoutType, OpKind, PropertyType, parse_enum
from .errors import (ExecutionError, InvalidArguments, InvalidDataType, InvalidShape,
                     Unimplemented, op_label)
from .fpmath import FPMath
from .graph import Graph
from .infer import merge_shapes, propagate
from .logical_tensor import LogicalTensor, dense_strides
from . import memory
from .memory import check_partition
from .op import Op
from .opset import OP_SCHEMAS
from .partition_cache import CACHE
from .tensor import Tensor, self_overlapping

#: op kinds with no kernel: oneDNN returns them as unsupported partitions
UNSUPPORTED_KINDS = {OpKind.Wildcard, OpKind.End}

#: element-wise ops whose output may overwrite their first input (the post-op table)
from .postops import INPLACE_KINDS  # noqa: E402


#: the id of every scratchpad logical tensor (oneDNN leaves it to the library)
SCRATCHPAD_ID = 0

#: a unique key per partition for the process-wide compiled-partition cache
_SERIALS = itertools.count()


class Partition:
    """A group of ops of one graph that compiles into one kernel plan.

    ``Partition(op, engine_kind)`` is oneDNN's ``partition(op, engine_kind)``:
    a one-op partition built directly (a one-op graph, partitioned).  Graphs
    build theirs as ``Partition(pid, graph, fusion)``.
    """

    def __init__(self, pid, graph=None, fusion=None):
        if isinstance(pid, Op):
            self._adopt_single_op(pid, EngineKind.cpu if graph is None else graph)
            return
        if graph is None or fusion is None:
            raise InvalidArguments(
                f"Partition takes (op, engine_kind) or (id, graph, fusion), got {type(pid).__name__} first")
        self._serial = next(_SERIALS)
        self.id = pid
        self.graph = graph
        self.fusion = fusion
        self.ops = [graph.ops[i] for i in fusion.op_ids]
        self.engine_kind = EngineKind.cpu
        self.fpmath: FPMath = graph.fpmath
        op_set = set(fusion.op_ids)
        seen: set[int] = set()
        self.input_ids: list[int] = []
        for op in self.ops:
            for lt in op.inputs:
                prod = graph.producer.get(lt.id)
                if (prod is None or prod[0] not in op_set) and lt.id not in seen:
                    seen.add(lt.id)
                    self.input_ids.append(lt.id)
        # constants of inlined Composite decompositions: values the partition carries
        bound = getattr(graph, "bound_constants", {})
        self.bound_ids = [t for t in self.input_ids if t in bound]
        self.input_ids = [t for t in self.input_ids if t not in bound]
        self.output_ids = []
        for op in self.ops:
            for lt in op.outputs:
                users = graph.consumers.get(lt.id, [])
                if not users or any(u not in op_set or graph.ops[u].kind == OpKind.End
                                    for u, _ in users):
                    self.output_ids.append(lt.id)

    def _adopt_single_op(self, op: Op, engine_kind) -> None:
        kind = parse_enum(EngineKind, engine_kind, "engine kind")
        if kind != EngineKind.cpu:
            raise InvalidArguments(f"partition of {op_label(op)}: engine kind {kind.name}; this runtime has cpu only")
        graph = Graph(kind)
        graph.add_op(op)
        graph.finalize()
        parts = graph.get_partitions()
        if len(parts) != 1:  # a Composite op inlined into several partitions
            raise Unimplemented(
                f"partition of {op_label(op)}: the op becomes {len(parts)} partitions; "
                f"add it to a Graph and call get_partitions")
        self.__dict__.update(parts[0].__dict__)

    @property
    def _cache(self) -> dict:
        """This partition's entries in the process-wide compiled-partition cache."""
        return CACHE.entries_of(self._serial)

    # ------------------------------------------------------------ queries
    @property
    def pattern_name(self) -> str | None:
        pattern = self.fusion.pattern
        if pattern is None:
            return None
        # not getattr(pattern, "name", str(pattern)): that formats the whole pattern on every call
        name = getattr(pattern, "name", None)
        return str(pattern) if name is None else name

    def get_id(self) -> int:
        return self.id

    def get_ops(self) -> list[int]:
        return [op.id for op in self.ops]

    def get_ops_num(self) -> int:
        return len(self.ops)

    def get_engine_kind(self) -> EngineKind:
        return self.engine_kind

    def get_kind(self) -> str:
        """The fused pattern's name, or 'single op'."""
        return self.pattern_name or "single op"

    def is_supported(self) -> bool:
        return self.unsupported_reason() is None

    def unsupported_reason(self) -> str | None:
        if len(self.ops) == 1 and self.ops[0].kind in UNSUPPORTED_KINDS:
            return f"{op_label(self.ops[0])} has no kernel (a placeholder op)"
        for op in self.ops:
            if op.kind == OpKind.Wildcard:
                return f"{op_label(op)} has no kernel (a placeholder op)"
        return None

    def get_input_ports(self) -> list[LogicalTensor]:
        return [self.graph.tensors[t] for t in self.input_ids]

    def get_output_ports(self) -> list[LogicalTensor]:
        return [self.graph.tensors[t] for t in self.output_ids]

    def set_fpmath_mode(self, mode, apply_to_int: bool = False) -> None:
        """Override the graph's fpmath for this partition only (int4 RFC option 1)."""
        self.fpmath = FPMath.make(mode, apply_to_int)

    def get_fpmath_mode(self):
        return self.fpmath.mode, self.fpmath.apply_to_int

    def __repr__(self) -> str:
        ops = ",".join(op.kind.name for op in self.ops)
        return f"Partition({self.id}, {self.get_kind()}, [{ops}], fpmath={self.fpmath})"

    # ------------------------------------------------------------ compile
    def compile(self, inputs, outputs, engine: Engine | None = None) -> "CompiledPartition":
        """Concrete shapes for every tensor, then a kernel plan for them.

        ``inputs``/``outputs`` are logical tensors matched to ports by id;
        outputs may have unknown dims and layout ``any`` (dense strided is chosen).
        """
        reason = self.unsupported_reason()
        if reason:
            raise InvalidArguments(f"partition {self.id} is not supported and cannot compile: {reason}")
        if engine is not None and (not isinstance(engine, Engine) or engine.kind != self.engine_kind):
            raise InvalidArguments(f"partition {self.id}: compile needs a cpu Engine, got {engine!r}")
        in_lts = self._match_inputs(inputs)
        in_lts.update({t: self.graph.tensors[t] for t in self.bound_ids})
        key = (tuple(lt.key() for lt in in_lts.values()),
               tuple(lt.key() for lt in outputs), self.fpmath, settings.reference)
        key = (self._serial,) + key
        cached = CACHE.get(key)
        if cached is not None:
            return cached
        start = time.perf_counter()
        # seed every op output with what the graph knows, so declared dims are checked
        known = dict(in_lts)
        for op in self.ops:
            for lt in op.outputs:
                known.setdefault(lt.id, self.graph.tensors[lt.id])
        known = propagate(self.ops, known, OP_SCHEMAS)
        out_lts = self._match_outputs(outputs, known)
        lts = {}
        for op in self.ops:
            for lt in list(op.inputs) + list(op.outputs):
                final = out_lts.get(lt.id) or known.get(lt.id)
                if final is None or not final.is_shape_known():
                    raise InvalidShape(
                        f"partition {self.id}: the shape of tensor {lt.id} ({op_label(op)}) "
                        f"cannot be inferred from the given inputs")
                internal = lt.id not in in_lts and lt.id not in out_lts
                if final.strides is None or final.layout != LayoutType.strided or (
                        internal and self_overlapping(final.shape, final.strides)):
                    # an intermediate's layout is the partition's own: one whose elements
                    # share memory would lose results (the per-op plan writes it)
                    final = final.with_shape(final.shape, dense_strides(final.shape), LayoutType.strided)
                lts[lt.id] = final
        for op in self.ops:
            for check in OP_SCHEMAS[op.kind].compile_checks:
                check(op, [lts[lt.id].shape for lt in op.inputs])
        label = f"partition {self.id} ({self.get_kind()})"
        need = check_partition(label, lts, self.input_ids, self.output_ids)
        if dump.enabled(GraphDumpMode.subgraph):  # before the plan compiles: a failing one is dumped too
            dump.dump_subgraph(self, lts)
        request = backend.CompileRequest(self.pattern_name, self.ops, lts, list(self.input_ids) + self.bound_ids,
                                         list(self.output_ids), self.fpmath, dict(self.fusion.bindings))
        # the plan's own allocations (offsets, prepared copies, the warm-up's intermediates)
        # count on top of the partition's tensors; its intermediates count as allocated
        with memory.working(label, need.total - need.intermediates):
            built = backend.compile_plan(request, f"partition {self.id}")
        plan = built.plan
        compiled = CompiledPartition(self, request, plan, built.scratch_bytes, engine, need)
        ms = (time.perf_counter() - start) * 1e3
        compiled.compile_ms = ms
        log(f"compile,partition {self.id},{self.get_kind()},{len(self.ops)} ops,"
            f"kernel={plan.name},fpmath={self.fpmath},{ms:.3f} ms")
        CACHE.put(key, compiled)
        return compiled

    def _match_inputs(self, inputs) -> dict[int, LogicalTensor]:
        given = {}
        for lt in inputs:
            if not isinstance(lt, LogicalTensor):
                raise InvalidArguments(f"partition {self.id}: compile inputs must be LogicalTensors")
            given[lt.id] = lt
        matched = {}
        for tid in self.input_ids:
            port = self.graph.tensors[tid]
            lt = given.get(tid)
            if lt is None:
                raise InvalidArguments(
                    f"partition {self.id}: input tensor {tid} ({port!r}) is missing from compile inputs")
            if lt.dtype != port.dtype:
                reader = next((op for op in self.ops if any(x.id == tid for x in op.inputs)), None)
                at = f" ({op_label(reader)} reads it)" if reader is not None else ""
                raise InvalidDataType(
                    f"partition {self.id}: input tensor {tid}{at} is {lt.dtype.name}, the graph says "
                    f"{port.dtype.name}")
            if lt.layout not in (LayoutType.strided, LayoutType.undef) and lt.property != PropertyType.host_scalar:
                raise InvalidArguments(
                    f"partition {self.id}: input tensor {tid} must have a strided layout, got {lt.layout.name}")
            if not lt.is_shape_known():
                raise InvalidShape(f"partition {self.id}: input tensor {tid} needs a concrete shape, got {lt!r}")
            try:
                merge_shapes(port.shape, lt.shape, self.ops[0], tid)
            except InvalidShape:
                raise InvalidShape(
                    f"partition {self.id}: input tensor {tid} has shape {list(lt.shape)}, "
                    f"the graph says {list(port.shape)}") from None
            if lt.strides is None:
                lt = lt.with_shape(lt.shape, dense_strides(lt.shape), LayoutType.strided)
            matched[tid] = _with_port_encoding(self.id, "input", lt, port)
        return matched

    def _match_outputs(self, outputs, known) -> dict[int, LogicalTensor]:
        given = {}
        for lt in outputs:
            if not isinstance(lt, LogicalTensor):
                raise InvalidArguments(f"partition {self.id}: compile outputs must be LogicalTensors")
            given[lt.id] = lt
        matched = {}
        for tid in self.output_ids:
            inferred = known[tid]
            lt = given.get(tid)
            if lt is None:
                raise InvalidArguments(f"partition {self.id}: output tensor {tid} is missing from compile outputs")
            if lt.dtype != inferred.dtype:
                raise InvalidDataType(
                    f"partition {self.id}: output tensor {tid} is {lt.dtype.name}, the graph says {inferred.dtype.name}")
            op = next(o for o in self.ops if any(x.id == tid for x in o.outputs))
            shape = merge_shapes(lt.shape, inferred.shape, op, tid)
            if shape is None or -1 in shape:
                raise InvalidShape(f"partition {self.id}: output tensor {tid} shape cannot be inferred")
            strides = lt.strides if (lt.layout == LayoutType.strided and lt.strides is not None
                                     and lt.shape == shape) else dense_strides(shape)
            if self_overlapping(shape, strides):
                raise InvalidArguments(
                    f"partition {self.id}: output tensor {tid} has strides {list(strides)} for shape "
                    f"{list(shape)}: elements overlap in memory, so results would be lost; outputs "
                    f"need a layout where every element has its own memory")
            matched[tid] = _with_port_encoding(
                self.id, "output", LogicalTensor(tid, lt.dtype, shape, strides, LayoutType.strided, lt.property,
                                                 lt.encoding), inferred)
        return matched


class CompiledPartition:
    """A partition compiled for concrete shapes: ``execute`` runs its plan."""

    def __init__(self, partition: Partition, request, plan, scratch_bytes: int = 0, engine: Engine | None = None,
                 need: memory.Need | None = None):
        self.partition = partition
        #: what the partition's tensors take (memory.Need), checked at compile
        self.need = need or memory.Need()
        self._label = f"partition {partition.id} ({partition.get_kind()})"
        self.request = request
        self.plan = plan
        #: bytes of intermediates one execution takes (the scratchpad's size)
        self.scratch_bytes = scratch_bytes
        self.engine = engine
        self.compile_ms = 0.0
        self.last_execute_ms = 0.0
        self._memories_checked: tuple = ()
        #: port id -> the LogicalTensor object of the Tensor last accepted there
        self._accepted: dict[int, LogicalTensor] = {}
        self._bound: dict[int, Tensor] | None = None
        #: tensor id -> (user Tensor, address of its memory, staged copy): a constant input
        #: in memory the plan cannot read directly is copied once, not per execute, so
        #: prepared weights (cached by the plans on their buffers) stay valid across calls
        self._constant_stages: dict[int, tuple] = {}

    @property
    def lts(self) -> dict[int, LogicalTensor]:
        return self.request.lts

    @property
    def held_bytes(self) -> int:
        """What this compiled partition may keep between executes (the compiled-partition
        cache's byte bound counts it): the prepared copies of its constants, as the
        memory budget counts them."""
        return self.need.constants

    def query_logical_tensor(self, tid: int) -> LogicalTensor:
        """The concrete logical tensor of an input or output port."""
        if tid not in self.request.input_ids and tid not in self.request.output_ids:
            raise InvalidArguments(
                f"compiled partition {self.partition.id}: tensor {tid} is not one of its ports "
                f"(inputs {self.request.input_ids}, outputs {self.request.output_ids})")
        return self.request.lts[tid]

    def get_scratchpad_logical_tensor(self) -> LogicalTensor:
        """The scratchpad an execution needs: u8, 1-D, its size in bytes (0: none).

        Pass a tensor of it as ``execute``'s ``scratchpad``; without one, each
        execution takes the memory from the engine's allocator, or numpy.
        """
        return LogicalTensor(SCRATCHPAD_ID, DataType.u8, [self.scratch_bytes], LayoutType.strided)

    def get_inplace_ports(self) -> list[tuple[int, int]]:
        """(input id, output id) pairs that may share memory: same-shape element-wise
        single ops whose input and output have the same dtype and layout."""
        if len(self.request.ops) != 1:
            return []
        op = self.request.ops[0]
        if op.kind not in INPLACE_KINDS or not op.inputs or not op.outputs:
            return []
        a, b = self.lts[op.inputs[0].id], self.lts[op.outputs[0].id]
        if a.dtype == b.dtype and a.shape == b.shape and a.strides == b.strides \
                and a.property != PropertyType.host_scalar:
            return [(a.id, b.id)]
        return []

    def _bound_tensors(self) -> dict[int, Tensor]:
        """The constants this partition carries (inlined Composite decompositions),
        wrapped once: constant data, so kernels may keep what they prepared from it."""
        if self._bound is None:
            values = getattr(self.partition.graph, "bound_constants", {})
            self._bound = {t: Tensor(self.lts[t], None, values[t]) for t in self.partition.bound_ids}
        return self._bound

    def _match(self, tensors, ids, what) -> dict[int, Tensor]:
        if not isinstance(tensors, (list, tuple)):
            raise InvalidArguments(
                f"partition {self.partition.id}: execute {what}s must be a list of Tensors, "
                f"got {type(tensors).__name__}")
        by_id = {}
        for t in tensors:
            if not isinstance(t, Tensor):
                raise InvalidArguments(
                    f"partition {self.partition.id}: execute {what} must be Tensors, got {type(t).__name__}")
            by_id[t.lt.id] = t
        matched = {}
        accepted = self._accepted
        for tid in ids:
            t = by_id.get(tid)
            if t is None:
                raise InvalidArguments(f"partition {self.partition.id}: {what} tensor {tid} is missing")
            # a Tensor's logical tensor never changes (LogicalTensors are values, never
            # mutated), so one that passed the checks below passes them again
            if accepted.get(tid) is not t.lt:
                self._check_tensor(t, tid, what)
                accepted[tid] = t.lt
            matched[tid] = t
        return matched

    def _check_tensor(self, t: Tensor, tid: int, what: str) -> None:
        """The tensor's data type, shape and layout are the compiled ones."""
        expected = self.lts[tid]
        if t.lt.dtype != expected.dtype:
            raise InvalidDataType(
                f"partition {self.partition.id}: {what} tensor {tid} is {t.lt.dtype.name}, "
                f"compiled for {expected.dtype.name}")
        if tuple(t.lt.shape) != tuple(expected.shape):
            raise InvalidShape(
                f"partition {self.partition.id}: {what} tensor {tid} has shape {list(t.lt.shape)}, "
                f"compiled for {list(expected.shape)}")
        if t.lt.encoding != expected.encoding:
            raise InvalidArguments(
                f"partition {self.partition.id}: {what} tensor {tid} is "
                f"{'sparse <%s>' % t.lt.encoding if t.lt.encoding else 'dense'}, compiled for "
                f"{'sparse <%s>' % expected.encoding if expected.encoding else 'dense'}")
        if expected.property != PropertyType.host_scalar and \
                not _same_strides(expected.shape, t.lt.strides, expected.strides):
            raise InvalidArguments(
                f"partition {self.partition.id}: {what} tensor {tid} has strides {list(t.lt.strides)}, "
                f"compiled for {list(expected.strides)}")

    def _check_outputs(self, outs: dict[int, Tensor], ins: dict[int, Tensor]) -> None:
        """Outputs must be writable, must not overlap themselves, each other or
        an input; an output that is exactly an input's memory (in place) is
        allowed when it is the only output, since every plan reads all inputs
        before it stores."""
        memories = [t.memory() for t in outs.values()]
        for tid, m in zip(outs, memories):
            if not m.flags.writeable:
                raise InvalidArguments(f"partition {self.partition.id}: output tensor {tid} is over read-only memory")
        # the layout checks depend only on the arrays (immutable in shape and
        # strides); weak references to the arrays last checked let a loop that
        # re-executes on the same tensors pay them once, without keeping them alive
        memories += [t.memory() for t in ins.values()]
        last = self._memories_checked
        if len(last) == len(memories):
            for r, m in zip(last, memories):
                if r() is not m:
                    break
            else:
                return
        self._check_layouts(outs, ins)
        self._memories_checked = tuple(weakref.ref(m) for m in memories)

    def _check_layouts(self, outs: dict[int, Tensor], ins: dict[int, Tensor]) -> None:
        pid = self.partition.id
        for tid, t in outs.items():
            if t.memory_overlaps_itself():
                raise InvalidArguments(
                    f"partition {pid}: output tensor {tid}'s memory has elements that overlap "
                    f"(a zero or overlapping stride); results would be lost")
        out_items = list(outs.items())
        for i, (tid, t) in enumerate(out_items):
            for other_id, other in out_items[i + 1:]:
                if _shares_memory(t.memory(), other.memory()):
                    raise InvalidArguments(
                        f"partition {pid}: output tensors {tid} and {other_id} share memory")
            for in_id, inp in ins.items():
                if not _shares_memory(t.memory(), inp.memory()):
                    continue
                if len(outs) == 1 and _same_memory(t, inp):
                    continue
                raise InvalidArguments(
                    f"partition {pid}: output tensor {tid} overlaps input tensor {in_id}; only "
                    f"the same memory with the same layout may be shared (in place), and only "
                    f"by a partition with one output")

    def _stage(self, tensors: dict[int, Tensor], what: str) -> dict[int, Tensor]:
        """Direct tensors for the plan: others are copied (inputs) or get private
        memory that is stored back through the user's strides (outputs)."""
        for t in tensors.values():
            if not t.is_direct():
                break
        else:
            return tensors
        staged = {}
        for tid, t in tensors.items():
            if t.is_direct():
                staged[tid] = t
                continue
            if what == "input" and t.lt.property == PropertyType.constant:
                address = t.memory().__array_interface__["data"][0]
                kept = self._constant_stages.get(tid)
                if kept is not None and kept[0] is t and kept[1] == address:
                    staged[tid] = kept[2]  # oneDNN: constant inputs do not change between executes
                    continue
                staged[tid] = t.staged(copy_values=True)
                self._constant_stages[tid] = (t, address, staged[tid])
                log(f"stage,partition {self.partition.id},constant input tensor {tid},"
                    f"memory layout differs from strides {list(t.lt.strides)}: copied in once")
                continue
            staged[tid] = t.staged(copy_values=what == "input")
            log(f"stage,partition {self.partition.id},{what} tensor {tid},"
                f"memory layout differs from strides {list(t.lt.strides)}: "
                f"{'copied in' if what == 'input' else 'stored back through its strides'}")
        return staged

    def execute(self, stream: Stream | None, inputs, outputs, scratchpad: Tensor | None = None) -> None:
        """Run the plan: inputs/outputs are Tensors matched to ports by id.

        ``scratchpad``: a tensor of :meth:`get_scratchpad_logical_tensor` (at
        least that many bytes) for the plan's intermediates.  Every check
        happens before the plan runs; a failed check leaves every output untouched.
        """
        scratch_memory, ins, outs = self._checked(stream, inputs, outputs, scratchpad)
        with memory.working(self._label, self._counted()):
            self._execute(stream, scratch_memory, ins, outs)

    def _counted(self) -> int:
        """Bytes of the partition's tensors a call holds before its plan allocates."""
        return self.need.total - self.need.intermediates

    def _execute(self, stream, scratch_memory, ins, outs) -> None:
        plan_ins, plan_outs = self._stage(ins, "input"), self._stage(outs, "output")
        reference = None
        if settings.check and self.plan.name != "reference":
            reference = self._reference_arrays(plan_ins)  # before outputs may overwrite inputs
        start = time.perf_counter()
        engine = stream.engine if stream is not None else self.engine
        allocator = engine.allocator if engine is not None and scratch_memory is None and self.scratch_bytes else None
        handle = None
        if allocator is not None:  # oneDNN's scratchpad from the engine's allocator, per execution
            scratch_memory, handle = allocator.take(self.scratch_bytes)
        try:
            with backend.scratch_arena(scratch_memory):
                self.plan.execute(plan_ins, plan_outs)
        finally:
            if handle is not None:
                allocator.give_back(handle)
        for tid, t in outs.items():
            if plan_outs[tid] is not t:
                t.write(plan_outs[tid].numpy())
        self.last_execute_ms = (time.perf_counter() - start) * 1e3
        if settings.verbose:  # (formatting the line costs more than a tiny kernel)
            log(f"exec,partition {self.partition.id},{self.partition.get_kind()},"
                f"kernel={self.plan.name},fpmath={self.request.fpmath},{self.last_execute_ms:.3f} ms")
        if reference is not None:
            self._check_against_reference(reference, outs)

    def bind(self, stream: Stream | None, inputs, outputs, scratchpad: Tensor | None = None):
        """A callable that executes this partition on exactly these Tensors, again and
        again (a compiled graph's steps): every check :meth:`execute` makes is made
        now, once, and so is the plan's per-call Python work where the plan has a
        bound form for these tensors (``plan.bind``: a linear layer, a normalization,
        f32 attention); other plans run their ``execute`` on the checked tensors.  The
        tensors' memory must stay where it is; their values may change between calls.
        Intermediates come from ``scratchpad`` (else from memory taken now), so every
        callable bound over one scratchpad must run one at a time.  While results are
        checked against the reference or logged (``GRAPH_API_CHECK``,
        ``GRAPH_API_VERBOSE``), or a variable tensor needs staging (a copy per call;
        constants are staged once), each call runs :meth:`execute`.  The callable's
        ``per_call_work`` says which of these it does ("execute", "plan"; absent: a
        bound form).

        Why: between two large kernels the interpreter's code and data have left the
        caches, and the few hundred Python steps of an execute then cost ~0.25 ms
        (measured on Zen 3: the BERT encoder's 54 partitions spent ~12 ms of ~124
        outside their kernels)."""
        def each_call():
            self.execute(stream, inputs, outputs, scratchpad)

        each_call.per_call_work = "execute"
        scratch_memory, ins, outs = self._checked(stream, inputs, outputs, scratchpad)
        with memory.working(self._label, self._counted()):
            return self._bind(each_call, scratch_memory, ins, outs)

    def _bind(self, each_call, scratch_memory, ins, outs):
        staged = self._stage(ins, "input")  # constants (unpacked int4 weights) are staged once and kept
        if settings.check or settings.verbose or self._stage(outs, "output") is not outs or \
                any(staged[t] is not ins[t] and ins[t].lt.property != PropertyType.constant for t in ins):
            return each_call
        ins = staged
        if self.scratch_bytes and scratch_memory is None:
            scratch_memory = memory.empty(self.scratch_bytes, np.uint8, "the scratchpad")
        fast = getattr(self.plan, "bind", None)
        with backend.scratch_arena(scratch_memory):
            runner = None if fast is None else fast(ins, outs)
        if runner is not None:
            return runner
        plan_execute, arena, work = self.plan.execute, backend.scratch_arena, memory.working
        label, counted = self._label, self._counted()

        def plan_call():
            with work(label, counted), arena(scratch_memory):
                plan_execute(dict(ins), dict(outs))  # copies: a plan's dicts are its own

        plan_call.per_call_work = "plan"
        return plan_call

    def _checked(self, stream, inputs, outputs, scratchpad):
        """(scratchpad bytes or None, input Tensors by id with the partition's bound
        constants, output Tensors by id) after every check of an execute's arguments."""
        if stream is not None and not isinstance(stream, Stream):
            raise InvalidArguments(f"execute needs a Stream, got {type(stream).__name__}")
        scratch_memory = self._scratch_memory(scratchpad)
        ins = self._match(inputs, self.partition.input_ids, "input")
        if self.partition.bound_ids:
            ins.update(self._bound_tensors())
        outs = self._match(outputs, self.request.output_ids, "output")
        self._check_outputs(outs, ins)
        return scratch_memory, ins, outs

    def _scratch_memory(self, scratchpad) -> np.ndarray | None:
        """The user's scratchpad as bytes (None when not given), checked for size."""
        if scratchpad is None:
            return None
        if not isinstance(scratchpad, Tensor):
            raise InvalidArguments(
                f"partition {self.partition.id}: the scratchpad must be a Tensor, got {type(scratchpad).__name__}")
        memory = scratchpad.memory()
        if memory.dtype != np.uint8 or memory.ndim != 1 or not memory.flags.c_contiguous \
                or not memory.flags.writeable:
            raise InvalidArguments(
                f"partition {self.partition.id}: the scratchpad must be a writable contiguous u8 "
                f"1-D tensor, got {scratchpad.lt!r}")
        if memory.size < self.scratch_bytes:
            raise InvalidArguments(
                f"partition {self.partition.id}: the scratchpad has {memory.size} bytes, execution "
                f"needs {self.scratch_bytes} (get_scratchpad_logical_tensor)")
        return memory

    def _reference_arrays(self, ins) -> dict:
        return backend.reference_plan(self.request).run_arrays({tid: t.numpy().copy() for tid, t in ins.items()})

    def _check_against_reference(self, arrays, outs) -> None:
        for tid, tensor in outs.items():
            verdict = compare(arrays[tid], tensor.numpy(), self.lts[tid].dtype, self.request.fpmath,
                              self.request.ops)
            if not verdict.ok:
                raise ExecutionError(
                    f"check mode: partition {self.partition.id} ({self.partition.get_kind()}, "
                    f"kernel {self.plan.name}) output {tid} differs from the unfused reference: {verdict.message}")


def _with_port_encoding(pid, what: str, lt: LogicalTensor, port: LogicalTensor) -> LogicalTensor:
    """``lt`` carrying the graph's sparse encoding of the port (a compile tensor
    may omit it; one that names another encoding is refused)."""
    if lt.encoding == port.encoding:
        return lt
    if lt.encoding is None:
        return lt.with_encoding(port.encoding)
    raise InvalidArguments(f"partition {pid}: {what} tensor {lt.id} has sparse encoding <{lt.encoding}>, "
                           f"the graph says {'<%s>' % port.encoding if port.encoding else 'dense'}")


def _shares_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Exact overlap test, bounded in work; a problem too hard to decide counts as shared."""
    try:
        return bool(np.shares_memory(a, b, max_work=10_000))
    except np.exceptions.TooHardError:
        return True


def _same_memory(a: Tensor, b: Tensor) -> bool:
    """Same start, strides, shape and item size: element i of one is element i of the other."""
    x, y = a.memory(), b.memory()
    return (x.__array_interface__["data"][0] == y.__array_interface__["data"][0]
            and x.shape == y.shape and x.strides == y.strides and x.itemsize == y.itemsize
            and a.lt.strides == b.lt.strides)


def _same_strides(shape, a, b) -> bool:
    """Same memory layout: strides agree on every dim of size > 1 (an empty
    tensor has no layout to disagree on)."""
    if 0 in shape:
        return True
    return all(x == y for d, x, y in zip(shape, a, b) if d > 1)

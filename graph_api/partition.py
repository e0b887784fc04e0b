"""``Partition`` (a set of ops to compile together) and ``CompiledPartition``."""
from __future__ import annotations

import time

import numpy as np

from .config import log, settings
from .engine import Engine, Stream
from .enums import EngineKind, LayoutType, OpKind, PropertyType
from .errors import (ExecutionError, InvalidArguments, InvalidDataType, InvalidShape,
                     op_label)
from .fpmath import FPMath
from .infer import merge_shapes, propagate
from .logical_tensor import LogicalTensor, dense_strides
from .tensor import Tensor

#: op kinds with no kernel: oneDNN returns them as unsupported partitions
UNSUPPORTED_KINDS = {OpKind.Wildcard, OpKind.End}

#: element-wise ops whose output may overwrite their first input (the post-op table)
from .postops import INPLACE_KINDS  # noqa: E402


class Partition:
    """A group of ops of one graph that compiles into one kernel plan."""

    def __init__(self, pid: int, graph, fusion):
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
        self.output_ids = []
        for op in self.ops:
            for lt in op.outputs:
                users = graph.consumers.get(lt.id, [])
                if not users or any(u not in op_set or graph.ops[u].kind == OpKind.End
                                    for u, _ in users):
                    self.output_ids.append(lt.id)
        self._cache: dict = {}

    # ------------------------------------------------------------ queries
    @property
    def pattern_name(self) -> str | None:
        pattern = self.fusion.pattern
        return None if pattern is None else getattr(pattern, "name", str(pattern))

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
        from .opset import OP_SCHEMAS
        from kernels.plan import CompileRequest
        from kernels.registry import select_plan

        reason = self.unsupported_reason()
        if reason:
            raise InvalidArguments(f"partition {self.id} is not supported and cannot compile: {reason}")
        if engine is not None and (not isinstance(engine, Engine) or engine.kind != self.engine_kind):
            raise InvalidArguments(f"partition {self.id}: compile needs a cpu Engine, got {engine!r}")
        in_lts = self._match_inputs(inputs)
        key = (tuple(lt.key() for lt in in_lts.values()),
               tuple(lt.key() for lt in outputs), self.fpmath, settings.reference)
        cached = self._cache.get(key)
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
                if final.strides is None or final.layout != LayoutType.strided:
                    final = final.with_shape(final.shape, dense_strides(final.shape), LayoutType.strided)
                lts[lt.id] = final
        request = CompileRequest(self.pattern_name, self.ops, lts, list(self.input_ids),
                                 list(self.output_ids), self.fpmath, dict(self.fusion.bindings))
        plan = select_plan(request)
        compiled = CompiledPartition(self, request, plan)
        ms = (time.perf_counter() - start) * 1e3
        compiled.compile_ms = ms
        log(f"compile,partition {self.id},{self.get_kind()},{len(self.ops)} ops,"
            f"kernel={plan.name},fpmath={self.fpmath},{ms:.3f} ms")
        self._cache[key] = compiled
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
                raise InvalidDataType(
                    f"partition {self.id}: input tensor {tid} is {lt.dtype.name}, the graph says {port.dtype.name}")
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
            matched[tid] = lt
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
            matched[tid] = LogicalTensor(tid, lt.dtype, shape, strides, LayoutType.strided, lt.property)
        return matched


class CompiledPartition:
    """A partition compiled for concrete shapes: ``execute`` runs its plan."""

    def __init__(self, partition: Partition, request, plan):
        self.partition = partition
        self.request = request
        self.plan = plan
        self.compile_ms = 0.0
        self.last_execute_ms = 0.0

    @property
    def lts(self) -> dict[int, LogicalTensor]:
        return self.request.lts

    def query_logical_tensor(self, tid: int) -> LogicalTensor:
        """The concrete logical tensor of an input or output port."""
        if tid not in self.request.input_ids and tid not in self.request.output_ids:
            raise InvalidArguments(
                f"compiled partition {self.partition.id}: tensor {tid} is not one of its ports "
                f"(inputs {self.request.input_ids}, outputs {self.request.output_ids})")
        return self.request.lts[tid]

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

    def _match(self, tensors, ids, what) -> dict[int, Tensor]:
        by_id = {}
        for t in tensors:
            if not isinstance(t, Tensor):
                raise InvalidArguments(
                    f"partition {self.partition.id}: execute {what} must be Tensors, got {type(t).__name__}")
            by_id[t.lt.id] = t
        matched = {}
        for tid in ids:
            t = by_id.get(tid)
            expected = self.lts[tid]
            if t is None:
                raise InvalidArguments(f"partition {self.partition.id}: {what} tensor {tid} is missing")
            if t.lt.dtype != expected.dtype:
                raise InvalidDataType(
                    f"partition {self.partition.id}: {what} tensor {tid} is {t.lt.dtype.name}, "
                    f"compiled for {expected.dtype.name}")
            if tuple(t.lt.shape) != tuple(expected.shape):
                raise InvalidShape(
                    f"partition {self.partition.id}: {what} tensor {tid} has shape {list(t.lt.shape)}, "
                    f"compiled for {list(expected.shape)}")
            if expected.property != PropertyType.host_scalar and t.lt.strides != expected.strides \
                    and np.prod(expected.shape) > 1:
                raise InvalidArguments(
                    f"partition {self.partition.id}: {what} tensor {tid} has strides {list(t.lt.strides)}, "
                    f"compiled for {list(expected.strides)}")
            matched[tid] = t
        return matched

    def execute(self, stream: Stream | None, inputs, outputs) -> None:
        """Run the plan: inputs/outputs are Tensors matched to ports by id."""
        if stream is not None and not isinstance(stream, Stream):
            raise InvalidArguments(f"execute needs a Stream, got {type(stream).__name__}")
        ins = self._match(inputs, self.request.input_ids, "input")
        outs = self._match(outputs, self.request.output_ids, "output")
        start = time.perf_counter()
        self.plan.execute(ins, outs)
        self.last_execute_ms = (time.perf_counter() - start) * 1e3
        log(f"exec,partition {self.partition.id},{self.partition.get_kind()},"
            f"kernel={self.plan.name},fpmath={self.request.fpmath},{self.last_execute_ms:.3f} ms")
        if settings.check and self.plan.name != "reference":
            self._check_against_reference(ins, outs)

    def _check_against_reference(self, ins, outs) -> None:
        from kernels.plan import ComposedPlan

        from .check import compare

        arrays = ComposedPlan(self.request).run_arrays({tid: t.numpy() for tid, t in ins.items()})
        for tid, tensor in outs.items():
            verdict = compare(arrays[tid], tensor.numpy(), self.lts[tid].dtype, self.request.fpmath,
                              self.request.ops)
            if not verdict.ok:
                raise ExecutionError(
                    f"check mode: partition {self.partition.id} ({self.partition.get_kind()}, "
                    f"kernel {self.plan.name}) output {tid} differs from the unfused reference: {verdict.message}")

"""Execution plans: what a compiled partition runs.

A plan is built once at compile time for concrete shapes and runs many times.
``ComposedPlan`` executes the partition's ops one by one through the numpy
reference kernels; it is the ground truth, the executor of every partition
without a fast kernel, and what check mode compares fast kernels against.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from graph_api.enums import OpKind
from graph_api.fpmath import FPMath

#: ops whose output is data decompressed from integers
_DEQUANTIZERS = {OpKind.DynamicDequantize, OpKind.Dequantize}
#: ops that only move or re-type data, so "came from integers" passes through them
_PASS_THROUGH = {OpKind.TypeCast, OpKind.Reorder, OpKind.StaticReshape, OpKind.StaticTranspose}
_INT_WEIGHT_CONSUMERS = {OpKind.MatMul, OpKind.Convolution, OpKind.ConvTranspose}


@dataclass
class CompileRequest:
    """Everything a kernel builder may look at: ops in order, every tensor's
    concrete logical tensor, port ids, fpmath and the pattern's bindings."""

    pattern: str | None
    ops: list
    lts: dict
    input_ids: list[int]
    output_ids: list[int]
    fpmath: FPMath
    bindings: dict = field(default_factory=dict)
    #: MatMul input ports fed by integers dequantized outside this request (a per-op
    #: plan's MatMul whose Dequantize is another op of the partition); None: look in ``ops``
    int_inputs: frozenset | None = None


def dequantized_inputs(ops) -> dict[int, frozenset]:
    """For each MatMul/Conv op id: input ports fed by integer data dequantized
    inside the same op list (through type casts and reshapes)."""
    producer = {lt.id: op for op in ops for lt in op.outputs}

    def from_integers(tid) -> bool:
        op = producer.get(tid)
        while op is not None and op.kind in _PASS_THROUGH:
            op = producer.get(op.inputs[0].id)
        return op is not None and op.kind in _DEQUANTIZERS

    return {op.id: frozenset(i for i, lt in enumerate(op.inputs) if from_integers(lt.id))
            for op in ops if op.kind in _INT_WEIGHT_CONSUMERS}


class ComposedPlan:
    """Runs each op through ``REFERENCE`` in topological order."""

    name = "reference"

    def __init__(self, request: CompileRequest):
        from graph_api.kernels.reference import REFERENCE, RefContext

        self.request = request
        self.ops = request.ops
        self.lts = request.lts
        int_inputs = dequantized_inputs(self.ops)
        self.steps = []
        for op in self.ops:
            ctx = RefContext(fpmath=request.fpmath, int_inputs=int_inputs.get(op.id, frozenset()))
            out_lts = [self.lts[lt.id] for lt in op.outputs]
            self.steps.append((REFERENCE[op.kind], op, out_lts, ctx))

    def run_arrays(self, arrays: dict) -> dict:
        """Execute on logical numpy arrays keyed by tensor id; returns all arrays."""
        arrays = dict(arrays)
        for fn, op, out_lts, ctx in self.steps:
            results = fn(op, [arrays[lt.id] for lt in op.inputs], out_lts, ctx)
            for lt, value in zip(out_lts, results):
                arrays[lt.id] = value
        return arrays

    def execute(self, inputs: dict, outputs: dict) -> None:
        arrays = self.run_arrays({tid: t.numpy() for tid, t in inputs.items()})
        for tid, tensor in outputs.items():
            tensor.write(arrays[tid])

"""A fused partition without a fused kernel: each op on its own single-op fast plan.

When every fused builder refuses (or the pattern has none: ``mqa_jax``; or the shapes, types or fpmath do
not suit the kernel: each builder says why), the
partition still should not run the f64 reference: this plan compiles each op
as if it were a single-op partition (BLAS MatMul, Numba element-wise and
norm kernels, f32 numpy formulas) and runs them in topological order.
Intermediates come from scratch memory at each execute; partition outputs are
written by the op that produces them.  Ops without a single-op fast plan
run as reference steps, named in the plan's name.  A MatMul whose input is dequantized from integers
inside the partition is told so (its fpmath rounding follows ``apply_to_int``
as in the fused reference).
"""
from __future__ import annotations

import numpy as np

from graph_api import dtypes
from graph_api.tensor import Tensor
from graph_api.kernels import scratch
from graph_api.kernels.plan import ComposedPlan, CompileRequest, dequantized_inputs


class _RefStep:
    """One op through the reference (kept as a plan with the same interface)."""

    name = "reference"

    def __init__(self, step):
        self.fn, self.op, self.out_lts, self.ctx = step

    def execute(self, inputs, outputs):
        results = self.fn(self.op, [inputs[lt.id].numpy() for lt in self.op.inputs], self.out_lts, self.ctx)
        for lt, value in zip(self.out_lts, results):
            outputs[lt.id].write(value)


class PerOpPlan:
    def __init__(self, request: CompileRequest, plans: list):
        self.request = request
        self.plans = plans  # (op, plan)
        outs = set(request.output_ids)
        #: intermediates, taken from scratch memory at every execute
        self.between = [request.lts[lt.id] for op, _ in plans for lt in op.outputs if lt.id not in outs]
        slow = sorted({op.kind.name for op, p in plans if p.name == "reference"})
        self.name = "per_op_fast" + (f"+ref[{','.join(slow)}]" if slow else "")
        self.fast = len(slow) < len({op.kind for op, _ in plans})

    def execute(self, inputs: dict, outputs: dict) -> None:
        tensors = dict(inputs)
        tensors.update({lt.id: _scratch_tensor(lt) for lt in self.between})
        tensors.update(outputs)
        for op, plan in self.plans:
            plan.execute({lt.id: tensors[lt.id] for lt in op.inputs},
                         {lt.id: tensors[lt.id] for lt in op.outputs})


def _scratch_tensor(lt) -> Tensor:
    """A tensor of ``lt`` over scratch memory (packed bytes for s4/u4)."""
    info = dtypes.info(lt.dtype)
    n = 0 if 0 in lt.shape else 1 + sum((d - 1) * s for d, s in zip(lt.shape, lt.strides))  # the strided span
    flat = scratch.empty((n + 1) // 2, np.uint8) if info.packed else scratch.empty(n, info.np_dtype)
    return Tensor(lt, None, flat)


def build(request: CompileRequest, single_op_builder):
    """A :class:`PerOpPlan`, or a reason when no op of the partition gets a fast plan."""
    int_inputs = dequantized_inputs(request.ops)
    ref_steps = {s[1].id: s for s in ComposedPlan(request).steps}
    plans = []
    for op in request.ops:
        plan = None
        builder = single_op_builder(op.kind)
        if builder is not None:
            sub = CompileRequest(None, [op], request.lts, [lt.id for lt in op.inputs],
                                 [lt.id for lt in op.outputs], request.fpmath,
                                 int_inputs=int_inputs.get(op.id) or None)
            plan = builder(sub)
            if isinstance(plan, str):
                plan = None
        plans.append((op, plan if plan is not None else _RefStep(ref_steps[op.id])))
    result = PerOpPlan(request, plans)
    return result if result.fast else "no op of the partition has a single-op fast plan"

"""The ``grouped_matmul`` partition: every expert of a mixture-of-experts layer.

Plans, by the experts' template (``request.bindings["template"]``):

* **compressed experts** (``expert_matmul`` with an s4/u4/s8/u8 DynamicDequantize
  weight, or ``gated_mlp`` with three such weights; constant weights, f32
  activations and output, strict fpmath): every expert's weights are prepared once
  (:func:`~graph_api.kernels.weight_compressed.wmatmul.prepare`) into *one* stacked
  buffer, and all experts with at most :data:`GROUPED_MAX_ROWS` tokens run in one
  parallel launch (:mod:`graph_api.kernels.grouped.grouped_gemv`: work items over
  (expert, 8-row block, 128-column block)).  The gated MLP takes two launches
  (gate and up together, then down) with ``h = act(gate) * up`` between them.
  Experts with more tokens (prefill) run the weight-compressed prefill of
  :func:`~graph_api.kernels.weight_compressed.wmatmul.wmatmul` on their slice of the
  stacked weights, one call per expert (each call a parallel kernel of its own).
* **everything else** (f32/bf16/f16 experts; post-ops the grouped kernel does not
  take): one plan per expert, chosen by the registry for the expert alone (the f32
  MatMul: OpenBLAS per expert, each call multi-threaded), run one after the other.
  Not one launch: BLAS has no grouped entry here.

The experts must agree on K, N, dtypes and attributes (the RFC's uniform K and N);
the partitioner checks what the graph knows, :func:`check_experts` the concrete
shapes at compile (``InvalidShape`` / ``InvalidDataType`` naming the op).  An expert
may have no tokens (M = 0): its output is empty.
"""
from __future__ import annotations

import numpy as np

from graph_api.errors import InvalidDataType, InvalidShape, op_label
from graph_api.kernels.plan import CompileRequest
from graph_api.patterns.library.moe import expert_op_ids, expert_signature, token_tensors

#: experts with more tokens than this leave the grouped launch for the per-expert prefill
GROUPED_MAX_ROWS = 32


# ------------------------------------------------------------------ the experts
def expert_ops(request: CompileRequest) -> list[list]:
    """Each expert's ops (roles in name order)."""
    by_id = {op.id: op for op in request.ops}
    return [[by_id[i] for i in expert_op_ids(b)] for b in request.bindings["experts"]]


def check_experts(request: CompileRequest) -> None:
    """Raise when the concrete shapes or dtypes of an expert differ from expert 0's."""
    experts = expert_ops(request)
    first = expert_signature(experts[0], request.lts)
    for e, ops in enumerate(experts[1:], 1):
        for op0, op, a, b in zip(experts[0], ops, first, expert_signature(ops, request.lts)):
            for side, xs, ys, lts in (("input", a[2], b[2], op.inputs), ("output", a[3], b[3], op.outputs)):
                for port, ((dt0, d0), (dt1, d1), lt) in enumerate(zip(xs, ys, lts)):
                    if dt0 != dt1:
                        raise InvalidDataType(
                            f"grouped_matmul: expert {e} {op_label(op)} {side} {port} (tensor {lt.id}) is "
                            f"{dt1.name}, expert 0's {op_label(op0)} has {dt0.name}; experts share dtypes")
                    if d0 != d1:
                        what = "K/N and every dim but the token count"
                        raise InvalidShape(
                            f"grouped_matmul: expert {e} {op_label(op)} {side} {port} (tensor {lt.id}) has "
                            f"dims {list(d1)}, expert 0's {op_label(op0)} has {list(d0)} (the token dims "
                            f"left out); experts share {what}")


def sub_request(request: CompileRequest, bindings: dict, template: str, ops: list,
                one_row: bool = False) -> CompileRequest:
    """The request of one expert alone, as its own pattern's partition would make it.
    ``one_row``: token tensors with no rows are given one (for builders that only
    validate; no plan made from it runs)."""
    ids = {op.id for op in ops}
    ordered = [op for op in request.ops if op.id in ids]  # topological
    produced = {lt.id for op in ordered for lt in op.outputs}
    used = {lt.id for op in ordered for lt in op.inputs}
    lts = {t: request.lts[t] for t in produced | used}
    if one_row:
        tokens = token_tensors(ordered)
        for tid in tokens:
            shape = lts[tid].shape
            if shape and 0 in shape[:-1]:
                lts[tid] = lts[tid].with_shape((1,) * (len(shape) - 1) + tuple(shape[-1:]))
    if template == "expert_matmul":
        pattern = "matmul_compressed" if bindings.get("wei_dequant") is not None else None
    else:
        pattern = template
    return CompileRequest(pattern if len(ordered) > 1 else None, ordered, lts,
                          [t for t in request.input_ids if t in used],
                          [t for t in request.output_ids if t in produced], request.fpmath,
                          dict(bindings) if pattern else {})


class PerExpertPlan:
    """Each expert's own plan (the registry's choice for it alone), one after the other."""

    def __init__(self, request: CompileRequest, reason: str = ""):
        from graph_api.kernels.registry import select_plan

        self.request = request
        template = request.bindings["template"]
        self.steps = []
        for b, ops in zip(request.bindings["experts"], expert_ops(request)):
            sub = sub_request(request, b, template, ops)
            self.steps.append((select_plan(sub), sub.input_ids, sub.output_ids))
        kinds = sorted({plan.name for plan, _, _ in self.steps})
        self.name = "per_expert(" + ",".join(kinds) + ")"
        self.fallback_reason = reason

    def execute(self, inputs: dict, outputs: dict) -> None:
        for plan, ins, outs in self.steps:
            plan.execute({t: inputs[t] for t in ins}, {t: outputs[t] for t in outs})


def build(request: CompileRequest):
    check_experts(request)
    from . import compressed

    plan = compressed.build(request)
    if isinstance(plan, str):
        return PerExpertPlan(request, plan)
    return plan


def write_output(tensor, values: np.ndarray) -> None:
    """Put f32 ``values`` into an output tensor (in place when it is a plain view)."""
    view = tensor.numpy()
    if view.dtype == np.float32 and view.flags.c_contiguous and tensor.is_view_of(view):
        view.reshape(values.shape)[...] = values
    else:
        tensor.write(values.reshape(view.shape))

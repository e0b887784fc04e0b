"""DynamicQuantize / DynamicDequantize single ops on ``graph_api.kernels.quantize``.

Groups of ``G`` consecutive elements along the last axis (``group_shape``
``[1, .., 1, G]``) and per-tensor parameters (one group per row, the scale
broadcast); int4 data stays packed (the output tensor's packed buffer is
written directly, a packed input is read from its buffer).  The arithmetic is
the reference's: ``rne(x / s) + z`` saturated, ``(q - z) * s`` in f32.
Other granularities run the f32 numpy formula (``numpy_direct``).
"""
from __future__ import annotations

import numpy as np

from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K
from graph_api.kernels.plan import CompileRequest

_INT = {DataType.s8: "s8", DataType.u8: "u8", DataType.s4: "s4", DataType.u4: "u4"}
_OUT = {DataType.f32: "f32", DataType.bf16: "bf16", DataType.f16: "f16"}


def _group(op, x_shape, s_shape) -> int | str:
    from graph_api.kernels.reference.quant import group_shape

    C = x_shape[-1] if x_shape else 1
    if op.attrs["qtype"] == "per_tensor":
        return C
    if op.attrs["qtype"] != "per_group":
        return f"qtype {op.attrs['qtype']}"
    groups = group_shape(op, x_shape, s_shape)
    if any(g != 1 for g in groups[:-1]) or not groups or C % groups[-1]:
        return f"group_shape {groups} does not group along the last axis only"
    return int(groups[-1])


class QuantPlan:
    """See the module docstring."""

    def __init__(self, request: CompileRequest, op, G: int):
        self.op, self.G = op, G
        lts = request.lts
        self.x_id, self.s_id = op.inputs[0].id, op.inputs[1].id
        self.z_id = op.inputs[2].id if len(op.inputs) > 2 else None
        self.out_id = op.outputs[0].id
        self.shape = tuple(lts[self.x_id].shape)
        self.per_tensor = op.attrs["qtype"] == "per_tensor"
        self.rows = int(np.prod(self.shape[:-1])) if self.shape else 1
        self.quant = op.kind == K.DynamicQuantize
        self.dtype = _INT[lts[self.out_id].dtype if self.quant else lts[self.x_id].dtype]
        self.out_dtype = None if self.quant else _OUT[lts[self.out_id].dtype]
        self.name = "numba_quantize" if self.quant else "numba_dequantize"

    def _param(self, inputs, tid):
        a = np.asarray(inputs[tid].numpy(), np.float32).reshape(-1)
        return np.broadcast_to(a, (self.rows,)) if self.per_tensor else a

    def execute(self, inputs: dict, outputs: dict) -> None:
        from graph_api.kernels import quantize

        s = self._param(inputs, self.s_id)
        z = None if self.z_id is None else self._param(inputs, self.z_id)
        out = outputs[self.out_id]
        if self.quant:
            x = inputs[self.x_id].numpy()
            buf = out.buffer if out.packed else out.buffer.view(np.int8 if self.dtype == "s8" else np.uint8)
            quantize.quantize(x, s, z, dtype=self.dtype, group=self.G, out=buf)
        else:
            src = inputs[self.x_id]
            q = src.buffer if src.packed else src.numpy()
            buf = out.buffer if self.out_dtype == "f32" else out.buffer.view(np.uint16)
            quantize.dequantize(q, self.shape, s, z, dtype=self.dtype, group=self.G, out=buf,
                                out_dtype=self.out_dtype)


def build(request: CompileRequest):
    """A :class:`QuantPlan` for a single dynamic (de)quantize op, or why not."""
    from graph_api.kernels.weight_compressed.wmatmul_plan import zero_size_reason

    reason = zero_size_reason(request)  # the kernel's groups assume elements
    if reason:
        return reason
    (op,) = request.ops
    lts = request.lts
    x, out = lts[op.inputs[0].id], lts[op.outputs[0].id]
    if not x.shape or not x.is_dense() or not out.is_dense():
        return "needs dense tensors of rank >= 1"
    if op.kind == K.DynamicQuantize and (out.dtype not in _INT or x.dtype not in _OUT):
        return f"{x.dtype.name} -> {out.dtype.name}"
    if op.kind == K.DynamicDequantize and (x.dtype not in _INT or out.dtype not in _OUT):
        return f"{x.dtype.name} -> {out.dtype.name}"
    if len(op.inputs) > 2 and lts[op.inputs[2].id].dtype not in (DataType.s8, DataType.u8, DataType.s32,
                                                                    DataType.f32):
        return "zero points type"
    G = _group(op, tuple(x.shape), tuple(lts[op.inputs[1].id].shape))
    if isinstance(G, str):
        return G
    return QuantPlan(request, op, G)

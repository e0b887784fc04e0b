"""Image-blocked plans for the memory-bound CNN fusions: pooling, BatchNorm,
GroupNorm, Interpolate, int8 Concat and their post-op chains.

Every op of such a partition treats the images of a batch independently, so the
plan runs the whole partition one image at a time: each op's reference kernel
on that image's slice (batch 1), the next op reading the previous result while
it is still in L2, and only the partition outputs written to memory.  The
arithmetic is the reference's, op by op (bit-identical results); what changes is
that a chain of k ops over a batch costs one pass over memory instead of k.

A partition qualifies when every op is batch-separable (:func:`_separable`) and
every tensor its ops see is either batch-shaped (sliced) or a parameter that
does not vary along the batch (broadcast, per-channel vectors, scalars).
"""
from __future__ import annotations

import numpy as np

from graph_api import dtypes
from graph_api.enums import OpKind as K
from graph_api.logical_tensor import LogicalTensor
from graph_api.postops import FUSABLE_BINARY
from graph_api.kernels import scratch
from graph_api.kernels.plan import CompileRequest
from graph_api.kernels.reference import REFERENCE, RefContext
from graph_api.kernels.reference.eltwise import ELTWISE

_PER_IMAGE = {K.AvgPool, K.MaxPool, K.Interpolate, K.BatchNormInference, K.GroupNorm, K.TypeCast,
              K.BiasAdd} | FUSABLE_BINARY


def _separable(op, lts) -> str | None:
    """Why ``op`` mixes images of the batch, or None."""
    rank = len(lts[op.outputs[0].id].shape or ())
    if rank < 2:
        return f"{op.kind.name} (op {op.id}) output has no batch dim"
    if op.kind in _PER_IMAGE or op.kind in ELTWISE:
        return None
    if op.kind in (K.Quantize, K.Dequantize):
        if op.attrs["qtype"] == "per_channel" and op.attrs["axis"] % rank == 0:
            return f"{op.kind.name} (op {op.id}) is per channel along the batch"
        return None
    if op.kind == K.Concat:
        return None if op.attrs["axis"] % rank != 0 else f"Concat (op {op.id}) joins along the batch"
    if op.kind == K.StaticTranspose:
        order = [a % rank for a in op.attrs["order"]]
        return None if order and order[0] == 0 else f"StaticTranspose (op {op.id}) moves the batch dim"
    return f"{op.kind.name} (op {op.id}) is not image-separable here"


class BlockedPlan:
    """The partition's reference steps, run image by image."""

    name = "image_blocked"

    def __init__(self, request: CompileRequest, batch: int, sliced: set):
        self.request = request
        self.batch = batch
        self.sliced = sliced  # tensor ids whose dim 0 is the batch
        lts = request.lts
        self.steps = []
        for op in request.ops:
            out_lts = [LogicalTensor(lt.id, lts[lt.id].dtype, [1] + list(lts[lt.id].shape[1:]))
                       for lt in op.outputs]
            self.steps.append((REFERENCE[op.kind], op, out_lts, RefContext(fpmath=request.fpmath)))

    def run_arrays(self, arrays: dict) -> dict:
        arrays = dict(arrays)
        lts = self.request.lts
        results = {tid: scratch.empty(lts[tid].shape, dtypes.numpy_dtype(lts[tid].dtype))
                   for tid in self.request.output_ids}
        for n in range(self.batch):
            local = {tid: (a[n:n + 1] if tid in self.sliced else a) for tid, a in arrays.items()}
            for fn, op, out_lts, ctx in self.steps:
                for lt, value in zip(out_lts, fn(op, [local[i.id] for i in op.inputs], out_lts, ctx)):
                    local[lt.id] = value
            for tid, out in results.items():
                out[n:n + 1] = local[tid]
        arrays.update(results)
        return arrays

    def execute(self, inputs: dict, outputs: dict) -> None:
        arrays = self.run_arrays({tid: t.numpy() for tid, t in inputs.items()})
        for tid, tensor in outputs.items():
            tensor.write(arrays[tid])


def build(request: CompileRequest):
    """An image-blocked plan, or why the partition cannot be split by image."""
    lts = request.lts
    for op in request.ops:
        reason = _separable(op, lts)
        if reason:
            return reason
    data = [lts[t] for t in request.input_ids if lts[t].shape]
    rank = max(len(lt.shape) for lt in data)
    batch = next(lt.shape[0] for lt in data if len(lt.shape) == rank)
    for op in request.ops:  # the steps run each op's outputs as [1, ...]: all lead with the batch
        for lt in op.outputs:
            if tuple(lts[lt.id].shape[:1]) != (batch,):
                return (f"{op.kind.name} (op {op.id}) output {lt.id} {list(lts[lt.id].shape)} does not "
                        f"lead with the batch {batch} (a broadcast changed the rank)")
    sliced = set()
    for op in request.ops:
        out_rank = len(lts[op.outputs[0].id].shape)
        for lt in list(op.inputs) + list(op.outputs):
            shape = lts[lt.id].shape
            if shape and len(shape) == out_rank and shape[0] == batch and batch > 1:
                sliced.add(lt.id)
            elif shape and len(shape) == out_rank and len(shape) == rank and shape[0] not in (1, batch):
                return f"tensor {lt.id} has a leading dim {shape[0]} that is neither 1 nor the batch"
    if any(lts[t].shape[0] != batch for t in request.output_ids) and batch > 1:
        return "an output is not batch-shaped"
    return BlockedPlan(request, batch, sliced)


class ShufflePlan:
    """reshape -> transpose -> reshape as one strided copy (the reshapes are views)."""

    name = "shuffle_copy"

    def __init__(self, request: CompileRequest, mid_shape, order, out_id):
        self.request = request
        self.mid_shape = tuple(mid_shape)
        self.order = tuple(order)
        self.out_id = out_id

    def run_arrays(self, arrays: dict) -> dict:
        x = arrays[self.request.input_ids[0]]
        out_shape = self.request.lts[self.out_id].shape
        y = np.ascontiguousarray(np.transpose(np.reshape(x, self.mid_shape), self.order))
        return {**arrays, self.out_id: y.reshape(out_shape)}

    def execute(self, inputs: dict, outputs: dict) -> None:
        arrays = self.run_arrays({tid: t.numpy() for tid, t in inputs.items()})
        for tid, tensor in outputs.items():
            tensor.write(arrays[tid])


def build_shuffle(request: CompileRequest):
    """The plan of a ``shuffle`` partition (shapes from the compiled logical tensors)."""
    b, lts = request.bindings, request.lts
    ops = {op.id: op for op in request.ops}
    reshape, transpose, back = ops[b["reshape"]], ops[b["transpose"]], ops[b["back_reshape"]]
    mid = lts[reshape.outputs[0].id].shape
    order = [a % len(mid) for a in transpose.attrs["order"]]
    if len(request.input_ids) != 1 or sorted(order) != list(range(len(mid))):
        return "not a single-input reshape-transpose-reshape"
    return ShufflePlan(request, mid, order, back.outputs[0].id)

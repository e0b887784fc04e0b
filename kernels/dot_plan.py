"""The plan of partitions whose MatMul carries an ``algorithm`` or ``indexing_maps``,
is a BatchReduceMatMul, or has transposes folded into its maps.

The MatMul runs in :mod:`graph_api.kernels.dot_algorithms` (f32 BLAS on strided views,
algorithm parts), reading folded producers' sources directly; every other op
of the partition (bias is part of the core, post-ops are not) runs through the
reference kernels after it (:class:`~graph_api.kernels.fused.hybrid.HybridPlan`).

:func:`needs_dot_plan` is what the registry asks first: such partitions never
reach a fast kernel that ignores the algorithm or the maps; when :func:`build`
refuses, the registry runs the composed reference, which honours both.
"""
from __future__ import annotations

import numpy as np

from graph_api import dot_algorithm, dtypes, indexing_maps
from graph_api.dtypes import DataType
from graph_api.enums import OpKind

from .dot_algorithms import contract, matmul_with_algorithm
from .plan import CompileRequest

DOTS = (OpKind.MatMul, OpKind.BatchReduceMatMul)
FOLD_PATTERN = "matmul_indexing_maps"


def needs_dot_plan(request: CompileRequest) -> bool:
    """A MatMul with an algorithm or maps, a BatchReduceMatMul, or folded maps."""
    return request.pattern == FOLD_PATTERN or any(
        op.kind == OpKind.BatchReduceMatMul
        or (op.kind == OpKind.MatMul and ("algorithm" in op.attrs or "indexing_maps" in op.attrs))
        for op in request.ops)


def _folds(request: CompileRequest, ops: dict) -> dict:
    b = request.bindings
    return {port: ops[b[role]] for port, role in ((0, "a_fold"), (1, "b_fold"))
            if b.get(role) is not None}


def _core_op(request: CompileRequest):
    """(the dot op as computed, covered op ids) or a reason string."""
    dots = [op for op in request.ops if op.kind in DOTS]
    if len(dots) != 1:
        return f"{len(dots)} MatMul ops in the partition (the dot plan computes one)"
    dot, ops = dots[0], {op.id: op for op in request.ops}
    covered = {dot.id}
    if request.pattern == FOLD_PATTERN:
        folds = _folds(request, ops)
        dot = indexing_maps.folded_matmul(dot, folds, lambda lt: request.lts[lt.id].shape)
        if dot is None:
            return "the folded maps do not hold for these shapes"
        covered |= {op.id for op in folds.values()}
    for lt in dot.inputs:
        if lt.id not in request.input_ids:
            return f"MatMul operand tensor {lt.id} is computed inside the partition"
    return dot, covered


def build(request: CompileRequest):
    """A HybridPlan with the dot as its core, or why not."""
    from .fused.hybrid import HybridPlan
    from .weight_compressed.wmatmul_plan import zero_size_reason

    reason = zero_size_reason(request)  # e.g. a batch-reduce over no GEMMs: the reference sums to 0
    if reason:
        return reason
    core_op = _core_op(request)
    if isinstance(core_op, str):
        return core_op
    dot, covered = core_op
    out_lt = request.lts[dot.outputs[0].id]
    algorithm = dot_algorithm.algorithm_of(dot)
    explicit = "indexing_maps" in dot.attrs or dot.kind == OpKind.BatchReduceMatMul
    maps = (indexing_maps.maps_of(dot) or indexing_maps.default(dot.kind.name, True)) if explicit else None
    fpmath, accumulation = request.fpmath, dot.attrs.get("accumulation_mode", "strict")

    def operand(inputs, index):
        lt = dot.inputs[index]
        x = inputs[lt.id].numpy()
        if algorithm is not None:  # the algorithm wins: it rounds the operands itself
            return dtypes.to_f32(x)
        return fpmath.round_input(x, request.lts[lt.id].dtype)

    def core(inputs, arrays):
        a, b = operand(inputs, 0), operand(inputs, 1)
        if maps is not None:
            acc = matmul_with_algorithm(a, b, algorithm, lambda x, y: contract(x, y, maps))
            acc = indexing_maps.broadcast_c(acc, maps, out_lt.shape)
        else:
            acc = matmul_with_algorithm(*_flagged(a, b, dot), algorithm)
            acc = _drop_unit(acc, a.ndim, b.ndim)
        if accumulation == "f16":
            acc = dtypes.round_through(acc, DataType.f16)
        if len(dot.inputs) > 2:
            acc = acc + dtypes.to_f32(inputs[dot.inputs[2].id].numpy())
        arrays[out_lt.id] = dtypes.convert(np.broadcast_to(acc, out_lt.shape), out_lt.dtype)

    name = "dot_" + (algorithm_name(dot) if algorithm else "f32") + ("_maps" if maps else "")
    return HybridPlan(request, name, core, covered)


def algorithm_name(op) -> str:
    value = op.attrs["algorithm"]
    return value if isinstance(value, str) else "custom"


def _flagged(a, b, op):
    """transpose_a/b as swapped views; 1-D operands promoted (numpy matmul rules)."""
    if op.attrs.get("transpose_a", False) and a.ndim > 1:
        a = np.swapaxes(a, -1, -2)
    if op.attrs.get("transpose_b", False) and b.ndim > 1:
        b = np.swapaxes(b, -1, -2)
    a = a[np.newaxis, :] if a.ndim == 1 else a
    b = b[:, np.newaxis] if b.ndim == 1 else b
    return a, b


def _drop_unit(acc, a_rank: int, b_rank: int):
    if b_rank == 1:
        acc = acc[..., 0]
    if a_rank == 1:
        acc = acc[..., 0, :] if b_rank != 1 else acc[..., 0]
    return acc

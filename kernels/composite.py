"""Fast kernels for Composite ops, by name and version: ``FAST_COMPOSITES``.

Each entry says how the backend runs the composite natively: its *native form*, a
few ordinary ops over the composite's own tensors (the seed's "first region": the
op the composite abstracts), compiled like a partition of its own.  The native
form of ``gated_mlp`` and ``sdpa`` is exactly what the ``gated_mlp`` and ``sdpa``
patterns fuse, so they run the existing Numba kernels (``graph_api.kernels.fused``);
``tanh``, ``gelu_tanh`` and ``rms_norm`` run the runtime's own Tanh, GELU and
RMSNorm kernels.  ``suits`` refuses shapes the kernel does not take (checked on the
graph's shapes at ``get_partitions``; a refusal there inlines the decomposition).

A composite not listed here is always inlined (its decomposition is the only
implementation).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

from graph_api.enums import OpKind as K
from graph_api.logical_tensor import dense_strides
from graph_api.op import Op

from .plan import CompileRequest


@dataclass(frozen=True)
class Native:
    """How one composite runs natively."""

    what: str  # "the runtime's Tanh op", for verbose lines and explanations
    ops: Callable  # (composite op, fresh tensor ids) -> [Op] over the composite's tensors
    suits: Callable = lambda op, lts: None  # (op, input lts) -> None, or why not


def _one_op(kind, fixed=None, **from_attrs) -> Callable:
    """One op of ``kind``: ``fixed`` attributes, and attributes named after the composite's."""
    def build(op, fresh):
        given = dict(fixed or {})
        given.update({name: op.attrs[source] for name, source in from_attrs.items()})
        return [Op(0, kind, op.inputs, op.outputs, attrs=given)]
    return build


def _fresh_lt(fresh, like):
    from graph_api.logical_tensor import LogicalTensor

    return LogicalTensor(next(fresh), like.dtype)


def _gated_mlp_ops(op, fresh):
    x, w_gate, w_up, w_down = op.inputs
    gate, act, silu, up, hidden = (_fresh_lt(fresh, x) for _ in range(5))
    return [Op(0, K.MatMul, [x, w_gate], [gate]),
            Op(1, K.Sigmoid, [gate], [act]),
            Op(2, K.Multiply, [gate, act], [silu]),
            Op(3, K.MatMul, [x, w_up], [up]),
            Op(4, K.Multiply, [silu, up], [hidden]),
            Op(5, K.MatMul, [hidden, w_down], op.outputs)]


def _sdpa_ops(op, fresh):
    q, k, v, scale, mask = op.inputs
    scores, scaled, masked, probs = (_fresh_lt(fresh, q) for _ in range(4))
    return [Op(0, K.MatMul, [q, k], [scores], attrs={"transpose_b": True}),
            Op(1, K.Multiply, [scores, scale], [scaled]),
            Op(2, K.Add, [scaled, mask], [masked]),
            Op(3, K.SoftMax, [masked], [probs], attrs={"axis": -1}),
            Op(4, K.MatMul, [probs, v], op.outputs)]


def _known_shapes(op, lts) -> str | None:
    unknown = [lt.id for lt in lts if not lt.is_shape_known()]
    return f"tensors {unknown} have no concrete shape in the graph" if unknown else None


def _sdpa_suits(op, lts) -> str | None:
    reason = _known_shapes(op, lts)
    if reason:
        return reason
    q, k, v, scale, _ = (lt.shape for lt in lts)
    if q[-1] != k[-1] or k[:-1] != v[:-1]:
        return f"q {list(q)}, k {list(k)}, v {list(v)}: K/V must share [B, H, S] and Q's head size"
    if v[-1] != q[-1]:
        return f"v head size {v[-1]} differs from q's {q[-1]}"
    return None


#: (name, version) -> how it runs natively
FAST_COMPOSITES: dict[tuple[str, int], Native] = {
    ("tanh", 1): Native("the runtime's Tanh op", _one_op(K.Tanh)),
    ("gelu_tanh", 1): Native("the runtime's GELU op (mode gelu_tanh)",
                             _one_op(K.GELU, {"mode": "gelu_tanh"})),
    ("rms_norm", 1): Native("the runtime's RMSNorm op", _one_op(K.RMSNorm, epsilon="epsilon")),
    ("gated_mlp", 1): Native("the gated_mlp fused kernel", _gated_mlp_ops, _known_shapes),
    ("sdpa", 1): Native("the sdpa fused kernel", _sdpa_ops, _sdpa_suits),
}


class CompositePlan:
    """A composite's native plan; ``name`` says which composite and which kernel."""

    def __init__(self, label: str, native: Native, plan):
        self.plan = plan
        self.name = f"composite {label}: {native.what} ({plan.name} plan)"

    def execute(self, inputs, outputs) -> None:
        self.plan.execute(inputs, outputs)


#: ``(ops, fpmath) -> (fusions, tensors, ops in topological order)``: the native ops
#: as a finalized graph, partitioned.  Graphs belong to the runtime, above this layer,
#: so the runtime's backend seam installs this function (graph_api.backend) and the
#: kernels never import it.
partition_native: Callable | None = None


def _native_request(request: CompileRequest, native: Native) -> CompileRequest:
    """The native ops as a request of their own, with the pattern that fuses them."""
    op = request.ops[0]
    ports = {lt.id: request.lts[lt.id] for lt in op.inputs + op.outputs}
    fresh = itertools.count(max(request.lts) + 1)
    ops = native.ops(op.copy(), fresh)
    for o in ops:
        o.inputs = [ports.get(lt.id, lt) for lt in o.inputs]
        o.outputs = [ports.get(lt.id, lt) for lt in o.outputs]
    if partition_native is None:
        raise RuntimeError("graph_api.backend did not install kernels.composite.partition_native")
    fusions, tensors, ordered = partition_native(ops, request.fpmath)
    pattern, bindings = None, {}
    if len(fusions) == 1 and fusions[0].pattern is not None:
        pattern, bindings = fusions[0].pattern.name, dict(fusions[0].bindings)
    lts = dict(request.lts)
    for tid, lt in tensors.items():
        lts.setdefault(tid, lt.with_shape(lt.shape, dense_strides(lt.shape)))
    return CompileRequest(pattern, ordered, lts, list(request.input_ids), list(request.output_ids),
                          request.fpmath, bindings)


def build(request: CompileRequest):
    """``KERNELS['composite']``: the registered native plan of a one-Composite partition."""
    from graph_api.composite import NAME, VERSION

    from .registry import select_plan

    op = request.ops[0]
    key = (op.attrs[NAME], op.attrs[VERSION])
    native = FAST_COMPOSITES.get(key)
    if native is None:
        return f"no fast kernel is registered for composite '{key[0]}' v{key[1]}"
    refusal = native.suits(op, [request.lts[lt.id] for lt in op.inputs])
    if refusal:
        return refusal
    return CompositePlan(f"'{key[0]}' v{key[1]}", native, select_plan(_native_request(request, native)))

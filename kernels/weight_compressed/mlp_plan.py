"""Gated MLP partitions with compressed weights on the weight-compressed MatMul kernels.

    gate = act(x @ dequant(W_gate))          one kernel call, activation in its epilogue
    h    = gate (*) (x @ dequant(W_up))      one kernel call, the gating binary in its epilogue
    out  = h @ dequant(W_down)               [TypeCast of h done by the up kernel's store]

Each call streams its packed weights once; the activation is read from L1/L2.
Float weights (any of the three) run f32 BLAS with the same epilogues
(:class:`~graph_api.kernels.weight_compressed.wmatmul_plan.DenseLinear`).
"""
from __future__ import annotations

from graph_api.kernels.plan import CompileRequest

from graph_api.kernels.fused.epilogue import bind, chain_program
from graph_api.kernels.fused.hybrid import HybridPlan
from .wmatmul_plan import make_linear


def build(request: CompileRequest):
    b, lts = request.bindings, request.lts
    ops = {op.id: op for op in request.ops}
    linears = {}
    for role in ("gate", "up", "down"):
        linear = make_linear(request, b.get(f"{role}_wei_dequant"), b[f"{role}_matmul"],
                             any_out=role == "down")
        if isinstance(linear, str):
            return f"{role} projection: {linear}"
        linears[role] = linear
    gate_mm, up_mm, down_mm = (ops[b[f"{r}_matmul"]] for r in ("gate", "up", "down"))
    gate_prog = chain_program(ops, list(b.get("gate_act") or []), gate_mm.outputs[0].id, lts)
    if isinstance(gate_prog, str):
        return gate_prog
    gate_steps, gate_id = gate_prog
    mul_prog = chain_program(ops, [b["gate_mul"]], up_mm.outputs[0].id, lts)
    if isinstance(mul_prog, str):
        return mul_prog
    mul_steps, _ = mul_prog
    h_dtype = "f32"
    if b.get("mlp_cast") is not None:
        cast = ops[b["mlp_cast"]]
        h_dtype = lts[cast.outputs[0].id].dtype.name
    out_id = down_mm.outputs[0].id
    out_dtype = lts[out_id].dtype.name
    out_shape = lts[out_id].shape
    g, u, d = linears["gate"], linears["up"], linears["down"]
    covered = {op.id for op in request.ops}

    def core(inputs, arrays):
        x = inputs[g.x_id].numpy()
        M = x.size // g.K
        x2 = x.reshape(M, g.K)
        gate = g(x2, inputs, gate_steps)
        post = bind(mul_steps, lambda tid: gate if tid == gate_id else inputs[tid].numpy(), (M, u.N), M, u.N)
        h = u(x2, inputs, post, h_dtype)
        arrays[out_id] = d(h, inputs, (), out_dtype).reshape(out_shape)

    return HybridPlan(request, "numba_gated_mlp", core, covered)

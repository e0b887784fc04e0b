"""Kernel registry: (pattern, data types, fpmath) -> plan builder.

A builder takes a :class:`~graph_api.kernels.plan.CompileRequest` and returns a plan, or
a string saying why when the concrete shapes do not suit it (the reason is
printed in verbose mode).  Partitions without a registered fast kernel run the
composed reference plan, which computes exactly what the unfused ops compute.
"""
from __future__ import annotations

from typing import Callable

from graph_api.config import log, settings
from graph_api.enums import OpKind

from .plan import ComposedPlan, CompileRequest

Builder = Callable[[CompileRequest], object]

def _wmatmul(request):
    from .fused import wmatmul_plan

    return wmatmul_plan.build(request)


def _matmul(request):
    from .fused import matmul_plan

    return matmul_plan.build(request)


def _eltwise(request):
    from .fused import eltwise_plan

    return eltwise_plan.build(request)


def _dynamic_quant(request):
    from .fused import eltwise_plan, quant_plan

    plan = quant_plan.build(request)
    if isinstance(plan, str):
        log(f"refused,{request.ops[0].kind.name},numba_quantize,{plan}")
        return eltwise_plan.build(request)
    return plan


def _gated_mlp(request):
    from .fused import mlp_plan

    return mlp_plan.build(request)


def _sdpa(request):
    from .fused import sdpa_plan

    return sdpa_plan.build(request)


def _dot_plan(request):
    from . import dot_plan

    return dot_plan.build(request)


def _sparse(request):
    from .fused import sparse_plan

    return sparse_plan.build(request)


#: the key of the dot plan (MatMul algorithm / indexing maps): asked before any pattern key
DOT_KEY = ("<dot algorithm or indexing maps>", "*", "*")


def _composite(request):
    from . import composite

    return composite.build(request)


def _conv(request):
    from .fused import conv_plan

    return conv_plan.build(request)


def _blocked(request):
    from .fused import blocked_plan

    return blocked_plan.build(request)


def _shuffle(request):
    from .fused import blocked_plan

    return blocked_plan.build_shuffle(request)


#: (pattern name, dtype key, fpmath mode name or "*") -> builder.  Builders
#: import their Numba modules lazily so that graphs without fused partitions
#: never pay Numba's import and compile time.
KERNELS: dict[tuple[str, str, str], Builder] = {
    ("matmul_compressed", "*", "*"): _wmatmul,
    ("matmul_post_ops", "*", "*"): _matmul,
    ("matmul_transpose", "*", "*"): _matmul,
    ("binary_matmul_binary", "*", "*"): _matmul,
    ("matmul_dropout", "*", "*"): _matmul,
    ("matmul_quantized", "*", "*"): _matmul,
    **{(name, "*", "*"): _eltwise for name in (
        "binary_post_ops", "eltwise_post_ops", "softmax_post_ops", "layernorm_post_ops",
        "reduction_post_ops", "reciprocal_multiply", "typecast_quantize", "reorder_sum", "x8_reorder")},
    ("gated_mlp", "*", "*"): _gated_mlp,
    ("sdpa", "*", "*"): _sdpa,
    ("sdpa_compressed", "*", "*"): _sdpa,
    ("sdpa_gqa", "*", "*"): _sdpa,
    DOT_KEY: _dot_plan,
    ("composite", "*", "*"): _composite,  # extension: Composite ops with a fast kernel
    ("conv_post_ops", "*", "*"): _conv,
    ("conv_depthwise", "*", "*"): _conv,
    ("conv_quantized", "*", "*"): _conv,
    ("convtranspose_post_ops", "*", "*"): _conv,
    ("pool_post_ops", "*", "*"): _blocked,
    ("pool_quantized", "*", "*"): _blocked,
    ("bn_relu", "*", "*"): _blocked,
    ("bn_quantized", "*", "*"): _blocked,
    ("groupnorm_post_ops", "*", "*"): _blocked,
    ("interpolate_post_ops", "*", "*"): _blocked,
    ("concat_quantized", "*", "*"): _blocked,
    ("shuffle", "*", "*"): _shuffle,
    ("sparse_matmul_post_ops", "*", "*"): _sparse,  # seed 003: SpMM + epilogue
}


#: single-op partitions: op kind -> builder
SINGLE_OP: dict = {
    OpKind.MatMul: _matmul,
    **{OpKind[k]: _eltwise for k in (
        "Abs Clamp Elu Exp GELU HardSigmoid HardSwish LeakyReLU Log Mish Pow Reciprocal ReLU Round "
        "Sigmoid SoftPlus Sqrt Square Tanh Add Subtract Multiply Divide Maximum Minimum "
        "SquaredDifference Select PReLU BiasAdd GreaterEqual TypeCast Reorder StaticReshape "
        "StaticTranspose Concat GenIndex Quantize Dequantize "
        "SoftMax LogSoftmax LayerNorm RMSNorm ReduceL1 ReduceL2 ReduceMax ReduceMean ReduceMin "
        "ReduceProd ReduceSum BatchNormInference GroupNorm Dropout").split()},
    OpKind.DynamicQuantize: _dynamic_quant,
    OpKind.DynamicDequantize: _dynamic_quant,
}


def dtype_key(request: CompileRequest) -> str:
    """Data types of the partition's inputs, in port order: 'f32,s4,f32'."""
    return ",".join(request.lts[t].dtype.name for t in request.input_ids)


def _dot_extensions(request):
    """The dot plan for a MatMul with an algorithm or maps (graph_api.dot_algorithm,
    indexing_maps), or None when the request has neither.  Such a request never
    reaches the pattern kernels below, which do not honour them: when the dot plan
    refuses (or is not registered), the composed reference (which does) runs."""
    from .dot_plan import needs_dot_plan

    if not needs_dot_plan(request):
        return None
    builder = KERNELS.get(DOT_KEY)
    plan = builder(request) if builder is not None else "no dot plan registered"
    if isinstance(plan, str):
        log(f"refused,{request.pattern},dot plan,{plan}")
        return ComposedPlan(request)
    return plan


def _candidates(request: CompileRequest):
    if request.pattern is None:
        if len(request.ops) == 1 and request.ops[0].kind in SINGLE_OP:
            yield request.ops[0].kind.name, SINGLE_OP[request.ops[0].kind]
        return
    dkey = dtype_key(request)
    mode = request.fpmath.mode.name
    for key in ((request.pattern, dkey, mode), (request.pattern, dkey, "*"),
                (request.pattern, "*", mode), (request.pattern, "*", "*")):
        if key in KERNELS:
            yield key, KERNELS[key]


def select_plan(request: CompileRequest):
    """The fast plan registered for this request, else the composed reference plan.

    The reference plan is chosen explicitly by ``GRAPH_API_REFERENCE=1``
    (``settings.reference``); otherwise a partition falls back to it only when
    no builder is registered or every builder refused (or a MatMul algorithm /
    indexing map the dot plan refuses), and verbose mode says why.
    """
    what = request.pattern or ",".join(op.kind.name for op in request.ops)
    if settings.reference:
        log(f"plan,{what},reference,chosen by GRAPH_API_REFERENCE")
        return ComposedPlan(request)
    if any(lt.encoding is not None for lt in request.lts.values()):
        # sparse tensors (seed 003): the SpMM plan or the sparse composed plan, never a dense kernel
        return _sparse(request)
    dot = _dot_extensions(request)  # MatMul algorithms / indexing maps: the dot plan or the reference
    if dot is not None:
        return dot
    reasons = []
    for key, builder in _candidates(request):
        plan = builder(request)
        if isinstance(plan, str):
            reasons.append(plan)
            log(f"refused,{what},{key},{plan}")
            continue
        if plan is not None:
            return plan
    reason = "; ".join(reasons) or "no fast kernel registered"
    if len(request.ops) > 1:  # not fused, but every op on its single-op fast plan
        from .fused import per_op

        plan = per_op.build(request, SINGLE_OP.get)
        if not isinstance(plan, str):
            log(f"unfused,{what},{plan.name},{reason}")
            plan.fallback_reason = reason
            return plan
        reason += f"; {plan}"
    log(f"fallback,{what},reference,{reason}")
    plan = ComposedPlan(request)
    plan.fallback_reason = reason
    return plan

"""Kernel registry: (pattern, data types, fpmath) -> plan builder.

Each fast kernel is registered with the pattern object it serves (as oneDNN's
pass registration pairs a pattern with its kernel); the roles a builder reads
from ``request.bindings`` are node names of that pattern
(tests/kernels/test_registry_roles.py checks it).

A builder takes a :class:`~graph_api.kernels.plan.CompileRequest` and returns a plan, or
a string saying why when the concrete shapes do not suit it (the reason is
printed in verbose mode).  Partitions without a registered fast kernel run the
composed reference plan, which computes exactly what the unfused ops compute.
"""
from __future__ import annotations

from typing import Callable

from graph_api.config import log, settings
from graph_api.enums import OpKind
from graph_api.patterns import library as P

from .plan import ComposedPlan, CompileRequest

Builder = Callable[[CompileRequest], object]

def _wmatmul(request):
    from .weight_compressed import wmatmul_plan

    return wmatmul_plan.build(request)


def _matmul(request):
    from .fused import matmul_plan

    return matmul_plan.build(request)


def _quantized_matmul(request):
    from .fused import matmul_plan, qmatmul_plan

    plan = qmatmul_plan.build(request)
    if isinstance(plan, str):  # the f32 BLAS plan, dequantizing ops as reference steps
        log(f"refused,{request.pattern},int_gemm_epilogue,{plan}")
        return matmul_plan.build(request)
    return plan


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
    from .weight_compressed import mlp_plan

    return mlp_plan.build(request)


def _grouped(request):
    from .grouped import plan as grouped_plan

    return grouped_plan.build(request)


def _sdpa(request):
    from .sdpa import plan as sdpa_plan

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
    from .convolution import conv_plan

    return conv_plan.build(request)


def _blocked(request):
    from .fused import blocked_plan

    return blocked_plan.build(request)


def _shuffle(request):
    from .fused import blocked_plan

    return blocked_plan.build_shuffle(request)


def _f32_single(request):
    from .fused import backward_plan

    return backward_plan.build(request)


def _backward_chain(request):
    from .fused import backward_plan

    return backward_plan.build_chain(request)


#: (pattern, dtype key, fpmath mode name or "*") -> builder.  Builders
#: import their Numba modules lazily so that graphs without fused partitions
#: never pay Numba's import and compile time.
KERNELS: dict[tuple, Builder] = {
    (P.MATMUL_COMPRESSED, "*", "*"): _wmatmul,
    (P.MATMUL_POST_OPS, "*", "*"): _matmul,
    (P.MATMUL_TRANSPOSE, "*", "*"): _matmul,
    (P.BINARY_MATMUL_BINARY, "*", "*"): _matmul,
    (P.MATMUL_DROPOUT, "*", "*"): _matmul,
    (P.MATMUL_QUANTIZED, "*", "*"): _quantized_matmul,
    **{(pattern, "*", "*"): _eltwise for pattern in (
        P.BINARY_POST_OPS, P.ELTWISE_POST_OPS, P.SOFTMAX_POST_OPS, P.LAYERNORM_POST_OPS,
        P.REDUCTION_POST_OPS, P.RECIPROCAL_MULTIPLY, P.TYPECAST_QUANTIZE, P.REORDER_SUM, P.X8_REORDER)},
    (P.GATED_MLP, "*", "*"): _gated_mlp,
    (P.GROUPED_MATMUL, "*", "*"): _grouped,  # the experts of a mixture-of-experts layer
    (P.SDPA, "*", "*"): _sdpa,
    (P.SDPA_COMPRESSED, "*", "*"): _sdpa,
    (P.SDPA_GQA, "*", "*"): _sdpa,
    (P.SDPA_JAX, "*", "*"): _sdpa,
    (P.SDPA_QUANTIZED, "*", "*"): _sdpa,
    (P.SDPA_BACKWARD, "*", "*"): _sdpa,
    DOT_KEY: _dot_plan,
    (P.COMPOSITE, "*", "*"): _composite,  # extension: Composite ops with a fast kernel
    (P.CONV_POST_OPS, "*", "*"): _conv,
    (P.CONV_DEPTHWISE, "*", "*"): _conv,
    (P.CONV_QUANTIZED, "*", "*"): _conv,
    (P.CONVTRANSPOSE_POST_OPS, "*", "*"): _conv,
    (P.POOL_POST_OPS, "*", "*"): _blocked,
    (P.POOL_QUANTIZED, "*", "*"): _blocked,
    (P.BN_RELU, "*", "*"): _blocked,
    (P.BN_QUANTIZED, "*", "*"): _blocked,
    (P.GROUPNORM_POST_OPS, "*", "*"): _blocked,
    (P.INTERPOLATE_POST_OPS, "*", "*"): _blocked,
    (P.CONCAT_QUANTIZED, "*", "*"): _blocked,
    (P.SHUFFLE, "*", "*"): _shuffle,
    (P.BATCHNORM_BWD_RELU_BWD, "*", "*"): _backward_chain,
    (P.SPARSE_MATMUL_POST_OPS, "*", "*"): _sparse,  # seed 003: SpMM + epilogue
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
    **{kind: _f32_single for kind in OpKind if "Backward" in kind.name},
    OpKind.Convolution: _conv,
    OpKind.ConvTranspose: _conv,
    **{OpKind[k]: _f32_single for k in "AvgPool MaxPool Interpolate BatchNormForwardTraining".split()},
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
    pattern = P.BY_NAME.get(request.pattern)  # the request names the pattern its partition matched
    dkey = dtype_key(request)
    mode = request.fpmath.mode.name
    for key in ((pattern, dkey, mode), (pattern, dkey, "*"), (pattern, "*", mode), (pattern, "*", "*")):
        if key in KERNELS:
            yield (request.pattern,) + key[1:], KERNELS[key]


_QUANT_KINDS = frozenset({OpKind.Quantize, OpKind.Dequantize, OpKind.DynamicQuantize, OpKind.DynamicDequantize})


def _with_masked_quant(request: CompileRequest, masked: list, what: str):
    """A partition with quantization ``mask`` ops: the fused and single-op quantization
    kernels read qtype/axis only, so the masked ops run as reference steps and every
    other op on its single-op fast plan (or the whole partition on the reference)."""
    from .fused import per_op

    ids = {op.id for op in masked}
    reason = f"quantization mask on op {', '.join(str(i) for i in sorted(ids))}: reference formula"
    if len(request.ops) > 1:
        plan = per_op.build(request, lambda kind: None if kind in _QUANT_KINDS else SINGLE_OP.get(kind))
        if not isinstance(plan, str):
            log(f"unfused,{what},{plan.name},{reason}")
            plan.fallback_reason = reason
            return plan
    log(f"fallback,{what},reference,{reason}")
    plan = ComposedPlan(request)
    plan.fallback_reason = reason
    return plan


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
        # sparse tensors (seed 003): the SpMM plan or the sparse composed plan, never a dense
        # kernel; the sparse pattern's builder is the one registered for it in KERNELS
        builder = KERNELS.get((P.SPARSE_MATMUL_POST_OPS, "*", "*")) \
            if request.pattern == P.SPARSE_MATMUL_POST_OPS.name else None
        return (builder or _sparse)(request)
    masked = [op for op in request.ops if op.kind in _QUANT_KINDS and op.attrs.get("mask") is not None]
    if masked:  # quantization masks (issue 34): only the reference formulas read them
        return _with_masked_quant(request, masked, what)
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

"""Kernel registry: (pattern, data types, fpmath) -> plan builder.

A builder takes a :class:`~kernels.plan.CompileRequest` and returns a plan, or
a string saying why when the concrete shapes do not suit it (the reason is
printed in verbose mode).  Partitions without a registered fast kernel run the
composed reference plan, which computes exactly what the unfused ops compute.
"""
from __future__ import annotations

from typing import Callable

from graph_api.config import log

from .plan import ComposedPlan, CompileRequest

Builder = Callable[[CompileRequest], object]

def _wmatmul(request):
    from .fused import wmatmul_plan

    return wmatmul_plan.build(request)


def _gated_mlp(request):
    from .fused import mlp_plan

    return mlp_plan.build(request)


def _sdpa(request):
    from .fused import sdpa_plan

    return sdpa_plan.build(request)


def _dot_plan(request):
    from . import dot_plan

    return dot_plan.build(request)


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
    ("matmul_post_ops", "*", "*"): _wmatmul,
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


def select_plan(request: CompileRequest):
    """The fast plan registered for this request, else the composed reference plan."""
    dot = _dot_extensions(request)
    if dot is not None:
        return dot
    if request.pattern is not None:
        dkey = dtype_key(request)
        mode = request.fpmath.mode.name
        for key in ((request.pattern, dkey, mode), (request.pattern, dkey, "*"),
                    (request.pattern, "*", mode), (request.pattern, "*", "*")):
            builder = KERNELS.get(key)
            if builder is None:
                continue
            plan = builder(request)
            if isinstance(plan, str):
                log(f"refused,{request.pattern},{key},{plan}")
                continue
            if plan is not None:
                return plan
    return ComposedPlan(request)

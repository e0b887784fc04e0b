"""Backward (training) op kinds on f32 plans: what oneDNN's CPU primitives compute.

Every input is widened to f32 (bf16/f16 exactly), the gradient is computed in
f32 arithmetic and each output is rounded once to its data type, as oneDNN's
``*_bwd`` primitives do.  Sums over many terms (bias, slope, gamma and beta
gradients, the BatchNorm/LayerNorm/SoftMax reductions) accumulate in f64 from
f32 operands (numpy's ``dtype=`` accumulator, no f64 copy of the tensor); the
reference (:mod:`graph_api.kernels.reference.backward`, ``backward_window``)
does everything in f64, so results agree within a few f32 ulps of the terms.

* element-wise gradients: the reference's own ``*_bwd`` formula evaluated on
  f32 arrays (numpy keeps f32 with Python-float attributes);
* SoftMax/LogSoftmax, BiasAdd, PReLU, BatchNorm and LayerNorm gradients:
  vectorised f32 numpy, formulas in the functions' docstrings;
* Convolution/ConvTranspose gradients (:mod:`.backward_window_plan`): im2col,
  col2im and f32 BLAS of :mod:`graph_api.kernels.convolution.conv`, image by image;
* pooling and Interpolate gradients: the reference's canonical cores run on
  f32 arrays (strided numpy, one pass per kernel tap).

A fused ``batchnorm_bwd_relu_bwd`` partition runs the two computations in
order on in-memory f32 arrays (:class:`ChainBackwardPlan`).  :class:`F32Plan`
also runs the lone forward pooling, Interpolate and BatchNormForwardTraining
partitions (:mod:`.forward_window_plan`).
"""
from __future__ import annotations

import inspect

import numpy as np

from graph_api import dtypes
from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K
from graph_api.kernels.plan import CompileRequest
from graph_api.kernels.reference import REFERENCE
from graph_api.kernels.reference._common import channel_axis, norm_axis
from graph_api.kernels.reference.backward import BACKWARD, slope_view_shape

F32 = np.float32


def _sum(x, axes, keepdims=False):
    """f32 terms summed with an f64 accumulator, returned as f32."""
    return np.sum(x, axis=axes, dtype=np.float64, keepdims=keepdims).astype(F32)


def _attr(value):
    """An f32 attribute as oneDNN stores it (rounded to f32), a Python float so
    numpy keeps the arrays it multiplies in f32."""
    return float(np.float32(value)) if isinstance(value, float) else value


# ---------------------------------------------------------- element-wise
ELTWISE_BWD = {kind for kind, fn in BACKWARD.items() if hasattr(fn, "formula")}


def eltwise(op, lts):
    """``formula(v, dd, **attrs)`` of the reference on f32 arrays."""
    formula = BACKWARD[op.kind].formula
    names = list(inspect.signature(formula).parameters)[2:]
    attrs = {name: _attr(op.attrs[name]) for name in names}

    def compute(xs):
        with np.errstate(all="ignore"):
            return [formula(xs[0], xs[1], **attrs)]

    return compute


# ---------------------------------------------------------------- softmax
def softmax(op, lts):
    """diff_src = dst (dd - sum(dd dst)) along axis (inputs: diff_dst, dst)."""
    axis = norm_axis(op.attrs["axis"], len(lts[op.inputs[0].id].shape))

    def compute(xs):
        dd, dst = xs
        return [dst * (dd - _sum(dd * dst, axis, keepdims=True))]

    return compute


def log_softmax(op, lts):
    """diff_src = dd - exp(dst) sum(dd) along axis (inputs: diff_dst, dst)."""
    axis = norm_axis(op.attrs["axis"], len(lts[op.inputs[0].id].shape))

    def compute(xs):
        dd, dst = xs
        with np.errstate(all="ignore"):
            return [dd - np.exp(dst) * _sum(dd, axis, keepdims=True)]

    return compute


# ------------------------------------------------------- bias and PReLU
def _all_but(ndim: int, axis: int) -> tuple:
    return tuple(i for i in range(ndim) if i != axis)


def bias_add(op, lts):
    """diff_bias[c] = sum of diff_dst over every dim but the channel one."""
    ndim = len(lts[op.inputs[0].id].shape)
    axes = _all_but(ndim, channel_axis(op.attrs["data_format"], ndim))
    return lambda xs: [_sum(xs[0], axes)]


def prelu(op, lts):
    """diff_src = dd (x > 0 ? 1 : slope); diff_slope = sum of dd (x > 0 ? 0 : x)
    over the dims the slope broadcasts along (inputs: src, slope, diff_dst)."""
    x_shape = tuple(lts[op.inputs[0].id].shape)
    slope_shape = tuple(lts[op.inputs[1].id].shape)
    view = slope_view_shape(op, slope_shape, len(x_shape))
    axes = tuple(i for i, (v, d) in enumerate(zip(view, x_shape)) if v == 1 and d != 1)

    def compute(xs):
        x, slope, dd = xs
        positive = x > 0
        contrib = np.where(positive, F32(0), dd * x)
        diff_slope = _sum(contrib, axes, keepdims=True) if axes else contrib
        return [np.where(positive, dd, dd * slope.reshape(view)), diff_slope.reshape(slope_shape)]

    return compute


# --------------------------------------------------------- normalization
def _norm_grads(x, dd, mean, var, eps, axes, gamma):
    """(dx, dgamma terms, dd) over ``axes``, mean/var/gamma broadcasting:
    dx = inv (g dd - mean(g dd) - xhat mean(g dd xhat)), inv = 1/sqrt(var + eps)."""
    with np.errstate(all="ignore"):  # a negative variance gives NaN, as oneDNN's sqrtf
        inv = (1.0 / np.sqrt(var.astype(np.float64) + eps)).astype(F32)
    xhat = (x - mean) * inv
    gdd = dd if gamma is None else dd * gamma
    count = np.prod([x.shape[a] for a in axes])
    with np.errstate(invalid="ignore", divide="ignore"):  # 0/0 over no elements: NaN, as the reference
        mean_gdd = (np.sum(gdd, axis=axes, dtype=np.float64, keepdims=True) / count).astype(F32)
        mean_gdd_xhat = (np.sum(gdd * xhat, axis=axes, dtype=np.float64, keepdims=True) / count).astype(F32)
    return inv * (gdd - mean_gdd - xhat * mean_gdd_xhat), dd * xhat


def batch_norm(op, lts):
    """BatchNormTrainingBackward with the given mean and variance, per channel
    (inputs: src, diff_dst, mean, variance[, gamma]; outputs diff_src[, diff_gamma, diff_beta])."""
    ndim = len(lts[op.inputs[0].id].shape)
    axis = channel_axis(op.attrs["data_format"], ndim)
    shape = [1] * ndim
    shape[axis] = -1
    axes = _all_but(ndim, axis)
    eps = float(np.float32(op.attrs["epsilon"]))
    n_out = len(op.outputs)

    def compute(xs):
        x, dd = xs[:2]
        mean, var = (v.reshape(shape) for v in xs[2:4])
        gamma = xs[4].reshape(shape) if len(xs) > 4 else None
        dx, dgamma = _norm_grads(x, dd, mean, var, eps, axes, gamma)
        return [dx, _sum(dgamma, axes), _sum(dd, axes)][:n_out]

    return compute


def layer_norm(op, lts):
    """LayerNormBackward over dims begin_norm_axis.. with the given mean and
    variance (inputs: src, diff_dst, mean, variance[, gamma, beta])."""
    x_shape = tuple(lts[op.inputs[0].id].shape)
    begin = norm_axis(op.attrs["begin_norm_axis"], len(x_shape))
    rows, cols = int(np.prod(x_shape[:begin])), int(np.prod(x_shape[begin:]))
    affine = op.attrs["use_affine"] and len(op.inputs) > 4
    n_out = len(op.outputs)

    def compute(xs):
        x, dd = (v.reshape(rows, cols) for v in xs[:2])
        mean, var = (v.reshape(rows, 1) for v in xs[2:4])
        gamma = xs[4].reshape(1, cols) if affine else None
        dx, dgamma = _norm_grads(x, dd, mean, var, float(np.float32(op.attrs["epsilon"])), (1,), gamma)
        outs = [dx.reshape(x_shape), _sum(dgamma, 0).reshape(x_shape[begin:]),
                _sum(dd, 0).reshape(x_shape[begin:])]
        return outs[:n_out]

    return compute


# ------------------------------------------------------------------ plans
def _widen(lt, fpmath, rounds: bool):
    """How one input becomes f32: exactly, or through the fpmath down-conversion
    (Convolution gradients only, as their reference rounds them)."""
    if rounds:
        return lambda x: fpmath.round_input(x, lt.dtype)
    return dtypes.to_f32


class F32Plan:
    """One op: inputs widened to f32, ``compute``, outputs rounded on write."""

    def __init__(self, request: CompileRequest, kernel: str, compute, rounded_inputs=()):
        self.request = request
        self.op = request.ops[0]
        self.name = kernel
        self.compute = compute
        self.widen = [_widen(request.lts[lt.id], request.fpmath, i in rounded_inputs)
                      for i, lt in enumerate(self.op.inputs)]

    def run(self, xs: list) -> list:
        """f32 inputs in port order -> f32 outputs in port order."""
        return self.compute([w(x) for w, x in zip(self.widen, xs)])

    def execute(self, inputs: dict, outputs: dict) -> None:
        results = self.run([inputs[lt.id].numpy() for lt in self.op.inputs])
        for lt, value in zip(self.op.outputs, results):
            outputs[lt.id].write(value)


def _shape_input(kind) -> int | None:
    """The optional s32 shape input of a kind (read at compile time, not computed on)."""
    return {K.ConvolutionBackwardData: 2, K.ConvolutionBackwardWeights: 2,
            K.ConvTransposeBackwardWeights: 2, K.AvgPoolBackward: 1, K.InterpolateBackward: 2,
            K.Interpolate: 1}.get(kind)


#: op kind -> (kernel name, prepare(op, lts) -> compute(list of f32 arrays))
PREPARE = {
    **{kind: ("numpy_f32_eltwise_bwd", eltwise) for kind in ELTWISE_BWD},
    K.SoftMaxBackward: ("numpy_f32_softmax_bwd", softmax),
    K.LogSoftmaxBackward: ("numpy_f32_softmax_bwd", log_softmax),
    K.BiasAddBackward: ("numpy_f32_reduce_bwd", bias_add),
    K.PReLUBackward: ("numpy_f32_prelu_bwd", prelu),
    K.BatchNormTrainingBackward: ("numpy_f32_norm_bwd", batch_norm),
    K.LayerNormBackward: ("numpy_f32_norm_bwd", layer_norm),
}


def _tables():
    """(prepare table, fpmath-rounded input ports by kind) of every f32 single-op plan."""
    from . import backward_window_plan, forward_window_plan

    return [(PREPARE, {}), (backward_window_plan.PREPARE, backward_window_plan.ROUNDED_INPUTS),
            (forward_window_plan.PREPARE, {})]


def _prepare(op, request):
    """(kernel name, compute, fpmath-rounded input ports) for one op, or a reason."""
    table, rounded = next(((t, r) for t, r in _tables() if op.kind in t), (None, None))
    if table is None:
        return f"{op.kind.name} (op {op.id}) has no f32 plan"
    for lt in op.outputs:
        if dtypes.info(request.lts[lt.id].dtype).kind != "float":
            return f"{op.kind.name} (op {op.id}) output {lt.id} is not a float"
    kernel, prepare = table[op.kind]
    return kernel, prepare(op, request.lts), rounded.get(op.kind, ())


def build(request: CompileRequest):
    """A single op's :class:`F32Plan` (a backward kind, or a lone pooling,
    Interpolate or BatchNormForwardTraining of :mod:`.forward_window_plan`), or a reason."""
    op = request.ops[0]
    prepared = _prepare(op, request)
    if isinstance(prepared, str):
        return prepared
    kernel, compute, rounded = prepared
    port = _shape_input(op.kind)
    if port is not None and len(op.inputs) > port:  # the shape is known at compile time
        compute = _dropping(compute, port)
    return F32Plan(request, kernel, compute, rounded)


def _dropping(compute, port):
    """``compute`` fed every input but the shape one (its values are already in the output shape)."""
    return lambda xs: compute(xs[:port] + xs[port + 1:])


class ChainBackwardPlan:
    """Ops of a fused backward partition in order, intermediates kept as f32
    arrays (rounded to their data type first when that is not f32)."""

    def __init__(self, request: CompileRequest, steps: list):
        self.request = request
        self.steps = steps  # (op, F32Plan)
        self.name = "f32_backward_chain[" + ",".join(p.name for _, p in steps) + "]"
        self.round = {lt.id: request.lts[lt.id].dtype for op, _ in steps for lt in op.outputs
                      if request.lts[lt.id].dtype != DataType.f32}

    def execute(self, inputs: dict, outputs: dict) -> None:
        arrays = {tid: t.numpy() for tid, t in inputs.items()}
        for op, plan in self.steps:
            results = plan.run([arrays[lt.id] for lt in op.inputs])
            for lt, value in zip(op.outputs, results):
                dt = self.round.get(lt.id)
                arrays[lt.id] = value if dt is None else dtypes.convert(value, dt)
        for tid, tensor in outputs.items():
            tensor.write(arrays[tid])


def build_chain(request: CompileRequest):
    """Every op of the partition on its f32 backward computation, in order."""
    steps = []
    for op in request.ops:
        sub = CompileRequest(None, [op], request.lts, [lt.id for lt in op.inputs],
                             [lt.id for lt in op.outputs], request.fpmath)
        plan = build(sub)
        if isinstance(plan, str):
            return plan
        steps.append((op, plan))
    return ChainBackwardPlan(request, steps)


assert set(REFERENCE) >= set(PREPARE)

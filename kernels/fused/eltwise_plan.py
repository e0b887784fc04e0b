"""Element-wise, normalization, reduction and data-movement partitions.

Serves single ops and the small post-op patterns (``eltwise_post_ops``,
``binary_post_ops``, ``softmax_post_ops``, ``layernorm_post_ops``,
``reduction_post_ops``, ``reciprocal_multiply``, ``typecast_quantize``,
``reorder_sum``) as one :class:`~graph_api.kernels.fused.chain.ChainPlan` each:

* element-wise head (unary op, binary op whose operand 0 or 1 already has the
  output shape, TypeCast, Reorder, BiasAdd): no head pass at all; the walk
  starts at that input and the op is the epilogue's first step
  (``numba_eltwise``);
* SoftMax / LayerNorm / RMSNorm over trailing axes: ``graph_api.kernels.norm``'s
  row kernel with the chain as its epilogue, one pass (``numba_norm``);
  other axes, LogSoftmax and ``inf_as_zero`` in f32 numpy (``numpy_f32_norm``);
* reductions: numpy in f32 (pairwise sums), then the chain (``numpy_f32_reduce``);
* ops whose ground-truth formula already is vectorised f32 numpy (binary ops
  with two-sided broadcasting, Select, PReLU, quantization, Concat, GenIndex,
  reshapes, transposes, Dropout's counter-based generator): that formula,
  then the chain (``numpy_f32``; ``numpy_direct`` for a single op whose
  output is not a float or that has several outputs).

Every float computation is f32 (statistics of norms in f64 as the reference
and oneDNN do); the reference evaluates the unary formulas in f64 and rounds
once, so results agree within a few f32 ulps (tests/kernels/test_fast_plans.py).
"""
from __future__ import annotations

import numpy as np

from graph_api import dtypes
from graph_api.enums import OpKind as K
from graph_api.postops import POST_OPS
from graph_api.kernels.plan import CompileRequest

from .chain import OKIND, ChainPlan, Walk, run_steps

NORMS = {K.SoftMax, K.LogSoftmax, K.LayerNorm, K.RMSNorm}
REDUCES = {K.ReduceL1: lambda x, a: np.abs(x).sum(axis=a, keepdims=True),
           K.ReduceL2: lambda x, a: np.sqrt(np.square(x).sum(axis=a, keepdims=True)),
           K.ReduceMax: lambda x, a: x.max(axis=a, keepdims=True),
           K.ReduceMin: lambda x, a: x.min(axis=a, keepdims=True),
           K.ReduceMean: lambda x, a: x.mean(axis=a, keepdims=True),
           K.ReduceProd: lambda x, a: x.prod(axis=a, keepdims=True),
           K.ReduceSum: lambda x, a: x.sum(axis=a, keepdims=True)}
#: kinds whose reference formula is vectorised numpy in f32 (or pure data movement)
F32_FORMULA = {K.Add, K.Subtract, K.Multiply, K.Divide, K.Maximum, K.Minimum, K.SquaredDifference,
               K.Select, K.PReLU, K.BiasAdd, K.GreaterEqual, K.TypeCast, K.Reorder, K.StaticReshape,
               K.StaticTranspose, K.Concat, K.GenIndex, K.Quantize, K.Dequantize,
               K.DynamicQuantize, K.DynamicDequantize, K.Dropout}
_ELTWISE_HEADS = set(POST_OPS) | {K.TypeCast, K.Reorder, K.BiasAdd}


def _f32(x):
    return dtypes.to_f32(x)


class EltwisePlan(ChainPlan):
    """The head op is the epilogue's first step: acc is the widened input."""

    kernel = "numba_eltwise"

    def __init__(self, request, walk, src_id):
        self.src_id = src_id
        super().__init__(request, walk, [src_id])

    def head(self, arrays):
        return _f32(arrays[self.src_id])

    def bind(self, inputs, outputs):
        """A callable that runs this plan on these tensors (see
        ``CompiledPartition.bind``): the epilogue store reading the f32 input in place;
        None where a call converts or copies (other input types, copied epilogue
        operands, reference steps), which runs :meth:`execute`."""
        if self.pre_steps or self.post_steps or not self.dest_out or self.head_add is not None:
            return None
        arrays = {tid: t.numpy() for tid, t in inputs.items()}
        x = arrays[self.src_id]
        if x.dtype != np.float32 or not x.flags.c_contiguous or not x.size or x.size != self.R * self.N:
            return None
        ep = self.epilogue(arrays)
        if self._ep_cache[2]:  # epilogue operands copied per call
            return None
        buf = self._dest_buffer(outputs)
        return self._store.store_runner(x.reshape(self.R, self.N), buf.view(np.uint16) if self.okind else buf,
                                        self.offsets[0], self.offsets[1], self.okind, ep, self.run_length)


class FormulaPlan(ChainPlan):
    """The head runs its (f32 numpy) reference formula, the chain follows."""

    kernel = "numpy_f32"

    def __init__(self, request, walk):
        from graph_api.kernels.plan import ComposedPlan

        head = walk.head
        self.step = next(s for s in ComposedPlan(request).steps if s[1].id == head.id)
        super().__init__(request, walk, [lt.id for lt in head.inputs])

    def head(self, arrays):
        run_steps([self.step], arrays)
        return _f32(arrays[self.walk.head.outputs[0].id])


class ReducePlan(ChainPlan):
    kernel = "numpy_f32_reduce"

    def __init__(self, request, walk):
        from graph_api.kernels.reference.reduce import reduce_axes

        head = walk.head
        self.src = head.inputs[0].id
        ndim = len(request.lts[self.src].shape)
        self.axes = reduce_axes(head, [], ndim) if head.attrs.get("axes") else None
        self.formula = REDUCES[head.kind]
        super().__init__(request, walk, [lt.id for lt in head.inputs])

    def head(self, arrays):
        from graph_api.kernels.reference.reduce import reduce_axes

        x = _f32(arrays[self.src])
        axes = self.axes
        if axes is None:
            axes = reduce_axes(self.walk.head, [arrays[lt.id] for lt in self.walk.head.inputs], x.ndim)
        with np.errstate(all="ignore"):
            return self.formula(x, axes).reshape(self.shape)


class NormPlan(ChainPlan):
    """SoftMax/LogSoftmax/LayerNorm/RMSNorm over trailing axes (see module doc)."""

    def __init__(self, request, walk, begin: int, fused: bool):
        head = walk.head
        self.src = head.inputs[0].id
        shape = request.lts[self.src].shape
        self.C = int(np.prod(shape[begin:]))
        self.norm_shape = tuple(shape[begin:])
        self.begin = begin
        self.fused = fused
        self.kernel = "numba_norm" if fused else "numpy_f32_norm"
        a = head.attrs
        self.eps = float(np.float32(a.get("epsilon", 0.0)))
        self.gamma = head.inputs[1].id if head.kind in (K.LayerNorm, K.RMSNorm) and len(head.inputs) > 1 \
            and (head.kind == K.RMSNorm or (a["use_affine"] and len(head.inputs) > 2)) else None
        self.beta = head.inputs[2].id if head.kind == K.LayerNorm and self.gamma is not None else None
        used = {lt.id for op in request.ops for lt in op.inputs} | set(request.output_ids)
        self.extra = [lt.id for lt in head.outputs[1:] if lt.id in used]
        super().__init__(request, walk, [lt.id for lt in head.inputs])

    def _affine(self, arrays, tid) -> np.ndarray:
        """gamma/beta as C f32 values: one that broadcasts into the normalized
        dims (a scalar, a [1, C]; the shape rule allows it) is spread to them,
        as the reference reads it (the row kernel indexes C values)."""
        v = _f32(arrays[tid])
        if v.size == self.C:
            return v.reshape(-1)
        return np.ascontiguousarray(np.broadcast_to(v.reshape(self.request.lts[tid].shape),
                                                    self.norm_shape)).reshape(-1)

    def _stats(self, x, arrays):
        """LayerNorm mean/variance or SoftMax stats outputs (f64 / f32 as the reference)."""
        head, lts = self.walk.head, self.request.lts
        if not self.extra:
            return
        rows = x.reshape(-1, self.C)
        if head.kind == K.LayerNorm:
            x64 = rows.astype(np.float64)
            mean = x64.mean(axis=1)
            values = [mean, np.square(x64 - mean[:, None]).mean(axis=1)]
        else:
            m = rows.max(axis=1, keepdims=True)
            with np.errstate(all="ignore"):
                st = m + np.log(np.exp(rows - m).sum(axis=1, keepdims=True))
            if head.attrs.get("mode") == "inf_as_zero":  # an all -inf row: -inf, not NaN
                st = np.where(m == -np.inf, -np.inf, st)
            values = [st]
        for tid, v in zip(self.extra, values):
            arrays[tid] = dtypes.convert(v.reshape(lts[tid].shape), lts[tid].dtype)

    def _numpy(self, x, arrays):
        head = self.walk.head
        rows = x.reshape(-1, self.C)
        with np.errstate(all="ignore"):
            if head.kind in (K.SoftMax, K.LogSoftmax):
                m = rows.max(axis=1, keepdims=True)
                e = np.exp(rows - m)
                s = e.sum(axis=1, keepdims=True)
                if head.kind == K.LogSoftmax:
                    y = rows - m - np.log(s)
                else:
                    y = e / s
                    if head.attrs.get("mode") == "inf_as_zero":
                        y = np.where(m == -np.inf, np.float32(0.0), y)
            elif head.kind == K.LayerNorm:
                x64 = rows.astype(np.float64)
                mean = x64.mean(axis=1, keepdims=True)
                var = np.square(x64 - mean).mean(axis=1, keepdims=True)
                y = ((x64 - mean) / np.sqrt(var + self.eps)).astype(np.float32)
            else:
                x64 = rows.astype(np.float64)
                y = (x64 / np.sqrt(np.square(x64).mean(axis=1, keepdims=True) + self.eps)).astype(np.float32)
            y = y.reshape(-1)
            if self.gamma is not None:
                y = (y.reshape(-1, self.C) * self._affine(arrays, self.gamma).reshape(1, -1)).reshape(-1)
            if self.beta is not None:
                y = (y.reshape(-1, self.C) + self._affine(arrays, self.beta).reshape(1, -1)).reshape(-1)
        return y

    def run(self, arrays, outputs) -> None:
        from graph_api.kernels import norm

        x = arrays[self.src]
        self._stats(_f32(x), arrays)
        if not self.fused:
            return self._store_with_extra(self._numpy(_f32(x), arrays).reshape(self.shape), arrays, outputs)
        buf = self._dest_buffer(outputs)
        if x.size:
            norm._rows(*self._rows_args(x, arrays, buf))
        self._write_extra(arrays, outputs)
        self.finish(buf, arrays, outputs)

    def _rows_args(self, x, arrays, buf) -> tuple:
        """The arguments of the fused row kernel (``norm._rows``) for ``x`` into ``buf``."""
        from graph_api.kernels import norm

        R = x.size // self.C
        xv, kind = norm.act_kind(np.ascontiguousarray(x).reshape(-1))
        op = {K.LayerNorm: norm.LAYER, K.RMSNorm: norm.RMS, K.SoftMax: norm.SOFTMAX}[self.walk.head.kind]
        g = np.ones(1, np.float32) if self.gamma is None else self._affine(arrays, self.gamma)
        b = np.zeros(1, np.float32) if self.beta is None else self._affine(arrays, self.beta)
        ep = self.epilogue(arrays, R, self.C)
        return (norm.bits16(xv), kind, R, self.C, op, g, self.gamma is not None, b, self.beta is not None,
                self.eps, self.okind, ep.ops, ep.fpar, ep.ipar, ep.buf, norm.bits16(buf), norm.blocks(R))

    def bind(self, inputs, outputs):
        """A callable that runs this plan on these tensors (see
        ``CompiledPartition.bind``): the fused row kernel on the tensors' own memory;
        None where a call does more (statistics outputs, converted or copied
        operands, reference steps), which runs :meth:`execute`."""
        from graph_api.kernels import norm

        if not self.fused or self.extra or self.pre_steps or self.post_steps or not self.dest_out:
            return None
        arrays = {tid: t.numpy() for tid, t in inputs.items()}
        x = arrays[self.src]
        if not x.size or not x.flags.c_contiguous or \
                any(arrays[t].dtype != np.float32 or not arrays[t].flags.c_contiguous
                    or arrays[t].size != self.C for t in (self.gamma, self.beta) if t is not None):
            return None
        args = self._rows_args(x, arrays, self._dest_buffer(outputs))
        if self._ep_cache[2]:  # epilogue operands copied per call
            return None
        rows = norm._rows

        def runner() -> None:
            rows(*args)

        return runner

    def _write_extra(self, arrays, outputs):
        for tid in self.extra:
            if tid in outputs:
                outputs[tid].write(arrays[tid])

    def _store_with_extra(self, acc, arrays, outputs):
        self._write_extra(arrays, outputs)
        self.store(acc, arrays, outputs)


class ChannelNormPlan(ChainPlan):
    """BatchNormInference (running statistics) and GroupNorm (statistics in f64
    per sample and group, as the reference), normalization in f32 numpy."""

    kernel = "numpy_f32_channel_norm"

    def __init__(self, request, walk):
        head = walk.head
        self.ndim = len(request.lts[head.inputs[0].id].shape)
        fmt = head.attrs["data_format"]
        self.axis = 1 if fmt == "NCX" and self.ndim >= 2 else self.ndim - 1
        self.eps = np.float32(head.attrs["epsilon"])
        used = {lt.id for op in request.ops for lt in op.inputs} | set(request.output_ids)
        self.extra = [lt.id for lt in head.outputs[1:] if lt.id in used]
        super().__init__(request, walk, [lt.id for lt in head.inputs])

    def _along(self, v):
        shape = [1] * self.ndim
        shape[self.axis] = -1
        return _f32(v).reshape(shape)

    def head(self, arrays):
        head, lts = self.walk.head, self.request.lts
        x = _f32(arrays[head.inputs[0].id])
        ins = [arrays[lt.id] for lt in head.inputs]
        with np.errstate(all="ignore"):
            if head.kind == K.BatchNormInference:
                gamma, beta, mean, var = (self._along(v) for v in ins[1:5])
                return (x - mean) / np.sqrt(var + self.eps) * gamma + beta
            xc = np.moveaxis(x, self.axis, 1)
            n, groups = xc.shape[0], int(head.attrs["groups"])
            xg = xc.reshape(n, groups, -1).astype(np.float64)
            mean = xg.mean(axis=2, keepdims=True)
            var = np.square(xg - mean).mean(axis=2, keepdims=True)
            y = ((xg - mean) / np.sqrt(var + float(self.eps))).astype(np.float32).reshape(xc.shape)
            y = np.moveaxis(y, 1, self.axis)
            if head.attrs["use_affine"] and len(ins) >= 3:
                y = y * self._along(ins[1]) + self._along(ins[2])
        for tid, v in zip(self.extra, (mean[..., 0], var[..., 0])):
            arrays[tid] = dtypes.convert(v.reshape(lts[tid].shape), lts[tid].dtype)
        return y

    def run(self, arrays, outputs) -> None:
        acc = self.head(arrays)
        for tid in self.extra:
            if tid in outputs:
                outputs[tid].write(arrays[tid])
        self.store(acc, arrays, outputs)


class DirectPlan:
    """A single data-movement / quantization op whose formula is f32 numpy:
    the formula, its result written into the output tensor."""

    name = "numpy_direct"

    def __init__(self, request: CompileRequest):
        from graph_api.kernels.plan import ComposedPlan

        self.request = request
        self.steps = ComposedPlan(request).steps

    def execute(self, inputs: dict, outputs: dict) -> None:
        arrays = {tid: t.numpy() for tid, t in inputs.items()}
        run_steps(self.steps, arrays)
        for tid, tensor in outputs.items():
            tensor.write(arrays[tid])


def _norm_begin(head, ndim: int):
    """First normalized axis when the op normalizes trailing axes, else None."""
    if head.kind in (K.LayerNorm, K.RMSNorm):
        b = int(head.attrs["begin_norm_axis"])
        return b + ndim if b < 0 else b
    axis = int(head.attrs["axis"])
    axis = axis + ndim if axis < 0 else axis
    return axis if axis == ndim - 1 else None


def _norm_plan(request, head):
    lts = request.lts
    ndim = len(lts[head.inputs[0].id].shape)
    begin = _norm_begin(head, ndim)
    if begin is None:  # SoftMax over an inner axis: f32 numpy along that axis
        return FormulaF32Softmax(request, Walk(request, head).run())
    walk = Walk(request, head).run(layout=False)
    # the row kernel's epilogue indexes operands by (row, column) of [R, C]: only
    # when C is the last axis do they mean the same as the [.., N] chain operands
    fused = head.kind != K.LogSoftmax and head.attrs.get("mode", "none") == "none" and begin == ndim - 1
    plan = NormPlan(request, walk, begin, fused)
    if fused and (not plan.dest_dense):
        plan = NormPlan(request, Walk(request, head).run(layout=False), begin, False)
    return plan


class FormulaF32Softmax(ChainPlan):
    """SoftMax/LogSoftmax over a non-trailing axis in f32 numpy."""

    kernel = "numpy_f32_softmax"

    def __init__(self, request, walk):
        super().__init__(request, walk, [lt.id for lt in walk.head.inputs])
        ndim = len(request.lts[walk.head.inputs[0].id].shape)
        self.axis = int(walk.head.attrs["axis"]) % ndim
        self.extra = [lt.id for lt in walk.head.outputs[1:]]

    def head(self, arrays):
        head = self.walk.head
        x = _f32(arrays[head.inputs[0].id])
        with np.errstate(all="ignore"):
            m = x.max(axis=self.axis, keepdims=True)
            e = np.exp(x - m)
            s = e.sum(axis=self.axis, keepdims=True)
            if head.kind == K.LogSoftmax:
                return x - m - np.log(s)
            y = e / s
            if head.attrs.get("mode") == "inf_as_zero":
                y = np.where(m == -np.inf, np.float32(0.0), y)
            for tid in self.extra:
                st = m + np.log(s)
                if head.attrs.get("mode") == "inf_as_zero":
                    st = np.where(m == -np.inf, -np.inf, st)
                arrays[tid] = dtypes.convert(st.reshape(self.request.lts[tid].shape),
                                             self.request.lts[tid].dtype)
        return y

    def run(self, arrays, outputs):
        acc = self.head(arrays)
        self.store(acc, arrays, outputs)
        for tid in self.extra:
            if tid in outputs:
                outputs[tid].write(arrays[tid])


def _full_input(request, head):
    """A float input of ``head`` with the output's shape (the walk can start there)."""
    lts = request.lts
    out_shape = tuple(lts[head.outputs[0].id].shape)
    cands = head.inputs[:2] if head.kind in POST_OPS and POST_OPS[head.kind].binary else head.inputs[:1]
    if head.kind == K.BiasAdd:
        cands = head.inputs[:1]
    for lt in cands:
        if tuple(lts[lt.id].shape) == out_shape and dtypes.info(lts[lt.id].dtype).kind == "float":
            return lt.id
    return None


#: pattern -> the role of its head op
HEAD_ROLE = {"binary_post_ops": "binary", "eltwise_post_ops": "eltwise", "softmax_post_ops": "softmax",
             "layernorm_post_ops": "layernorm", "reduction_post_ops": "reduce",
             "reciprocal_multiply": "reciprocal", "typecast_quantize": "cast", "reorder_sum": "reorder",
             "x8_reorder": "dequant"}


def build(request: CompileRequest):
    """The plan of an element-wise/norm/reduction/data-movement partition, or why not."""
    from graph_api.kernels.weight_compressed.wmatmul_plan import zero_size_reason

    reason = zero_size_reason(request)  # the reference has the empty-axis semantics
    if reason:
        return reason
    if request.pattern is None:
        head = request.ops[0]
    else:
        head_id = request.bindings.get(HEAD_ROLE.get(request.pattern, ""))
        head = next((op for op in request.ops if op.id == head_id), None)
        if head is None:
            return f"no head role for {request.pattern}"
    lts = request.lts
    out_type = lts[head.outputs[0].id].dtype
    if head.kind in _ELTWISE_HEADS:
        src = _full_input(request, head)
        if src is not None:
            walk = Walk(request, head, value_id=src).run()
            if head.id in walk.covered[1:]:
                plan = EltwisePlan(request, walk, src)
                return plan.reason() or plan
    if head.kind in NORMS:
        if any(dtypes.info(lts[lt.id].dtype).kind != "float" for lt in head.inputs):
            return "non-float norm input"
        plan = _norm_plan(request, head)
        return plan.reason() or plan
    if head.kind in (K.BatchNormInference, K.GroupNorm):
        if any(dtypes.info(lts[lt.id].dtype).kind != "float" for lt in head.inputs):
            return "non-float norm input"
        plan = ChannelNormPlan(request, Walk(request, head).run())
        return plan.reason() or plan
    if head.kind in REDUCES:
        plan = ReducePlan(request, Walk(request, head).run())
        return plan.reason() or plan
    if head.kind in F32_FORMULA:
        if out_type in OKIND and dtypes.info(out_type).kind == "float" and len(head.outputs) == 1:
            plan = FormulaPlan(request, Walk(request, head).run())
            if plan.reason() is None:
                return plan
        if len(request.ops) == 1:
            return DirectPlan(request)
        return f"{head.kind.name} heads produce {out_type.name}"
    return f"no fast head for {head.kind.name}"

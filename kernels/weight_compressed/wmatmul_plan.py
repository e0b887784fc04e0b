"""Weight-compressed MatMul partitions on the Numba kernels of ``graph_api.kernels.weight_compressed.wmatmul``.

Covers ``DynamicDequantize(W int4/int8) [-> TypeCast] -> MatMul [+bias] ->
post-ops [-> TypeCast]`` with W two-dimensional ([K, N], or [N, K] with
``transpose_b``), grouped along K and/or N (per_group), per channel (along N) or per
tensor.  Anything after the epilogue (Quantize/DynamicQuantize, Select) runs
as reference steps.  Constant weights (with constant scales and zero points)
are repacked once into the kernel's blocked layout and cached (see
:class:`ConstantCache`, the process-wide constant tensor cache): oneDNN's rule
is that a constant tensor's data does not change after the first execute, so
the cache is keyed on the identity of every buffer the copy was built from,
never on their contents.

fpmath: the arithmetic of the composed reference plan, exactly: f32
activations are rounded as the mode says; dequantized weights are rounded to
the DynamicDequantize output type (the scales' type) or a following
TypeCast's type, and to the mode's type only with ``apply_to_int``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graph_api import constant_cache, dtypes
from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K
from graph_api.enums import PropertyType
from graph_api.kernels.bits import RND_BF16, RND_F16, rounding_code
from graph_api.kernels import scratch
from graph_api.kernels.plan import CompileRequest

from graph_api.kernels.fused.epilogue import bind, chain_program
from graph_api.kernels.fused.hybrid import HybridPlan

_WEIGHT_KINDS = {DataType.s4: "s4", DataType.u4: "u4", DataType.s8: "s8", DataType.u8: "u8"}
_ACT = {DataType.f32: None, DataType.bf16: "bf16", DataType.f16: "f16"}
_TYPE_RND = {DataType.bf16: RND_BF16, DataType.f16: RND_F16}


def _group_layout(deq, w_shape, transposed: bool):
    """(G along K, G along N, scale kind) or a reason.

    Groups may run along K, along N (oneDNN's gated_mlp_int4 example: u4 [K, N]
    weights with ``group_shape [1, 128]``) or both; the kernels index the
    scales [K/G, N/G_N] (prepared copies hold one scale per column)."""
    n_axis = 0 if transposed else 1
    k_axis = 1 - n_axis
    qtype = deq.attrs.get("qtype", "per_tensor")
    if qtype == "per_group":
        gs = list(deq.attrs.get("group_shape", []))
        if len(gs) != 2 or gs[k_axis] < 1 or gs[n_axis] < 1 or w_shape[k_axis] % gs[k_axis] \
                or w_shape[n_axis] % gs[n_axis]:
            return f"group_shape {gs} does not tile the weights {list(w_shape)}"
        return gs[k_axis], gs[n_axis], "group"
    if qtype == "per_channel":
        axis = deq.attrs.get("axis", 1) % 2
        if axis != n_axis:
            return f"per_channel axis {axis} is not the N axis"
        return w_shape[k_axis], 1, "channel"
    return w_shape[k_axis], 1, "tensor"


class ConstantCache:
    """One plan's slot in the process-wide constant tensor cache
    (:mod:`graph_api.constant_cache`): the prepared copy of constant tensors,
    keyed on this slot and on every source tensor's buffer (address, shape,
    strides, dtype).  Constant tensors may not change after the first execute
    (oneDNN's rule), so the same buffers give the same copy; other buffers fed
    to the same compiled partition get their own copy."""

    def get(self, tensors, build):
        return constant_cache.CACHE.get(self, "prepared", tensors, build)


@dataclass
class Linear:
    """``x @ dequant(W)`` of one DynamicDequantize -> MatMul pair, ready to run."""

    x_id: int
    w_id: int
    s_id: int
    z_id: int | None
    spec: object
    scale_kind: str
    rnd_x: int
    rnd_w: int
    act: str | None
    constant: bool  # weights, scales and zero points are all constant
    cache: ConstantCache = field(default_factory=ConstantCache)
    bf16_pairs: bool = False  # rnd_w is fpmath bf16 (apply_to_int): constants packed for the vdpbf16ps decode

    @property
    def K(self) -> int:
        return self.spec.K

    @property
    def N(self) -> int:
        return self.spec.N

    def _params(self, tensor):
        """Scales/zps as the kernel's per-group array ([K/G, N/G_N] or [N/G_N, K/G])."""
        a = np.asarray(tensor.numpy())
        spec = self.spec
        nn = spec.N // spec.group_n
        shape = (nn, spec.K // spec.group) if spec.transposed else (spec.K // spec.group, nn)
        if self.scale_kind == "group":
            return a.reshape(shape)
        if self.scale_kind == "channel":
            a = a.reshape(-1, 1) if spec.transposed else a.reshape(1, -1)
        else:
            a = a.reshape(1, 1)
        return np.broadcast_to(a, shape)

    def _weights(self, inputs):
        """(weight buffer, scales, zero points, prepared weight or None) of this call."""
        from graph_api.kernels.weight_compressed import wmatmul as wm

        w_buf = inputs[self.w_id].get_data_handle()
        scales = self._params(inputs[self.s_id])
        zps = None if self.z_id is None else self._params(inputs[self.z_id])
        prepared = None
        if self.constant and (self.rnd_w == 0 or self.bf16_pairs):
            sources = [inputs[t] for t in (self.w_id, self.s_id, self.z_id) if t is not None]
            pack = wm.prepare_bf16 if self.bf16_pairs else wm.prepare
            prepared = self.cache.get(sources, lambda: pack(w_buf, self.spec, scales, zps))
        return w_buf, scales, zps, prepared

    def bind(self, x2d, inputs, ep, out, head=None):
        """The dense-copy prefill of ``x2d`` into ``out`` (f32 [M, N]) with bias row ``head``
        and epilogue ``ep`` as a callable returning False where its overflow guard refuses
        (:func:`graph_api.kernels.weight_compressed.wmatmul.prefill_runner`), or None."""
        from graph_api.kernels.weight_compressed import wmatmul as wm

        if not self.constant or self.rnd_x or self.rnd_w or self.bf16_pairs or self.act:
            return None
        _, scales, zps, prepared = self._weights(inputs)
        return wm.prefill_runner(x2d, self.spec, scales, zps, prepared, out, ep, head)

    def __call__(self, x2d, inputs, post=(), out_dtype="f32", out=None):
        """``post(x2d @ dequant(W))`` as ``out_dtype``, into ``out`` (f32 [M, N], or
        uint16 bits for bf16/f16) when given."""
        from graph_api.kernels.weight_compressed import wmatmul as wm

        w_buf, scales, zps, prepared = self._weights(inputs)
        y = wm.wmatmul(x2d, w_buf, self.spec, scales, zps, prepared=prepared, post_ops=post, out=out,
                       out_dtype=out_dtype, rnd_x=self.rnd_x, rnd_w=self.rnd_w, act_dtype=self.act)
        return y if out_dtype == "f32" else y.view(dtypes.numpy_dtype(DataType[out_dtype]))


@dataclass
class DenseLinear:
    """``x @ W`` with float weights: f32 BLAS on (fpmath-rounded) f32 copies, or the AMX
    unit where both operands are bf16 values after the rounding, then the same Numba
    epilogue as the compressed kernels.  Constant weights are converted (and packed into
    AMX tiles) once (:class:`ConstantCache`)."""

    x_id: int
    w_id: int
    transposed: bool
    K: int
    N: int
    fpmath: object
    x_dtype: DataType
    w_dtype: DataType
    constant: bool
    cache: ConstantCache = field(default_factory=ConstantCache)
    unit: str | None = None  # the bf16 unit the products run on (kernels.bf16_matmul; set at construction)

    def __post_init__(self):
        from graph_api.kernels import bf16_matmul

        if all(self.fpmath.operand_type(t) == DataType.bf16 for t in (self.x_dtype, self.w_dtype)):
            self.unit = bf16_matmul.UNIT

    def _weights(self, tensor):
        """(f32 [K, N] weights, max |w|: NaN when a weight is NaN, their packed bf16: constant
        weights on a bf16 unit, else None)."""
        def build():
            from graph_api.kernels import bf16_matmul

            w = self.fpmath.round_input(tensor.numpy(), self.w_dtype)
            w = np.ascontiguousarray(w.T if self.transposed else w, dtype=np.float32)
            tiles = bf16_matmul.pack_b(bf16_matmul.bf16_bits(w)) if self.unit and self.constant else None
            return w, float(np.max(np.abs(w))) if w.size else 0.0, tiles

        return self.cache.get([tensor], build) if self.constant else build()

    def __call__(self, x2d, inputs, post=(), out_dtype="f32", out=None):
        from graph_api.kernels.weight_compressed import wmatmul as wm

        xf = self.fpmath.round_input(x2d, self.x_dtype)
        w, wmax, tiles = self._weights(inputs[self.w_id])
        amax = float(np.max(np.abs(xf))) if xf.size else 0.0
        if self.unit and xf.shape[0] > 8 and self.K:  # bf16 operands on the matrix unit
            from graph_api.kernels import bf16_matmul

            tiles = bf16_matmul.pack_b(bf16_matmul.bf16_bits(w)) if tiles is None else tiles  # variable: per call
            acc = bf16_matmul.matmul(xf, tiles, lambda: w, np.empty((xf.shape[0], self.N), np.float32))
        elif amax * wmax * max(self.K, 1) < wm._SAFE:  # NaN compares False
            acc = np.matmul(xf, w)
        else:  # inf/NaN or f32 partial sums that may overflow: float64 sums, as the reference
            with np.errstate(all="ignore"):
                acc = np.matmul(xf.astype(np.float64), w.astype(np.float64)).astype(np.float32)
        M = acc.shape[0]
        ep = wm.make_epilogue(post, M, self.N)
        okind = {"f32": wm.OUT_F32, "bf16": wm.OUT_BF16, "f16": wm.OUT_F16}[out_dtype]
        if out is None:
            out = scratch.empty((M, self.N), np.float32 if okind == wm.OUT_F32 else np.uint16)
        wm._store_rows(acc, 0, 0, out, okind, ep.ops, ep.fpar, ep.ipar, ep.buf)
        return out if out_dtype == "f32" else out.view(dtypes.numpy_dtype(DataType[out_dtype]))


def make_dense_linear(request: CompileRequest, mm_id: int, any_out: bool = False):
    """A :class:`DenseLinear` for a MatMul with 2-D float weights, or why not."""
    lts = request.lts
    mm = next(op for op in request.ops if op.id == mm_id)
    x_lt, w_lt = lts[mm.inputs[0].id], lts[mm.inputs[1].id]
    if mm.attrs.get("transpose_a") or len(w_lt.shape) != 2 or len(x_lt.shape) < 1:
        return "dense path needs 2-D weights and no transpose_a"
    if x_lt.dtype not in _ACT or w_lt.dtype not in _ACT:
        return f"dense path needs float operands, got {x_lt.dtype.name} x {w_lt.dtype.name}"
    transposed = bool(mm.attrs.get("transpose_b"))
    K_, N = (w_lt.shape[1], w_lt.shape[0]) if transposed else w_lt.shape
    if x_lt.shape[-1] != K_:
        return "activation K differs from the weights' K"
    if lts[mm.outputs[0].id].dtype != DataType.f32 and not any_out:
        return f"MatMul output is {lts[mm.outputs[0].id].dtype.name}; the epilogue runs in f32"
    return DenseLinear(x_lt.id, w_lt.id, transposed, K_, N, request.fpmath, x_lt.dtype, w_lt.dtype,
                       w_lt.property == PropertyType.constant)


def zero_size_reason(request: CompileRequest) -> str | None:
    """Why a partition with a zero-size tensor takes the reference plan, if it has one.

    Empty outputs and sums over no terms (K = 0: zeros, then bias and post-ops)
    are what the reference ops compute; the kernels' blockings assume work.
    """
    empty = [lt.id for lt in request.lts.values() if lt.shape and 0 in lt.shape]
    if empty:
        return f"tensors {sorted(empty)} have a zero-size dim (the reference plan computes " \
               f"empty outputs and sums over no terms)"
    return None


def make_linear(request: CompileRequest, deq_id: int | None, mm_id: int, cast_id: int | None = None,
                any_out: bool = False):
    """A :class:`Linear` for a compressed-weight MatMul (a :class:`DenseLinear`
    for float weights), or the reason it cannot be one.  ``any_out``: the
    MatMul output may be bf16/f16 (no epilogue follows; the store rounds)."""
    from graph_api.kernels.weight_compressed import wmatmul as wm

    lts = request.lts
    ops = {op.id: op for op in request.ops}
    reason = zero_size_reason(request)
    if reason:
        return reason
    if deq_id is None:
        return make_dense_linear(request, mm_id, any_out)
    deq, mm = ops[deq_id], ops[mm_id]
    if deq.kind != K.DynamicDequantize:
        return "static Dequantize weights take the reference path"
    wq = lts[deq.inputs[0].id]
    if wq.dtype not in _WEIGHT_KINDS or len(wq.shape) != 2 or not wq.is_dense():
        return f"weights {wq!r} are not a dense 2-D s4/u4/s8/u8 tensor"
    if mm.inputs[1].id != (ops[cast_id].outputs[0].id if cast_id is not None else deq.outputs[0].id):
        return "the dequantized weights are not the MatMul's second input"
    if mm.attrs.get("transpose_a"):
        return "transpose_a"
    transposed = bool(mm.attrs.get("transpose_b"))
    layout = _group_layout(deq, wq.shape, transposed)
    if isinstance(layout, str):
        return layout
    group, group_n, scale_kind = layout
    x_lt = lts[mm.inputs[0].id]
    if x_lt.dtype not in _ACT:
        return f"activations {x_lt!r}"
    K_ = wq.shape[1] if transposed else wq.shape[0]
    N = wq.shape[0] if transposed else wq.shape[1]
    if x_lt.shape[-1] != K_ or K_ % group:
        return "activation K differs from the weights' K"
    if lts[mm.outputs[0].id].dtype != DataType.f32 and not any_out:
        return f"MatMul output is {lts[mm.outputs[0].id].dtype.name}; the epilogue runs in f32"
    w_type = lts[ops[cast_id].outputs[0].id].dtype if cast_id is not None else lts[deq.outputs[0].id].dtype
    rnd_w = _TYPE_RND.get(w_type) or rounding_code(request.fpmath, for_int_weights=True)
    if lts[deq.outputs[0].id].dtype in _TYPE_RND and cast_id is not None and \
            lts[ops[cast_id].outputs[0].id].dtype == DataType.f32:
        rnd_w = _TYPE_RND[lts[deq.outputs[0].id].dtype]
    rnd_x = rounding_code(request.fpmath, src_is_f32=x_lt.dtype == DataType.f32)
    z_id = deq.inputs[2].id if len(deq.inputs) > 2 else None
    constant = all(lts[t.id].property == PropertyType.constant for t in deq.inputs)
    spec = wm.WeightSpec(_WEIGHT_KINDS[wq.dtype], K_, N, group, transposed, group_n)
    # the bf16 rounding of the weights comes from the fpmath mode, not from a bf16 tensor
    # in the graph: the decode kernel may keep (q - z) exact and scale the group sums
    bf16_pairs = (rnd_w == RND_BF16 and rounding_code(request.fpmath, for_int_weights=True) == RND_BF16
                  and w_type not in _TYPE_RND and lts[deq.outputs[0].id].dtype not in _TYPE_RND
                  and wm.bf16_decode_applies(spec))
    return Linear(mm.inputs[0].id, deq.inputs[0].id, deq.inputs[1].id, z_id, spec, scale_kind,
                  rnd_x, rnd_w, _ACT[x_lt.dtype], constant, bf16_pairs=bf16_pairs)


def build(request: CompileRequest):
    """The plan of a ``matmul_compressed`` partition, or why the fast path does not apply."""
    b, lts = request.bindings, request.lts
    ops = {op.id: op for op in request.ops}
    if b.get("src_dequant") is not None:
        return "dequantized activations take the reference path"
    linear = make_linear(request, b.get("wei_dequant"), b["matmul"], b.get("wei_cast"))
    if isinstance(linear, str):
        return linear
    mm = ops[b["matmul"]]
    steps, value_id = [], mm.outputs[0].id
    if len(mm.inputs) > 2:
        steps.append(("add", mm.inputs[2].id))
    program = chain_program(ops, list(b.get("post_ops") or []), value_id, lts)
    if isinstance(program, str):
        return program
    chain_steps, value_id = program
    steps += chain_steps
    covered = {mm.id} | set(b.get("post_ops") or [])
    if b.get("wei_dequant") is not None:
        covered.add(b["wei_dequant"])
    if b.get("wei_cast") is not None:
        covered.add(b["wei_cast"])
    out_dtype = "f32"
    if b.get("out_cast") is not None and b.get("select") is None:
        out_cast = ops[b["out_cast"]]
        out_dtype = lts[out_cast.outputs[0].id].dtype.name
        covered.add(out_cast.id)
        value_id = out_cast.outputs[0].id
    out_shape = lts[value_id].shape
    inner = {lt.id for op_id in covered for lt in ops[op_id].outputs} - {value_id}
    escaping = [op.id for op in request.ops if op.id not in covered and any(lt.id in inner for lt in op.inputs)]
    if escaping:  # the core keeps only its final value
        return f"op {escaping[0]} after the fused core reads one of the core's intermediates"

    def core(inputs, arrays, outputs=None):
        x = inputs[linear.x_id].numpy()
        M = x.size // linear.K
        post = bind(steps, lambda tid: arrays[tid] if tid in arrays else inputs[tid].numpy(),
                    out_shape, M, linear.N)
        dest = _output_memory(outputs.get(value_id) if outputs else None, M, linear.N, out_dtype)
        y = linear(x.reshape(M, linear.K), inputs, post, out_dtype, dest)
        arrays[value_id] = y.reshape(out_shape)  # the output's own memory: not copied again

    def bind_core(inputs, outputs):
        """``core`` as a callable on these tensors (see ``CompiledPartition.bind``): an
        f32 prefill on the weight's dense copy, a first f32 row operand (the bias) added
        as the store's head row, the epilogue reading at most one other operand in place
        (a residual); None otherwise.  A call its overflow guard refuses runs core."""
        from graph_api.kernels.weight_compressed import wmatmul as wm

        if not isinstance(linear, Linear) or out_dtype != "f32":
            return None
        x = inputs[linear.x_id].numpy()
        M = x.size // linear.K
        dest = _output_memory(outputs.get(value_id), M, linear.N, "f32")
        if dest is None or x.dtype != np.float32 or not x.flags.c_contiguous:
            return None
        post = bind(steps, lambda tid: inputs[tid].numpy(), out_shape, M, linear.N)
        head = None
        if post and post[0][0] == "add" and isinstance(post[0][1], np.ndarray) and \
                post[0][1].shape == (1, linear.N) and post[0][1].dtype == np.float32 and post[0][1].flags.c_contiguous:
            head, post = post[0][1].reshape(-1), post[1:]
        operands = [arg for _, arg in post if isinstance(arg, np.ndarray)]
        ep = wm.make_epilogue(post, M, linear.N)
        if len(operands) > 1 or (operands and not np.shares_memory(ep.buf, operands[0])):
            return None  # operands copied into the epilogue's buffer: per call
        run = linear.bind(x.reshape(M, linear.K), inputs, ep, dest, head)
        if run is None:
            return None

        def runner() -> None:
            if not run():
                core(inputs, {}, outputs)

        return runner

    core.writes_outputs = True
    core.bind = bind_core
    name = "numba_wmatmul" if isinstance(linear, Linear) else "blas_matmul_epilogue"
    return HybridPlan(request, name, core, covered)


def _output_memory(tensor, M: int, N: int, out_dtype: str):
    """The output tensor's memory as the kernels' ``out`` (f32 [M, N], or uint16 bits
    for bf16/f16), when the tensor is that array element for element (dense, row-major,
    no mirror or conversion); else None (the result is written to it afterwards)."""
    if tensor is None:
        return None
    view = tensor.numpy()
    want = np.float32 if out_dtype == "f32" else dtypes.numpy_dtype(DataType[out_dtype])
    if view.dtype != want or view.size != M * N or not view.flags.c_contiguous or not tensor.is_view_of(view):
        return None
    flat = view.reshape(M, N)
    return flat if out_dtype == "f32" else flat.view(np.uint16)

"""Convolution partitions (conv_post_ops, conv_depthwise, conv_quantized) on
im2col + f32 BLAS, image by image, with the post-op chain run on each image's
L2-resident output block.

Per image ``n`` the plan computes the first Convolution's output block
``[OC, P]`` (channels first whatever the data format) with
:mod:`graph_api.kernels.conv`, then every later op of the partition (post-ops, a fused
depthwise Convolution, TypeCast, Quantize) on blocks, and writes the blocks of
the partition outputs into place.  Chain ops run through their own reference
kernels on the block, so each one computes and rounds exactly as the unfused
op does; only the convolution's summation order differs from the reference
(f32 BLAS instead of an f64 sum: a few f32 ulps of the terms' magnitude).

Folded into the convolution: its bias (input or a BiasAdd right after) and a
BatchNormInference right after that (``w' = w a``, ``b' = (b - mean) a + beta``
with ``a = gamma / sqrt(var + eps)``, in f64), when the conv output is f32.

int8 (s8/u8 data and s8 weights, no TypeCasts, per-tensor data and per-tensor
or per-output-channel weight scales, weight zero points 0): the products
``(x - zp_x) * w`` are integers and are summed exactly (:func:`graph_api.kernels.conv.int_gemm`),
then scaled once by ``scale_x * scale_w[oc]``.  Other quantized forms (f8,
TypeCasts to bf16, a weight Quantize) dequantize through the reference ops
first and run the float path on the dequantized values, as the reference does.

Ops before the convolution (dequantization of data, weights, and binary
operands) run as reference steps on whole tensors before the image loop.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graph_api import dtypes
from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K
from graph_api.enums import PropertyType
from graph_api.logical_tensor import LogicalTensor
from graph_api.kernels import conv as cv
from graph_api.kernels import scratch
from graph_api.kernels.plan import CompileRequest, dequantized_inputs
from graph_api.kernels.reference import REFERENCE, RefContext
from graph_api.kernels.reference._common import pads, spatial_list, to_ncx
from graph_api.kernels.reference.conv import weights_to_oix
from graph_api.kernels.reference.eltwise import ELTWISE, clamp

_BINARY = {K.Add, K.Subtract, K.Multiply, K.Divide, K.Maximum, K.Minimum}
_INT8 = {DataType.s8: (-128, 127), DataType.u8: (0, 255)}
F32 = DataType.f32


@dataclass
class ConvStage:
    """One Convolution of the flow (the first, or a fused depthwise one)."""

    op: object
    geo: cv.Geometry
    x_id: int
    out_id: int
    w_id: int
    bias_id: int | None
    bn: object | None  # BatchNormInference op folded in
    int8: dict | None  # exact integer path: x/w scales and zero points
    round_x: object
    round_w: object
    absorbed: list = field(default_factory=list)  # BiasAdd/BatchNorm op ids folded in
    cache: dict = field(default_factory=dict)

    def param_ids(self) -> list:
        ids = [self.w_id] + ([self.bias_id] if self.bias_id is not None else [])
        return ids + ([lt.id for lt in self.bn.inputs[1:5]] if self.bn is not None else [])

    def weights(self, arrays, key=None):
        """``(w2 [G, OCg, J] or [C, K] for depthwise, bias [OC, 1] or None)``, f32.

        ``key`` (the constant parameters' buffer addresses) caches the result:
        a constant tensor's data does not change (oneDNN's rule)."""
        if key is not None and key in self.cache:
            return self.cache[key]
        fmt = self.op.attrs["weights_format"]
        w = weights_to_oix(self.round_w(arrays[self.w_id]), fmt).astype(np.float64)
        bias = None if self.bias_id is None else dtypes.to_f32(arrays[self.bias_id]).astype(np.float64)
        if self.bn is not None:
            gamma, beta, mean, var = (dtypes.to_f32(arrays[lt.id]).astype(np.float64)
                                      for lt in self.bn.inputs[1:5])
            a = gamma / np.sqrt(var + float(np.float32(self.bn.attrs["epsilon"])))
            w = w * a.reshape((-1,) + (1,) * (w.ndim - 1))
            bias = (0.0 if bias is None else bias) - mean
            bias = bias * a + beta
        geo = self.geo
        if geo.deconv:
            w2 = cv.deconv_weights(w, geo.groups)
        elif self.direct_depthwise:
            w2 = w.reshape(geo.out_channels, -1)
        else:
            w2 = w.reshape(geo.groups, geo.out_channels // geo.groups, -1)
        out = (np.ascontiguousarray(w2, np.float32),
               None if bias is None else bias.astype(np.float32).reshape(-1, 1))
        if key is not None:
            self.cache.clear()
            self.cache[key] = out
        return out

    @property
    def direct_depthwise(self) -> bool:
        """Depthwise on the tap-by-tap kernel: always in float; in int8 when every
        partial sum of the prod(K) integer products is exact in f32 (<= chunk terms)."""
        if not self.geo.depthwise:
            return False
        return self.int8 is None or int(np.prod(self.geo.kernel)) <= self.int8["chunk"]

    def _columns(self, xp, buf: dict):
        """im2col into this stage's buffer, reused from image to image."""
        cols = cv.im2col(xp, self.geo, buf.get(id(self)))
        if not self.geo.pointwise:  # pointwise columns are a view of the image itself
            buf[id(self)] = cols
        return cols

    def run(self, x_img, w2, bias, buf):
        """The ``[OC, P]`` f32 block of one image ``x_img`` [IC, spatial...]."""
        geo = self.geo
        if geo.deconv:
            exact = None
            if self.int8 is not None:
                x_img, exact = x_img.astype(np.float32) - np.float32(self.int8["x_zp"]), self.int8["chunk"]
            y = cv.deconv_col2im(self.round_x(x_img) if exact is None else x_img, w2, geo, exact)
            y = y.astype(np.float32) if exact is None else (y * self.int8["scale"]).astype(np.float32)
        elif self.int8 is not None:
            xs = x_img.astype(np.float32) - np.float32(self.int8["x_zp"])
            if self.direct_depthwise:  # exact: integer partial sums below 2^24
                y = cv.conv_depthwise(cv.pad_image(xs, geo), w2, geo).astype(np.float64)
            else:
                y = cv.int_gemm(self._columns(cv.pad_image(xs, geo), buf), w2, self.int8["chunk"])
            y = (y * self.int8["scale"]).astype(np.float32)
        else:
            xp = cv.pad_image(self.round_x(x_img), geo)
            if geo.depthwise:
                y = cv.conv_depthwise(xp, w2, geo)
            else:
                y = cv.conv_gemm(self._columns(xp, buf), w2)
        if bias is not None:
            y += bias
        return y


def _geometry(op, x_lt, w_lt, out_lt) -> cv.Geometry:
    deconv = op.kind == K.ConvTranspose
    fmt = op.attrs["data_format"]
    x_shape = (x_lt.shape[0], x_lt.shape[-1]) + tuple(x_lt.shape[1:-1]) if fmt == "NXC" else x_lt.shape
    out_shape = (out_lt.shape[0], out_lt.shape[-1]) + tuple(out_lt.shape[1:-1]) if fmt == "NXC" \
        else out_lt.shape
    w_oix = weights_to_oix(np.empty(w_lt.shape, np.uint8), op.attrs["weights_format"]).shape
    nsp = len(x_shape) - 2
    strides = spatial_list(op, "strides", nsp, 1)
    dilations = spatial_list(op, "dilations", nsp, 1)
    kernel = list(w_oix[2:])
    begin, end = pads(op, list(x_shape[2:]), strides, kernel, dilations, deconv)
    out_sp = tuple(out_shape[2:])
    if not deconv:  # the end padding that makes the last window fit exactly
        end = [(o - 1) * s + (k - 1) * d + 1 - i - b
               for o, s, k, d, i, b in zip(out_sp, strides, kernel, dilations, x_shape[2:], begin)]
    return cv.Geometry(x_shape[1], out_shape[1], int(op.attrs["groups"]), tuple(x_shape[2:]), out_sp,
                       tuple(kernel), tuple(strides), tuple(dilations), tuple(begin), tuple(end), deconv)


def _int8_params(request, conv, ops_by_out):
    """Integer-path parameters, or None when the float path must run."""
    if request.fpmath.rounding is not None and request.fpmath.apply_to_int:
        return None
    deqs = [ops_by_out.get(lt.id) for lt in conv.inputs[:2]]
    if any(d is None or d.kind != K.Dequantize for d in deqs):
        return None
    xd, wd = deqs
    lts = request.lts
    x_dt, w_dt = lts[xd.inputs[0].id].dtype, lts[wd.inputs[0].id].dtype
    if x_dt not in _INT8 or w_dt != DataType.s8 or ops_by_out.get(wd.inputs[0].id) is not None:
        return None
    if xd.attrs["qtype"] != "per_tensor" or len(xd.attrs["scales"]) != 1:
        return None
    if any(z != 0 for z in wd.attrs.get("zps") or [0]):
        return None
    oc = lts[conv.outputs[0].id].shape
    oc = oc[1] if conv.attrs["data_format"] == "NCX" else oc[-1]
    w_scales = np.asarray(wd.attrs["scales"], np.float64)
    if wd.attrs["qtype"] == "per_channel":
        if conv.kind == K.ConvTranspose:  # (OCg, IC, K) weights: scales per group slot
            return None
        fmt, ndim = conv.attrs["weights_format"], len(lts[wd.inputs[0].id].shape)
        o_axis = 0 if fmt == "OIX" else ndim - 1
        if wd.attrs["axis"] % ndim != o_axis or w_scales.size != oc:
            return None
    elif wd.attrs["qtype"] != "per_tensor":
        return None
    zp = int((xd.attrs.get("zps") or [0])[0])
    lo, hi = _INT8[x_dt]
    scale = np.float64(np.float32(xd.attrs["scales"][0])) * w_scales.astype(np.float32).astype(np.float64)
    return {"x_id": xd.inputs[0].id, "w_id": wd.inputs[0].id, "x_zp": zp,
            "scale": np.broadcast_to(scale, (oc,)).reshape(-1, 1),
            "chunk": cv.exact_chunk(max(abs(lo - zp), abs(hi - zp)), 128), "skip": {xd.id, wd.id}}


# ---------------------------------------------------------------- the chain on blocks
def _block_lt(lt, shape) -> LogicalTensor:
    return LogicalTensor(lt.id, lt.dtype, list(shape))


def _run_block_op(op, in_blocks, out_lt, ctx):
    """One chain op on ``[C, P]`` blocks (channels first), rounded as the op rounds."""
    shape = in_blocks[0].shape
    out = _block_lt(out_lt, shape)
    if op.kind == K.BiasAdd:
        y = dtypes.to_f32(in_blocks[0]) + dtypes.to_f32(in_blocks[1]).reshape(-1, 1)
        return dtypes.convert(y, out_lt.dtype)
    if op.kind == K.Quantize and op.attrs["qtype"] == "per_channel":
        scales = np.asarray(op.attrs["scales"], np.float32).reshape(-1, 1)
        zps = np.asarray(op.attrs.get("zps") or [0], np.float32).reshape(-1, 1)
        with np.errstate(all="ignore"):
            return dtypes.convert(dtypes.to_f32(in_blocks[0]) / scales + zps, out_lt.dtype)
    if op.kind == K.ReLU and in_blocks[0].dtype == np.float32 and out_lt.dtype == F32:
        x = in_blocks[0]  # relu is exact: the f32 form equals the reference's f64 formula
        return np.where(x > 0, x, x * np.float32(0))
    if op.kind == K.Clamp and in_blocks[0].dtype == np.float32 and out_lt.dtype == F32:
        # clamp only selects x, min or max (f32 values): the f32 form equals the f64 reference
        return clamp(in_blocks[0], np.float32(op.attrs["min"]), np.float32(op.attrs["max"]))
    if op.kind == K.BatchNormInference:
        x = in_blocks[0].astype(np.float64)
        gamma, beta, mean, var = (b.astype(np.float64).reshape(-1, 1) for b in in_blocks[1:5])
        eps = float(np.float32(op.attrs["epsilon"]))
        return dtypes.convert(gamma * (x - mean) / np.sqrt(var + eps) + beta, out_lt.dtype)
    return REFERENCE[op.kind](op, in_blocks, [out], ctx)[0]


def _chain_reason(op, lts, fmt, flow_ids) -> str | None:
    """Why ``op`` cannot run on blocks, or None."""
    if op.kind in ELTWISE or op.kind in _BINARY or op.kind in (K.TypeCast, K.BiasAdd):
        pass
    elif op.kind == K.Quantize:
        rank = len(lts[op.inputs[0].id].shape)
        channel = 1 if fmt == "NCX" else rank - 1
        if op.attrs["qtype"] == "per_channel" and op.attrs["axis"] % rank != channel:
            return f"Quantize (op {op.id}) is per channel along a non-channel axis"
        if op.attrs["qtype"] not in ("per_tensor", "per_channel"):
            return f"Quantize (op {op.id}) is {op.attrs['qtype']}"
    elif op.kind == K.BatchNormInference:
        if op.attrs["data_format"] != fmt:
            return f"BatchNormInference (op {op.id}) data format differs from the conv's"
    else:
        return f"{op.kind.name} (op {op.id}) has no block form"
    if op.kind == K.BiasAdd and op.attrs["data_format"] != fmt:
        return f"BiasAdd (op {op.id}) data format differs from the conv's"
    flow_in = next(lt for lt in op.inputs if lt.id in flow_ids)
    if tuple(lts[op.outputs[0].id].shape) != tuple(lts[flow_in.id].shape):
        return f"{op.kind.name} (op {op.id}) broadcasts the running value"
    return None


class ConvPlan:
    """Pre-steps on whole tensors, then per image: conv stages and chain ops on blocks."""

    name = "conv_im2col_blas"

    def __init__(self, request, pre_steps, flow, fmt, n_images, outputs, constants):
        self.request = request
        self.pre_steps = pre_steps  # (fn, op, out_lts, ctx) on whole tensors
        self.flow = flow  # ConvStage | (op, out_lt, ctx)
        self.fmt = fmt
        self.n_images = n_images
        self.outputs = outputs  # tensor id -> lt
        self.constants = constants  # tensor ids of constant inputs

    def run_arrays(self, arrays: dict, keys: dict | None = None) -> dict:
        """Execute on logical arrays keyed by tensor id (``keys``: buffer
        addresses of constant inputs, for the weight cache); returns all arrays."""
        arrays = dict(arrays)
        keys = keys or {}
        for fn, op, out_lts, ctx in self.pre_steps:
            for lt, value in zip(out_lts, fn(op, [arrays[lt.id] for lt in op.inputs], out_lts, ctx)):
                arrays[lt.id] = value
        lts = self.request.lts
        results = {tid: scratch.empty(lt.shape, dtypes.numpy_dtype(lt.dtype)) for tid, lt in self.outputs.items()}
        weights = {}
        for s in self.flow:
            if isinstance(s, ConvStage):
                ids = s.param_ids()
                key = tuple(keys[i] for i in ids) if all(i in keys for i in ids) else None
                weights[id(s)] = s.weights(arrays, key)
        operands = {}
        for step in self.flow:
            if not isinstance(step, ConvStage) and step[0].kind not in (K.BiasAdd, K.BatchNormInference):
                op, out_lt, _ = step
                for lt in op.inputs:
                    if lt.id in arrays and lt.id not in operands:
                        operands[lt.id] = to_ncx(np.broadcast_to(arrays[lt.id], out_lt.shape), self.fmt)
        buf: dict = {}
        for n in range(self.n_images):
            blocks = {}
            for step in self.flow:
                if isinstance(step, ConvStage):
                    x = blocks[step.x_id] if step.x_id in blocks else to_ncx(arrays[step.x_id], self.fmt)[n]
                    x = x.reshape((step.geo.in_channels,) + step.geo.in_spatial)
                    w2, bias = weights[id(step)]
                    y = step.run(x, w2, bias, buf)
                    blocks[step.out_id] = dtypes.convert(y, lts[step.out_id].dtype)
                    continue
                op, out_lt, ctx = step
                shape = next(blocks[lt.id].shape for lt in op.inputs if lt.id in blocks)
                ins = []
                for lt in op.inputs:
                    if lt.id in blocks:
                        ins.append(blocks[lt.id])
                    elif op.kind in (K.BiasAdd, K.BatchNormInference):
                        ins.append(arrays[lt.id])
                    else:
                        ins.append(operands[lt.id][n].reshape(shape))
                blocks[out_lt.id] = _run_block_op(op, ins, out_lt, ctx)
            for tid, out in results.items():
                target = to_ncx(out, self.fmt)[n]
                target[...] = blocks[tid].reshape(target.shape)
        arrays.update(results)
        return arrays

    def execute(self, inputs: dict, outputs: dict) -> None:
        keys = {tid: (t.buffer.__array_interface__["data"][0], t.buffer.nbytes)
                for tid, t in inputs.items() if tid in self.constants}
        arrays = self.run_arrays({tid: t.numpy() for tid, t in inputs.items()}, keys)
        for tid, tensor in outputs.items():
            tensor.write(arrays[tid])


# ---------------------------------------------------------------- building
def _rounder(request, conv, index):
    """The reference's rounding of conv input ``index`` (fpmath; dequantized data)."""
    fp = request.fpmath
    if index in dequantized_inputs(request.ops).get(conv.id, frozenset()):
        return fp.round_dequantized_weight
    dtype = request.lts[conv.inputs[index].id].dtype
    return lambda a: fp.round_input(a, dtype)


def _downstream(ops, start_id) -> set:
    """Tensor ids computed (transitively) from the output of op ``start_id``."""
    flow = set()
    for op in ops:
        if op.id == start_id or any(lt.id in flow for lt in op.inputs):
            flow.update(lt.id for lt in op.outputs)
    return flow


def _stage(request, conv, ops_by_out, after, int8=None) -> ConvStage | str:
    """A ConvStage for ``conv``, folding a following BiasAdd and BatchNormInference
    (``after``: the consumers chain of the partition, op by op)."""
    lts = request.lts
    x_lt, w_lt, out_lt = (lts[conv.inputs[0].id], lts[conv.inputs[1].id], lts[conv.outputs[0].id])
    if x_lt.shape is None or len(x_lt.shape) < 3:
        return f"conv (op {conv.id}) input rank is not >= 3"
    geo = _geometry(conv, x_lt, w_lt, out_lt)
    bias_id = conv.inputs[2].id if len(conv.inputs) > 2 else None
    out_id, bn = conv.outputs[0].id, None
    absorbed = []
    if out_lt.dtype == F32:
        nxt = after.get(out_id)
        if nxt is not None and nxt.kind == K.BiasAdd and bias_id is None and \
                nxt.attrs["data_format"] == conv.attrs["data_format"] and lts[nxt.outputs[0].id].dtype == F32:
            bias_id, out_id = nxt.inputs[1].id, nxt.outputs[0].id
            absorbed.append(nxt.id)
            nxt = after.get(out_id)
        if nxt is not None and nxt.kind == K.BatchNormInference and int8 is None and \
                conv.kind == K.Convolution and \
                nxt.attrs["data_format"] == conv.attrs["data_format"] and lts[nxt.outputs[0].id].dtype == F32:
            bn, out_id = nxt, nxt.outputs[0].id
            absorbed.append(nxt.id)
    x_id = int8["x_id"] if int8 else conv.inputs[0].id
    w_id = int8["w_id"] if int8 else conv.inputs[1].id
    return ConvStage(conv, geo, x_id, out_id, w_id, bias_id, bn, int8,
                     _rounder(request, conv, 0), _rounder(request, conv, 1), absorbed)


def build(request: CompileRequest):
    """The plan of a Convolution partition, or why the fast path does not apply."""
    lts, ops = request.lts, request.ops
    convs = [op for op in ops if op.kind in (K.Convolution, K.ConvTranspose)]
    first = convs[0]
    fmt = first.attrs["data_format"]
    if any(c.attrs["data_format"] != fmt for c in convs):
        return "the convolutions' data formats differ"
    flow_ids = _downstream(ops, first.id)
    ops_by_out = {lt.id: op for op in ops for lt in op.outputs}
    after = {lt.id: op for op in ops for lt in op.inputs if op.id != first.id}
    int8 = _int8_params(request, first, ops_by_out)
    stages, absorbed = {}, set()
    for conv in convs:
        stage = _stage(request, conv, ops_by_out, after, int8 if conv is first else None)
        if isinstance(stage, str):
            return stage
        stages[conv.id] = stage
        absorbed.update(stage.absorbed)
    skip = int8["skip"] if int8 else set()
    pre, flow = [], []
    for op in ops:
        if op.id in skip or op.id in absorbed:
            continue
        ctx = RefContext(fpmath=request.fpmath)
        out_lts = [lts[lt.id] for lt in op.outputs]
        if op.id in stages:
            flow.append(stages[op.id])
        elif op.outputs[0].id in flow_ids:
            reason = _chain_reason(op, lts, fmt, flow_ids)
            if reason:
                return reason
            flow.append((op, out_lts[0], ctx))
        else:
            pre.append((REFERENCE[op.kind], op, out_lts, ctx))
    stage_outs = {s.out_id for s in stages.values()}
    for op in ops:
        if op.id in skip | absorbed and any(lt.id in request.output_ids and lt.id not in stage_outs
                                             for lt in op.outputs):
            return "a folded op's output leaves the partition"
    outputs = {tid: lts[tid] for tid in request.output_ids}
    if not all(tid in flow_ids for tid in outputs):
        return "a partition output is not computed from the convolution"
    constants = {tid for tid in request.input_ids if lts[tid].property == PropertyType.constant}
    n_images = lts[first.inputs[0].id].shape[0]
    return ConvPlan(request, pre, flow, fmt, n_images, outputs, constants)

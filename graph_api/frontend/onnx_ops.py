"""ai.onnx ops onto the oneDNN Graph opset (``graph_api/opset.py``): one mapper per op type.

A mapper reads the node through a :class:`~.onnx_import.NodeContext` and either adds
graph_api ops (returning True) or returns False, and the node runs as a host step
(numpy).  Mappers decline rather than approximate: an ONNX semantics the oneDNN op does
not have (Round's half-to-even, integer arithmetic, a shape only known at run time)
goes to the host.

    ONNX                                oneDNN Graph
    MatMul / Gemm                       MatMul (transpose_a/b, bias) [+ Multiply alpha]
    Conv / ConvTranspose                Convolution / ConvTranspose (NCX, OIX / IOX)
    Relu, Sigmoid, ..., Gelu, Clip      ReLU, Sigmoid, ..., GELU, Clamp
    Add Sub Mul Div Max Min Pow         Add Subtract Multiply Divide Maximum Minimum Pow
    Softmax / LogSoftmax                SoftMax / LogSoftmax (axis)
    LayerNormalization                  LayerNorm (begin_norm_axis = axis)
    RMSNormalization                    RMSNorm
    BatchNormalization (inference)      BatchNormInference
    MaxPool / AveragePool / Global*     MaxPool / AvgPool / ReduceMax, ReduceMean
    Reshape Flatten Squeeze Unsqueeze   StaticReshape (shape known at load)
    Transpose / Concat / Cast           StaticTranspose / Concat / TypeCast (floats)
    Reduce*                             Reduce*
    Where                               Select
    QuantizeLinear / DequantizeLinear   Quantize / Dequantize (per tensor, per axis);
                                        DynamicDequantize per_group (opset 21 block_size)
"""
from __future__ import annotations

import numpy as np

from ..dtypes import DataType as DT
from ..errors import InvalidShape

FLOAT_NP = {np.dtype(np.float32), np.dtype(np.float16)}


def _is_float(dtype) -> bool:
    return dtype is not None and (np.dtype(dtype) in FLOAT_NP or str(dtype) == "bfloat16")


def _floats(ctx, *indexes) -> bool:
    return all(ctx.has(i) and _is_float(ctx.dtype(i)) for i in indexes)


def _same_float(ctx, *indexes) -> bool:
    """Every input a float of one type (constants of another float type are converted)."""
    if not _floats(ctx, *indexes):
        return False
    runtime = {str(ctx.dtype(i)) for i in indexes if ctx.const(i) is None}
    return len(runtime) <= 1


def _target(ctx, *indexes):
    """The data type run-time inputs have (constants follow it)."""
    from ..dtypes import from_numpy
    for i in indexes:
        if ctx.const(i) is None:
            return from_numpy(ctx.dtype(i))
    return from_numpy(ctx.dtype(indexes[0]))


def _vals(ctx, *indexes):
    dt = _target(ctx, *indexes)
    return [ctx.value(i, dt) for i in indexes]


# ====================================================================== element-wise
def unary(kind_method: str, **fixed):
    def mapper(ctx):
        if not _floats(ctx, 0):
            return False
        attrs = {k: (v(ctx) if callable(v) else v) for k, v in fixed.items()}
        return ctx.out(getattr(ctx.b, kind_method)(ctx.value(0), **attrs))
    return mapper


def _gelu(ctx):
    if not _floats(ctx, 0):
        return False
    mode = "gelu_tanh" if ctx.attr("approximate", "none") == "tanh" else "gelu_erf"
    return ctx.out(ctx.b.gelu(ctx.value(0), mode=mode))


def _clip(ctx):
    if not _floats(ctx, 0):
        return False
    lo, hi = ctx.attr("min"), ctx.attr("max")
    if ctx.has(1):
        if ctx.const(1) is None:
            return False
        lo = float(ctx.const(1).reshape(-1)[0])
    if ctx.has(2):
        if ctx.const(2) is None:
            return False
        hi = float(ctx.const(2).reshape(-1)[0])
    lo = -np.inf if lo is None else float(lo)
    hi = np.inf if hi is None else float(hi)
    if lo == 0.0 and hi == np.inf:
        return ctx.out(ctx.b.relu(ctx.value(0)))
    return ctx.out(ctx.b.clamp(ctx.value(0), min=lo, max=hi))


def _neg(ctx):
    if not _floats(ctx, 0):
        return False
    minus = ctx.constant(np.array([-1.0], np.float32), _target(ctx, 0))
    return ctx.out(ctx.b.multiply(ctx.value(0), minus))


def _identity(ctx):
    if ctx.imp.seg is None or ctx.name(0) not in ctx.imp.seg.values:
        return False
    return ctx.out(ctx.value(0))


def _dropout(ctx):  # inference: identity (the mask output, if asked for, goes to the host)
    if len([o for o in ctx.node.output if o]) > 1 or (ctx.has(2) and ctx.const(2) is None):
        return False
    if ctx.has(2) and bool(ctx.const(2).reshape(-1)[0]):
        return False  # training_mode=true
    return _identity(ctx)


def binary(method: str):
    def mapper(ctx):
        if ctx.n_inputs() != 2 or not _same_float(ctx, 0, 1):
            return False
        a, b = _vals(ctx, 0, 1)
        return ctx.out(getattr(ctx.b, method)(a, b))
    return mapper


def variadic(method: str):
    def mapper(ctx):
        idx = list(range(ctx.n_inputs()))
        if not idx or not _same_float(ctx, *idx):
            return False
        vals = _vals(ctx, *idx)
        out = vals[0]
        for v in vals[1:]:
            out = getattr(ctx.b, method)(out, v)
        return ctx.out(out)
    return mapper


def _pow(ctx):
    if not _floats(ctx, 0):
        return False
    e = ctx.const(1)
    if e is None or e.size != 1:
        return False
    beta = float(e.reshape(-1)[0])
    if beta == 2.0:
        return ctx.out(ctx.b.square(ctx.value(0)))
    if beta == 0.5:
        return ctx.out(ctx.b.sqrt(ctx.value(0)))
    return ctx.out(ctx.b.pow(ctx.value(0), beta=beta))


def _expand(ctx):
    """Expand(x, shape) of a float graph value with a shape known at load: ``x * ones`` with
    ``ones`` holding 1 only along the dims that grow (x * 1.0 is x exactly, inf and NaN included).
    PyTorch's GQA ``repeat_kv`` writes this before the attention MatMuls."""
    shape, target = ctx.shape(0), ctx.const(1)
    if not _floats(ctx, 0) or shape is None or target is None or any(d < 0 for d in shape):
        return False
    target = [int(d) for d in target.reshape(-1)]
    try:
        out = np.broadcast_shapes(tuple(shape), tuple(target))
    except ValueError:
        raise ctx.fail(InvalidShape, f"cannot expand {list(shape)} to {target}") from None
    full = (1,) * (len(out) - len(shape)) + tuple(shape)
    grow = [o if s == 1 and o != 1 else 1 for s, o in zip(full, out)]
    if all(g == 1 for g in grow) and len(out) == len(shape):
        return _identity(ctx)
    ones = ctx.constant(np.ones(grow, np.float32), _target(ctx, 0))
    return ctx.out(ctx.b.multiply(ctx.value(0), ones))


def _where(ctx):
    cond = ctx.dtype(0)
    if cond is None or np.dtype(cond) != np.bool_ or not _same_float(ctx, 1, 2):
        return False
    shapes = [ctx.shape(i) for i in range(3)]
    if any(s is None or any(d < 0 for d in s) for s in shapes):
        return False
    values = np.broadcast_shapes(shapes[1], shapes[2])
    if np.broadcast_shapes(values, shapes[0]) != values:
        return False  # Select broadcasts cond one way only: the host takes the wider condition
    a, b = _vals(ctx, 1, 2)
    return ctx.out(ctx.b.select(ctx.value(0), a, b))


def _prelu(ctx):
    if not _same_float(ctx, 0, 1) or ctx.shape(0) is None or ctx.shape(1) is None:
        return False
    x, slope = _vals(ctx, 0, 1)
    return ctx.out(ctx.b.prelu(x, slope, data_format="NCX", per_channel_broadcast=False))


# ====================================================================== matmul, conv
def _matmul(ctx):
    if not _same_float(ctx, 0, 1):
        return False
    sa, sb = ctx.shape(0), ctx.shape(1)
    if sa is None or sb is None or len(sa) < 2 or len(sb) < 2:
        return False  # 1-D operands: numpy semantics on the host
    a, b = _vals(ctx, 0, 1)
    return ctx.out(ctx.b.matmul(a, b))


def _gemm(ctx):
    if not _same_float(ctx, 0, 1) or (ctx.has(2) and not _floats(ctx, 2)):
        return False
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    a, b = _vals(ctx, 0, 1)
    dt = _target(ctx, 0, 1)
    bias = None
    c = ctx.const(2) if ctx.has(2) else None
    n = ctx.shape(1)[0 if ctx.attr("transB", 0) else 1] if ctx.shape(1) else -1
    if ctx.has(2) and c is not None and alpha == 1.0 and c.size in (1, n) and c.ndim <= 2 and n > 0:
        bias = ctx.constant(np.broadcast_to(c.astype(np.float32) * beta, (n,)).copy(), dt)
    y = ctx.b.matmul(a, b, bias, transpose_a=bool(ctx.attr("transA", 0)),
                     transpose_b=bool(ctx.attr("transB", 0))) if bias is not None else \
        ctx.b.matmul(a, b, transpose_a=bool(ctx.attr("transA", 0)), transpose_b=bool(ctx.attr("transB", 0)))
    if alpha != 1.0:
        y = ctx.b.multiply(y, ctx.constant(np.array([alpha], np.float32), dt))
    if ctx.has(2) and bias is None:
        cv = ctx.constant(ctx.const(2) * beta, dt) if c is not None else ctx.value(2, dt)
        if c is None and beta != 1.0:
            cv = ctx.b.multiply(cv, ctx.constant(np.array([beta], np.float32), dt))
        y = ctx.b.add(y, cv)
    return ctx.out(y)


_AUTO_PAD = {"NOTSET": "None", "SAME_UPPER": "SAME_UPPER", "SAME_LOWER": "SAME_LOWER", "VALID": "VALID"}


def _spatial(ctx, rank_spatial: int):
    pads = list(ctx.attr("pads", [0] * (2 * rank_spatial)))
    return dict(strides=list(ctx.attr("strides", [1] * rank_spatial)),
                pads_begin=pads[:rank_spatial], pads_end=pads[rank_spatial:],
                auto_pad=_AUTO_PAD[ctx.attr("auto_pad", "NOTSET")], data_format="NCX")


def _conv(ctx, transpose: bool):
    if not _same_float(ctx, 0, 1) or ctx.shape(1) is None or (ctx.has(2) and not _floats(ctx, 2)):
        return False
    if transpose and ctx.attr("output_shape") is not None:
        return False
    spatial = len(ctx.shape(1)) - 2
    attrs = _spatial(ctx, spatial)
    attrs.update(dilations=list(ctx.attr("dilations", [1] * spatial)), groups=int(ctx.attr("group", 1)),
                 weights_format="IOX" if transpose else "OIX")
    if transpose:
        attrs["output_padding"] = list(ctx.attr("output_padding", [0] * spatial))
    idx = [0, 1, 2] if ctx.has(2) else [0, 1]
    vals = _vals(ctx, *idx)
    method = ctx.b.conv_transpose if transpose else ctx.b.convolution
    return ctx.out(method(*vals, **attrs))


def _pool(ctx, kind: str):
    if not _floats(ctx, 0) or len([o for o in ctx.node.output if o]) > 1:
        return False  # MaxPool's Indices output: host
    kernel = list(ctx.attr("kernel_shape"))
    attrs = _spatial(ctx, len(kernel))
    attrs.update(kernel=kernel, rounding_type="ceil" if ctx.attr("ceil_mode", 0) else "floor")
    if kind == "max":
        if ctx.attr("storage_order", 0):
            return False
        attrs["dilations"] = list(ctx.attr("dilations", [1] * len(kernel)))
        return ctx.out(ctx.b.max_pool(ctx.value(0), **attrs))
    if ctx.attr("dilations") is not None and any(d != 1 for d in ctx.attr("dilations")):
        return False
    attrs["exclude_pad"] = not bool(ctx.attr("count_include_pad", 0))
    return ctx.out(ctx.b.avg_pool(ctx.value(0), **attrs))


def _global_pool(method: str):
    def mapper(ctx):
        shape = ctx.shape(0)
        if not _floats(ctx, 0) or shape is None or len(shape) < 3:
            return False
        return ctx.out(getattr(ctx.b, method)(ctx.value(0), axes=list(range(2, len(shape))), keep_dims=True))
    return mapper


# ====================================================================== softmax, norms
def _softmax(method: str):
    def mapper(ctx):
        shape = ctx.shape(0)
        if not _floats(ctx, 0) or shape is None:
            return False
        axis = int(ctx.attr("axis", -1))
        if ctx.attr("graph_api_inf_as_zero", 0):  # onnx_rewrite.fuse_softmax_nan_guard
            return ctx.out(ctx.b.softmax(ctx.value(0), axis=axis, mode="inf_as_zero"))
        return ctx.out(getattr(ctx.b, method)(ctx.value(0), axis=axis))
    return mapper


def _layer_norm(ctx):
    if not _floats(ctx, 0) or len([o for o in ctx.node.output if o]) > 1:
        return False  # Mean / InvStdDev outputs: host
    axis, eps = int(ctx.attr("axis", -1)), float(ctx.attr("epsilon", 1e-5))
    shape = ctx.shape(0)
    if shape is None:
        return False
    width = shape[axis:] if axis >= 0 else shape[len(shape) + axis:]
    aux = DT.f32 if _target(ctx, 0) != DT.bf16 else DT.bf16
    gamma = ctx.value(1, aux) if ctx.has(1) else None
    if ctx.has(2):
        beta = ctx.value(2, aux)
    elif all(d > 0 for d in width):
        beta = ctx.constant(np.zeros(width, np.float32), aux)
    else:
        return False
    return ctx.out(ctx.b.layer_norm(ctx.value(0), gamma, beta, keep_stats=False, begin_norm_axis=axis,
                                    epsilon=eps))


def _rms_norm(ctx):
    if not _floats(ctx, 0) or len([o for o in ctx.node.output if o]) > 1:
        return False
    axis, eps = int(ctx.attr("axis", -1)), float(ctx.attr("epsilon", 1e-5))
    gamma = ctx.value(1, _target(ctx, 0)) if ctx.has(1) else None
    return ctx.out(ctx.b.rms_norm(ctx.value(0), gamma, begin_norm_axis=axis, epsilon=eps))


def _batch_norm(ctx):
    if not _floats(ctx, 0) or ctx.attr("training_mode", 0) or len([o for o in ctx.node.output if o]) > 1:
        return False
    if any(ctx.const(i) is None for i in (1, 2, 3, 4)):
        return False
    x = ctx.value(0)
    aux = [ctx.value(i, DT.f32) for i in (1, 2, 3, 4)]
    return ctx.out(ctx.b.batch_norm_inference(x, *aux, epsilon=float(ctx.attr("epsilon", 1e-5)),
                                              data_format="NCX"))


# ====================================================================== layout
def _reshape(ctx):
    shape = ctx.const(1)
    if not _floats(ctx, 0) or shape is None:
        return False
    shape = [int(d) for d in shape.reshape(-1)]
    allowzero = bool(ctx.attr("allowzero", 0))
    if allowzero and 0 in shape:
        return False
    return ctx.out(ctx.b.static_reshape(ctx.value(0), shape=shape, special_zero=not allowzero))


def _known_reshape(ctx, out_shape):
    """A StaticReshape to ``out_shape`` (at most one unknown dim, written -1)."""
    if out_shape is None or sum(d < 0 for d in out_shape) > 1:
        return False
    return ctx.out(ctx.b.static_reshape(ctx.value(0), shape=[int(d) for d in out_shape], special_zero=False))


def _flatten(ctx):
    shape = ctx.shape(0)
    if not _floats(ctx, 0) or shape is None:
        return False
    axis = int(ctx.attr("axis", 1)) % (len(shape) + 1) if shape else 0
    head, tail = shape[:axis], shape[axis:]
    prod = lambda dims: -1 if any(d < 0 for d in dims) else int(np.prod(dims, dtype=np.int64))
    return _known_reshape(ctx, [prod(head), prod(tail)])


def _axes_of(ctx):
    if ctx.attr("axes") is not None:
        return [int(a) for a in ctx.attr("axes")]
    if ctx.has(1):
        c = ctx.const(1)
        return None if c is None else [int(a) for a in c.reshape(-1)]
    return []


def _squeeze(ctx):
    shape, axes = ctx.shape(0), _axes_of(ctx)
    if not _floats(ctx, 0) or shape is None or axes is None:
        return False
    if not axes:
        if any(d < 0 for d in shape):
            return False
        axes = [i for i, d in enumerate(shape) if d == 1]
    axes = {a % len(shape) for a in axes}
    return _known_reshape(ctx, [d for i, d in enumerate(shape) if i not in axes])


def _unsqueeze(ctx):
    shape, axes = ctx.shape(0), _axes_of(ctx)
    if not _floats(ctx, 0) or shape is None or not axes:
        return False
    rank = len(shape) + len(axes)
    axes = sorted(a % rank for a in axes)
    out = list(shape)
    for a in axes:
        out.insert(a, 1)
    return _known_reshape(ctx, out)


def _transpose(ctx):
    shape = ctx.shape(0)
    if not _floats(ctx, 0) or shape is None:
        return False
    perm = ctx.attr("perm")
    perm = list(range(len(shape)))[::-1] if perm is None else [int(p) for p in perm]
    return ctx.out(ctx.b.static_transpose(ctx.value(0), order=perm))


def _concat(ctx):
    idx = [i for i in range(ctx.n_inputs()) if ctx.has(i)]
    if not _same_float(ctx, *idx):
        return False
    return ctx.out(ctx.b.concat(*_vals(ctx, *idx), axis=int(ctx.attr("axis"))))


def _cast(ctx):
    from onnx import helper

    if not _floats(ctx, 0):
        return False
    to = np.dtype(helper.tensor_dtype_to_np_dtype(int(ctx.attr("to"))))
    if not _is_float(to):
        return False
    from ..dtypes import from_numpy
    src, dst = _target(ctx, 0), from_numpy(to)
    if src == dst:
        return ctx.out(ctx.value(0)) if ctx.imp.seg and ctx.name(0) in ctx.imp.seg.values else False
    if {src, dst} == {DT.bf16, DT.f16}:
        return ctx.out(ctx.b.type_cast(ctx.b.type_cast(ctx.value(0), out_dtype=DT.f32), out_dtype=dst))
    return ctx.out(ctx.b.type_cast(ctx.value(0), out_dtype=dst))


def _reduce(method: str):
    def mapper(ctx):
        shape = ctx.shape(0)
        if not _floats(ctx, 0) or shape is None:
            return False
        axes = _axes_of(ctx)
        if axes is None:
            return False
        if not axes:
            if ctx.attr("noop_with_empty_axes", 0):
                return _identity(ctx)
            axes = list(range(len(shape)))
        return ctx.out(getattr(ctx.b, method)(ctx.value(0), axes=axes,
                                              keep_dims=bool(ctx.attr("keepdims", 1))))
    return mapper


# ====================================================================== quantization
_QTYPES = {np.dtype(np.int8): DT.s8, np.dtype(np.uint8): DT.u8}


def _quant_params(ctx, x_shape):
    """(qtype, axis, scales list, zps list or None) of a per-tensor/per-axis Q/DQ, or None."""
    scale = ctx.const(1)
    zp = ctx.const(2) if ctx.has(2) else None
    if scale is None or (ctx.has(2) and zp is None) or ctx.attr("block_size", 0):
        return None
    scales = [float(s) for s in scale.reshape(-1)]
    zps = None if zp is None else [int(z) for z in zp.reshape(-1)]
    if scale.size == 1:
        return "per_tensor", 1, scales, zps
    if x_shape is None:
        return None
    axis = int(ctx.attr("axis", 1)) % len(x_shape)
    return "per_channel", axis, scales, zps


def _quantize(ctx):
    if not _floats(ctx, 0) or _target(ctx, 0) != DT.f32:
        return False
    zp = ctx.const(2) if ctx.has(2) else None
    if ctx.has(2) and zp is None:
        return False
    if zp is not None:
        out_dt = _QTYPES.get(np.dtype(zp.dtype))
    else:  # opset 21 output_dtype: 0 (default: uint8), 2 uint8, 3 int8
        out_dt = {0: DT.u8, 2: DT.u8, 3: DT.s8}.get(int(ctx.attr("output_dtype", 0)))
    params = _quant_params(ctx, ctx.shape(0))
    if out_dt is None or params is None or int(ctx.attr("saturate", 1)) != 1:
        return False
    qtype, axis, scales, zps = params
    return ctx.out(ctx.b.quantize(ctx.value(0), qtype=qtype, axis=axis, scales=scales,
                                  zps=zps if zps is not None else [0] * len(scales), out_dtype=out_dt))


def _dequantize(ctx):
    src = ctx.dtype(0)
    if src is None:
        return False
    if ctx.attr("block_size", 0):
        return _block_dequantize(ctx)
    if np.dtype(src) not in _QTYPES:
        return False
    params = _quant_params(ctx, ctx.shape(0))
    scale = ctx.const(1)
    if params is None or scale.dtype != np.float32:
        return False
    qtype, axis, scales, zps = params
    return ctx.out(ctx.b.dequantize(ctx.value(0), qtype=qtype, axis=axis, scales=scales,
                                    zps=zps if zps is not None else [0] * len(scales), out_dtype=DT.f32))


def _block_dequantize(ctx):
    """opset 21 blocked DequantizeLinear -> DynamicDequantize per_group: the scales (and zero
    points) as constant tensors, ``group_shape`` 1 except ``block_size`` along ``axis``."""
    import ml_dtypes

    x, scale = ctx.const(0), ctx.const(1)
    shape = ctx.shape(0)
    if scale is None or shape is None or any(d < 0 for d in shape) or len(shape) < 2:
        return False
    block, axis = int(ctx.attr("block_size")), int(ctx.attr("axis", 1)) % len(shape)
    if shape[axis] % block:
        return False  # a partial last block: the host evaluates it
    kinds = {np.dtype(np.int8): DT.s8, np.dtype(np.uint8): DT.u8, np.dtype(ml_dtypes.int4): DT.s4,
             np.dtype(ml_dtypes.uint4): DT.u4}
    src_dt = kinds.get(np.dtype(ctx.dtype(0)))
    if src_dt is None or not _is_float(scale.dtype):
        return False
    group = [1] * len(shape)
    group[axis] = block
    src = ctx.constant(x, src_dt) if x is not None else ctx.value(0)
    sc = ctx.constant(scale)
    zps = None
    if ctx.has(2):
        zp = ctx.const(2)
        if zp is None:
            return False
        if not np.any(zp.astype(np.int32)):
            zps = None
        else:
            zps = ctx.constant(zp, kinds.get(np.dtype(zp.dtype)))
    args = [src, sc] + ([zps] if zps is not None else [])
    return ctx.out(ctx.b.dynamic_dequantize(*args, qtype="per_group", group_shape=group))


# ====================================================================== the table
MAPPERS = {
    "Relu": unary("relu"), "Sigmoid": unary("sigmoid"), "Tanh": unary("tanh"), "Exp": unary("exp"),
    "Log": unary("log"), "Abs": unary("abs"), "Sqrt": unary("sqrt"), "Reciprocal": unary("reciprocal"),
    "HardSwish": unary("hard_swish"), "Mish": unary("mish"),
    "Elu": unary("elu", alpha=lambda c: float(c.attr("alpha", 1.0))),
    "LeakyRelu": unary("leaky_relu", alpha=lambda c: float(c.attr("alpha", 0.01))),
    "HardSigmoid": unary("hard_sigmoid", alpha=lambda c: float(c.attr("alpha", 0.2)),
                         beta=lambda c: float(c.attr("beta", 0.5))),
    "Softplus": unary("soft_plus"),
    "Gelu": _gelu, "Clip": _clip, "Neg": _neg, "Identity": _identity, "Dropout": _dropout,
    "Add": binary("add"), "Sub": binary("subtract"), "Mul": binary("multiply"), "Div": binary("divide"),
    "Max": variadic("maximum"), "Min": variadic("minimum"), "Sum": variadic("add"),
    "Pow": _pow, "Where": _where, "PRelu": _prelu, "Expand": _expand,
    "MatMul": _matmul, "Gemm": _gemm,
    "Conv": lambda ctx: _conv(ctx, False), "ConvTranspose": lambda ctx: _conv(ctx, True),
    "MaxPool": lambda ctx: _pool(ctx, "max"), "AveragePool": lambda ctx: _pool(ctx, "avg"),
    "GlobalAveragePool": _global_pool("reduce_mean"), "GlobalMaxPool": _global_pool("reduce_max"),
    "Softmax": _softmax("softmax"), "LogSoftmax": _softmax("log_softmax"),
    "LayerNormalization": _layer_norm, "RMSNormalization": _rms_norm,
    "SimplifiedLayerNormalization": _rms_norm, "BatchNormalization": _batch_norm,
    "Reshape": _reshape, "Flatten": _flatten, "Squeeze": _squeeze, "Unsqueeze": _unsqueeze,
    "Transpose": _transpose, "Concat": _concat, "Cast": _cast,
    "ReduceMean": _reduce("reduce_mean"), "ReduceSum": _reduce("reduce_sum"),
    "ReduceMax": _reduce("reduce_max"), "ReduceMin": _reduce("reduce_min"),
    "ReduceProd": _reduce("reduce_prod"), "ReduceL1": _reduce("reduce_l1"), "ReduceL2": _reduce("reduce_l2"),
    "QuantizeLinear": _quantize, "DequantizeLinear": _dequantize,
}


def _attention(ctx):
    from .onnx_attention import _attention as mapper  # the SDPA chain lives with the ORT attention ops

    return mapper(ctx)


MAPPERS["Attention"] = _attention

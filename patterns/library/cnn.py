"""CNN fusions of oneDNN's dnnl backend: Convolution/ConvTranspose, pooling,
batch/group norm, Interpolate, shuffle and int8 Concat.

Shared roles: ``conv`` (Convolution or ConvTranspose), ``bias`` (BiasAdd, only
when the conv has no bias input), ``post_ops`` (list of op ids in execution
order: unary ops, binary ops with an outside operand, Sigmoid+Multiply swish
pairs and, in quantized patterns, a Dequantize [-> TypeCast] feeding a binary
op: the int8 "sum"/binary post-op), ``out_cast`` (TypeCast), ``quant_out``
(Quantize).
"""
from __future__ import annotations

from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K

from ..pattern import (ENTRY, Body, Check, Cond, In, Node, Pattern, Repeat, in_dtype,
                       input_is_external_const, n_inputs, out_dtype)
from .common import BINARY, BINARY_BODY, FP8, INT8, SWISH_BODY, UNARY_BODY, post_ops

_CAST = K.TypeCast
_CONVS = frozenset({K.Convolution, K.ConvTranspose})
_POOLS = frozenset({K.AvgPool, K.MaxPool})
F32 = DataType.f32

#: a binary post-op whose other operand is dequantized from int8/f8 in the partition
DEQUANT_BINARY_BODY = Body("dequant_binary", [
    Node("dequant", K.Dequantize),
    Node("op", BINARY, [In(ENTRY, 0, swap=True), In("dequant", 1, swap=True)]),
])
#: the same with a TypeCast of the dequantized operand (the int8-bf16 graphs)
DEQUANT_CAST_BINARY_BODY = Body("dequant_cast_binary", [
    Node("dequant", K.Dequantize),
    Node("cast", _CAST, [In("dequant", 0)]),
    Node("op", BINARY, [In(ENTRY, 0, swap=True), In("cast", 1, swap=True)]),
])
QUANTIZED_POST_OP_BODIES = (DEQUANT_CAST_BINARY_BODY, DEQUANT_BINARY_BODY, SWISH_BODY, UNARY_BODY,
                            BINARY_BODY)


# ---------------------------------------------------------------- predicates
def _shape(g, lt):
    return g.tensors.get(lt.id, lt).shape


def _weight_spatial(op, g):
    """Spatial dims of a conv's weights (by ``weights_format``) or None."""
    shape = _shape(g, op.inputs[1]) if len(op.inputs) > 1 else None
    if shape is None or len(shape) < 3:
        return None
    fmt = op.attrs.get("weights_format", "XIO")
    return tuple(shape[:-2]) if fmt.startswith("X") else tuple(shape[2:])


def weights_spatial_is(size: int) -> Cond:
    """The weights are ``size`` x ... x ``size`` (oneDNN's check_conv_weight_size)."""
    return Cond(f"weights are {size}x{size}",
                lambda op, g: _weight_spatial(op, g) is not None
                and all(d == size for d in _weight_spatial(op, g)))


def _depthwise(op, g) -> bool:
    shape = _shape(g, op.outputs[0])
    if shape is None or len(shape) < 3:
        return False
    channels = shape[1] if op.attrs.get("data_format", "NXC") == "NCX" else shape[-1]
    return int(op.attrs.get("groups", 1)) == channels


DEPTHWISE = Cond("groups equal the channels (depthwise)", _depthwise)


def _avgpool_ok(op, g) -> bool:
    """oneDNN does not fuse AvgPool with ceil rounding that counts padding."""
    return not (op.kind == K.AvgPool and op.attrs.get("rounding_type") == "ceil"
                and not op.attrs.get("exclude_pad"))


AVGPOOL_OK = Cond("not AvgPool with ceil rounding and exclude_pad false", _avgpool_ok)
PER_TENSOR = Cond("qtype is per_tensor", lambda op, g: op.attrs.get("qtype", "per_tensor") == "per_tensor")
ZPS_ZERO = Cond("zero points are 0", lambda op, g: all(z == 0 for z in op.attrs.get("zps") or [0]))
AUX_F32 = Cond("inputs 1.. are f32", lambda op, g: all(
    g.tensors.get(lt.id, lt).dtype == F32 for lt in op.inputs[1:]))


def _bias_only_without_bias_input(role: str = "conv") -> Check:
    """A BiasAdd fuses only when the conv has no bias input (check_producer_input_num<2>)."""
    return Check(f"bias only when '{role}' has two inputs",
                 lambda b, g: b.get("bias") is None or len(g.ops[b[role]].inputs) == 2)


# ---------------------------------------------------------------- float conv
def _float_conv(name: str, priority: float, kinds, bn: bool, doc: str) -> Pattern:
    nodes = [
        Node("conv", kinds),
        Node("bias", K.BiasAdd, [In("conv", 0)], optional=True),
    ]
    if bn:
        nodes.append(Node("bn", K.BatchNormInference, [In("bias", 0)], optional=True))
    nodes += [
        post_ops(nodes[-1].name),
        Node("out_cast", _CAST, [In("post_ops", 0)], optional=True,
             when=[in_dtype(0, DataType.bf16), out_dtype(0, F32)]),
    ]
    return Pattern(name, priority, nodes, [_bias_only_without_bias_input()], doc=doc)


CONV_POST_OPS = _float_conv("conv_post_ops", 9.8, K.Convolution, True, """
Convolution with bias, BatchNormInference and post-ops (fp_conv_post_ops).

    conv ─ [bias]? ─ [bn]? ─ {swish | unary | binary}*0..20 ─ [out_cast (bf16 -> f32)]?

Roles: conv, bias, bn, post_ops (list), out_cast.""")

CONVTRANSPOSE_POST_OPS = _float_conv("convtranspose_post_ops", 10.4, K.ConvTranspose, False, """
ConvTranspose with bias and post-ops (convtranspose_post_ops_fusion).

    conv (ConvTranspose) ─ [bias]? ─ {swish | unary | binary}*0..20 ─ [out_cast (bf16 -> f32)]?

Roles: conv, bias, post_ops (list), out_cast.""")

CONV_DEPTHWISE = Pattern("conv_depthwise", 10.3, [
    Node("conv", K.Convolution, when=[weights_spatial_is(1)]),
    Node("bias", K.BiasAdd, [In("conv", 0)], optional=True),
    post_ops("bias"),
    Node("dw_conv", K.Convolution, [In("post_ops", 0)], when=[weights_spatial_is(3), DEPTHWISE]),
    Node("dw_bias", K.BiasAdd, [In("dw_conv", 0)], optional=True),
    post_ops("dw_bias", name="dw_post_ops"),
], [_bias_only_without_bias_input(),
    Check("dw_bias only when 'dw_conv' has two inputs",
          lambda b, g: b.get("dw_bias") is None or len(g.ops[b["dw_conv"]].inputs) == 2)], doc="""
A 1x1 Convolution followed by a 3x3 depthwise Convolution, each with bias and
post-ops (fp_conv_postops_depthwise_postops_cpu).

    conv (1x1) ─ [bias]? ─ {swish | unary | binary}*0..20
      ─ dw_conv (3x3, groups = channels) ─ [dw_bias]? ─ {swish | unary | binary}*0..20

Roles: conv, bias, post_ops (list), dw_conv, dw_bias, dw_post_ops (list).""")


# ---------------------------------------------------------------- quantized conv
def _f8_without_scales(b, g) -> bool:
    """oneDNN's f8 Convolution takes its f8 inputs unscaled (check_f8_conv_with_no_scale_and_zp)."""
    for role in ("src_dequant", "wei_dequant"):
        op = g.ops[b[role]]
        if g.tensors[op.inputs[0].id].dtype in FP8 and (
                any(sc != 1.0 for sc in op.attrs["scales"]) or any(op.attrs.get("zps") or [])):
            return False
    return True


def _quantized_conv() -> Pattern:
    q8 = INT8 + FP8
    nodes = [
        Node("src_dequant", K.Dequantize, when=[in_dtype(0, *q8)]),
        Node("src_cast", _CAST, [In("src_dequant", 0)], optional=True),
        Node("wei_quant", K.Quantize, optional=True, via=None, when=[input_is_external_const(0)]),
        Node("wei_dequant", K.Dequantize, [In("wei_quant", 0)], via=None,
             when=[in_dtype(0, DataType.s8, *FP8)]),
        Node("wei_cast", _CAST, [In("wei_dequant", 0)], optional=True),
        Node("conv", _CONVS, [In("src_cast", 0), In("wei_cast", 1)]),
        Node("bias_cast", _CAST, optional=True, via=None, when=[out_dtype(0, DataType.bf16)]),
        Node("bias", K.BiasAdd, [In("conv", 0), In("bias_cast", 1)], optional=True),
        Repeat("post_ops", QUANTIZED_POST_OP_BODIES, 0, 20, "bias"),
        Node("out_cast", _CAST, [In("post_ops", 0)], optional=True),
        Node("quant_out", K.Quantize, [In("out_cast", 0)], optional=True),
    ]
    return Pattern("conv_quantized", 10.6, nodes, [
        _bias_only_without_bias_input(),
        Check("bias_cast only together with bias",
              lambda b, g: b.get("bias_cast") is None or b.get("bias") is not None),
        Check("f8 src/weight Dequantize has scales 1 and no zero points", _f8_without_scales),
    ], doc="""
int8 / f8 Convolution and ConvTranspose (x8x8x8_conv_add_post_ops_cpu,
x8x8x_conv_post_ops, x8s8x_tc_conv_(add_)post_ops, int8_convtranspose_post_ops_fusion_cpu):
s8/u8 data with s8 weights, or f8 data and weights with scales 1.

    src8 ─ src_dequant ─ [src_cast]? ──────────────────────────────┐
    [wei_quant (const)]? ─ wei_dequant ─ [wei_cast]? ─ conv (Convolution|ConvTranspose)
      ─ [bias (BiasAdd, [bias_cast]? operand)]?
      ─ {dequant_cast_binary | dequant_binary | swish | unary | binary}*0..20
      ─ [out_cast]? ─ [quant_out]?

A Dequantize [-> TypeCast] feeding a binary post-op is the int8 "sum" /
residual add.  Roles: src_dequant, src_cast, wei_quant, wei_dequant, wei_cast,
conv, bias_cast, bias, post_ops (list), out_cast, quant_out.""")


CONV_QUANTIZED = _quantized_conv()


# ---------------------------------------------------------------- pooling
POOL_POST_OPS = Pattern("pool_post_ops", 9.9, [
    Node("pool", _POOLS, when=[AVGPOOL_OK]),
    post_ops("pool", min=1),
], doc="""Pooling and its post-ops (fp_pool_post_ops).

    pool (AvgPool|MaxPool) ─ {swish | unary | binary}*1..20

Roles: pool, post_ops (list).""")

POOL_QUANTIZED = Pattern("pool_quantized", 10.1, [
    Node("src_dequant", K.Dequantize, when=[PER_TENSOR]),
    Node("pool", _POOLS, [In("src_dequant", 0)], when=[AVGPOOL_OK]),
    Node("layout", {K.StaticReshape, K.StaticTranspose}, [In("pool", 0)], optional=True),
    Repeat("post_ops", QUANTIZED_POST_OP_BODIES[1:], 0, 20, "layout"),
    Node("quant_out", K.Quantize, [In("post_ops", 0)], when=[PER_TENSOR]),
], [Check("layout change only without post-ops",
          lambda b, g: b.get("layout") is None or not b.get("post_ops"))], doc="""
int8 pooling (x8_pool_add_post_ops_cpu, x8_pool_post_ops, x8_pool_reshape_transpose).

    src8 ─ src_dequant (per_tensor) ─ pool (AvgPool|MaxPool)
      ─ ( [layout (StaticReshape|StaticTranspose)]?
        | {dequant_binary | swish | unary | binary}*0..20 ) ─ quant_out (per_tensor)

Roles: src_dequant, pool, layout, post_ops (list), quant_out.""")


# ---------------------------------------------------------------- normalization
BN_RELU = Pattern("bn_relu", 8.8, [
    Node("bn", {K.BatchNormInference, K.BatchNormForwardTraining}, when=[AUX_F32],
         escape=(1, 2, 3, 4)),
    Node("relu", K.ReLU, [In("bn", 0)]),
], doc="""BatchNorm then ReLU (fp_bn_relu); training statistics may leave.

    bn (BatchNormInference|BatchNormForwardTraining, f32 aux) ─ relu

Roles: bn, relu.""")

_S8 = DataType.s8
BN_QUANTIZED = Pattern("bn_quantized", 9.0, [
    Node("src_dequant", K.Dequantize, when=[in_dtype(0, _S8), PER_TENSOR, ZPS_ZERO]),
    Node("bn", K.BatchNormInference, [In("src_dequant", 0)], when=[AUX_F32]),
    Node("relu", K.ReLU, [In("bn", 0)], optional=True),
    Node("quant_out", K.Quantize, [In("relu", 0)], when=[out_dtype(0, _S8), PER_TENSOR, ZPS_ZERO]),
], doc="""int8 BatchNormInference (x8_bn): s8, per-tensor, zero points 0.

    s8 ─ src_dequant ─ bn ─ [relu]? ─ quant_out (s8)

Roles: src_dequant, bn, relu, quant_out.""")

GROUPNORM_POST_OPS = Pattern("groupnorm_post_ops", 8.4, [
    Node("groupnorm", K.GroupNorm, when=[AUX_F32], escape=(1, 2)),
    post_ops("groupnorm"),
    Node("cast", _CAST, [In("post_ops", 0)], optional=True),
    post_ops("cast", name="cast_post_ops"),
    Node("quant_out", K.Quantize, [In("cast_post_ops", 0)], optional=True),
], doc="""GroupNorm with post-ops, a TypeCast and Quantize (groupnorm_post_ops_fusion).

    groupnorm ─ {swish | unary | binary}*0..20 ─ [cast]? ─ {swish | unary | binary}*0..20
      ─ [quant_out]?

Roles: groupnorm, post_ops (list), cast, cast_post_ops (list), quant_out.""")


# ---------------------------------------------------------------- misc
INTERPOLATE_POST_OPS = Pattern("interpolate_post_ops", 8.4, [
    Node("interpolate", K.Interpolate,
         when=[Cond("coordinate_transformation_mode is half_pixel",
                    lambda op, g: op.attrs.get("coordinate_transformation_mode",
                                               "half_pixel") == "half_pixel")]),
    post_ops("interpolate", min=1),
], doc="""Interpolate and its post-ops (interpolate_post_ops_fusion).

    interpolate (half_pixel) ─ {swish | unary | binary}*1..20

Roles: interpolate, post_ops (list).""")

SHUFFLE = Pattern("shuffle", 8.2, [
    Node("reshape", K.StaticReshape),
    Node("transpose", K.StaticTranspose, [In("reshape", 0)]),
    Node("back_reshape", K.StaticReshape, [In("transpose", 0)]),
], doc="""Channel shuffle written as reshape-transpose-reshape (shuffle_fusion).

    reshape ─ transpose ─ back_reshape

Roles: reshape, transpose, back_reshape.""")

#: Concat inputs a concat_quantized pattern can take (oneDNN: VARIADIC_INPUT_NUM)
CONCAT_INPUTS = 8


def _concat_body(n: int) -> Body:
    """``n`` Dequantize ops feeding inputs 0..n-1 of a Concat."""
    return Body(f"concat{n}", [Node(f"dequant{i}", K.Dequantize) for i in range(n)] + [
        Node("concat", K.Concat, [In(f"dequant{i}", i) for i in range(n)], when=[n_inputs(n)])])


def _same_quantization(b, g) -> bool:
    """Every Concat input is a Dequantize with the Quantize's scales and zps."""
    quant = g.ops[b["quant_out"]]
    want = (list(quant.attrs.get("scales") or []), list(quant.attrs.get("zps") or []))
    concat = g.ops[g.producer[quant.inputs[0].id][0]]
    for lt in concat.inputs:
        deq = g.ops[g.producer[lt.id][0]]
        if (list(deq.attrs.get("scales") or []), list(deq.attrs.get("zps") or [])) != want:
            return False
    return True


CONCAT_QUANTIZED = Pattern("concat_quantized", 8.2, [
    Repeat("concat", tuple(_concat_body(n) for n in range(CONCAT_INPUTS, 0, -1)), 1, 1),
    Node("quant_out", K.Quantize, [In("concat", 0)]),
], [Check("every input is dequantized with the output's scales and zero points", _same_quantization)],
    doc="""int8 Concat (int8_concat_fusion): inputs and output share scales and zps.

    dequant0 ─┐
    ...       ├ concat ─ quant_out          (1..8 inputs)
    dequantN ─┘

Roles: quant_out (the Concat and its Dequantize ops are one alternation with
no chain entering it, so the matcher binds them without a role list).""")

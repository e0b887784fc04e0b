"""MatMul patterns: post-op chains, quantized, weight-compressed, bmb, transposes.

Shared roles: ``matmul`` (the MatMul), ``bias`` (BiasAdd), ``post_ops`` (list
of op ids in execution order: unary ops, binary ops whose other operand comes
from outside, Sigmoid+Multiply swish pairs), ``select`` (Select, running value
at input 1 or 2), ``out_cast`` (TypeCast).
"""
from __future__ import annotations

from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K

from ..pattern import (Body, In, Node, Pattern, Repeat, fed_by, in_dtype, input_is_external_const,
                       out_dtype, requires)
from .common import BINARY, DEQUANT, FP8, INT4, INT8, QUANT_OUT, SCALE, post_ops

_CAST = K.TypeCast


def _epilogue(prev: str) -> list:
    """``[bias]? -> post_ops -> [select]? -> [out_cast]?`` after node ``prev``."""
    return [
        Node("bias", K.BiasAdd, [In(prev, 0)], optional=True),
        post_ops("bias"),
        Node("select", K.Select, [In("post_ops", (1, 2))], optional=True),
        Node("out_cast", _CAST, [In("select", 0)], optional=True),
    ]


MATMUL_POST_OPS = Pattern("matmul_post_ops", 8.8, [Node("matmul", K.MatMul)] + _epilogue("matmul"),
                          doc="""MatMul with bias and element-wise post-ops (fp_matmul_post_ops).

    matmul ─ [bias]? ─ {swish | unary | binary}*0..20 ─ [select]? ─ [out_cast]?

Roles: matmul, bias, post_ops (list), select, out_cast.""")

MATMUL_DROPOUT = Pattern("matmul_dropout", 8.9, [
    Node("matmul", K.MatMul),
    Node("dropout", K.Dropout, [In("matmul", 0)], escape=(1,)),
], doc="""MatMul followed by Dropout (fp_matmul_dropout).

    matmul ─ dropout

Roles: matmul, dropout.""")

MATMUL_TRANSPOSE = Pattern("matmul_transpose", 9.1, [
    Node("matmul", K.MatMul),
    Node("bias", K.BiasAdd, [In("matmul", 0)], optional=True),
    Node("out_cast", _CAST, [In("bias", 0)], optional=True),
    Node("pre_reshape", K.StaticReshape, [In("out_cast", 0)], optional=True),
    Node("transpose", K.StaticTranspose, [In("pre_reshape", 0)]),
    Node("post_reshape", {K.StaticReshape, K.Reorder}, [In("transpose", 0)], optional=True),
], doc="""MatMul then a layout change (fp_matmul_transpose_reorder and
fp_matmul_reshape_transpose_reshape in one pattern).

    matmul ─ [bias]? ─ [out_cast]? ─ [pre_reshape]? ─ transpose ─ [post_reshape | Reorder]?

Roles: matmul, bias, out_cast, pre_reshape, transpose, post_reshape.""")

_F32_BINARY = Body("binary", [Node("op", BINARY, [In("<entry>", 0, swap=True)],
                                   when=[out_dtype(0, DataType.f32)])])
_BINARY = Body("binary", [Node("op", BINARY, [In("<entry>", 0, swap=True)])])

BINARY_MATMUL_BINARY = Pattern("binary_matmul_binary", 19.5, [
    Repeat("pre_ops", (_F32_BINARY,), 1, 20, via=None),
    Node("pre_cast", _CAST, [In("pre_ops", 0)], optional=True),
    Node("matmul", K.MatMul, [In("pre_cast", 0)]),
    Repeat("post_ops", (_BINARY,), 0, 20, via="matmul"),
    Node("out_cast", _CAST, [In("post_ops", 0)], optional=True),
], doc="""Binary chain -> MatMul -> binary chain (float_bmb).

    {binary (f32 out)}*1..20 ─ [pre_cast]? ─ matmul (input 0) ─ {binary}*0..20 ─ [out_cast]?

Roles: pre_ops (list), pre_cast, matmul, post_ops (list), out_cast.""")


def _quantized() -> Pattern:
    q8 = INT8 + FP8
    nodes = [
        Node("src_dequant", K.Dequantize, when=[in_dtype(0, *q8)]),
        Node("src_cast", _CAST, [In("src_dequant", 0)], optional=True),
        Node("wei_quant", K.Quantize, optional=True, via=None, when=[input_is_external_const(0)]),
        Node("wei_dequant", K.Dequantize, [In("wei_quant", 0)], via=None, when=[in_dtype(0, *q8)]),
        Node("wei_cast", _CAST, [In("wei_dequant", 0)], optional=True),
        Node("matmul", K.MatMul, [In("src_cast", 0), In("wei_cast", 1)]),
        Node("bias", K.BiasAdd, [In("matmul", 0)], optional=True),
        Node("res_dequant", K.Dequantize, optional="residual", via=None),
        Node("res_cast", _CAST, [In("res_dequant", 0)], optional=True, when=[fed_by(0, {K.Dequantize})]),
        Node("res_add", K.Add, [In("bias", 0, swap=True), In("res_cast", 1, swap=True)],
             optional="residual"),
        post_ops("res_add"),
        Node("select", K.Select, [In("post_ops", (1, 2))], optional=True),
        Node("out_cast", _CAST, [In("select", 0)], optional=True),
        Node("tail_add", K.Add, [In("out_cast", 0, swap=True)], optional=True),
        Node("smooth_scale", SCALE, [In("tail_add", 0, swap=True)], optional=True),
        Node("quant_out", K.Quantize, [In("smooth_scale", 0)], optional=True),
    ]
    return Pattern("matmul_quantized", 10.5, nodes, [requires("smooth_scale", "quant_out")], doc="""
Static int8/fp8 MatMul (x8x8x_matmul_post_ops, x8x8x8_matmul_add_post_ops and
their bf16 TypeCast forms x8x8x_tc_* / x8x8x8_tc_*, incl. the SmoothQuant tail).

    src8 ─ src_dequant ─ [src_cast]? ─────────────────────┐
    [wei_quant (const/input weight)]? ─ wei_dequant ─ [wei_cast]? ─┴ matmul ─ [bias]?
      ─ [res_add(., [res_cast]?(res_dequant(other8)))]?   (int8 residual "sum")
      ─ {swish | unary | binary}*0..20 ─ [select]? ─ [out_cast]?
      ─ [tail_add]? ─ [smooth_scale (Multiply|Divide)]? ─ [quant_out]?

smooth_scale only together with quant_out.  Roles: src_dequant, src_cast,
wei_quant, wei_dequant, wei_cast, matmul, bias, res_dequant, res_cast,
res_add, post_ops (list), select, out_cast, tail_add, smooth_scale, quant_out.""")


MATMUL_QUANTIZED = _quantized()


def _compressed() -> Pattern:
    nodes = [
        Node("src_dequant", DEQUANT, optional=True, via=None,
             when=[in_dtype(0, *(INT8 + INT4 + FP8))]),
        Node("src_cast", _CAST, [In("src_dequant", 0)], optional=True, when=[fed_by(0, DEQUANT)]),
        Node("wei_dequant", DEQUANT, when=[in_dtype(0, *(INT8 + INT4 + FP8))]),
        Node("wei_cast", _CAST, [In("wei_dequant", 0)], optional=True),
        Node("matmul", K.MatMul, [In("src_cast", 0), In("wei_cast", 1)]),
    ] + _epilogue("matmul") + [
        Node("quant_out", QUANT_OUT, [In("out_cast", 0)], optional=True),
    ]
    return Pattern("matmul_compressed", 10.3, nodes, doc="""
Weight-compressed MatMul (an extension asked for by the int4 RFC; oneDNN
leaves DynamicDequantize -> MatMul unfused).

    W_int, scales[, zps] ─ wei_dequant (DynamicDequantize|Dequantize) ─ [wei_cast]? ─┐
    src ─ [src_dequant]? ─ [src_cast]? ──────────────────────────────────── matmul ─┘
      ─ [bias]? ─ {swish | unary | binary}*0..20 ─ [select]? ─ [out_cast]?
      ─ [quant_out (DynamicQuantize|Quantize)]?

Weights s4/u4/s8/u8 (or f8 for Dequantize), per-tensor/channel/group scales,
optional zero points.  The RFC's three-op int4 form is wei_dequant -> matmul
-> quant_out.  Roles: src_dequant, src_cast, wei_dequant, wei_cast, matmul,
bias, post_ops (list), select, out_cast, quant_out.""")


MATMUL_COMPRESSED = _compressed()


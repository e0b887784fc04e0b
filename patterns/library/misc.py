"""Small fusions: binary/eltwise/softmax/layernorm/reduction + post-ops, reorders.

``post_ops`` is always the list of op ids of the repeated element-wise chain
(unary ops, binary ops with an outside operand, Sigmoid+Multiply pairs).
"""
from __future__ import annotations

from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K

from ..pattern import In, Node, Pattern, in_dtype, out_dtype
from .common import BINARY, INT8, REDUCE, UNARY, XF16, post_ops

_CAST = K.TypeCast


def _tail(prev: str) -> list:
    return [
        Node("out_cast", _CAST, [In(prev, 0)], optional=True),
        Node("quant_out", K.Quantize, [In("out_cast", 0)], optional=True),
    ]


BINARY_POST_OPS = Pattern("binary_post_ops", 8.3, [
    Node("binary", BINARY),
    post_ops("binary", min=1),
], doc="""A binary op and its post-ops (fp_binary_post_ops).

    binary ─ {swish | unary | binary}*1..20

Roles: binary, post_ops (list).""")

REDUCTION_POST_OPS = Pattern("reduction_post_ops", 8.4, [
    Node("reduce", REDUCE),
    post_ops("reduce", min=1),
], doc="""A reduction and its post-ops (fp_reduction_post_ops).

    reduce ─ {swish | unary | binary}*1..20

Roles: reduce, post_ops (list).""")

SOFTMAX_POST_OPS = Pattern("softmax_post_ops", 8.2, [
    Node("softmax", K.SoftMax, escape=(1,)),
    post_ops("softmax"),
] + _tail("post_ops"), doc="""SoftMax and its post-ops (fp_softmax_post_ops).

    softmax ─ {swish | unary | binary}*0..20 ─ [out_cast]? ─ [quant_out]?

Roles: softmax, post_ops (list), out_cast, quant_out.""")

LAYERNORM_POST_OPS = Pattern("layernorm_post_ops", 8.2, [
    Node("layernorm", K.LayerNorm, escape=(1, 2)),
    Node("pre_cast", _CAST, [In("layernorm", 0)], optional=True),
    post_ops("pre_cast"),
] + _tail("post_ops"), doc="""LayerNorm and its post-ops (layernorm_post_ops; mean and
variance may leave the partition).

    layernorm ─ [pre_cast]? ─ {swish | unary | binary}*0..20 ─ [out_cast]? ─ [quant_out]?

Roles: layernorm, pre_cast, post_ops (list), out_cast, quant_out.""")

RECIPROCAL_MULTIPLY = Pattern("reciprocal_multiply", 8.2, [
    Node("reciprocal", K.Reciprocal),
    Node("multiply", K.Multiply, [In("reciprocal", 0, swap=True)]),
], doc="""x * (1/y) (fp_reciprocal_multiply).

    reciprocal ─ multiply

Roles: reciprocal, multiply.""")

ELTWISE_POST_OPS = Pattern("eltwise_post_ops", 8.2, [
    Node("eltwise", UNARY),
    post_ops("eltwise", min=1),
], doc="""A unary op and its post-ops (fp_eltwise_binary).

    eltwise ─ {swish | unary | binary}*1..20

Roles: eltwise, post_ops (list).""")

X8_REORDER = Pattern("x8_reorder", 10.0, [
    Node("dequant", K.Dequantize, when=[in_dtype(0, *INT8)]),
    Node("reorder", K.Reorder, [In("dequant", 0)]),
    Node("res_dequant", K.Dequantize, optional="residual", via=None),
    Node("res_add", K.Add, [In("reorder", 0, swap=True), In("res_dequant", 1, swap=True)],
         optional="residual"),
    Node("quant_out", K.Quantize, [In("res_add", 0)]),
], doc="""int8 reorder (x8_reorder, x8_reorder_sum).

    dequant ─ reorder ─ [res_add(., res_dequant(other))]? ─ quant_out

Roles: dequant, reorder, res_dequant, res_add, quant_out.""")

TYPECAST_QUANTIZE = Pattern("typecast_quantize", 8.1, [
    Node("cast", _CAST, when=[in_dtype(0, *XF16), out_dtype(0, DataType.f32)]),
    Node("quant_out", K.Quantize, [In("cast", 0)]),
], doc="""bf16/f16 -> f32 TypeCast then Quantize (typecast_quantize_fusion).

    cast ─ quant_out

Roles: cast, quant_out.""")

REORDER_SUM = Pattern("reorder_sum", 8.1, [
    Node("reorder", K.Reorder),
    Node("add", K.Add, [In("reorder", 0, swap=True)]),
], doc="""Reorder then Add (fp_reorder_sum).

    reorder ─ add

Roles: reorder, add.""")


"""Gated MLP (LLM feed-forward), optionally with int4/int8 compressed weights."""
from __future__ import annotations

from graph_api.enums import OpKind as K

from ..pattern import In, Input, Node, Pattern, Repeat, in_dtype
from .common import BINARY, INT4, INT8, SWISH_BODY, UNARY_BODY


def _weight(role: str) -> Node:
    return Node(f"{role}_wei_dequant", K.DynamicDequantize, optional=True, via=None,
                when=[in_dtype(0, *(INT8 + INT4))])


GATED_MLP = Pattern("gated_mlp", 22.1, [
    Input("src"),
    _weight("gate"),
    Node("gate_matmul", K.MatMul, [In("src", 0), In("gate_wei_dequant", 1)]),
    Repeat("gate_act", (SWISH_BODY, UNARY_BODY), 0, 1, via="gate_matmul"),
    _weight("up"),
    Node("up_matmul", K.MatMul, [In("src", 0), In("up_wei_dequant", 1)]),
    Node("gate_mul", BINARY, [In("gate_act", 0, swap=True), In("up_matmul", 1, swap=True)]),
    Node("mlp_cast", K.TypeCast, [In("gate_mul", 0)], optional=True),
    _weight("down"),
    Node("down_matmul", K.MatMul, [In("mlp_cast", 0), In("down_wei_dequant", 1)]),
], doc="""Gated MLP (gated_mlp, gated_mlp_v1 and quantized_gated_mlp in one pattern).

              src ─────────────┬──────────────────────┐
    [gate_wei_dequant]? ─ gate_matmul          [up_wei_dequant]? ─ up_matmul
                               │                                   │
               [gate_act: unary | Sigmoid*x (swish)]?              │
                               └──── gate_mul (binary, gate at 0) ─┘
                                         │
                                    [mlp_cast]?
                    [down_wei_dequant]? ─ down_matmul

``src`` is the same tensor for both first MatMuls.  Weight dequantizers are
DynamicDequantize of s4/u4/s8/u8 (each optional).  Roles: gate_wei_dequant,
gate_matmul, gate_act (list: the activation op, or Sigmoid and Multiply),
up_wei_dequant, up_matmul, gate_mul, mlp_cast, down_wei_dequant, down_matmul.""")


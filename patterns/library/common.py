"""Op-kind sets and the repeated post-op bodies shared by the pattern files."""
from __future__ import annotations

from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K
from graph_api.postops import FUSABLE_BINARY, FUSABLE_UNARY

from ..pattern import ENTRY, Body, In, Node, Repeat

#: element-wise unary / binary ops oneDNN accepts as post-ops (from the one
#: post-op table; a binary post-op's other operand comes from outside)
UNARY = FUSABLE_UNARY
BINARY = FUSABLE_BINARY
SCALE = frozenset({K.Multiply, K.Divide})
QUANT_OUT = frozenset({K.Quantize, K.DynamicQuantize})
DEQUANT = frozenset({K.Dequantize, K.DynamicDequantize})
REDUCE = frozenset({K.ReduceL1, K.ReduceL2, K.ReduceMax, K.ReduceMean, K.ReduceMin, K.ReduceProd,
                    K.ReduceSum})

FLOATS = (DataType.f32, DataType.bf16, DataType.f16)
XF16 = (DataType.bf16, DataType.f16)
INT8 = (DataType.s8, DataType.u8)
INT4 = (DataType.s4, DataType.u4)
FP8 = (DataType.f8_e4m3, DataType.f8_e5m2)

#: a unary post-op on the chain
UNARY_BODY = Body("unary", [Node("op", UNARY, [In(ENTRY, 0)])])
#: a binary post-op: the chain enters input 0 (either input if commutative)
BINARY_BODY = Body("binary", [Node("op", BINARY, [In(ENTRY, 0, swap=True)])])
#: swish / SiLU decomposed: x * sigmoid(x)
SWISH_BODY = Body("swish", [
    Node("sigmoid", K.Sigmoid, [In(ENTRY, 0)]),
    Node("multiply", K.Multiply, [In(ENTRY, 0, swap=True), In("sigmoid", 1, swap=True)]),
])


def post_ops(via: str | None, name: str = "post_ops", min: int = 0, max: int = 20,
             bodies=(SWISH_BODY, UNARY_BODY, BINARY_BODY)) -> Repeat:
    """``{swish|unary|binary}*min..max`` after node ``via``."""
    return Repeat(name, bodies, min, max, via)


def binary_chain(via: str | None, name: str, min: int = 0, max: int = 20) -> Repeat:
    return Repeat(name, (BINARY_BODY,), min, max, via)

"""The one table of element-wise ops that kernels apply as post-ops.

One row per OpKind: the epilogue code(s) the Numba kernels switch on, the
op's f32 parameters taken from its attributes, and whether oneDNN fuses it
as a post-op of MatMul/SoftMax/LayerNorm/... (the pattern library's
alternatives).  Everything else derives from this table:

* ``graph_api.patterns.library.common.UNARY`` / ``BINARY`` (pattern alternatives),
* ``graph_api.kernels.weight_compressed.wmatmul`` epilogue constants and the name -> code maps,
* ``graph_api.partition.INPLACE_KINDS`` (single ops that may run in place),
* ``graph_api.kernels.fused.epilogue.chain_program`` (op -> epilogue step; the gated MLP's
  activation too).

Adding a fusable op is one row here plus its branch in the epilogue
evaluator (``graph_api.kernels.weight_compressed.wmatmul._ep_steps``); ``tests/kernels/test_postops.py``
checks every row against the reference op.

Codes below ``UNARY_FIRST`` (10) are binary (they read an operand); the rest are
unary.  Codes are stable numbers because compiled Numba kernels switch on them;
kernels name them (module-level ints are compile-time constants to Numba), never
write the numbers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .enums import OpKind as K


def _none(attrs) -> tuple[float, float]:
    return 0.0, 0.0


def _attr(*names: str) -> Callable:
    """Parameters = the named float attributes, rounded to f32 as oneDNN stores them."""
    def params(attrs):
        vals = [float(np.float32(attrs[n])) for n in names] + [0.0, 0.0]
        return vals[0], vals[1]
    params.__name__ = "attrs_" + "_".join(names)
    return params


@dataclass(frozen=True)
class PostOp:
    """How kernels apply one op kind to the running value.

    Attributes:
        name: epilogue step name (``make_epilogue``'s vocabulary).
        code: epilogue code; binary ops: with the running value at input 0.
        rcode: binary ops only: the code with the running value at input 1
            (``a - v`` is ``rsub``); equal to ``code`` for commutative ops.
        params: attrs -> (alpha, beta) f32 parameters of the step.
        fusable: oneDNN accepts it as a post-op (a pattern alternative).
        modes: attribute-selected variants: (attr name, {value: (name, code)}).
    """

    name: str
    code: int
    rcode: int | None = None
    params: Callable = _none
    fusable: bool = True
    modes: tuple | None = None

    @property
    def binary(self) -> bool:
        return self.rcode is not None

    def step(self, attrs, at_input: int = 0) -> tuple[str, int, tuple[float, float]]:
        """(step name, code, params) of an op with these attributes."""
        if self.binary:
            return (self.name if at_input == 0 else RNAMES[self.name],
                    self.code if at_input == 0 else self.rcode, (0.0, 0.0))
        name, code = self.name, self.code
        if self.modes is not None:
            attr, variants = self.modes
            name, code = variants[attrs[attr]]
        return name, code, self.params(attrs)


# binary codes 1..9
ADD, MUL, SUB, DIV, MAX, MIN, RSUB, RDIV = 1, 2, 3, 4, 5, 6, 7, 8
#: codes below this one are binary
UNARY_FIRST = 10
# unary codes
RELU, GELU_ERF, GELU_TANH, SIGMOID, SILU, TANH, CLAMP = 10, 11, 12, 13, 14, 15, 16
LINEAR, ELU, ABS, EXP, SQUARE, LEAKY_RELU = 17, 18, 19, 20, 21, 22
HARD_SIGMOID, HARD_SWISH, LOG, MISH, SOFT_PLUS, ROUND, SQRT, POW, RECIPROCAL = range(23, 32)
#: round the running value to bf16 / f16 (an intermediate of that type)
ROUND_BF16, ROUND_F16 = 40, 41
#: ``x / scale + zero point`` in f32 (a final Quantize; the store rounds): the
#: convolution epilogue's (``kernels/convolution/conv_fast.py``) last step
QUANTIZE = 42

POST_OPS: dict[K, PostOp] = {
    K.Add: PostOp("add", ADD, ADD),
    K.Multiply: PostOp("mul", MUL, MUL),
    K.Subtract: PostOp("sub", SUB, RSUB),
    K.Divide: PostOp("div", DIV, RDIV),
    K.Maximum: PostOp("max", MAX, MAX),
    K.Minimum: PostOp("min", MIN, MIN),
    K.ReLU: PostOp("relu", RELU),
    K.GELU: PostOp("gelu_erf", GELU_ERF, modes=("mode", {"gelu_erf": ("gelu_erf", GELU_ERF),
                                                         "gelu_tanh": ("gelu_tanh", GELU_TANH)})),
    K.Sigmoid: PostOp("sigmoid", SIGMOID),
    K.Tanh: PostOp("tanh", TANH),
    K.Clamp: PostOp("clamp", CLAMP, params=_attr("min", "max")),
    K.Elu: PostOp("elu", ELU, params=_attr("alpha")),
    K.Abs: PostOp("abs", ABS),
    K.Exp: PostOp("exp", EXP),
    K.Square: PostOp("square", SQUARE),
    K.LeakyReLU: PostOp("leaky_relu", LEAKY_RELU, params=_attr("alpha")),
    K.HardSigmoid: PostOp("hard_sigmoid", HARD_SIGMOID, params=_attr("alpha", "beta")),
    K.HardSwish: PostOp("hard_swish", HARD_SWISH),
    K.Log: PostOp("log", LOG),
    K.Mish: PostOp("mish", MISH),
    K.SoftPlus: PostOp("soft_plus", SOFT_PLUS, params=_attr("beta")),
    K.Round: PostOp("round", ROUND),
    K.Sqrt: PostOp("sqrt", SQRT),
    K.Pow: PostOp("pow", POW, params=_attr("beta"), fusable=False),
    K.Reciprocal: PostOp("reciprocal", RECIPROCAL, fusable=False),
}

#: reversed binary step names (running value at input 1)
RNAMES = {"add": "add", "mul": "mul", "sub": "rsub", "div": "rdiv", "max": "max", "min": "min"}

#: unary post-ops oneDNN fuses (pattern alternatives)
FUSABLE_UNARY = frozenset(k for k, p in POST_OPS.items() if p.fusable and not p.binary)
#: binary post-ops oneDNN fuses (the other operand comes from outside)
FUSABLE_BINARY = frozenset(k for k, p in POST_OPS.items() if p.fusable and p.binary)
#: single element-wise ops whose output may overwrite their first input
INPLACE_KINDS = frozenset(POST_OPS)


def _names() -> tuple[dict[str, int], dict[str, int]]:
    unary, binary = {}, {}
    for p in POST_OPS.values():
        if p.binary:
            binary[p.name] = p.code
            binary[RNAMES[p.name]] = p.rcode
        elif p.modes is not None:
            unary.update({n: c for n, c in p.modes[1].values()})
        else:
            unary[p.name] = p.code
    # aliases: SiLU (the Sigmoid+Multiply pair), a*x+b, bias as add, intermediate roundings
    unary.update(silu=SILU, swish=SILU, linear=LINEAR, round_bf16=ROUND_BF16, round_f16=ROUND_F16)
    binary["bias"] = ADD
    return unary, binary


#: epilogue step name -> code
UNARY_CODES, BINARY_CODES = _names()

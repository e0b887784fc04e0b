"""The decompositions shipped with graph_api (all f32, version 1).

=================  ===============================  =====================================
composite          ports                            reference decomposition
=================  ===============================  =====================================
``tanh``           x -> y (any shape)               rational minimax approximation by
                                                    Horner's method on clamp(x, -9, 9)
``gelu_tanh``      x -> y (any shape)               0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
                                                    tanh the composite above (nesting)
``rms_norm``       x [.., N], gamma [N] -> y        x / sqrt(mean(x^2, last axis) + epsilon) * gamma;
                   attribute epsilon = 1e-6         epsilon is the call site's attribute
``gated_mlp``      x [M, K], w_gate [K, N],         (silu(x w_gate) * (x w_up)) w_down,
                   w_up [K, N], w_down [N, K2]      silu(g) = g / (1 + exp(-g))
``sdpa``           q, k, v [B, H, S, D],            softmax(q k^T * scale + mask) v with the
                   scale [1], mask [B|1, H|1, S, S] softmax spelled out (max, exp, sum, divide)
=================  ===============================  =====================================

The fast kernels that serve them are in :mod:`graph_api.kernels.composite`.  The tanh
coefficients are the f32 rational approximation of Eigen / XLA (odd numerator of
degree 13, even denominator of degree 6, exact to a few f32 ulps on [-9, 9], and
tanh(+-9) rounds to +-1 in f32).
"""
from __future__ import annotations

import math

from .composite import Decomposition
from .dtypes import DataType
from .enums import OpKind as K
from .logical_tensor import LogicalTensor
from .op import Op

#: numerator p(x) = x (a1 + a3 x^2 + ... + a13 x^12), highest power first
TANH_NUMERATOR = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
                  5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
                  4.89352455891786e-03)
#: denominator q(x) = b0 + b2 x^2 + b4 x^4 + b6 x^6, highest power first
TANH_DENOMINATOR = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
                    4.89352518554385e-03)
TANH_CLAMP = 9.0
GELU_C = math.sqrt(2.0 / math.pi)
GELU_CUBIC = 0.044715


class Builder:
    """Builds a decomposition's ops with fresh tensor and op ids (all f32)."""

    def __init__(self):
        self.ops: list[Op] = []
        self.constants: dict = {}
        self._tid = 0

    def _lt(self, shape=None, dtype=DataType.f32) -> LogicalTensor:
        self._tid += 1
        return LogicalTensor(self._tid, dtype, shape)

    def port(self, shape=None) -> LogicalTensor:
        return self._lt(shape)

    def const(self, value, shape=(1,)) -> LogicalTensor:
        """A constant with a fixed value, or ``value`` a str: the composite's attribute."""
        lt = self._lt(shape)
        self.constants[lt.id] = value
        return lt

    def op(self, kind, *inputs, **attrs) -> LogicalTensor:
        out = self._lt()
        self.ops.append(Op(len(self.ops), kind, list(inputs), [out], attrs=attrs))
        return out

    def composite(self, name: str, *inputs, version: int = 1, **attrs) -> LogicalTensor:
        return self.op(K.Composite, *inputs, name=name, version=version, **attrs)

    def horner(self, x2: LogicalTensor, coefficients) -> LogicalTensor:
        """c0 x2^n + ... + cn by Horner's method: ((c0 x2 + c1) x2 + c2) ..."""
        acc = self.op(K.Multiply, x2, self.const(coefficients[0]))
        for i, c in enumerate(coefficients[1:]):
            acc = self.op(K.Add, acc, self.const(c))
            if i < len(coefficients) - 2:
                acc = self.op(K.Multiply, acc, x2)
        return acc

    def decomposition(self, name, inputs, outputs, attrs=None, doc="") -> Decomposition:
        return Decomposition(name, inputs, outputs, self.ops, 1, self.constants, attrs, doc)


def tanh() -> Decomposition:
    b = Builder()
    x = b.port()
    xc = b.op(K.Clamp, x, min=-TANH_CLAMP, max=TANH_CLAMP)
    x2 = b.op(K.Pow, xc, beta=2.0)  # Pow is no post-op: pattern searches stop here
    p = b.op(K.Multiply, b.horner(x2, TANH_NUMERATOR), xc)
    q = b.horner(x2, TANH_DENOMINATOR)
    y = b.op(K.Divide, p, q)
    return b.decomposition("tanh", [x], [y], doc="rational approximation, Horner's method")


def gelu_tanh() -> Decomposition:
    b = Builder()
    x = b.port()
    x3 = b.op(K.Multiply, b.op(K.Multiply, x, x), x)
    inner = b.op(K.Add, x, b.op(K.Multiply, x3, b.const(GELU_CUBIC)))
    t = b.composite("tanh", b.op(K.Multiply, inner, b.const(GELU_C)))
    half_x = b.op(K.Multiply, x, b.const(0.5))
    y = b.op(K.Multiply, half_x, b.op(K.Add, t, b.const(1.0)))
    return b.decomposition("gelu_tanh", [x], [y], doc="GELU, tanh approximation")


def rms_norm() -> Decomposition:
    b = Builder()
    x, gamma = b.port(), b.port([-1])
    mean_sq = b.op(K.ReduceMean, b.op(K.Multiply, x, x), axes=[-1], keep_dims=True)
    rms = b.op(K.Sqrt, b.op(K.Add, mean_sq, b.const("epsilon")))
    y = b.op(K.Multiply, b.op(K.Divide, x, rms), gamma)
    return b.decomposition("rms_norm", [x, gamma], [y], {"epsilon": 1e-6},
                           doc="RMSNorm over the last axis")


def gated_mlp() -> Decomposition:
    b = Builder()
    x, w_gate, w_up, w_down = b.port([-1, -1]), b.port([-1, -1]), b.port([-1, -1]), b.port([-1, -1])
    gate = b.op(K.MatMul, x, w_gate)
    exp_neg = b.op(K.Exp, b.op(K.Multiply, gate, b.const(-1.0)))
    silu = b.op(K.Divide, gate, b.op(K.Add, exp_neg, b.const(1.0)))
    hidden = b.op(K.Multiply, silu, b.op(K.MatMul, x, w_up))
    y = b.op(K.MatMul, hidden, w_down)
    return b.decomposition("gated_mlp", [x, w_gate, w_up, w_down], [y],
                           doc="SiLU-gated MLP (LLaMA feed-forward)")


def sdpa() -> Decomposition:
    b = Builder()
    q, k, v = (b.port([-1, -1, -1, -1]) for _ in range(3))
    scale, mask = b.port([1]), b.port([-1, -1, -1, -1])
    scores = b.op(K.Add, b.op(K.Multiply, b.op(K.MatMul, q, k, transpose_b=True), scale), mask)
    shifted = b.op(K.Subtract, scores, b.op(K.ReduceMax, scores, axes=[-1], keep_dims=True))
    e = b.op(K.Exp, shifted)
    probs = b.op(K.Divide, e, b.op(K.ReduceSum, e, axes=[-1], keep_dims=True))
    y = b.op(K.MatMul, probs, v)
    return b.decomposition("sdpa", [q, k, v, scale, mask], [y],
                           doc="scaled dot-product attention with an additive mask")


def shipped() -> list[Decomposition]:
    """Every shipped decomposition (callees may come in any order: the library sorts)."""
    return [tanh(), gelu_tanh(), rms_norm(), gated_mlp(), sdpa()]

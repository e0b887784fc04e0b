"""Element-wise unary ops: one pure numpy formula per op, attrs as kwargs.

Each formula gets the input as float64 holding the exact input values (f32,
bf16, f16 all widen exactly) and returns float64; the adapter rounds the result
to the output type through f32 (``dtypes.convert``).  Evaluating oneDNN's f32
formula in f64 gives the correctly rounded answer that oneDNN's f32 math
approximates (within ~1 ulp); where oneDNN branches explicitly (overflow
bounds of sigmoid/soft_relu, NaN handling of clamp/relu) the branch is kept.
Formulas follow ``src/common/math_utils.hpp`` and the graph op -> eltwise
algorithm mapping (HardSwish = hardswish(alpha=1/6, beta=1/2), SoftPlus =
soft_relu(alpha=beta), Pow = pow(alpha=1, beta), Clamp = clip_v2).
"""
from __future__ import annotations

import math

import numpy as np

from graph_api.enums import OpKind

from ._common import f64, finish

#: expf(x) overflows above this (oneDNN uses it to guard sigmoid/soft_relu)
EXP_OVERFLOW_BOUND = 88.72283172607421875

try:  # scipy is optional: a vectorized math.erf is the exact fallback
    from scipy.special import erf as _erf
except ImportError:  # pragma: no cover - exercised only without scipy
    _erf = np.vectorize(math.erf, otypes=[np.float64])


def abs_(x):
    """dst = |x|"""
    return np.abs(x)


def clamp(x, min, max):
    """dst = min(max(x, min_), max_); NaN becomes ``min`` as oneDNN's clip_v2."""
    x = np.where(x > min, x, min)
    return np.where(x < max, x, max)


def elu(x, alpha):
    """dst = x if x > 0 else alpha * (exp(x) - 1)"""
    return np.where(x > 0, x, alpha * np.expm1(x))


def exp(x):
    """dst = e^x"""
    return np.exp(x)


def gelu(x, mode="gelu_erf"):
    """gelu_erf: 0.5 x (1 + erf(x / sqrt 2));
    gelu_tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    if mode == "gelu_tanh":
        inner = math.sqrt(2.0 / math.pi) * x * (1.0 + 0.044715 * x * x)
        return 0.5 * x * (1.0 + np.tanh(inner))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def hard_sigmoid(x, alpha, beta):
    """dst = clip(alpha x + beta, 0, 1) (NaN stays NaN)"""
    return np.clip(alpha * x + beta, 0.0, 1.0)


def hard_swish(x):
    """dst = x * clip(x / 6 + 1/2, 0, 1)"""
    return x * np.clip(x / 6.0 + 0.5, 0.0, 1.0)


def leaky_relu(x, alpha):
    """dst = x if x > 0 else alpha x"""
    return np.where(x > 0, x, x * alpha)


def log(x):
    """dst = ln x"""
    return np.log(x)


def soft_plus(x, beta=1.0):
    """dst = ln(1 + e^(beta x)) / beta, and x itself once beta x would overflow exp."""
    bx = beta * x
    safe = np.where(bx < EXP_OVERFLOW_BOUND, bx, 0.0)
    return np.where(bx < EXP_OVERFLOW_BOUND, np.log1p(np.exp(safe)), bx) / beta


def mish(x):
    """dst = x tanh(softplus(x))"""
    return x * np.tanh(soft_plus(x, 1.0))


def pow_(x, beta):
    """dst = x^beta (NaN for negative x and non-integer beta)"""
    return np.power(x, beta)


def reciprocal(x):
    """dst = 1 / x"""
    return 1.0 / x


def relu(x):
    """dst = x if x > 0 else 0 (x * 0: -0 for negatives, NaN stays NaN)"""
    return np.where(x > 0, x, x * 0.0)


def round_(x):
    """dst = nearbyint(x): round half to even (oneDNN's mxcsr rounding)."""
    return np.rint(x)


def sigmoid(x):
    """dst = 1 / (1 + e^-x), exactly 0 once e^-x would overflow."""
    neg = -x
    safe = np.where(neg < EXP_OVERFLOW_BOUND, neg, 0.0)
    return np.where(neg < EXP_OVERFLOW_BOUND, 1.0 / (1.0 + np.exp(safe)), 0.0)


def sqrt(x):
    """dst = sqrt(x)"""
    return np.sqrt(x)


def square(x):
    """dst = x^2"""
    return x * x


def tanh(x):
    """dst = tanh(x)"""
    return np.tanh(x)


def unary(formula, **attr_defaults):
    """Adapt ``formula(x, **attrs)`` to the reference-kernel contract.

    ``attr_defaults`` names the op attributes the formula takes (None =
    required, validated by the schema).  Float attributes are f32 in oneDNN, so
    they are rounded to f32 before use.
    """

    def kernel(op, inputs, out_lts, ctx):
        attrs = {}
        for name, default in attr_defaults.items():
            value = op.attrs.get(name, default)
            attrs[name] = float(np.float32(value)) if isinstance(value, float) else value
        with np.errstate(all="ignore"):
            y = formula(f64(inputs[0]), **attrs)
        return [finish(y, out_lts[0])]

    kernel.__name__ = formula.__name__.rstrip("_")
    kernel.__doc__ = formula.__doc__
    kernel.formula = formula
    return kernel


ELTWISE = {
    OpKind.Abs: unary(abs_),
    OpKind.Clamp: unary(clamp, min=None, max=None),
    OpKind.Elu: unary(elu, alpha=None),
    OpKind.Exp: unary(exp),
    OpKind.GELU: unary(gelu, mode="gelu_erf"),
    OpKind.HardSigmoid: unary(hard_sigmoid, alpha=None, beta=None),
    OpKind.HardSwish: unary(hard_swish),
    OpKind.LeakyReLU: unary(leaky_relu, alpha=None),
    OpKind.Log: unary(log),
    OpKind.Mish: unary(mish),
    OpKind.Pow: unary(pow_, beta=None),
    OpKind.Reciprocal: unary(reciprocal),
    OpKind.ReLU: unary(relu),
    OpKind.Round: unary(round_),
    OpKind.Sigmoid: unary(sigmoid),
    OpKind.SoftPlus: unary(soft_plus, beta=1.0),
    OpKind.Sqrt: unary(sqrt),
    OpKind.Square: unary(square),
    OpKind.Tanh: unary(tanh),
}

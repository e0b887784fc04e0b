"""Unary and binary element-wise op cases (f32, bf16, f16; s32 where allowed)."""
from __future__ import annotations

import math

import numpy as np

from graph_api.enums import OpKind as K

from .records import EXACT, In, OpCase, Out, as_f64, each, each_broadcast

FLOATS = ("f32", "bf16", "f16")
UNARY_SHAPES = ((2, 3, 4), (5, 7))


def _gelu_tanh(x):
    return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


# kind, attrs, scalar formula(x, attrs), input range (low, high, step)
UNARY = [
    (K.Abs, {}, lambda x, a: abs(x), (-3, 3, None)),
    (K.Clamp, {"min": -0.5, "max": 1.25}, lambda x, a: min(max(x, a["min"]), a["max"]),
     (-3, 3, None)),
    (K.Elu, {"alpha": 0.75}, lambda x, a: x if x > 0 else a["alpha"] * (math.exp(x) - 1),
     (-3, 3, None)),
    (K.Exp, {}, lambda x, a: math.exp(x), (-3, 3, None)),
    (K.GELU, {}, lambda x, a: 0.5 * x * (1 + math.erf(x / math.sqrt(2))), (-4, 4, None)),
    (K.GELU, {"mode": "gelu_tanh"}, lambda x, a: _gelu_tanh(x), (-4, 4, None)),
    (K.HardSigmoid, {"alpha": 0.2, "beta": 0.5},
     lambda x, a: max(0.0, min(1.0, a["alpha"] * x + a["beta"])), (-4, 4, None)),
    (K.HardSwish, {}, lambda x, a: x * min(max(x + 3, 0.0), 6.0) / 6, (-5, 5, None)),
    (K.LeakyReLU, {"alpha": 0.1}, lambda x, a: max(x, 0.0) + a["alpha"] * min(x, 0.0),
     (-3, 3, None)),
    (K.Log, {}, lambda x, a: math.log(x), (0.05, 5, None)),
    (K.Mish, {}, lambda x, a: x * math.tanh(math.log(1 + math.exp(x))), (-4, 4, None)),
    (K.Pow, {"beta": 2.5}, lambda x, a: x ** a["beta"], (0.1, 3, None)),
    (K.Pow, {"beta": -1.5}, lambda x, a: x ** a["beta"], (0.25, 3, None)),
    (K.Reciprocal, {}, lambda x, a: 1 / x, (0.25, 4, None)),
    (K.ReLU, {}, lambda x, a: max(x, 0.0), (-3, 3, None)),
    (K.Round, {}, lambda x, a: float(round(x)), (-4, 4, 0.25)),  # ties at .5: half to even
    (K.Sigmoid, {}, lambda x, a: 1 / (1 + math.exp(-x)), (-6, 6, None)),
    (K.SoftPlus, {}, lambda x, a: math.log(1 + math.exp(x)), (-4, 4, None)),
    (K.SoftPlus, {"beta": 2.0}, lambda x, a: math.log(1 + math.exp(2 * x)) / 2, (-4, 4, None)),
    (K.Sqrt, {}, lambda x, a: math.sqrt(x), (0, 6, None)),
    (K.Square, {}, lambda x, a: x * x, (-3, 3, None)),
    (K.Tanh, {}, lambda x, a: math.tanh(x), (-3, 3, None)),
]


def _unary_expected(formula):
    return lambda inputs, attrs: [each(lambda x: formula(x, attrs), inputs[0])]


def unary_cases():
    cases = []
    for kind, attrs, formula, (low, high, step) in UNARY:
        tag = "_".join(f"{k}{v}" for k, v in attrs.items())
        for dt in FLOATS:
            for i, shape in enumerate(UNARY_SHAPES):
                cases.append(OpCase(
                    f"{kind.name}{'_' + tag if tag else ''}_{dt}_{i}", kind,
                    (In(shape, dt, low, high, step),), (Out(shape, dt),),
                    _unary_expected(formula), dict(attrs), seed=len(cases)))
    return cases


# ------------------------------------------------------------------- binary
BINARY = [
    (K.Add, lambda a, b: a + b),
    (K.Subtract, lambda a, b: a - b),
    (K.Multiply, lambda a, b: a * b),
    (K.Divide, lambda a, b: a / b),
    (K.Maximum, lambda a, b: a if a >= b else b),
    (K.Minimum, lambda a, b: a if a <= b else b),
    (K.SquaredDifference, lambda a, b: (a - b) ** 2),
]
# (shape a, shape b, shape out): plain, numpy broadcast both ways
BINARY_SHAPES = (((4, 5), (4, 5), (4, 5)), ((2, 3, 4), (3, 1), (2, 3, 4)),
                 ((1, 4), (3, 1), (3, 4)))


def _binary_expected(formula):
    def expected(inputs, attrs):
        a, b = as_f64(inputs[0]), as_f64(inputs[1])
        out_shape = np.broadcast_shapes(a.shape, b.shape)
        return [each_broadcast(formula, out_shape, a, b).astype(np.float64)]

    return expected


def _int_expected(formula):
    def expected(inputs, attrs):
        a, b = np.asarray(inputs[0]), np.asarray(inputs[1])
        out = each_broadcast(lambda x, y: min(max(formula(int(x), int(y)), -2 ** 31), 2 ** 31 - 1),
                             np.broadcast_shapes(a.shape, b.shape), a, b)
        return [out.astype(np.int64)]

    return expected


def binary_cases():
    cases = []
    for kind, formula in BINARY:
        # divisors stay away from 0 (both signs)
        low_b, high_b = (0.5, 4.0) if kind == K.Divide else (-3.0, 3.0)
        for dt in FLOATS:
            for i, (sa, sb, so) in enumerate(BINARY_SHAPES):
                cases.append(OpCase(
                    f"{kind.name}_{dt}_{i}", kind, (In(sa, dt), In(sb, dt, low_b, high_b)),
                    (Out(so, dt),), _binary_expected(formula), seed=1000 + len(cases)))
    # mixed precision: bf16/f16 with f32 gives f32 (Add/Subtract/Multiply/Divide)
    for kind, formula in BINARY[:4]:
        for dt in ("bf16", "f16"):
            cases.append(OpCase(
                f"{kind.name}_{dt}_f32_mixed", kind, (In((3, 4), dt), In((4,), "f32", 0.5, 2)),
                (Out((3, 4), "f32"),), _binary_expected(formula), seed=1100 + len(cases)))
    # s32 Add/Subtract: exact integers, saturating at the s32 range
    for kind, formula in BINARY[:2]:
        cases.append(OpCase(
            f"{kind.name}_s32_0", kind, (In((3, 4), "s32", -1000, 1000), In((4,), "s32", -50, 50)),
            (Out((3, 4), "s32"),), _int_expected(formula), seed=1200 + len(cases)))
        big = [[2 ** 30 + 5, -2 ** 30 - 7], [2 ** 31 - 1, -2 ** 31]]
        cases.append(OpCase(
            f"{kind.name}_s32_saturate", kind,
            (In((2, 2), "s32", values=big), In((2, 2), "s32", values=[[2 ** 30, 2 ** 30], [1, 1]])),
            (Out((2, 2), "s32"),), _int_expected(formula)))
    return cases


def _greater_equal_expected(inputs, attrs):
    a, b = as_f64(inputs[0]), as_f64(inputs[1])
    return [each_broadcast(lambda x, y: x >= y, np.broadcast_shapes(a.shape, b.shape), a, b)
            .astype(bool)]


def greater_equal_cases():
    cases = []
    for dt in FLOATS + ("s32",):
        for i, (sa, sb, so) in enumerate(BINARY_SHAPES[1:]):
            # a coarse step makes equal pairs frequent, so ">=" vs ">" is tested
            cases.append(OpCase(
                f"GreaterEqual_{dt}_{i}", K.GreaterEqual,
                (In(sa, dt, -2, 2, 1), In(sb, dt, -2, 2, 1)), (Out(so, "boolean"),),
                _greater_equal_expected, seed=1300 + len(cases)))
    return cases


def _select_expected(inputs, attrs):
    cond, a, b = inputs
    out_shape = np.broadcast_shapes(np.shape(a), np.shape(b))
    return [each_broadcast(lambda c, x, y: x if c else y, out_shape, cond,
                           as_f64(a), as_f64(b)).astype(np.float64)]


def select_cases():
    cases = []
    shapes = (((4,), (2, 3, 4), (3, 4), (2, 3, 4)), ((3, 1), (3, 5), (1, 5), (3, 5)))
    for dt in FLOATS:
        for i, (sc, sa, sb, so) in enumerate(shapes):
            cases.append(OpCase(
                f"Select_{dt}_{i}", K.Select, (In(sc, "boolean"), In(sa, dt), In(sb, dt)),
                (Out(so, dt),), _select_expected, tol=EXACT, seed=1400 + len(cases)))
    return cases


def _channel(shape, fmt):
    return 1 if fmt == "NCX" else len(shape) - 1


def _prelu_expected(inputs, attrs):
    x, slope = as_f64(inputs[0]), as_f64(inputs[1])
    out = np.empty(x.shape)
    per_channel = attrs.get("per_channel_broadcast", True) and slope.ndim == 1
    for idx in np.ndindex(x.shape):
        if per_channel:
            s = slope[idx[_channel(x.shape, attrs.get("data_format", "NXC"))]]
        elif slope.ndim == 1:
            s = slope[idx[-1]]
        else:
            s = slope[tuple(0 if d == 1 else i for i, d in zip(idx[x.ndim - slope.ndim:], slope.shape))]
        out[idx] = x[idx] if x[idx] >= 0 else s * x[idx]
    return [out]


def prelu_cases():
    cases = []
    configs = (  # src shape, slope shape, attrs
        ((2, 3, 4, 4), (3,), {"data_format": "NCX"}),
        ((2, 4, 4, 3), (3,), {}),
        ((2, 3, 5), (5,), {"per_channel_broadcast": False}),
        ((2, 3, 5), (3, 1), {"per_channel_broadcast": False}),
    )
    for dt in FLOATS:
        for i, (sx, ss, attrs) in enumerate(configs):
            cases.append(OpCase(
                f"PReLU_{dt}_{i}", K.PReLU, (In(sx, dt), In(ss, dt, 0.05, 0.5)), (Out(sx, dt),),
                _prelu_expected, attrs, seed=1500 + len(cases)))
    return cases


def _bias_add_expected(inputs, attrs):
    x, bias = as_f64(inputs[0]), as_f64(inputs[1])
    out = np.empty(x.shape)
    c = _channel(x.shape, attrs.get("data_format", "NXC"))
    for idx in np.ndindex(x.shape):
        out[idx] = x[idx] + bias[idx[c]]
    return [out]


def bias_add_cases():
    cases = []
    for dt in FLOATS:
        for i, (sx, c, attrs) in enumerate((((2, 5, 3), 3, {}), ((2, 4, 3, 3), 4, {"data_format": "NCX"}))):
            cases.append(OpCase(
                f"BiasAdd_{dt}_{i}", K.BiasAdd, (In(sx, dt), In((c,), dt)), (Out(sx, dt),),
                _bias_add_expected, attrs, seed=1600 + len(cases)))
    return cases


def elementwise_cases():
    return (unary_cases() + binary_cases() + greater_equal_cases() + select_cases()
            + prelu_cases() + bias_add_cases())


"""Normalization, softmax and reduction cases.

Expected statistics use ``math.fsum`` over explicit index loops (population
variance, as oneDNN).
"""
from __future__ import annotations

import math

import numpy as np

from graph_api.enums import OpKind as K

from .records import In, OpCase, Out, as_f64, product_range

FLOATS = ("f32", "bf16", "f16")


def _stats(values):
    n = len(values)
    mean = math.fsum(values) / n
    return mean, math.fsum((v - mean) ** 2 for v in values) / n


def _split(shape, begin):
    """(outer index space, inner index space) for a norm over dims begin..end."""
    begin = begin % len(shape)
    return shape[:begin], shape[begin:]


# ---------------------------------------------------------------- LayerNorm
def _layer_norm_expected(inputs, attrs):
    x = as_f64(inputs[0])
    outer, inner = _split(x.shape, attrs.get("begin_norm_axis", -1))
    eps = float(np.float32(attrs.get("epsilon", 1e-5)))
    affine = attrs.get("use_affine", True) and len(inputs) == 3
    dst, means, variances = np.empty(x.shape), np.empty(outer), np.empty(outer)
    for o in product_range(*outer):
        vals = [x[o + i] for i in product_range(*inner)]
        mean, var = _stats(vals)
        means[o], variances[o] = mean, var
        for i in product_range(*inner):
            y = (x[o + i] - mean) / math.sqrt(var + eps)
            dst[o + i] = y * as_f64(inputs[1])[i] + as_f64(inputs[2])[i] if affine else y
    return [dst, means, variances]


def layer_norm_cases():
    cases = []
    for dt, aux in (("f32", "f32"), ("bf16", "bf16"), ("bf16", "f32"), ("f16", "f32")):
        cases.append(OpCase(
            f"LayerNorm_{dt}_{aux}_stats", K.LayerNorm,
            (In((2, 3, 8), dt), In((8,), aux, 0.5, 1.5), In((8,), aux)),
            (Out((2, 3, 8), dt), Out((2, 3), aux), Out((2, 3), aux)),
            _layer_norm_expected, {"epsilon": 1e-4}, seed=3000 + len(cases)))
        cases.append(OpCase(
            f"LayerNorm_{dt}_{aux}_plain", K.LayerNorm, (In((4, 2, 5), dt),), (Out((4, 2, 5), dt),),
            lambda ins, attrs: _layer_norm_expected(ins, attrs)[:1],
            {"begin_norm_axis": 1, "keep_stats": False, "use_affine": False},
            seed=3000 + len(cases)))
    return cases


def _rms_norm_expected(inputs, attrs):
    x = as_f64(inputs[0])
    outer, inner = _split(x.shape, attrs.get("begin_norm_axis", -1))
    eps = float(np.float32(attrs.get("epsilon", 1e-5)))
    dst = np.empty(x.shape)
    for o in product_range(*outer):
        ms = math.fsum(x[o + i] ** 2 for i in product_range(*inner)) / math.prod(inner)
        for i in product_range(*inner):
            gamma = as_f64(inputs[1])[i] if len(inputs) > 1 else 1.0
            dst[o + i] = gamma * x[o + i] / math.sqrt(ms + eps)
    return [dst]


def rms_norm_cases():
    cases = []
    for dt in FLOATS:
        cases.append(OpCase(f"RMSNorm_{dt}_gamma", K.RMSNorm, (In((2, 3, 8), dt), In((8,), dt)),
                            (Out((2, 3, 8), dt),), _rms_norm_expected, seed=3100 + len(cases)))
        cases.append(OpCase(f"RMSNorm_{dt}_plain", K.RMSNorm, (In((4, 6), dt),), (Out((4, 6), dt),),
                            _rms_norm_expected, {"epsilon": 1e-3}, seed=3100 + len(cases)))
    return cases


# ---------------------------------------------------------------- BatchNorm
def _channel(x, attrs):
    return 1 if attrs.get("data_format", "NXC") == "NCX" else x.ndim - 1


def _bn_inference_expected(inputs, attrs):
    x = as_f64(inputs[0])
    gamma, beta, mean, var = (as_f64(v) for v in inputs[1:5])
    eps = float(np.float32(attrs["epsilon"]))
    c_axis = _channel(x, attrs)
    out = np.empty(x.shape)
    for idx in np.ndindex(x.shape):
        c = idx[c_axis]
        out[idx] = gamma[c] * (x[idx] - mean[c]) / math.sqrt(var[c] + eps) + beta[c]
    return [out]


def _bn_training_expected(inputs, attrs):
    x = as_f64(inputs[0])
    c_axis = _channel(x, attrs)
    eps = float(np.float32(attrs["epsilon"]))
    m = float(np.float32(attrs.get("momentum", 0.5)))
    n_ch = x.shape[c_axis]
    bmean, bvar = np.empty(n_ch), np.empty(n_ch)
    for c in range(n_ch):
        bmean[c], bvar[c] = _stats([x[i] for i in np.ndindex(x.shape) if i[c_axis] == c])
    out = np.empty(x.shape)
    for idx in np.ndindex(x.shape):
        c = idx[c_axis]
        y = (x[idx] - bmean[c]) / math.sqrt(bvar[c] + eps)
        out[idx] = y * as_f64(inputs[3])[c] + as_f64(inputs[4])[c] if len(inputs) == 5 else y
    run_mean = m * as_f64(inputs[1]) + (1 - m) * bmean
    run_var = m * as_f64(inputs[2]) + (1 - m) * bvar
    return [out, run_mean, run_var, bmean, bvar]


def batch_norm_cases():
    cases = []
    for dt, aux in (("f32", "f32"), ("bf16", "bf16"), ("f16", "f32")):
        for i, (shape, c, attrs) in enumerate((((2, 4, 4, 3), 3, {}),
                                               ((2, 3, 4, 4), 3, {"data_format": "NCX"}))):
            ins = (In(shape, dt), In((c,), aux, 0.5, 1.5), In((c,), aux), In((c,), aux),
                   In((c,), aux, 0.5, 2.0))
            cases.append(OpCase(f"BatchNormInference_{dt}_{i}", K.BatchNormInference, ins,
                                (Out(shape, dt),), _bn_inference_expected,
                                dict(attrs, epsilon=1e-3), seed=3200 + len(cases)))
        stats = tuple(Out((3,), aux) for _ in range(4))
        cases.append(OpCase(
            f"BatchNormForwardTraining_{dt}_affine", K.BatchNormForwardTraining,
            (In((4, 3, 2, 2), dt), In((3,), aux), In((3,), aux, 0.5, 2), In((3,), aux, 0.5, 1.5),
             In((3,), aux)), (Out((4, 3, 2, 2), dt),) + stats, _bn_training_expected,
            {"epsilon": 1e-3, "momentum": 0.1, "data_format": "NCX"}, seed=3200 + len(cases)))
        cases.append(OpCase(
            f"BatchNormForwardTraining_{dt}_plain", K.BatchNormForwardTraining,
            (In((3, 2, 2, 3), dt), In((3,), aux), In((3,), aux, 0.5, 2)),
            (Out((3, 2, 2, 3), dt),) + stats, _bn_training_expected, {"epsilon": 1e-3},
            seed=3200 + len(cases)))
    return cases


# ---------------------------------------------------------------- GroupNorm
def _group_norm_expected(inputs, attrs):
    x = as_f64(inputs[0])
    c_axis = _channel(x, attrs)
    groups = attrs["groups"]
    eps = float(np.float32(attrs.get("epsilon", 1e-5)))
    per_group = x.shape[c_axis] // groups
    n_size = x.shape[0]
    means, variances = np.empty((n_size, groups)), np.empty((n_size, groups))
    for n, g in product_range(n_size, groups):
        vals = [x[i] for i in np.ndindex(x.shape) if i[0] == n and i[c_axis] // per_group == g]
        means[n, g], variances[n, g] = _stats(vals)
    out = np.empty(x.shape)
    affine = attrs.get("use_affine", True) and len(inputs) == 3
    for idx in np.ndindex(x.shape):
        c = idx[c_axis]
        n, g = idx[0], c // per_group
        y = (x[idx] - means[n, g]) / math.sqrt(variances[n, g] + eps)
        out[idx] = y * as_f64(inputs[1])[c] + as_f64(inputs[2])[c] if affine else y
    return [out, means, variances]


def group_norm_cases():
    cases = []
    for dt, aux in (("f32", "f32"), ("bf16", "bf16"), ("bf16", "f32"), ("f16", "f32")):
        cases.append(OpCase(
            f"GroupNorm_{dt}_{aux}_stats", K.GroupNorm,
            (In((2, 4, 3, 3), dt), In((4,), aux, 0.5, 1.5), In((4,), aux)),
            (Out((2, 4, 3, 3), dt), Out((2, 2), aux), Out((2, 2), aux)), _group_norm_expected,
            {"groups": 2, "data_format": "NCX"}, seed=3300 + len(cases)))
        cases.append(OpCase(
            f"GroupNorm_{dt}_{aux}_nxc", K.GroupNorm,
            (In((2, 3, 3, 6), dt), In((6,), aux, 0.5, 1.5), In((6,), aux)),
            (Out((2, 3, 3, 6), dt),), lambda ins, attrs: _group_norm_expected(ins, attrs)[:1],
            {"groups": 3, "keep_stats": False, "epsilon": 1e-3}, seed=3300 + len(cases)))
    return cases


# ------------------------------------------------------------------ SoftMax
def _softmax_expected(log=False, default_axis=1):
    def expected(inputs, attrs):
        x = as_f64(inputs[0])
        axis = attrs.get("axis", default_axis) % x.ndim
        out = np.empty(x.shape)
        stats = np.empty(x.shape[:axis] + (1,) + x.shape[axis + 1:])
        for idx in np.ndindex(stats.shape):
            line = [idx[:axis] + (j,) + idx[axis + 1:] for j in range(x.shape[axis])]
            top = max(x[i] for i in line)
            total = math.fsum(math.exp(x[i] - top) for i in line)
            for i in line:
                out[i] = x[i] - top - math.log(total) if log else math.exp(x[i] - top) / total
            stats[idx] = top + math.log(total)
        return [out, stats]

    return expected


def softmax_cases():
    cases = []
    for dt in FLOATS:
        cases.append(OpCase(f"SoftMax_{dt}_axis1", K.SoftMax, (In((2, 5, 3), dt, -4, 4),),
                            (Out((2, 5, 3), dt),), _softmax_expected(), seed=3400 + len(cases)))
        cases.append(OpCase(f"SoftMax_{dt}_stats", K.SoftMax, (In((3, 6), dt, -4, 4),),
                            (Out((3, 6), dt), Out((3, 1), "f32")), _softmax_expected(),
                            {"axis": -1, "mode": "inf_as_zero"}, seed=3400 + len(cases)))
        cases.append(OpCase(f"LogSoftmax_{dt}_0", K.LogSoftmax, (In((2, 5, 3), dt, -4, 4),),
                            (Out((2, 5, 3), dt),), _softmax_expected(True, -1),
                            seed=3400 + len(cases)))
        cases.append(OpCase(f"LogSoftmax_{dt}_1", K.LogSoftmax, (In((4, 7), dt, -4, 4),),
                            (Out((4, 7), dt),), _softmax_expected(True, -1), {"axis": 0},
                            seed=3400 + len(cases)))
    for dt in ("bf16", "f16"):
        cases.append(OpCase(f"SoftMax_{dt}_to_f32", K.SoftMax, (In((4, 9), dt, -4, 4),),
                            (Out((4, 9), "f32"),), _softmax_expected(), {"axis": -1},
                            seed=3450 + len(cases)))
    return cases


# --------------------------------------------------------------- reductions
REDUCTIONS = [
    (K.ReduceL1, lambda v: math.fsum(abs(a) for a in v)),
    (K.ReduceL2, lambda v: math.sqrt(math.fsum(a * a for a in v))),
    (K.ReduceMax, max),
    (K.ReduceMean, lambda v: math.fsum(v) / len(v)),
    (K.ReduceMin, min),
    (K.ReduceProd, math.prod),
    (K.ReduceSum, math.fsum),
]


def _reduce_expected(formula):
    def expected(inputs, attrs):
        x = as_f64(inputs[0])
        axes = attrs.get("axes") or np.asarray(inputs[1]).tolist()
        axes = {a % x.ndim for a in axes}
        buckets: dict = {}
        for idx in np.ndindex(x.shape):
            key = tuple(0 if d in axes else i for d, i in enumerate(idx))
            buckets.setdefault(key, []).append(x[idx])
        kept = tuple(1 if d in axes else s for d, s in enumerate(x.shape))
        out = np.empty(kept)
        for key, vals in buckets.items():
            out[key] = formula(vals)
        return [out]

    return expected


def reduce_cases():
    cases = []
    for kind, formula in REDUCTIONS:
        low, high = (0.5, 1.5) if kind == K.ReduceProd else (-3, 3)
        for dt in FLOATS:
            for i, (src, axes, keep, out) in enumerate((((2, 3, 4), [1], False, (2, 4)),
                                                        ((3, 2, 5), [0, 2], True, (1, 2, 1)))):
                cases.append(OpCase(f"{kind.name}_{dt}_{i}", kind, (In(src, dt, low, high),),
                                    (Out(out, dt),), _reduce_expected(formula),
                                    {"axes": axes, "keep_dims": keep}, seed=3500 + len(cases)))
        # the axes as an s32 second input instead of the attribute
        cases.append(OpCase(f"{kind.name}_f32_axes_input", kind,
                            (In((3, 4, 2), "f32", low, high), In((2,), "s32", values=[-2, 0])),
                            (Out((2,)),), _reduce_expected(formula), seed=3500 + len(cases)))
    return cases


def norm_cases():
    return (layer_norm_cases() + rms_norm_cases() + batch_norm_cases() + group_norm_cases()
            + softmax_cases() + reduce_cases())

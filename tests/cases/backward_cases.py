"""Backward (training) op cases: the derivative of each forward op written out
by hand with Python loops and the ``math`` module (never the kernels' code).

Element-wise inputs avoid the kinks (a kink's side is oneDNN's choice and is
tested in ``tests/kernels/test_backward.py``).  ``use_dst`` cases feed a
forward dst and differentiate through it.  Window ops loop over every output
cell and kernel tap.
"""
from __future__ import annotations

import math

import numpy as np

from graph_api.enums import OpKind as K

from .records import In, OpCase, Out, as_f64, product_range

SHAPE = (2, 3, 4)


def _sigmoid(x):
    return 1 / (1 + math.exp(-x))


def _d_gelu_tanh(x):
    c = math.sqrt(2 / math.pi)
    g = c * (x + 0.044715 * x ** 3)
    return 0.5 * (1 + math.tanh(g)) + 0.5 * x * (1 - math.tanh(g) ** 2) * c * (1 + 3 * 0.044715 * x * x)


def _d_mish(x):
    sp = math.log1p(math.exp(x))
    return math.tanh(sp) + x * _sigmoid(x) * (1 - math.tanh(sp) ** 2)


# kind, attrs, derivative(v, attrs) at the input 0 value v, input 0 range
ELTWISE = [
    (K.AbsBackward, {}, lambda x, a: 1.0 if x > 0 else -1.0, (-3, 3)),
    (K.ClampBackward, {"min": -1.0, "max": 1.5, "use_dst": False},
     lambda x, a: 1.0 if -1.0 < x < 1.5 else 0.0, (-3, 3)),
    (K.ClampBackward, {"min": -1.0, "max": 1.5}, lambda d, a: 1.0 if -1.0 < d < 1.5 else 0.0,
     (-0.99, 1.49)),
    (K.EluBackward, {"alpha": 0.5, "use_dst": False},
     lambda x, a: 1.0 if x > 0 else 0.5 * math.exp(x), (-3, 3)),
    (K.EluBackward, {"alpha": 0.5}, lambda d, a: 1.0 if d > 0 else d + 0.5, (-0.49, 2)),
    (K.GELUBackward, {}, lambda x, a: 0.5 * (1 + math.erf(x / math.sqrt(2)))
     + x * math.exp(-x * x / 2) / math.sqrt(2 * math.pi), (-4, 4)),
    (K.GELUBackward, {"mode": "gelu_tanh"}, lambda x, a: _d_gelu_tanh(x), (-4, 4)),
    (K.HardSigmoidBackward, {"alpha": 0.25, "beta": 0.5},
     lambda x, a: 0.25 if -2 < x < 2 else 0.0, (-4, 4)),
    (K.HardSwishBackward, {}, lambda x, a: 0.0 if x < -3 else 1.0 if x > 3 else x / 3 + 0.5,
     (-5, 5)),
    (K.MishBackward, {}, lambda x, a: _d_mish(x), (-4, 4)),
    (K.ReLUBackward, {"use_dst": False}, lambda x, a: 1.0 if x > 0 else 0.0, (-3, 3)),
    (K.ReLUBackward, {}, lambda d, a: 1.0 if d > 0 else 0.0, (0, 3)),
    (K.SigmoidBackward, {"use_dst": False}, lambda x, a: _sigmoid(x) * (1 - _sigmoid(x)), (-6, 6)),
    (K.SigmoidBackward, {}, lambda d, a: d * (1 - d), (0.01, 0.99)),
    (K.SoftPlusBackward, {"beta": 2.0}, lambda x, a: _sigmoid(2 * x), (-4, 4)),
    (K.SqrtBackward, {"use_dst": False}, lambda x, a: 0.5 / math.sqrt(x), (0.1, 5)),
    (K.SqrtBackward, {}, lambda d, a: 0.5 / d, (0.1, 3)),
    (K.TanhBackward, {"use_dst": False}, lambda x, a: 1 - math.tanh(x) ** 2, (-3, 3)),
    (K.TanhBackward, {}, lambda d, a: 1 - d * d, (-0.99, 0.99)),
]


def _eltwise_expected(derivative):
    def expected(inputs, attrs):
        v, dd = as_f64(inputs[0]), as_f64(inputs[1])
        out = np.empty(v.shape)
        for i in np.ndindex(v.shape):
            out[i] = dd[i] * derivative(float(v[i]), attrs)
        return [out]
    return expected


def eltwise_cases():
    cases = []
    for kind, attrs, derivative, (low, high) in ELTWISE:
        tag = "_".join(f"{k}{v}" for k, v in attrs.items())
        for dt in ("f32", "bf16"):
            cases.append(OpCase(f"{kind.name}{'_' + tag if tag else ''}_{dt}", kind,
                                (In(SHAPE, dt, low, high), In(SHAPE, dt, -2, 2)), (Out(SHAPE, dt),),
                                _eltwise_expected(derivative), attrs))
    return cases


# --------------------------------------------------------------- softmax family
def _slices(shape, axis):
    """Every index tuple of ``shape`` with ``axis`` left free (as a slice)."""
    others = [range(d) if i != axis else [slice(None)] for i, d in enumerate(shape)]
    for idx in product_range(*[len(r) for r in others]):
        yield tuple(others[i][j] for i, j in enumerate(idx))


def _softmax_bwd(inputs, attrs):
    dd, y = as_f64(inputs[0]), as_f64(inputs[1])
    axis = attrs["axis"] % dd.ndim
    out = np.empty(dd.shape)
    for s in _slices(dd.shape, axis):
        dot = sum(a * b for a, b in zip(dd[s], y[s]))
        out[s] = [yi * (di - dot) for yi, di in zip(y[s], dd[s])]
    return [out]


def _log_softmax_bwd(inputs, attrs):
    dd, y = as_f64(inputs[0]), as_f64(inputs[1])
    axis = attrs["axis"] % dd.ndim
    out = np.empty(dd.shape)
    for s in _slices(dd.shape, axis):
        total = sum(dd[s])
        out[s] = [di - math.exp(yi) * total for yi, di in zip(y[s], dd[s])]
    return [out]


def _softmax_dst(shape, axis, seed):
    """A true softmax output (rows sum to 1), so the case is a real gradient."""
    x = np.random.default_rng(seed).normal(size=shape)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def softmax_cases():
    y = _softmax_dst(SHAPE, 1, 1)
    return [
        OpCase("SoftMaxBackward_axis1_f32", K.SoftMaxBackward,
               (In(SHAPE), In(SHAPE, values=y)), (Out(SHAPE),), _softmax_bwd, {"axis": 1}),
        OpCase("SoftMaxBackward_bf16_to_f32", K.SoftMaxBackward,
               (In(SHAPE, "bf16"), In(SHAPE, "bf16", values=y)), (Out(SHAPE, "f32"),),
               _softmax_bwd, {"axis": -2}),
        OpCase("LogSoftmaxBackward_f32", K.LogSoftmaxBackward,
               (In(SHAPE), In(SHAPE, values=np.log(_softmax_dst(SHAPE, 2, 2)))), (Out(SHAPE),),
               _log_softmax_bwd, {"axis": -1}),
    ]


# ------------------------------------------------------------ bias and PReLU
def _bias_bwd(inputs, attrs):
    dd = as_f64(inputs[0])
    c_axis = 1 if attrs["data_format"] == "NCX" else dd.ndim - 1
    out = np.zeros(dd.shape[c_axis])
    for i in np.ndindex(dd.shape):
        out[i[c_axis]] += dd[i]
    return [out]


def _prelu_bwd(inputs, attrs):
    x, slope, dd = (as_f64(v) for v in inputs)
    c_axis = 1 if attrs["data_format"] == "NCX" else x.ndim - 1
    dx, ds = np.empty(x.shape), np.zeros(slope.shape)
    for i in np.ndindex(x.shape):
        s = (i[c_axis],) if slope.ndim == 1 else tuple(0 if d == 1 else k for k, d in
                                                        zip(i[x.ndim - slope.ndim:], slope.shape))
        dx[i] = dd[i] if x[i] > 0 else slope[s] * dd[i]
        ds[s] += 0.0 if x[i] > 0 else x[i] * dd[i]
    return [dx, ds]


def bias_prelu_cases():
    return [
        OpCase("BiasAddBackward_NCX", K.BiasAddBackward, (In((2, 3, 4, 2)),), (Out((3,)),),
               _bias_bwd, {"data_format": "NCX"}),
        OpCase("BiasAddBackward_NXC_bf16", K.BiasAddBackward, (In((2, 3, 5), "bf16"),),
               (Out((5,), "bf16"),), _bias_bwd, {"data_format": "NXC"}),
        OpCase("PReLUBackward_channel_NCX", K.PReLUBackward,
               (In((2, 3, 4)), In((3,), low=0.1, high=0.9), In((2, 3, 4))),
               (Out((2, 3, 4)), Out((3,))), _prelu_bwd, {"data_format": "NCX"}),
        OpCase("PReLUBackward_broadcast_NXC", K.PReLUBackward,
               (In((2, 3, 4)), In((1, 1, 4), low=0.1, high=0.9), In((2, 3, 4))),
               (Out((2, 3, 4)), Out((1, 1, 4))), _prelu_bwd, {"data_format": "NXC"}),
    ]


# ------------------------------------------------------------ normalization
def _norm_groups(shape, reduced):
    """Index lists: one list of indices per statistics cell."""
    groups = {}
    for i in np.ndindex(shape):
        groups.setdefault(tuple(k for d, k in enumerate(i) if d not in reduced), []).append(i)
    return groups


def _norm_bwd(x, dd, mean, var, gamma, eps, reduced, stat_key, gamma_key):
    """dx = (g dd - mean(g dd) - xhat mean(g dd xhat)) / sigma per group."""
    dx = np.empty(x.shape)
    for key, cells in _norm_groups(x.shape, reduced).items():
        n = len(cells)
        m, v = mean[stat_key(key)], var[stat_key(key)]
        sigma = math.sqrt(v + eps)
        xhat = {i: (x[i] - m) / sigma for i in cells}
        gdd = {i: gamma[gamma_key(i)] * dd[i] for i in cells}
        mean_gdd = sum(gdd.values()) / n
        mean_gdd_xhat = sum(gdd[i] * xhat[i] for i in cells) / n
        for i in cells:
            dx[i] = (gdd[i] - mean_gdd - xhat[i] * mean_gdd_xhat) / sigma
    return dx


def _bn_bwd(inputs, attrs):
    x, dd, mean, var = (as_f64(v) for v in inputs[:4])
    c = 1 if attrs["data_format"] == "NCX" else x.ndim - 1
    gamma = as_f64(inputs[4]) if len(inputs) > 4 else np.ones(x.shape[c])
    eps = float(np.float32(attrs["epsilon"]))
    reduced = {d for d in range(x.ndim) if d != c}
    dx = _norm_bwd(x, dd, mean, var, gamma, eps, reduced, lambda k: k[0], lambda i: i[c])
    dg, db = np.zeros(x.shape[c]), np.zeros(x.shape[c])
    for i in np.ndindex(x.shape):
        dg[i[c]] += dd[i] * (x[i] - mean[i[c]]) / math.sqrt(var[i[c]] + eps)
        db[i[c]] += dd[i]
    return [dx, dg, db]


def _ln_bwd(inputs, attrs):
    x, dd, mean, var = (as_f64(v) for v in inputs[:4])
    begin = attrs["begin_norm_axis"] % x.ndim
    affine = attrs.get("use_affine", True)
    gamma = as_f64(inputs[4]) if affine else np.ones(x.shape[begin:])
    eps = float(np.float32(attrs["epsilon"]))
    reduced = set(range(begin, x.ndim))
    dx = _norm_bwd(x, dd, mean, var, gamma, eps, reduced, lambda k: k, lambda i: i[begin:])
    if not affine:
        return [dx]
    dg, db = np.zeros(x.shape[begin:]), np.zeros(x.shape[begin:])
    for i in np.ndindex(x.shape):
        dg[i[begin:]] += dd[i] * (x[i] - mean[i[:begin]]) / math.sqrt(var[i[:begin]] + eps)
        db[i[begin:]] += dd[i]
    return [dx, dg, db]


def norm_cases():
    # statistics: any mean and a positive variance (the gradient formula holds for them)
    return [
        OpCase("BatchNormTrainingBackward_NCX", K.BatchNormTrainingBackward,
               (In((2, 3, 2, 2)), In((2, 3, 2, 2)), In((3,), low=-0.5, high=0.5),
                In((3,), low=0.5, high=2), In((3,), low=0.5, high=1.5)),
               (Out((2, 3, 2, 2)), Out((3,)), Out((3,))), _bn_bwd,
               {"epsilon": 1e-3, "data_format": "NCX"}),
        OpCase("BatchNormTrainingBackward_NXC_no_gamma", K.BatchNormTrainingBackward,
               (In((2, 2, 3)), In((2, 2, 3)), In((3,), low=-0.5, high=0.5),
                In((3,), low=0.5, high=2)),
               (Out((2, 2, 3)),), _bn_bwd, {"epsilon": 1e-3, "data_format": "NXC"}),
        OpCase("LayerNormBackward_affine", K.LayerNormBackward,
               (In((2, 3, 4)), In((2, 3, 4)), In((2, 3), low=-0.5, high=0.5),
                In((2, 3), low=0.5, high=2), In((4,), low=0.5, high=1.5), In((4,))),
               (Out((2, 3, 4)), Out((4,)), Out((4,))), _ln_bwd,
               {"begin_norm_axis": -1, "epsilon": 1e-5}),
        OpCase("LayerNormBackward_two_dims_no_affine", K.LayerNormBackward,
               (In((2, 3, 4)), In((2, 3, 4)), In((2,), low=-0.5, high=0.5),
                In((2,), low=0.5, high=2)),
               (Out((2, 3, 4)),), _ln_bwd,
               {"begin_norm_axis": 1, "epsilon": 1e-5, "use_affine": False}),
    ]


# ----------------------------------------------------------- window ops (NCX)
def _taps(kernel):
    return product_range(*kernel)


def _conv_cells(out_sp, kernel, strides, pads, dilations, in_sp):
    """(output cell, tap, source cell) for every tap inside the source."""
    for y in product_range(*out_sp):
        for k in _taps(kernel):
            p = tuple(yy * s + kk * d - b for yy, s, kk, d, b in zip(y, strides, k, dilations, pads))
            if all(0 <= pp < n for pp, n in zip(p, in_sp)):
                yield y, k, p


def _conv_bwd_data(inputs, attrs):
    """dx[n, ci, p] += dy[n, co, y] w[co, ci, k] (OIX, 1 group)."""
    dy, w = as_f64(inputs[0]), as_f64(inputs[1])
    src_shape = tuple(attrs["dst_shape"])
    dx = np.zeros(src_shape)
    for y, k, p in _conv_cells(dy.shape[2:], w.shape[2:], attrs["strides"], attrs["pads_begin"],
                               attrs["dilations"], src_shape[2:]):
        for n, co, ci in product_range(dy.shape[0], w.shape[0], w.shape[1]):
            dx[(n, ci) + p] += dy[(n, co) + y] * w[(co, ci) + k]
    return [dx]


def _conv_bwd_weights(inputs, attrs):
    """dw[co, ci, k] += x[n, ci, p] dy[n, co, y]."""
    x, dy = as_f64(inputs[0]), as_f64(inputs[1])
    dw = np.zeros(tuple(attrs["weights_shape"]))
    for y, k, p in _conv_cells(dy.shape[2:], dw.shape[2:], attrs["strides"], attrs["pads_begin"],
                               attrs["dilations"], x.shape[2:]):
        for n, co, ci in product_range(x.shape[0], dw.shape[0], dw.shape[1]):
            dw[(co, ci) + k] += x[(n, ci) + p] * dy[(n, co) + y]
    return [dw]


def _deconv_bwd_data(inputs, attrs):
    """ConvTranspose y[n, o, q*s + k*d - pb] += x[n, i, q] w[i, o, k] (IOX), so
    dx[n, i, q] = sum dy[n, o, q*s + k*d - pb] w[i, o, k]."""
    dy, w = as_f64(inputs[0]), as_f64(inputs[1])
    dx = np.zeros((dy.shape[0], w.shape[0]) + tuple(attrs["src_spatial"]))
    for q, k, p in _conv_cells(dx.shape[2:], w.shape[2:], attrs["strides"], attrs["pads_begin"],
                               attrs["dilations"], dy.shape[2:]):
        for n, i, o in product_range(dy.shape[0], w.shape[0], w.shape[1]):
            dx[(n, i) + q] += dy[(n, o) + p] * w[(i, o) + k]
    return [dx]


def _deconv_bwd_weights(inputs, attrs):
    x, dy = as_f64(inputs[0]), as_f64(inputs[1])
    dw = np.zeros(tuple(attrs["weights_shape"]))
    for q, k, p in _conv_cells(x.shape[2:], dw.shape[2:], attrs["strides"], attrs["pads_begin"],
                               attrs["dilations"], dy.shape[2:]):
        for n, i, o in product_range(x.shape[0], dw.shape[0], dw.shape[1]):
            dw[(i, o) + k] += x[(n, i) + q] * dy[(n, o) + p]
    return [dw]


def _avg_pool_bwd(inputs, attrs):
    dy = as_f64(inputs[0])
    src_shape = tuple(attrs["src_shape"])
    dx = np.zeros(src_shape)
    kernel, ones = attrs["kernel"], [1] * len(attrs["kernel"])
    per_cell = {}
    for y, k, p in _conv_cells(dy.shape[2:], kernel, attrs["strides"], attrs["pads_begin"], ones,
                               src_shape[2:]):
        per_cell.setdefault(y, []).append(p)
    for y, cells in per_cell.items():
        divisor = len(cells) if attrs["exclude_pad"] else math.prod(kernel)
        for n, c in product_range(*dy.shape[:2]):
            for p in cells:
                dx[(n, c) + p] += dy[(n, c) + y] / divisor
    return [dx]


def _max_pool_bwd(inputs, attrs):
    x, dy = as_f64(inputs[0]), as_f64(inputs[1])
    dx = np.zeros(x.shape)
    per_cell = {}
    for y, k, p in _conv_cells(dy.shape[2:], attrs["kernel"], attrs["strides"], attrs["pads_begin"],
                               [1] * len(attrs["kernel"]), x.shape[2:]):
        per_cell.setdefault(y, []).append(p)
    for y, cells in per_cell.items():
        for n, c in product_range(*dy.shape[:2]):
            best = max(cells, key=lambda p: x[(n, c) + p])  # values are distinct
            dx[(n, c) + best] += dy[(n, c) + y]
    return [dx]


def window_cases():
    conv = dict(strides=[2, 1], pads_begin=[1, 0], pads_end=[1, 1], dilations=[1, 2],
                data_format="NCX", weights_format="OIX")
    deconv = dict(strides=[2, 2], pads_begin=[1, 0], pads_end=[0, 1], dilations=[1, 1],
                  data_format="NCX", weights_format="IOX")
    pool = dict(kernel=[3, 2], strides=[2, 1], pads_begin=[1, 0], pads_end=[1, 1],
                data_format="NCX")
    return [
        OpCase("ConvolutionBackwardData_NCX_OIX", K.ConvolutionBackwardData,
               (In((2, 3, 3, 3)), In((3, 2, 3, 2))), (Out((2, 2, 5, 4)),), _conv_bwd_data,
               dict(conv, dst_shape=[2, 2, 5, 4])),
        OpCase("ConvolutionBackwardWeights_NCX_OIX", K.ConvolutionBackwardWeights,
               (In((2, 2, 5, 4)), In((2, 3, 3, 3))), (Out((3, 2, 3, 2)),), _conv_bwd_weights,
               dict(conv, weights_shape=[3, 2, 3, 2])),
        OpCase("ConvTransposeBackwardData_NCX_IOX", K.ConvTransposeBackwardData,
               (In((1, 2, 6, 8)), In((3, 2, 3, 3))), (Out((1, 3, 3, 4)),),
               lambda i, a: _deconv_bwd_data(i, dict(a, src_spatial=[3, 4])), deconv),
        OpCase("ConvTransposeBackwardWeights_NCX_IOX", K.ConvTransposeBackwardWeights,
               (In((1, 3, 3, 4)), In((1, 2, 6, 8))), (Out((3, 2, 3, 3)),), _deconv_bwd_weights,
               dict(deconv, weights_shape=[3, 2, 3, 3])),
        OpCase("AvgPoolBackward_exclude_pad", K.AvgPoolBackward, (In((2, 2, 3, 3)),),
               (Out((2, 2, 5, 3)),), _avg_pool_bwd,
               dict(pool, exclude_pad=True, src_shape=[2, 2, 5, 3])),
        OpCase("AvgPoolBackward_include_pad_bf16", K.AvgPoolBackward, (In((2, 2, 3, 3), "bf16"),),
               (Out((2, 2, 5, 3), "bf16"),), _avg_pool_bwd,
               dict(pool, exclude_pad=False, src_shape=[2, 2, 5, 3])),
        OpCase("MaxPoolBackward_NCX", K.MaxPoolBackward,
               (In((2, 2, 5, 3), values=np.random.default_rng(3).permutation(60).reshape(2, 2, 5, 3)),
                In((2, 2, 3, 3))), (Out((2, 2, 5, 3)),), _max_pool_bwd, pool),
    ]


def backward_cases():
    return eltwise_cases() + softmax_cases() + bias_prelu_cases() + norm_cases() + window_cases()

"""Composite op cases (extension): shipped composites called as single ops.

On the reference kernels they run their decomposition; through the public API
as single-op graphs they run their fast kernel (the runtime's Tanh/RMSNorm).
"""
from __future__ import annotations

import math

import numpy as np

from graph_api.enums import OpKind as K

from .records import In, OpCase, Out, Tol, as_f64, each


def _rms_norm(inputs, attrs):
    x, gamma = as_f64(inputs[0]), as_f64(inputs[1])
    out = np.empty(x.shape)
    for row in np.ndindex(x.shape[:-1]):
        mean_sq = sum(v * v for v in x[row]) / x.shape[-1]
        out[row] = [v / math.sqrt(mean_sq + attrs["epsilon"]) * g for v, g in zip(x[row], gamma)]
    return [out]


def composite_cases():
    return [
        # the decomposition's rational approximation is within 3.7e-7 of tanh on [-9, 9]
        # (tests/graph_api/test_composite.py); the Tanh op within an ulp
        OpCase("Composite_tanh", K.Composite, (In((3, 17), "f32", -9, 9),), (Out((3, 17)),),
               lambda ins, a: [each(math.tanh, ins[0])], {"name": "tanh"},
               Tol(0.0, 5e-7, "rational approximation error 3.7e-7 absolute on [-9, 9]"),
               seed=9100),
        OpCase("Composite_rms_norm", K.Composite, (In((2, 3, 8), "f32"), In((8,), "f32", 0.5, 2)),
               (Out((2, 3, 8)),), _rms_norm, {"name": "rms_norm", "version": 1, "epsilon": 1e-4},
               seed=9101),
    ]

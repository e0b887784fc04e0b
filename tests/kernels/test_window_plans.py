"""Lone Convolution, ConvTranspose, pooling, Interpolate and BatchNormForwardTraining
partitions on their fast plans (conv_plan; kernels/fused/forward_window_plan.py),
against the float64 reference.

Tolerance as in test_backward_plans.py (graph_api.check.compare): f32 rtol
2e-5 of ``|ref| + max|ref|`` covers f32 sums of at most a few hundred terms
(pool windows, conv reductions <= 72 terms, BatchNorm statistics accumulated in
f64); bf16 outputs are one rounding of the f32 value, at most one bf16 ulp from
the reference's rounding of the f64 value, within the 4 ulps compare allows.
(MaxPool and nearest Interpolate only select values, so they agree exactly.)
"""
from __future__ import annotations

import numpy as np
import pytest

from graph_api.enums import OpKind as K

from ..patterns.builder import dt
from .test_backward import make_op
from .test_backward_plans import DTYPES, NORM_DTYPES, check_against_reference
from .test_backward_window import CONV, DECONV, INTERP, POOL, inferred


def _dst(kind, in_shapes, attrs):
    return inferred(make_op(kind, in_shapes, [None], **attrs))[0]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(CONV))
def test_lone_convolution(name, dtype):
    src_shape, w_shape, attrs = CONV[name]
    rng = np.random.default_rng(31)
    check_against_reference(K.Convolution, [rng.normal(size=src_shape), rng.normal(size=w_shape)],
                            [_dst(K.Convolution, [src_shape, w_shape], attrs)], attrs, dtype,
                            "conv_im2col_blas")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(DECONV))
def test_lone_conv_transpose(name, dtype):
    src_shape, w_shape, attrs = DECONV[name]
    rng = np.random.default_rng(32)
    check_against_reference(K.ConvTranspose, [rng.normal(size=src_shape), rng.normal(size=w_shape)],
                            [_dst(K.ConvTranspose, [src_shape, w_shape], attrs)], attrs, dtype,
                            "conv_im2col_blas")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(POOL))
def test_lone_pooling(name, dtype):
    src_shape, attrs = POOL[name]
    rng = np.random.default_rng(33)
    x = rng.normal(size=src_shape)
    check_against_reference(K.AvgPool, [x], [_dst(K.AvgPool, [src_shape], attrs)], attrs, dtype,
                            "numpy_f32_pool")
    for ceil in ("floor", "ceil"):
        max_attrs = {**{k: v for k, v in attrs.items() if k != "exclude_pad"}, "rounding_type": ceil}
        check_against_reference(K.MaxPool, [x], [_dst(K.MaxPool, [src_shape], max_attrs)], max_attrs,
                                dtype, "numpy_f32_pool")


def test_avg_pool_ceil_mode_divides_by_the_cells_inside():
    src_shape, attrs = POOL["nxc-pad-include"]
    attrs = {**attrs, "rounding_type": "ceil"}
    x = np.random.default_rng(34).normal(size=src_shape)
    check_against_reference(K.AvgPool, [x], [_dst(K.AvgPool, [src_shape], attrs)], attrs, dt.f32)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("mode,ctm,src_shape,size", INTERP, ids=[c[0] for c in INTERP])
def test_lone_interpolate(mode, ctm, src_shape, size, dtype):
    attrs = dict(mode=mode, coordinate_transformation_mode=ctm, data_format="NCX", **size)
    x = np.random.default_rng(35).normal(size=src_shape)
    check_against_reference(K.Interpolate, [x], [_dst(K.Interpolate, [src_shape], attrs)], attrs, dtype,
                            "numpy_f32_interpolate")


@pytest.mark.parametrize("dtype", NORM_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("fmt,affine", [("NCX", True), ("NXC", False)])
def test_lone_batchnorm_training(fmt, affine, dtype):
    shape = (4, 5, 6, 7) if fmt == "NCX" else (4, 6, 7, 5)
    c = 5
    rng = np.random.default_rng(36)
    params = [rng.normal(size=c), rng.uniform(0.5, 2, c)] + \
             ([rng.uniform(0.5, 1.5, c), rng.normal(size=c)] if affine else [])
    # stats vectors share T1 here (bf16 with bf16 data), as T2 may
    check_against_reference(K.BatchNormForwardTraining, [rng.normal(size=shape) * 3 + 1] + params,
                            [shape] + [(c,)] * 4, {"epsilon": 1e-3, "momentum": 0.25, "data_format": fmt},
                            dtype, "numpy_f32_batchnorm_training")

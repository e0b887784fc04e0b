"""oneDNN's call forms, spelled in Python: each overload as oneDNN's C++ API writes it."""
import numpy as np
import pytest

import graph_api as ga

D, L, P = ga.DataType, ga.LayoutType, ga.PropertyType


# ------------------------------------------------------------ logical_tensor overloads
def test_ndims_layout_property_form_has_unknown_dims():
    lt = ga.LogicalTensor(4, D.f32, 4, L.undef, P.constant)
    assert (lt.ndims, lt.shape, lt.layout, lt.property) == (4, (-1,) * 4, L.undef, P.constant)


def test_ndims_minus_one_is_unknown_rank():
    assert ga.LogicalTensor(1, D.f32, -1, L.any).shape is None


def test_host_scalar_by_ndims_form():
    lt = ga.LogicalTensor(7, D.f32, 0, L.strided, P.host_scalar)
    assert (lt.shape, lt.property) == ((), P.host_scalar)


def test_dims_layout_form_derives_dense_strides():
    lt = ga.LogicalTensor(2, D.f32, [2, 0, 3], L.strided)
    assert lt.strides == (3, 3, 1)  # a 0 dim counts as 1, as oneDNN does
    assert ga.LogicalTensor(2, D.f32, [2, 3], L.any, P.constant).property == P.constant


def test_layout_only_form_has_unknown_rank():
    lt = ga.LogicalTensor(3, D.bf16, L.any)
    assert (lt.shape, lt.layout) == (None, L.any)


def test_dims_strides_property_form():
    lt = ga.LogicalTensor(5, D.f32, [2, 3], [1, 2], P.constant)
    assert (lt.strides, lt.layout, lt.property) == ((1, 2), L.strided, P.constant)


def test_existing_keyword_and_layout_after_strides_forms_still_work():
    a = ga.LogicalTensor(5, D.f32, [2, 3], [1, 2], L.strided, P.constant)
    b = ga.LogicalTensor(5, "f32", shape=[2, 3], strides=[1, 2], property="constant")
    assert a == b


@pytest.mark.parametrize("args", [
    (D.f32, 3, [1, 1, 1]),                 # ndims needs a layout type, not strides
    (D.f32, P.constant),                   # a property is not ndims, dims or a layout
    (D.f32, 13, L.strided),                # more than DNNL_MAX_NDIMS
    (D.f32, L.strided, L.strided),         # nothing but a property after a layout-only form
    (D.f32, [2], L.strided, P.constant, P.constant),
    (D.f32, [2], [1], P.constant, P.variable),
    (D.f32, "x", L.strided),
])
def test_wrong_argument_types_are_invalid_arguments(args):
    with pytest.raises(ga.InvalidArguments):
        ga.LogicalTensor(1, *args)

"""Property tests of the dtype table helpers (hypothesis)."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import graph_api as ga
from graph_api import dtypes
from graph_api.dtypes import DataType as dt


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-8, 7), min_size=0, max_size=65))
def test_pack_unpack_int4_round_trip(values):
    packed = dtypes.pack_int4(np.array(values, dtype=np.int64))
    assert packed.size == (len(values) + 1) // 2
    np.testing.assert_array_equal(dtypes.unpack_int4(packed, len(values), True).astype(int), values)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float64, st.integers(1, 40), elements=st.floats(-1e6, 1e6)),
       st.sampled_from([dt.s8, dt.u8, dt.s4, dt.u4, dt.s32]))
def test_convert_to_int_rounds_half_even_and_saturates(values, dtype):
    info = dtypes.info(dtype)
    got = dtypes.convert(values, dtype).astype(np.int64)
    want = [min(max(round(v), info.lowest), info.highest) for v in values.tolist()]  # round: half even
    np.testing.assert_array_equal(got, want)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 40), elements=st.floats(-1e5, 1e5, width=32)))
def test_convert_f8_e4m3_saturates_and_keeps_order(values):
    got = dtypes.convert(values, dt.f8_e4m3).astype(np.float32)
    assert np.all(np.abs(got) <= 448) and not np.isnan(got).any()
    order = np.argsort(values, kind="stable")
    assert np.all(np.diff(got[order]) >= 0)  # rounding is monotonic


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 6), st.booleans())
def test_tensor_round_trips_values_for_any_strides(rows, cols, transposed):
    shape = [rows, cols]
    strides = [1, rows] if transposed else None
    rng = np.random.default_rng(rows * 7 + cols)
    for dtype in (dt.f32, dt.bf16, dt.s4, dt.u8, dt.f8_e5m2):
        lt = ga.LogicalTensor(0, dtype, shape, strides)
        values = dtypes.convert(rng.integers(-3, 4, shape), dtype)
        t = ga.Tensor(lt, ga.Engine(), values)
        np.testing.assert_array_equal(t.numpy().astype(np.float32), values.astype(np.float32))
        assert t.get_data_handle().nbytes == lt.size_in_bytes()

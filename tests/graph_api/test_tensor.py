"""Logical tensors and tensors: sizes, strides, packed int4, host scalars."""
import ml_dtypes
import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import dtypes


def test_size_in_bytes_counts_int4_as_half_a_byte():
    assert ga.LogicalTensor(0, dt.s4, [3, 5]).size_in_bytes() == 8  # 15 nibbles -> 8 bytes
    assert ga.LogicalTensor(0, dt.u4, [4, 4]).size_in_bytes() == 8
    assert ga.LogicalTensor(0, dt.f32, [4, 4]).size_in_bytes() == 64
    assert ga.LogicalTensor(0, dt.bf16, [2, 3], [1, 2]).size_in_bytes() == 12
    assert ga.LogicalTensor(0, dt.f32, [0, 4]).size_in_bytes() == 0
    assert ga.LogicalTensor(0, dt.f32, []).size_in_bytes() == 4
    assert ga.LogicalTensor(0, dt.f32).size_in_bytes() == -1  # unknown rank


def test_unknown_rank_and_dims_allowed_while_building():
    lt = ga.LogicalTensor(7, dt.f16, [-1, 8])
    assert lt.ndims == 2 and not lt.is_shape_known()
    assert ga.LogicalTensor(8, dt.f16).ndims == -1
    with pytest.raises(ga.InvalidArguments):
        ga.LogicalTensor(8, dt.f16).get_dims()


def test_dense_strides_and_equality():
    lt = ga.LogicalTensor(1, dt.f32, [2, 3, 4])
    assert lt.strides == (12, 4, 1)
    assert lt == ga.LogicalTensor(1, "f32", (2, 3, 4))
    assert lt != ga.LogicalTensor(1, dt.f32, [2, 3, 4], [1, 2, 6])


@pytest.mark.parametrize("bad", [
    dict(id=-1, dtype=dt.f32), dict(id=0, dtype="f99"), dict(id=0, dtype=dt.f32, shape=[1] * 13),
    dict(id=0, dtype=dt.bf16, property=ga.PropertyType.host_scalar),
    dict(id=0, dtype=dt.f32, shape=[2], property=ga.PropertyType.host_scalar),
])
def test_bad_logical_tensors_raise_typed_errors(bad):
    with pytest.raises((ga.InvalidArguments, ga.InvalidDataType)):
        ga.LogicalTensor(**bad)


@pytest.mark.parametrize("dtype", [dt.s4, dt.u4])
@pytest.mark.parametrize("strides", [None, [1, 3]])
def test_int4_tensor_packs_low_nibble_first(dtype, strides):
    rng = np.random.default_rng(0)
    lo, hi = (-8, 8) if dtype == dt.s4 else (0, 16)
    values = rng.integers(lo, hi, size=(3, 5))
    lt = ga.LogicalTensor(0, dtype, [3, 5], strides)
    t = ga.Tensor(lt, ga.Engine(), values.astype(dtypes.numpy_dtype(dtype)))
    assert t.get_data_handle().dtype == np.uint8 and t.get_data_handle().size == lt.size_in_bytes()
    np.testing.assert_array_equal(t.numpy().astype(np.int64), values)
    # element at strided offset i lives in byte i // 2, low nibble when i is even
    raw = t.get_data_handle()
    st = lt.strides
    for (r, c), v in np.ndenumerate(values):
        off = r * st[0] + c * st[1]
        nib = (raw[off // 2] >> (4 * (off % 2))) & 0xF
        assert nib == (v & 0xF)


def test_int4_tensor_accepts_packed_bytes():
    packed = dtypes.pack_int4(np.array([1, -2, 3, -4, 5, -6]))
    t = ga.Tensor(ga.LogicalTensor(0, dt.s4, [2, 3]), ga.Engine(), packed)
    np.testing.assert_array_equal(t.numpy().astype(int), [[1, -2, 3], [-4, 5, -6]])


def test_tensor_wraps_user_memory_without_copy():
    a = np.zeros((2, 3), np.float32)
    t = ga.Tensor(ga.LogicalTensor(0, dt.f32, [2, 3]), ga.Engine(), a)
    t.write(np.ones((2, 3), np.float32))
    assert a.sum() == 6


def test_tensor_rejects_wrong_dtype_and_shape():
    with pytest.raises(ga.InvalidDataType):
        ga.Tensor(ga.LogicalTensor(0, dt.bf16, [2]), ga.Engine(), np.zeros(2, np.float32))
    with pytest.raises(ga.InvalidShape):
        ga.Tensor(ga.LogicalTensor(0, dt.f32, [2, 3]), ga.Engine(), np.zeros((3, 2), np.float32))
    with pytest.raises(ga.InvalidArguments):
        ga.Tensor(ga.LogicalTensor(0, dt.f32, [-1, 3]), ga.Engine())


def test_strided_tensor_view_follows_strides():
    lt = ga.LogicalTensor(0, dt.f32, [2, 3], [1, 2])  # column-major
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = ga.Tensor(lt, ga.Engine(), data)
    np.testing.assert_array_equal(t.numpy(), data)
    np.testing.assert_array_equal(t.get_data_handle(), data.T.reshape(-1))


def test_make_scalar_tensor():
    lt = ga.LogicalTensor(3, dt.f32, [], property=ga.PropertyType.host_scalar)
    t = ga.make_scalar_tensor(lt, 0.125)
    assert t.numpy().shape == () and float(t.numpy()) == 0.125
    with pytest.raises(ga.InvalidArguments):
        ga.make_scalar_tensor(ga.LogicalTensor(4, dt.f32, []), 1.0)


def test_dtype_convert_saturates_like_onednn():
    np.testing.assert_array_equal(
        dtypes.convert(np.array([1e4, -1e4, 2.5, 3.5]), dt.f8_e4m3).astype(np.float32), [448, -448, 2.5, 3.5])
    np.testing.assert_array_equal(dtypes.convert(np.array([7.6, -9.0, 2.5, -0.5]), dt.s4).astype(int), [7, -8, 2, 0])
    np.testing.assert_array_equal(dtypes.convert(np.array([300.0, -3.0]), dt.u8), [255, 0])
    assert dtypes.convert(np.array([1 + 2**-9], np.float32), dt.bf16)[0] == ml_dtypes.bfloat16(1.0)

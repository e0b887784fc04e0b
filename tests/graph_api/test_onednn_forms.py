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


# ------------------------------------------------------------ partition(op, engine_kind)
def _relu_op(op_id=0, shape=(2, 3)):
    src = ga.LogicalTensor(10 * op_id, D.f32, list(shape), L.strided)
    dst = ga.LogicalTensor(10 * op_id + 1, D.f32, list(shape), L.strided)
    return ga.Op(op_id, ga.OpKind.ReLU, [src], [dst], "relu"), src, dst


def test_single_op_partition_compiles_and_executes():
    op, src, dst = _relu_op()
    part = ga.Partition(op, ga.EngineKind.cpu)
    assert (part.get_ops(), part.is_supported(), part.get_engine_kind()) == ([0], True, ga.EngineKind.cpu)
    assert [lt.id for lt in part.get_input_ports()] == [0]
    assert [lt.id for lt in part.get_output_ports()] == [1]
    eng = ga.Engine(ga.EngineKind.cpu)
    x = np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)
    out = ga.Tensor(dst, eng)
    part.compile([src], [dst], eng).execute(ga.Stream(eng), [ga.Tensor(src, eng, x)], [out])
    np.testing.assert_array_equal(out.numpy(), np.maximum(x, 0))  # ReLU is exact


def test_single_op_partition_of_a_placeholder_is_unsupported():
    lt = ga.LogicalTensor(0, D.f32, [2], L.strided)
    part = ga.Partition(ga.Op(3, ga.OpKind.Wildcard, [lt], [ga.LogicalTensor(1, D.f32, [2], L.strided)]), "cpu")
    assert not part.is_supported()


def test_single_op_partition_refuses_other_engines_and_arguments():
    op, _, _ = _relu_op()
    with pytest.raises(ga.InvalidArguments):
        ga.Partition(op, ga.EngineKind.gpu)
    with pytest.raises(ga.InvalidArguments):
        ga.Partition("relu", ga.EngineKind.cpu)


# ------------------------------------------------------------ compiled partition cache
@pytest.fixture
def cache_capacity():
    saved = ga.get_compiled_partition_cache_capacity()
    yield ga.set_compiled_partition_cache_capacity
    ga.set_compiled_partition_cache_capacity(saved)


def test_cache_capacity_default_is_onednns():
    assert ga.get_compiled_partition_cache_capacity() == 1024


def test_cache_hit_returns_the_same_compiled_partition(cache_capacity):
    op, src, dst = _relu_op()
    part = ga.Partition(op, "cpu")
    assert part.compile([src], [dst]) is part.compile([src], [dst])


def test_cache_capacity_zero_recompiles(cache_capacity):
    cache_capacity(0)
    assert ga.get_compiled_partition_cache_capacity() == 0
    op, src, dst = _relu_op()
    part = ga.Partition(op, "cpu")
    assert part.compile([src], [dst]) is not part.compile([src], [dst])


def test_cache_capacity_one_evicts_the_least_recent(cache_capacity):
    cache_capacity(1)
    op_a, src_a, dst_a = _relu_op(1)
    op_b, src_b, dst_b = _relu_op(2)
    a, b = ga.Partition(op_a, "cpu"), ga.Partition(op_b, "cpu")
    first = a.compile([src_a], [dst_a])
    assert a.compile([src_a], [dst_a]) is first
    b.compile([src_b], [dst_b])  # evicts a's entry
    assert a.compile([src_a], [dst_a]) is not first


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8"])
def test_cache_capacity_must_be_a_non_negative_int(bad, cache_capacity):
    with pytest.raises(ga.InvalidArguments):
        ga.set_compiled_partition_cache_capacity(bad)


def test_cache_is_shared_by_threads_and_stays_within_capacity(cache_capacity):
    from concurrent.futures import ThreadPoolExecutor

    from graph_api.partition_cache import CACHE

    cache_capacity(3)
    built = [_relu_op(i) for i in range(1, 7)]
    parts = [ga.Partition(op, "cpu") for op, _, _ in built]

    def compile_all(_):
        return [p.compile([s], [d]) for p, (_, s, d) in zip(parts, built)]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(compile_all, range(8)))
    assert all(len(r) == 6 for r in results)
    assert len(CACHE._entries) <= 3


# ------------------------------------------------------------ tensor(lt, eng, handle + offset)
def test_tensor_at_an_offset_is_a_zero_copy_view():
    lt = ga.LogicalTensor(0, D.f32, [2, 3], [4, 1])  # rows padded to 4: span 2*4-1 = 7
    buffer = np.arange(20, dtype=np.float32)
    t = ga.Tensor(lt, ga.Engine(), buffer, offset=5)
    np.testing.assert_array_equal(t.numpy(), [[5, 6, 7], [9, 10, 11]])
    assert np.shares_memory(t.numpy(), buffer)


def test_partition_writes_outputs_in_place_at_the_offset():
    op, src, dst = _relu_op()
    eng = ga.Engine()
    part = ga.Partition(op, "cpu")
    arena = np.full(16, 7.0, dtype=np.float32)
    x = np.array([[-1, 2, -3], [4, -5, 6]], dtype=np.float32)
    out = ga.Tensor(dst, eng, arena, offset=10)
    part.compile([src], [dst], eng).execute(ga.Stream(eng), [ga.Tensor(src, eng, x)], [out])
    np.testing.assert_array_equal(arena[10:], np.maximum(x, 0).reshape(-1))
    np.testing.assert_array_equal(arena[:10], 7.0)  # nothing before the offset is touched


def test_tensor_offset_buffer_too_small_states_the_span():
    lt = ga.LogicalTensor(0, D.f32, [2, 3], [4, 1])
    with pytest.raises(ga.InvalidArguments, match="span 7 elements, so it needs at least 12"):
        ga.Tensor(lt, ga.Engine(), np.zeros(11, np.float32), offset=5)


def test_tensor_offset_refuses_bad_buffers_and_offsets():
    lt = ga.LogicalTensor(0, D.f32, [2], L.strided)
    with pytest.raises(ga.InvalidArguments):
        ga.Tensor(lt, ga.Engine(), np.zeros((2, 2), np.float32), offset=0)
    with pytest.raises(ga.InvalidArguments):
        ga.Tensor(lt, ga.Engine(), np.zeros(4, np.float32), offset=-1)
    with pytest.raises(ga.InvalidDataType):
        ga.Tensor(lt, ga.Engine(), np.zeros(4, np.float64), offset=1)
    packed = ga.LogicalTensor(1, D.s4, [4], L.strided)
    with pytest.raises(ga.InvalidArguments, match="even element offset"):
        ga.Tensor(packed, ga.Engine(), np.zeros(8, np.uint8), offset=3)


def test_packed_tensor_at_an_even_offset_reads_its_bytes():
    packed = ga.LogicalTensor(1, D.u4, [4], L.strided)
    raw = np.array([0xFF, 0x21, 0x43], dtype=np.uint8)  # low nibble first
    t = ga.Tensor(packed, ga.Engine(), raw, offset=2)
    np.testing.assert_array_equal(t.numpy().astype(int), [1, 2, 3, 4])


def test_set_data_handle_at_an_offset_moves_the_window():
    lt = ga.LogicalTensor(0, D.f32, [3], L.strided)
    buffer = np.arange(10, dtype=np.float32)
    t = ga.Tensor(lt, ga.Engine(), buffer, offset=0)
    t.set_data_handle(buffer, offset=6)
    np.testing.assert_array_equal(t.numpy(), [6, 7, 8])
    with pytest.raises(ga.InvalidArguments, match="needs at least 11"):
        t.set_data_handle(buffer, offset=8)
    np.testing.assert_array_equal(t.numpy(), [6, 7, 8])  # a refused handle changes nothing

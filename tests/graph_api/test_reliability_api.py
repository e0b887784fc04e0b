"""Regression tests for the API-side defects of issue 8 (reliability) and the
quantization-parameter validation of issue 11: one test per defect.

Every expected value is an independent numpy formula; ReLU and Add are exact in
f32, so results are compared exactly.
"""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api import dtypes
from graph_api.fill import fill_inputs
from graph_api.rewrite import power_of_two_scales

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ga.Engine()
STREAM = ga.Stream(ENGINE)


def _single_op(kind, in_lts, out_lts, attrs=None):
    g = ga.Graph(ga.EngineKind.cpu)
    g.add_op(ga.Op(0, kind, in_lts, out_lts, attrs=attrs or {}))
    g.finalize()
    (part,) = g.get_partitions()
    return part


def _relu(shape, out_strides=None):
    """A compiled single-ReLU partition: input id 0, output id 1."""
    x, y = ga.LogicalTensor(0, dt.f32, shape), ga.LogicalTensor(1, dt.f32, shape)
    out = ga.LogicalTensor(1, dt.f32, shape, out_strides)
    return _single_op(K.ReLU, [x], [y]).compile([x], [out], ENGINE)


X8 = np.array([-4, -3, -2, -1, 0, 1, 2, 3], np.float32)
RELU8 = np.maximum(X8, 0)


# ---------------------------------------------------------------- defect 2: handles vs strides
def test_reversed_output_handle_is_stored_in_bounds():
    # Before the fix the kernel wrote 8 floats forward from the handle's first
    # element (the last one in memory): out of bounds.  A subprocess turns a
    # crash into a failed assertion instead of a dead test run.
    code = textwrap.dedent("""
        import json, numpy as np, graph_api as ga
        from tests.graph_api.test_reliability_api import _relu, X8, ENGINE, STREAM
        cp = _relu([8])
        guard = np.full(24, 7.0, np.float32)
        base = guard[8:16]
        out = ga.Tensor(cp.query_logical_tensor(1), ENGINE)
        out.set_data_handle(base[::-1])
        cp.execute(STREAM, [ga.Tensor(cp.query_logical_tensor(0), ENGINE, X8)], [out])
        print(json.dumps(guard.tolist()))
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    guard = np.array(json.loads(run.stdout.strip().splitlines()[-1]), np.float32)
    np.testing.assert_array_equal(guard[8:16], RELU8[::-1])
    np.testing.assert_array_equal(np.r_[guard[:8], guard[16:]], 7.0)  # nothing outside written


def test_strided_output_handle_writes_only_its_elements():
    cp = _relu([8])
    parent = np.full(16, 7.0, np.float32)
    out = ga.Tensor(cp.query_logical_tensor(1), ENGINE)
    out.set_data_handle(parent[::2])
    cp.execute(STREAM, [ga.Tensor(cp.query_logical_tensor(0), ENGINE, X8)], [out])
    np.testing.assert_array_equal(parent[::2], RELU8)
    np.testing.assert_array_equal(parent[1::2], 7.0)


def test_strided_input_handle_reads_its_elements():
    cp = _relu([8])
    parent = np.empty(16, np.float32)
    parent[::2], parent[1::2] = X8, np.nan
    inp = ga.Tensor(cp.query_logical_tensor(0), ENGINE)
    inp.set_data_handle(parent[::2])
    out = ga.Tensor(cp.query_logical_tensor(1), ENGINE)
    cp.execute(STREAM, [inp], [out])
    np.testing.assert_array_equal(out.numpy(), RELU8)


def test_noncontiguous_packed_int4_bytes_are_read_as_values():
    """Every other byte of a bigger array is the packed int4 buffer: the fused
    int4 MatMul must see those bytes, not their contiguous neighbours."""
    n, k, group = 16, 64, 32
    rng = np.random.default_rng(3)
    w_vals = rng.integers(-8, 8, (n, k))
    packed = dtypes.pack_int4(w_vals)
    holder = np.zeros(2 * packed.size, np.uint8)
    holder[::2], holder[1::2] = packed, 0x77  # neighbours hold (7, 7)
    scales = np.full((n, k // group), 0.5, np.float32)
    x = rng.integers(-3, 4, (2, k)).astype(np.float32)
    w_lt = ga.LogicalTensor(0, dt.s4, [n, k], property=ga.PropertyType.constant)
    s_lt = ga.LogicalTensor(1, dt.f32, [n, k // group], property=ga.PropertyType.constant)
    wf_lt, x_lt, y_lt = (ga.LogicalTensor(2, dt.f32, [n, k]), ga.LogicalTensor(3, dt.f32, [2, k]),
                         ga.LogicalTensor(4, dt.f32, [2, n]))
    g = ga.Graph(ga.EngineKind.cpu)
    g.add_op(ga.Op(0, K.DynamicDequantize, [w_lt, s_lt], [wf_lt],
                   attrs={"qtype": "per_group", "group_shape": [1, group]}))
    g.add_op(ga.Op(1, K.MatMul, [x_lt, wf_lt], [y_lt], attrs={"transpose_b": True}))
    g.finalize()
    (part,) = g.get_partitions()
    cp = part.compile([w_lt, s_lt, x_lt], [y_lt], ENGINE)
    w_t = ga.Tensor(w_lt, ENGINE, holder[::2])
    y = ga.Tensor(y_lt, ENGINE)
    seen = []  # kernels read packed handles as flat bytes: they must get contiguous ones
    real = cp.plan.execute
    cp.plan.execute = lambda ins, outs: (seen.append(ins[0].get_data_handle().flags.c_contiguous),
                                         real(ins, outs))
    cp.execute(STREAM, [w_t, ga.Tensor(s_lt, ENGINE, scales), ga.Tensor(x_lt, ENGINE, x)], [y])
    expected = x.astype(np.float64) @ (w_vals * 0.5).T  # small integers: exact in f32
    np.testing.assert_array_equal(y.numpy(), expected)
    assert seen == [True]


# ---------------------------------------------------------------- defect 3: self-overlap
def test_self_overlapping_output_layout_is_rejected():
    with pytest.raises(ga.InvalidArguments, match="tensor 1"):
        _relu([4, 3], out_strides=[0, 1])  # 4 rows on one row of memory
    cp = _relu([4, 3])
    overlapping = np.lib.stride_tricks.as_strided(np.zeros(3, np.float32), (4, 3), (0, 4))
    with pytest.raises(ga.InvalidArguments, match="overlap"):
        cp.execute(STREAM, [ga.Tensor(cp.query_logical_tensor(0), ENGINE, np.ones((4, 3), np.float32))],
                   [ga.Tensor(cp.query_logical_tensor(1), ENGINE, overlapping)])


def test_stride_zero_input_is_a_broadcast_view():
    row = np.array([-1.0, 2.0, -3.0], np.float32)
    x = ga.LogicalTensor(0, dt.f32, [4, 3], [0, 1])
    y = ga.LogicalTensor(1, dt.f32, [4, 3])
    cp = _single_op(K.ReLU, [ga.LogicalTensor(0, dt.f32, [4, 3])], [y]).compile([x], [y], ENGINE)
    out = ga.Tensor(y, ENGINE)
    cp.execute(STREAM, [ga.Tensor(x, ENGINE, row)], [out])
    np.testing.assert_array_equal(out.numpy(), np.broadcast_to(np.maximum(row, 0), (4, 3)))


# ---------------------------------------------------------------- defect 10: Fortran output
def test_fortran_order_output_array_receives_the_result():
    cp = _relu([2, 3])
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    out = np.zeros((2, 3), np.float32, order="F")
    cp.execute(STREAM, [ga.Tensor(cp.query_logical_tensor(0), ENGINE, x)],
               [ga.Tensor(cp.query_logical_tensor(1), ENGINE, out)])
    np.testing.assert_array_equal(out, np.maximum(x, 0))


# ---------------------------------------------------------------- defect 6: typed errors
def test_read_only_output_fails_before_computing():
    cp = _relu([8])
    calls = []
    real = cp.plan.execute
    cp.plan.execute = lambda *a: (calls.append(1), real(*a))
    out = np.zeros(8, np.float32)
    out.flags.writeable = False
    with pytest.raises(ga.InvalidArguments, match="read-only"):
        cp.execute(STREAM, [ga.Tensor(cp.query_logical_tensor(0), ENGINE, X8)],
                   [ga.Tensor(cp.query_logical_tensor(1), ENGINE, out)])
    assert not calls


def test_make_scalar_tensor_rejects_non_numbers():
    lt = ga.LogicalTensor(3, dt.f32, [], property=ga.PropertyType.host_scalar)
    for bad in ("abc", [1.0, 2.0], object(), 1 + 2j):
        with pytest.raises(ga.InvalidArguments):
            ga.make_scalar_tensor(lt, bad)
    s32 = ga.LogicalTensor(4, dt.s32, [], property=ga.PropertyType.host_scalar)
    for bad in (float("nan"), 2.5, 2**40):
        with pytest.raises(ga.InvalidArguments):
            ga.make_scalar_tensor(s32, bad)
    assert int(ga.make_scalar_tensor(s32, 7).numpy()) == 7


@pytest.mark.parametrize("shape, strides", [
    ([float("nan"), 2], None),  # a NaN dim
    ([2.5], None),
    ([2**40, 2**40], None),  # 2^80 elements: the product overflows int64
    ([-2, 3], None),  # only -1 means unknown
    ([4, 4], [2**60, 1]),  # the span in bytes overflows int64
    ([4, 4], [-4, 1]),  # negative strides are not a layout oneDNN has
    (["3"], None),
])
def test_bad_dims_and_strides_are_invalid_arguments(shape, strides):
    with pytest.raises(ga.InvalidArguments):
        ga.LogicalTensor(0, dt.f32, shape, strides)


def test_huge_but_representable_strides_are_out_of_memory_not_crash():
    lt = ga.LogicalTensor(0, dt.f32, [2], [2**59])
    with pytest.raises(ga.OutOfMemory):
        ga.Tensor(lt, ENGINE)


def _dequant(shape, attrs):
    src, dst = ga.LogicalTensor(0, dt.s8, shape), ga.LogicalTensor(1, dt.f32, shape)
    return src, dst, _single_op(K.Dequantize, [src], [dst], attrs)


@pytest.mark.parametrize("axis", [5, 2, -3])
def test_per_channel_axis_out_of_range_fails_at_add_op(axis):
    with pytest.raises(ga.InvalidGraphOp, match=f"axis={axis}"):
        _dequant([4, 3], {"qtype": "per_channel", "axis": axis, "scales": [1.0] * 3})


def test_per_channel_axis_and_scale_count_checked_at_compile_when_shape_unknown():
    src, dst, part = _dequant(None, {"qtype": "per_channel", "axis": 5, "scales": [1.0] * 3})  # rank unknown
    with pytest.raises(ga.InvalidGraphOp, match="axis=5"):
        part.compile([ga.LogicalTensor(0, dt.s8, [4, 3])], [dst], ENGINE)


def test_per_channel_scale_count_vs_xio_weights_is_a_compile_error():
    """oneDNN's cpu_inference_int8 weight Dequantize: per_channel axis=1 on
    XIO (KH, KW, I, O) weights with O scales.  Dim 1 is KW, so the scales do
    not fit: a typed error at compile, not ValueError inside the kernel."""
    shape = [3, 3, 4, 8]
    src, dst, part = _dequant(shape, {"qtype": "per_channel", "axis": 1, "scales": [0.5] * 8,
                                      "zps": [0] * 8})
    with pytest.raises(ga.InvalidGraphOp, match="8 scales"):
        part.compile([src], [dst], ENGINE)


def test_dynamic_dequantize_scale_shape_checked_at_compile():
    src = ga.LogicalTensor(0, dt.s8, [-1, -1])
    scales = ga.LogicalTensor(1, dt.f32, [-1])
    dst = ga.LogicalTensor(2, dt.f32, [-1, -1])
    part = _single_op(K.DynamicDequantize, [src, scales], [dst], {"qtype": "per_channel", "axis": 1})
    with pytest.raises(ga.InvalidGraphOp, match="per_channel scales"):
        part.compile([ga.LogicalTensor(0, dt.s8, [4, 3]), ga.LogicalTensor(1, dt.f32, [5])], [dst], ENGINE)


def test_zero_points_beyond_s32_are_rejected_at_add_op():
    with pytest.raises(ga.InvalidGraphOp, match="zps"):
        _dequant([4], {"qtype": "per_tensor", "scales": [1.0], "zps": [2**40]})


@pytest.mark.parametrize("scale, kept", [(float("inf"), None), (float("nan"), None), (1e308, None),
                                         (3e38, 3e38), (1e38, 2.0**127), (-0.5, -0.5)])
def test_scale_rewrite_keeps_huge_scales_and_add_op_refuses_non_finite_ones(scale, kept):
    """Non-finite scales (1e308 is +inf in f32) are refused at add_op (issue 33);
    a finite scale whose power of two is past f32 stays as it is."""
    src = ga.LogicalTensor(0, dt.f32, [4])
    dst = ga.LogicalTensor(1, dt.s8, [4])
    g = ga.Graph(ga.EngineKind.cpu)
    op = ga.Op(0, K.Quantize, [src], [dst], attrs={"scales": [scale]})
    if kept is None:
        with pytest.raises(ga.InvalidGraphOp, match="attribute scales=.*must be finite"):
            g.add_op(op)
        return
    g.add_op(op)
    g.finalize()
    (op,) = power_of_two_scales(g).ops.values()
    assert op.attrs["scales"] == [kept]


def test_filler_handles_zero_points_outside_int16():
    src, dst = ga.LogicalTensor(0, dt.s8, [64]), ga.LogicalTensor(1, dt.f32, [64])
    g = ga.Graph(ga.EngineKind.cpu)
    g.add_op(ga.Op(0, K.Dequantize, [src], [dst], attrs={"scales": [1.0], "zps": [100000]}))
    g.finalize()
    feeds = fill_inputs(g)
    assert feeds[0].dtype == np.int8 and feeds[0].max() == 127  # the zero point saturates s8


def test_tensor_from_non_numeric_data_is_invalid_arguments():
    with pytest.raises(ga.InvalidArguments):
        ga.Tensor(ga.LogicalTensor(0, dt.f32, [2]), ENGINE, ["a", "b"])
    with pytest.raises((ga.InvalidArguments, ga.InvalidDataType)):
        ga.Tensor(ga.LogicalTensor(0, dt.s4, [2]), ENGINE, np.zeros(2, ml_dtypes.uint4))


def test_staging_is_said_in_verbose_mode(capsys, monkeypatch):
    from graph_api.config import settings

    monkeypatch.setattr(settings, "verbose", True)
    cp = _relu([2, 3])
    x = np.asfortranarray(np.arange(-3, 3, dtype=np.float32).reshape(2, 3))
    cp.execute(STREAM, [ga.Tensor(cp.query_logical_tensor(0), ENGINE, x)],
               [ga.Tensor(cp.query_logical_tensor(1), ENGINE)])
    err = capsys.readouterr().err
    assert "input tensor 0" in err and "copied in" in err


def test_layout_checks_rerun_when_the_memory_changes():
    cp = _relu([8])
    buf = np.r_[X8, np.float32(5)]
    x, y = ga.Tensor(cp.query_logical_tensor(0), ENGINE, buf[:8]), ga.Tensor(cp.query_logical_tensor(1), ENGINE)
    cp.execute(STREAM, [x], [y])  # fine: separate memory
    y.set_data_handle(buf[1:])  # now overlapping the input, shifted by one
    with pytest.raises(ga.InvalidArguments, match="overlaps input tensor 0"):
        cp.execute(STREAM, [x], [y])
    np.testing.assert_array_equal(buf[:8], X8)


def test_a_refused_handle_leaves_the_tensor_as_it_was():
    user = np.asfortranarray(np.ones((2, 3), np.float32))
    t = ga.Tensor(ga.LogicalTensor(0, dt.f32, [2, 3]), ENGINE, user)
    with pytest.raises(ga.InvalidArguments, match="span 6"):
        t.set_data_handle(np.zeros(5, np.float32))
    t.write(np.full((2, 3), 2.0, np.float32))
    np.testing.assert_array_equal(user, 2.0)  # still the user's array

"""Quantization ``mask`` (oneDNN branch lvtao/main/quant-mask, 2026-08) and f8 dynamic
quantization: numbers against float64 numpy / ml_dtypes, typed errors naming op and problem."""
import json

import ml_dtypes
import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K

RNG = np.random.default_rng(34)
SRC = (2, 3, 4, 5)


def _single(kind, src_dt, out_dt, shape, attrs, scales_shape=None, zps_shape=None, zps_dt=dt.s32):
    g = ga.Graph(ga.EngineKind.cpu)
    ins = [ga.LogicalTensor(0, src_dt, list(shape))]
    if scales_shape is not None:
        ins.append(ga.LogicalTensor(1, dt.f32, list(scales_shape)))
    if zps_shape is not None:
        ins.append(ga.LogicalTensor(2, zps_dt, list(zps_shape)))
    g.add_op(ga.Op(7, kind, ins, [ga.LogicalTensor(3, out_dt, list(shape))], name="q", attrs=attrs))
    g.finalize()
    return g


def _bcast(p, mask, ndim):
    shape = [n if mask >> d & 1 else 1 for d, n in enumerate(SRC[:ndim])]
    return np.asarray(p, np.float64).reshape(shape)


@pytest.mark.parametrize("mask", [3, 4, 0b1010, 1, 15])
def test_dynamic_dequantize_mask_per_head_and_token(mask):
    pshape = [n for d, n in enumerate(SRC) if mask >> d & 1]
    q = RNG.integers(-128, 128, SRC).astype(np.int8)
    s = (RNG.random(pshape) + 0.5).astype(np.float32)
    z = RNG.integers(-5, 6, pshape).astype(np.int32)
    g = _single(K.DynamicDequantize, dt.s8, dt.f32, SRC, {"mask": mask}, pshape, pshape)
    got = ga.run_graph(g, {0: q, 1: s, 2: z}).outputs[3]
    want = (q.astype(np.float64) - _bcast(z, mask, 4)) * _bcast(s, mask, 4)  # one rounding: as f32
    np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("mask", [2, 12])
def test_dynamic_quantize_mask(mask):
    pshape = [n for d, n in enumerate(SRC) if mask >> d & 1]
    x = (RNG.standard_normal(SRC) * 40).astype(np.float32)
    s = (2.0 ** RNG.integers(-2, 2, pshape)).astype(np.float32)  # powers of two: x / s exact
    g = _single(K.DynamicQuantize, dt.f32, dt.s8, SRC, {"mask": mask}, pshape)
    got = ga.run_graph(g, {0: x, 1: s}).outputs[3]
    want = np.clip(np.rint(x.astype(np.float64) / _bcast(s, mask, 4)), -128, 127)
    np.testing.assert_array_equal(got.astype(np.float64), want)


@pytest.mark.parametrize("f8, ml", [(dt.f8_e4m3, ml_dtypes.float8_e4m3fn), (dt.f8_e5m2, ml_dtypes.float8_e5m2)])
def test_f8_dynamic_quantize_and_dequantize(f8, ml):
    x = (RNG.standard_normal(SRC) * 3).astype(np.float32)
    s = np.array([0.25, 0.5, 2.0], np.float32)  # per head (mask 2)
    g = _single(K.DynamicQuantize, dt.f32, f8, SRC, {"mask": 2}, [3])
    q = ga.run_graph(g, {0: x, 1: s}).outputs[3]
    want_q = (x.astype(np.float64) / _bcast(s, 2, 4)).astype(np.float32).astype(ml)
    np.testing.assert_array_equal(np.asarray(q).view(np.uint8), want_q.view(np.uint8))
    g2 = _single(K.DynamicDequantize, f8, dt.f32, SRC, {"qtype": "per_tensor"}, [1])
    y = ga.run_graph(g2, {0: want_q, 1: np.array([0.5], np.float32)}).outputs[3]
    np.testing.assert_array_equal(y, (want_q.astype(np.float64) * 0.5).astype(np.float32))


def test_static_dequantize_mask_extension():
    shape = (2, 3, 4)
    scales = [0.5, 1.0, 2.0, 4.0, 0.25, 8.0]  # packed [2, 3], row-major
    zps = [1, 2, 3, -1, -2, 0]
    g = _single(K.Dequantize, dt.s8, dt.f32, shape, {"mask": 3, "scales": scales, "zps": zps})
    q = RNG.integers(-128, 128, shape).astype(np.int8)
    got = ga.run_graph(g, {0: q}).outputs[3]
    want = (q - np.reshape(zps, (2, 3, 1))) * np.reshape(scales, (2, 3, 1))
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_masked_weights_in_a_fused_pattern_run_the_reference_formula():
    """DynamicDequantize(W, per-column scales by mask=2) -> MatMul matches matmul_compressed;
    its fused kernel reads qtype only, so the masked op must not reach it."""
    g = ga.Graph(ga.EngineKind.cpu)
    x, w = ga.LogicalTensor(0, dt.f32, [4, 16]), ga.LogicalTensor(1, dt.s8, [16, 8], property=ga.PropertyType.constant)
    s, d, y = ga.LogicalTensor(2, dt.f32, [8]), ga.LogicalTensor(3, dt.f32, [16, 8]), ga.LogicalTensor(4, dt.f32, [4, 8])
    g.add_op(ga.Op(0, K.DynamicDequantize, [w, s], [d], attrs={"mask": 2}))
    g.add_op(ga.Op(1, K.MatMul, [x, d], [y]))
    g.finalize()
    xv = RNG.standard_normal((4, 16)).astype(np.float32)
    wv = RNG.integers(-128, 128, (16, 8)).astype(np.int8)
    sv = (RNG.random(8) + 0.1).astype(np.float32)
    run = ga.run_graph(g, {0: xv, 1: wv, 2: sv})
    assert run.partitions[0].partition.get_kind() == "matmul_compressed"
    np.testing.assert_allclose(run.outputs[4], xv.astype(np.float64) @ (wv * sv.astype(np.float64)),
                               rtol=1e-5, atol=1e-4)


def test_mask_round_trips_through_json():
    g = _single(K.DynamicDequantize, dt.s8, dt.f32, SRC, {"mask": 3}, [2, 3])
    doc = json.loads(g.to_json())
    assert doc["graph"][0]["attrs"]["mask"] == {"type": "s64", "value": 3}
    again = ga.Graph.from_json(g.to_json())
    assert again.ops[7].attrs["mask"] == 3
    assert ga.OpAttr.mask.name == "mask"


@pytest.mark.parametrize("kind, src_dt, out_dt, attrs, scales, zps, match", [
    (K.DynamicDequantize, dt.s8, dt.f32, {"mask": -1}, [1], None, "mask=-1 must be non-negative"),
    (K.DynamicDequantize, dt.s8, dt.f32, {"mask": 16}, [1], None, "outside the rank-4 src"),
    (K.DynamicDequantize, dt.s8, dt.f32, {"mask": 2, "qtype": "per_channel"}, [3], None, "qtype per_tensor"),
    (K.DynamicDequantize, dt.s8, dt.f32, {"mask": 3}, [3, 2], None, r"scales must be \[2, 3\]"),
    (K.DynamicDequantize, dt.s8, dt.f32, {"mask": 3}, [2, 3], [3], r"zps must be \[2, 3\]"),
    (K.DynamicDequantize, dt.f8_e4m3, dt.f32, {}, [1], [1], "zps are not supported for f8"),
    (K.DynamicQuantize, dt.f32, dt.f8_e5m2, {}, [1], [1], "zps are not supported for f8"),
    (K.DynamicDequantize, dt.s8, dt.f32, {"mask": 3, "qtype": "per_group", "group_shape": [1, 1, 4, 5]},
     [2, 3, 1, 1], None, "needs qtype per_tensor"),
    (K.Dequantize, dt.s8, dt.f32, {"mask": 3, "scales": [1.0, 2.0]}, None, None, "scales must hold 6 values"),
])
def test_bad_masks_raise_invalid_graph_op(kind, src_dt, out_dt, attrs, scales, zps, match):
    with pytest.raises(ga.InvalidGraphOp, match=match) as err:
        zdt = dt.s32 if src_dt != dt.f32 or out_dt not in (dt.f8_e5m2,) else dt.u8
        _single(kind, src_dt, out_dt, SRC, attrs, scales, zps, zdt)
    assert "op 7" in str(err.value) and kind.name in str(err.value)

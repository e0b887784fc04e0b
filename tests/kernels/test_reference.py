"""The numpy reference kernels against independent formulas.

Every ``OP_CASES`` record runs through ``REFERENCE`` and is compared with its
``expected`` function under the record's tolerance; the targeted tests below
pin the behaviours a fast kernel is most likely to get wrong.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from graph_api import dtypes
from graph_api.dtypes import DataType
from graph_api.enums import OpKind
from graph_api.errors import Unimplemented
from graph_api.fpmath import FPMath
from graph_api.logical_tensor import LogicalTensor
from graph_api.op import Op
from graph_api.kernels.reference import REFERENCE, TABLES, RefContext
from tests.cases.op_cases import EXACT, OP_CASES
from tests.cases.records import bf16_rne, f16_rne, tf32_rne

FORWARD_KINDS = {k for k in OpKind if "Backward" not in k.name}


def run(case, inputs, op=None):
    op = op or case.make_op()
    ctx = RefContext(fpmath=FPMath.make(case.fpmath))
    return REFERENCE[case.kind](op, inputs, op.outputs, ctx)


def assert_matches(got, want, tol, what=""):
    """Exact for integer/bool outputs and EXACT records, else allclose."""
    got = np.asarray(got)
    if got.dtype.kind in "iub" or tol is EXACT:
        np.testing.assert_array_equal(got.astype(np.float64), np.asarray(want, np.float64),
                                      err_msg=what)
    else:
        np.testing.assert_allclose(got.astype(np.float64), np.asarray(want, np.float64),
                                   rtol=tol.rtol, atol=tol.atol, err_msg=f"{what}: {tol.why}")


# ------------------------------------------------------------------ the cases
@pytest.mark.parametrize("case", OP_CASES, ids=lambda c: c.name)
def test_op_case(case):
    inputs = case.make_inputs()
    before = [x.copy() for x in inputs]
    outs = run(case, inputs)
    assert len(outs) == len(case.outputs)
    expected = case.expected(inputs, dict(case.attrs))
    for i, (got, spec, want) in enumerate(zip(outs, case.outputs, expected)):
        assert got.dtype == dtypes.numpy_dtype(DataType[spec.dtype]), f"output {i} dtype"
        assert got.shape == tuple(spec.shape), f"output {i} shape"
        # expected arrays may keep reduced dims: only the element order matters
        want = np.reshape(want, spec.shape)
        assert_matches(got, want, case.tolerance(i), f"{case.name} output {i}")
    for x, y in zip(inputs, before):  # inputs never modified (bitwise, NaN-safe)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


def test_every_forward_op_has_a_kernel_and_cases():
    assert set(REFERENCE) == set(OpKind)  # backward kinds: tests/kernels/test_backward*.py
    assert sum(len(t) for t in TABLES) == len(REFERENCE), "a kind is in two tables"
    counts = {}
    for case in OP_CASES:
        counts[case.kind] = counts.get(case.kind, 0) + 1
    missing = {k.name for k in FORWARD_KINDS - {OpKind.Wildcard} if counts.get(k, 0) < 2}
    assert not missing


def test_cases_follow_the_opset():
    """Each case is a valid op for the opset, and the schema defaults do not change
    the reference result (kernels read attrs with the same defaults)."""
    from graph_api.opset import OP_SCHEMAS
    from graph_api.schema import verify_op

    for case in OP_CASES:
        op = case.make_op()
        verify_op(op, OP_SCHEMAS)
        inputs = case.make_inputs()
        for got, want in zip(run(case, inputs, op), run(case, inputs)):
            assert got.tobytes() == want.tobytes(), case.name


# ------------------------------------------------------------- targeted tests
def call(kind, inputs, outputs, ctx=RefContext(), **attrs):
    """Run one reference kernel; ``outputs`` are (dtype name, shape) pairs."""
    in_lts = [LogicalTensor(i, dtypes.from_numpy(np.asarray(x).dtype), np.shape(x))
              for i, x in enumerate(inputs)]
    out_lts = [LogicalTensor(100 + i, dt, shape) for i, (dt, shape) in enumerate(outputs)]
    op = Op(7, kind, in_lts, out_lts, name="probe", attrs=attrs)
    return REFERENCE[kind](op, inputs, out_lts, ctx)


def test_softmax_all_minus_inf_row():
    x = np.array([[-np.inf] * 4, [0.0, 1.0, -np.inf, 2.0]], np.float32)
    outs = [("f32", (2, 4)), ("f32", (2, 1))]
    dst, stats = call(OpKind.SoftMax, [x], outs, axis=-1, mode="inf_as_zero")
    np.testing.assert_array_equal(dst[0], 0.0)
    assert stats[0, 0] == -np.inf
    e = np.exp(np.array([0.0, 1.0, 2.0]) - 2.0)
    np.testing.assert_allclose(dst[1], [e[0] / e.sum(), e[1] / e.sum(), 0.0, e[2] / e.sum()],
                               rtol=1e-6)
    dst, stats = call(OpKind.SoftMax, [x], outs, axis=-1)  # mode "none": IEEE NaN
    assert np.isnan(dst[0]).all() and np.isnan(stats[0, 0])
    assert not np.isnan(dst[1]).any()


def test_softmax_stats_is_log_sum_exp_without_overflow():
    x = np.array([[1000.0, 999.0, 998.0], [-5.0, 0.0, 5.0]], np.float32)
    _, stats = call(OpKind.SoftMax, [x], [("f32", (2, 3)), ("f32", (2, 1))], axis=1)
    want = [1000 + math.log(1 + math.exp(-1) + math.exp(-2)),
            5 + math.log(math.exp(-10) + math.exp(-5) + 1)]
    np.testing.assert_allclose(stats[:, 0], want, rtol=1e-6)


def test_quantize_f8_e4m3_saturates_to_448():
    x = np.array([1000.0, -1000.0, 448.0, 300.0, np.inf, -np.inf], np.float32)
    (y,) = call(OpKind.Quantize, [x], [("f8_e4m3", (6,))], scales=[1.0])
    np.testing.assert_array_equal(y.astype(np.float32), [448, -448, 448, 288, 448, -448])
    (y,) = call(OpKind.Quantize, [x[:2]], [("f8_e5m2", (2,))], scales=[1.0])
    np.testing.assert_array_equal(y.astype(np.float32), [1024, -1024])  # e5m2 has room


@pytest.mark.parametrize("dst, low, high", [("s4", -8, 7), ("u4", 0, 15), ("s8", -128, 127),
                                            ("u8", 0, 255)])
def test_quantize_saturates_to_the_integer_range(dst, low, high):
    x = np.array([[-1e6, -300.0, -9.0, 0.0], [7.4, 15.6, 300.0, 1e6]], np.float32)
    scales = np.array([[1.0, 1.0]], np.float32)
    (y,) = call(OpKind.DynamicQuantize, [x, scales], [(dst, (2, 4))],
                qtype="per_group", group_shape=[2, 2])
    assert y.dtype == dtypes.numpy_dtype(DataType[dst])
    want = np.clip(np.rint(x.astype(np.float64)), low, high)
    np.testing.assert_array_equal(y.astype(np.int64), want)


def test_quantize_rounds_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 126.5], np.float32)
    (y,) = call(OpKind.Quantize, [x], [("s8", (8,))], scales=[1.0])
    np.testing.assert_array_equal(y, [0, 2, 2, 0, -2, -2, 4, 126])
    (y,) = call(OpKind.DynamicQuantize, [x * 0.5, np.array([0.5], np.float32),
                                         np.array([1], np.int32)], [("u8", (8,))])
    # the zero point joins before rounding: round(x / s + zp), not round(x / s) + zp
    np.testing.assert_array_equal(y, [2, 2, 4, 0, 0, 0, 4, 128])


def _grouped_scales(shape, seed):
    return np.random.default_rng(seed).uniform(0.1, 2.0, shape).astype(np.float32)


@pytest.mark.parametrize("layout, src_shape, group_shape", [
    ("K as (N, H, D, S)", (2, 2, 8, 5), (1, 1, 4, 1)),
    ("V as (N, H, S, D)", (2, 2, 5, 8), (1, 1, 1, 4)),
])
def test_grouped_dynamic_dequantize(layout, src_shape, group_shape):
    rng = np.random.default_rng(3)
    src = rng.integers(-8, 8, src_shape).astype(ml_dtypes.int4)
    pshape = tuple(s // g for s, g in zip(src_shape, group_shape))
    scales = _grouped_scales(pshape, 4)
    zps = rng.integers(-2, 3, pshape).astype(ml_dtypes.int4)
    (y,) = call(OpKind.DynamicDequantize, [src, scales, zps], [("f32", src_shape)],
                qtype="per_group", group_shape=list(group_shape))
    axis = 2 if group_shape[2] > 1 else 3
    g = group_shape[axis]
    full_scales = np.repeat(scales, g, axis=axis)
    full_zps = np.repeat(zps.astype(np.float32), g, axis=axis)
    want = (src.astype(np.float32) - full_zps) * full_scales
    np.testing.assert_array_equal(y, want)
    # with src 1 and no zero point the output is the scale map: one value per group
    ones = np.ones(src_shape, ml_dtypes.int4)
    (y,) = call(OpKind.DynamicDequantize, [ones, scales], [("f32", src_shape)],
                qtype="per_group", group_shape=list(group_shape))
    np.testing.assert_array_equal(y, full_scales)


def test_dynamic_dequantize_rfc_groups_form():
    """axis list + groups (number of groups per dim), no group_shape: same result."""
    rng = np.random.default_rng(5)
    src = rng.integers(0, 16, (4, 8)).astype(ml_dtypes.uint4)
    scales = _grouped_scales((4, 2), 6)
    (want,) = call(OpKind.DynamicDequantize, [src, scales], [("f32", (4, 8))],
                   qtype="per_group", group_shape=[1, 4])
    (got,) = call(OpKind.DynamicDequantize, [src, scales], [("f32", (4, 8))],
                  qtype="per_group", axis=[0, 1], groups=[4, 2])
    np.testing.assert_array_equal(got, want)


FPMATH_ROUNDINGS = {"bf16": bf16_rne, "f16": f16_rne, "tf32": tf32_rne, "any": bf16_rne}


def _manual_matmul(a, b, round_a, round_b):
    out = np.empty((a.shape[0], b.shape[1]), np.float32)
    for m in range(a.shape[0]):
        for n in range(b.shape[1]):
            out[m, n] = math.fsum(round_a(float(a[m, k])) * round_b(float(b[k, n]))
                                  for k in range(a.shape[1]))
    return out


@pytest.mark.parametrize("mode", sorted(FPMATH_ROUNDINGS))
def test_matmul_fpmath_rounds_f32_inputs(mode):
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((5, 32)).astype(np.float32), rng.standard_normal((32, 4)).astype(np.float32)
    (strict,) = call(OpKind.MatMul, [a, b], [("f32", (5, 4))])
    (got,) = call(OpKind.MatMul, [a, b], [("f32", (5, 4))], RefContext(fpmath=FPMath.make(mode)))
    rnd = FPMATH_ROUNDINGS[mode]
    np.testing.assert_array_equal(got, _manual_matmul(a, b, rnd, rnd))
    assert (got != strict).mean() > 0.5  # random f32 data: the rounding shows almost everywhere
    # bf16 data is what it is: fpmath does not touch it
    a16, b16 = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
    ctx = RefContext(fpmath=FPMath.make(mode))
    np.testing.assert_array_equal(call(OpKind.MatMul, [a16, b16], [("f32", (5, 4))], ctx)[0],
                                  call(OpKind.MatMul, [a16, b16], [("f32", (5, 4))])[0])


@pytest.mark.parametrize("apply_to_int", [False, True])
def test_matmul_int_inputs_follow_apply_to_int(apply_to_int):
    """Weights dequantized from integers (int_inputs) are rounded only with apply_to_int;
    the other f32 operand is rounded in every non-strict mode."""
    rng = np.random.default_rng(12)
    a = rng.standard_normal((3, 16)).astype(np.float32)
    w = (rng.integers(-8, 8, (16, 4)) * np.float32(0.0123)).astype(np.float32)  # "dequantized"
    ctx = RefContext(fpmath=FPMath.make("bf16", apply_to_int), int_inputs=frozenset({1}))
    (got,) = call(OpKind.MatMul, [a, w], [("f32", (3, 4))], ctx)
    round_w = bf16_rne if apply_to_int else float
    np.testing.assert_array_equal(got, _manual_matmul(a, w, bf16_rne, round_w))
    (other,) = call(OpKind.MatMul, [a, w], [("f32", (3, 4))],
                    RefContext(fpmath=FPMath.make("bf16", not apply_to_int), int_inputs=frozenset({1})))
    assert (got != other).any()


def test_matmul_f16_accumulation_rounds_the_sum():
    rng = np.random.default_rng(13)
    a, b = rng.standard_normal((4, 64)).astype(np.float32), rng.standard_normal((64, 3)).astype(np.float32)
    (strict,) = call(OpKind.MatMul, [a, b], [("f32", (4, 3))])
    (f16acc,) = call(OpKind.MatMul, [a, b], [("f32", (4, 3))], accumulation_mode="f16")
    np.testing.assert_array_equal(f16acc, strict.astype(np.float16).astype(np.float32))
    assert (f16acc != strict).any()


def _dropout(x, seed, offset, p, dtype="f32"):
    scalars = [np.array(seed, np.int64), np.array(offset, np.int64), np.array(p, np.float32)]
    return call(OpKind.Dropout, [x] + scalars, [(dtype, x.shape), ("u8", x.shape)])


def test_dropout_is_deterministic_per_seed_and_offset():
    x = np.random.default_rng(14).standard_normal((64, 64)).astype(np.float32)
    dst1, mask1 = _dropout(x, 123456, 1, 0.4)
    dst2, mask2 = _dropout(x, 123456, 1, 0.4)
    np.testing.assert_array_equal(mask1, mask2)
    np.testing.assert_array_equal(dst1, dst2)
    _, other_seed = _dropout(x, 123457, 1, 0.4)
    assert (other_seed != mask1).mean() > 0.3
    # the offset shifts the counter stream
    _, shifted = _dropout(x, 123456, 1 + 10, 0.4)
    np.testing.assert_array_equal(shifted.reshape(-1)[:-10], mask1.reshape(-1)[10:])
    np.testing.assert_array_equal(dst1, np.where(mask1 == 1, x / np.float32(0.6), 0))


def test_dropout_probability_edges_and_scaling():
    x = np.ones((256, 256), np.float32)
    dst, mask = _dropout(x, 7, 0, 0.0)
    np.testing.assert_array_equal(dst, x)
    assert mask.all()
    dst, mask = _dropout(x, 7, 0, 1.0)
    assert not dst.any() and not mask.any()
    p, n = 0.3, x.size
    dst, mask = _dropout(x, 9, 0, p)
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(mask.mean() - (1 - p)) < 5 * sigma
    assert abs(dst.mean() - 1.0) < 5 * sigma / (1 - p)  # E[dst] = E[src]
    (dst16, _) = _dropout(x.astype(np.float16), 9, 0, p, "f16")
    np.testing.assert_array_equal(dst16 != 0, mask == 1)


def test_wildcard_is_not_executable():
    with pytest.raises(Unimplemented, match=r"op 7 \(Wildcard \"probe\"\)"):
        call(OpKind.Wildcard, [np.zeros(3, np.float32)], [("f32", (3,))])


def test_end_produces_nothing():
    assert call(OpKind.End, [np.zeros(3, np.float32)], []) == []


def test_outputs_never_alias_inputs():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for kind, attrs in ((OpKind.Reorder, {}), (OpKind.StaticReshape, {"shape": [3, 2],
                                                                     "special_zero": False})):
        (y,) = call(kind, [x], [("f32", (3, 2) if attrs else (2, 3))], **attrs)
        assert not np.shares_memory(x, y)


def test_big_tensors_are_exact():
    """~8M-element int4 per-group dequantization and an eltwise op on it (the
    reference must handle LLM-sized weights; values checked on sampled rows)."""
    rng = np.random.default_rng(15)
    src = rng.integers(-8, 8, (2048, 4096), dtype=np.int8).astype(ml_dtypes.int4)
    scales = rng.uniform(0.01, 0.1, (2048, 32)).astype(ml_dtypes.bfloat16)
    (y,) = call(OpKind.DynamicDequantize, [src, scales], [("bf16", src.shape)],
                qtype="per_group", group_shape=[1, 128])
    (g,) = call(OpKind.GELU, [y], [("bf16", src.shape)])
    assert y.shape == src.shape and g.dtype == ml_dtypes.bfloat16
    for row in (0, 1023, 2047):  # (q * s) rounded once to bf16; both factors exact in f32
        want = (src[row].astype(np.float32) * np.repeat(scales[row].astype(np.float32), 128))
        np.testing.assert_array_equal(y[row].astype(np.float32),
                                      want.astype(ml_dtypes.bfloat16).astype(np.float32))


@pytest.mark.parametrize("f8", ["f8_e4m3", "f8_e5m2"])
def test_dynamic_quant_kernels_take_f8(f8):
    """oneDNN's newest schema lets DynamicQuantize/Dequantize use f8; the kernels do."""
    x = np.array([[0.3, -1.7, 900.0, -0.01]], np.float32)
    scales = np.array([0.5], np.float32)
    (q,) = call(OpKind.DynamicQuantize, [x, scales], [(f8, (1, 4))])
    want = dtypes.convert(x / np.float32(0.5), DataType[f8])
    np.testing.assert_array_equal(q.astype(np.float32), want.astype(np.float32))
    (d,) = call(OpKind.DynamicDequantize, [q, scales], [("f32", (1, 4))])
    np.testing.assert_array_equal(d, q.astype(np.float32) * np.float32(0.5))

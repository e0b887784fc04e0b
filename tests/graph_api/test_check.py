"""graph_api.check.compare: the chunked comparison gives the verdict of the rule
applied to the whole arrays at once (written out below as the independent
formula), at chunk boundaries, with NaN/infinity, integers and strided inputs."""
import ml_dtypes
import numpy as np
import pytest

from graph_api import check
from graph_api.dtypes import DataType as dt


def whole_array_rule(expected, got, rtol):
    """The rule of graph_api.check on whole arrays: (ok, bad count, max |diff|)."""
    e, g = np.asarray(expected, np.float64).ravel(), np.asarray(got, np.float64).ravel()
    if (np.isnan(e) != np.isnan(g)).any():
        return False, None, None
    inf = np.isinf(e) | np.isinf(g)
    if (inf & (e != g)).any():
        return False, None, None
    finite = ~(np.isnan(e) | inf)
    e, g = e[finite], g[finite]
    diff = np.abs(e - g)
    bad = diff > rtol * (np.abs(e) + np.abs(e).max())
    return not bad.any(), int(bad.sum()), float(diff.max())


@pytest.fixture(params=[7, 1 << 17], ids=["chunk7", "chunk128k"])
def chunk(request, monkeypatch):
    # a tiny chunk puts many boundaries inside small arrays (the worst value, the
    # scale and the counts must be merged across chunks)
    monkeypatch.setattr(check, "CHUNK", request.param)
    return request.param


@pytest.mark.parametrize("noise", [0.0, 1e-6, 3e-5, 1e-3])
def test_float_verdict_matches_the_whole_array_rule(chunk, noise):
    rng = np.random.default_rng(0)
    exp = rng.normal(size=(5, 13, 3))
    got = (exp * (1 + noise * rng.normal(size=exp.shape))).astype(np.float32)
    verdict = check.compare(exp, got, dt.f32)
    ok, bad, max_abs = whole_array_rule(exp, got, check.rtol_for(dt.f32))
    assert verdict.ok == ok
    assert verdict.max_abs == pytest.approx(max_abs, rel=1e-12)
    if not ok:
        assert verdict.message.startswith(f"{bad} of {exp.size} values outside")


def test_one_bad_value_in_a_late_chunk_is_found_and_named(chunk):
    exp = np.linspace(-1, 1, 200).reshape(10, 20)
    got = exp.astype(np.float32)
    got[9, 17] += 0.5
    verdict = check.compare(exp, got, dt.f32)
    assert not verdict.ok
    assert verdict.message.startswith("1 of 200 values outside")
    assert f"expected {exp[9, 17]!r}" in verdict.message
    assert verdict.max_abs == pytest.approx(0.5, rel=1e-6)


def test_nan_and_infinity_must_match(chunk):
    exp = np.arange(40, dtype=np.float64)
    exp[[3, 30]] = np.nan
    exp[[5, 33]] = np.inf
    got = exp.astype(np.float32)
    assert check.compare(exp, got, dt.f32).ok
    got[30] = 1.0
    assert check.compare(exp, got, dt.f32).message.startswith("NaN mismatch at (30,)")
    got = exp.astype(np.float32)
    got[33] = -np.inf
    assert check.compare(exp, got, dt.f32).message.startswith("infinity mismatch at (33,)")
    # the non-finite values stay out of the scale: a large error elsewhere still fails
    got = exp.astype(np.float32)
    got[10] += 1.0
    assert not check.compare(exp, got, dt.f32).ok


def test_all_non_finite_matching_passes(chunk):
    exp = np.full(20, np.nan)
    assert check.compare(exp, exp.astype(np.float32), dt.f32).ok


def test_integers_allow_off_by_one_and_booleans_are_exact(chunk):
    exp = np.arange(-50, 50, dtype=np.int32).reshape(4, 25)
    got = exp.copy()
    got[3, 24] += 1
    verdict = check.compare(exp, got, dt.s32)
    assert verdict.ok and verdict.max_abs == 1.0
    got[2, 3] -= 3
    verdict = check.compare(exp, got, dt.s32)
    assert not verdict.ok
    assert verdict.message == "1 of 100 values differ; worst at (2, 3): got 0, expected 3"
    flags = np.arange(30) % 3 == 0
    assert check.compare(flags, flags.copy(), dt.boolean).ok
    assert not check.compare(flags, ~flags, dt.boolean).ok


def test_strided_and_low_precision_inputs(chunk):
    rng = np.random.default_rng(1)
    exp = rng.normal(size=(16, 9))
    got = exp.astype(ml_dtypes.bfloat16).T.copy().T  # a non-contiguous bf16 view
    assert not got.flags.c_contiguous
    assert check.compare(exp, got, dt.bf16).ok
    assert not check.compare(exp, got, dt.f32).ok  # bf16 rounding is far outside f32's rtol

"""Comparing a result with the reference: the per-data-type tolerance rule.

Used by check mode (``GRAPH_API_CHECK=1``), ``graph-api run --check`` and the
tests.  The rule, and why:

* Integer and boolean outputs: exact, except off by one where the reference
  lands within rounding distance of a .5 boundary (a different but correct
  f32 summation order may round the other way) — as benchdnn allows.
* Floating outputs: ``|got - exp| <= rtol * (|exp| + max|exp|)``.  ``rtol`` is
  a few units in the last place of the coarsest precision in play: the output
  type and the type the fpmath mode lets compute inputs be rounded to.  The
  ``max|exp|`` term makes the check scale-aware so results of cancelling sums
  (near zero) are judged against the magnitude of the terms, not of the result.
* NaN must match NaN; infinities must match exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import dtypes
from .dtypes import DataType
from .fpmath import FPMath

#: machine epsilon (2^-mantissa bits) of each float type, and tf32
EPS = {DataType.f32: 2.0**-23, DataType.f64: 2.0**-52, DataType.bf16: 2.0**-7,
       DataType.f16: 2.0**-10, DataType.f8_e4m3: 2.0**-3, DataType.f8_e5m2: 2.0**-2, "tf32": 2.0**-10}

#: ulps of the coarsest precision allowed: summation-order differences in f32
#: accumulate to a few f32 ulps per term magnitude for the sizes we run (K <= 16k
#: gives sqrt(K)*eps ~ 1e-5); one output rounding adds one ulp of the output type
F32_RTOL = 2e-5
ULPS = 4


@dataclass
class Verdict:
    ok: bool
    message: str = ""
    max_abs: float = 0.0
    max_rel: float = 0.0


def rtol_for(dtype: DataType, fpmath: FPMath | None = None) -> float:
    eps = EPS.get(DataType(dtype), 0.0) * ULPS
    if fpmath is not None and fpmath.rounding is not None:
        key = fpmath.rounding if fpmath.rounding == "tf32" else DataType[fpmath.rounding]
        eps = max(eps, EPS[key] * ULPS)
    return max(eps, F32_RTOL)


#: elements compared at a time: the float64 copies and temporaries of one
#: chunk (a few MB) stay in cache, where whole-array passes over a 16M-element
#: output allocate and page in ~130 MB per temporary (2 s per output, most of a
#: batch case's time); the result is the same as one whole-array pass
CHUNK = 1 << 17


def _chunks(e_flat: np.ndarray, g_flat: np.ndarray, dtype=np.float64):
    """(start, expected, got) a chunk at a time, converted to ``dtype``."""
    for start in range(0, e_flat.size, CHUNK):
        stop = start + CHUNK
        yield start, e_flat[start:stop].astype(dtype), g_flat[start:stop].astype(dtype)


def _index(flat: int, shape) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape))


def _int_verdict(exp, res, kind: str) -> Verdict:
    worst, worst_at, bad_count = -1, 0, 0
    for start, e, g in _chunks(exp.reshape(-1), res.reshape(-1), np.int64):
        diff = np.abs(e - g)
        bad_count += int(np.count_nonzero(diff > (1 if kind == "int" else 0)))
        i = int(np.argmax(diff))
        if diff[i] > worst:
            worst, worst_at = int(diff[i]), start + i
    if bad_count:
        i = _index(worst_at, exp.shape)
        return Verdict(False, f"{bad_count} of {exp.size} values differ; worst at {i}: "
                              f"got {res[i].astype(np.int64)}, expected {exp[i].astype(np.int64)}",
                       float(worst))
    return Verdict(True, max_abs=float(worst))


def _scale(shape, e_flat, g_flat):
    """``(mismatch, scale, finite)``: the first place where NaN does not match NaN
    or an infinity is not matched exactly (a message, else None), the largest
    finite |expected| (the scale of the rule) and how many values are finite."""
    scale, finite = 0.0, 0
    for start, e, g in _chunks(e_flat, g_flat):
        ok = np.isfinite(e)
        if not (ok.all() and np.isfinite(g).all()):
            nan_e, nan_g = np.isnan(e), np.isnan(g)
            if (nan_e != nan_g).any():
                k = int(np.argmax(nan_e != nan_g))
                return (f"NaN mismatch at {_index(start + k, shape)}: got {g[k]}, "
                        f"expected {e[k]}"), 0.0, 0
            wrong_inf = (np.isinf(e) | np.isinf(g)) & (e != g)
            if wrong_inf.any():
                k = int(np.argmax(wrong_inf))
                return (f"infinity mismatch at {_index(start + k, shape)}: got {g[k]}, "
                        f"expected {e[k]}"), 0.0, 0
        finite += int(np.count_nonzero(ok))
        scale = max(scale, float(np.max(np.abs(e), where=ok, initial=0.0)))
    return None, scale, finite


def compare(expected, got, dtype: DataType, fpmath: FPMath | None = None, ops=()) -> Verdict:
    """Does ``got`` match ``expected`` within the rule above?  Every element is
    compared (as benchdnn does), a chunk at a time."""
    exp = np.asarray(expected)
    res = np.asarray(got)
    if exp.shape != res.shape:
        return Verdict(False, f"shape {res.shape} != expected {exp.shape}")
    if exp.size == 0:
        return Verdict(True)
    kind = dtypes.info(dtype).kind
    if kind in ("int", "bool"):
        return _int_verdict(exp, res, kind)
    e_flat, g_flat = exp.reshape(-1), res.reshape(-1)  # a copy only when not contiguous
    mismatch, scale, finite = _scale(exp.shape, e_flat, g_flat)
    if mismatch:
        return Verdict(False, mismatch)
    if not finite:
        return Verdict(True)
    rtol = rtol_for(dtype, fpmath)
    bad_count, max_abs, max_rel, worst = 0, 0.0, 0.0, None
    tiny = np.finfo(np.float32).tiny
    for _, e, g in _chunks(e_flat, g_flat):
        # non-finite values agree pairwise now: their |diff| is NaN, which no
        # comparison selects; they stay out of the maxima and the worst value
        ok = np.isfinite(e)
        with np.errstate(invalid="ignore"):  # inf - inf
            diff = np.abs(e - g)
        excess = diff - rtol * (np.abs(e) + scale)
        bad_count += int(np.count_nonzero(excess > 0))
        max_abs = max(max_abs, float(np.max(diff, where=ok, initial=0.0)))
        rel = diff / np.maximum(np.abs(e), tiny)
        max_rel = max(max_rel, float(np.max(rel, where=ok, initial=0.0)))
        excess[~ok] = -np.inf
        k = int(np.argmax(excess))
        if excess[k] > 0 and (worst is None or excess[k] > worst[0]):
            worst = (excess[k], g[k], e[k], diff[k])
    if bad_count:
        _, g_k, e_k, d_k = worst
        return Verdict(False, f"{bad_count} of {finite} values outside rtol {rtol:.2e}; worst: "
                              f"got {g_k!r}, expected {e_k!r} (|diff| {d_k:.3e})", max_abs, max_rel)
    return Verdict(True, max_abs=max_abs, max_rel=max_rel)

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


def compare(expected, got, dtype: DataType, fpmath: FPMath | None = None, ops=()) -> Verdict:
    """Does ``got`` match ``expected`` within the rule above?"""
    exp = np.asarray(expected)
    res = np.asarray(got)
    if exp.shape != res.shape:
        return Verdict(False, f"shape {res.shape} != expected {exp.shape}")
    if exp.size == 0:
        return Verdict(True)
    kind = dtypes.info(dtype).kind
    if kind in ("int", "bool"):
        e, g = exp.astype(np.int64), res.astype(np.int64)
        diff = np.abs(e - g)
        bad = diff > (1 if kind == "int" else 0)
        if bad.any():
            i = np.unravel_index(np.argmax(diff), diff.shape)
            return Verdict(False, f"{int(bad.sum())} of {exp.size} values differ; worst at {i}: "
                                  f"got {g[i]}, expected {e[i]}", float(diff.max()))
        return Verdict(True, max_abs=float(diff.max()))
    e = exp.astype(np.float64)
    g = res.astype(np.float64)
    nan_e, nan_g = np.isnan(e), np.isnan(g)
    if (nan_e != nan_g).any():
        i = np.unravel_index(np.argmax(nan_e != nan_g), e.shape)
        return Verdict(False, f"NaN mismatch at {i}: got {g[i]}, expected {e[i]}")
    inf = np.isinf(e) | np.isinf(g)
    if (inf & (e != g)).any():
        i = np.unravel_index(np.argmax(inf & (e != g)), e.shape)
        return Verdict(False, f"infinity mismatch at {i}: got {g[i]}, expected {e[i]}")
    finite = ~(nan_e | inf)
    if not finite.any():
        return Verdict(True)
    e, g = e[finite], g[finite]
    rtol = rtol_for(dtype, fpmath)
    scale = np.abs(e).max()
    diff = np.abs(e - g)
    allowed = rtol * (np.abs(e) + scale)
    rel = diff / np.maximum(np.abs(e), np.finfo(np.float32).tiny)
    bad = diff > allowed
    if bad.any():
        i = int(np.argmax(diff - allowed))
        return Verdict(False, f"{int(bad.sum())} of {e.size} values outside rtol {rtol:.2e}; worst: "
                              f"got {g[i]!r}, expected {e[i]!r} (|diff| {diff[i]:.3e})",
                       float(diff.max()), float(rel.max()))
    return Verdict(True, max_abs=float(diff.max()), max_rel=float(rel.max()))

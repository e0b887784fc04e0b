"""The bf16 x bf16 -> f32 product on the host's matrix unit: the one entry the plans use.

``UNIT`` names it (``ISA.bf16_unit``): ``"amx_bf16"`` (``tdpbf16ps``,
:mod:`graph_api.kernels.amx`), ``"avx512_bf16"`` (``vdpbf16ps``,
:mod:`graph_api.kernels.dpbf16_gemm`) or None, where no unit makes a bf16 product
faster than f32 FMA and a relaxed fpmath mode runs the strict kernel on the rounded
values.  Both units read the same packed layouts (:func:`pack_a`, :func:`pack_b`), so
a constant weight packed once serves whichever the host has; both multiply exactly and
sum in f32 with subnormals flushed.
"""
from __future__ import annotations

import numpy as np

from graph_api.kernels.amx import bf16_bits, pack_a, pack_b, padded  # noqa: F401  (the shared layouts)
from graph_api.kernels.isa import ISA

#: the unit bf16 products run on (see the module docstring)
UNIT: str | None = ISA.bf16_unit


def gemm(a_packed: np.ndarray, b_packed: np.ndarray, c: np.ndarray, K: int) -> None:
    """``c[M, N] = A @ B`` on :data:`UNIT`: ``a_packed`` from :func:`pack_a`, ``b_packed``
    from :func:`pack_b` (both of depth ``K``), ``c`` f32 [M, N] C-contiguous."""
    if UNIT == "amx_bf16":
        from graph_api.kernels import amx

        amx.gemm(a_packed, b_packed, c, K)
    elif UNIT == "avx512_bf16":
        from graph_api.kernels import dpbf16_gemm

        dpbf16_gemm.gemm(a_packed, b_packed, c, K)
    else:
        raise RuntimeError(f"no bf16 matrix unit on this target ({ISA.describe()})")


def matmul(a: np.ndarray, packed_b: np.ndarray, b_values, out: np.ndarray) -> np.ndarray:
    """``out[M, N] = bf16(a) @ B`` on :data:`UNIT`: ``a`` f32 [M, K] (rounded to bf16 by
    the packing: a no-op where the plan's mode rounded it already), ``packed_b`` from
    :func:`pack_b`.  Rows whose f32 sums are not finite (an f32 sum may overflow where
    the reference's float64 sum does not) are redone with float64 sums of the same bf16
    values, rounded once; ``b_values()`` gives B's f32 [K, N] bf16 values for that
    (called only then)."""
    from graph_api.kernels import scratch

    M, K = a.shape
    gemm(pack_a(a, scratch.empty(padded(M) * padded(K), np.uint16)), packed_b, out, K)
    bad = ~np.isfinite(out).all(axis=1)
    if bad.any():
        rows = np.flatnonzero(bad)
        a_rows = (bf16_bits(a[rows]).astype(np.uint32) << np.uint32(16)).view(np.float32)
        with np.errstate(all="ignore"):
            out[rows] = a_rows.astype(np.float64) @ np.asarray(b_values(), np.float64)
    return out

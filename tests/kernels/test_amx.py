"""The AMX kernels' own parts (kernels/amx.py): the bf16 rounding of the packing and the
int8 GEMM on the tile unit.  The bf16 GEMM's tests (on every unit) are in
test_bf16_matmul.py."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from graph_api.kernels.isa import ISA


def test_bf16_bits_round_to_nearest_even_as_ml_dtypes():
    """Every f32 class: random bit patterns (NaN, inf, subnormals, halfway cases)."""
    from graph_api.kernels import amx

    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32)
    bits[:4] = [0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x00008000]  # ties to even, overflow, subnormal tie
    x = bits.view(np.float32)
    got = amx.bf16_bits(x)
    want = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], want[~nan])
    assert np.all(np.isnan(got[nan].view(ml_dtypes.bfloat16).astype(np.float32)))


needs_amx_int8 = pytest.mark.skipif(not ISA.amx_int8, reason="needs AMX-INT8 (this target: " + ISA.describe() + ")")


@needs_amx_int8
@pytest.mark.parametrize("a_dtype,b_dtype", [(np.uint8, np.int8), (np.int8, np.uint8), (np.uint8, np.uint8),
                                             (np.int8, np.int8)])
@pytest.mark.parametrize("M,Kd,N", [(100, 384, 150), (33, 70, 64), (64, 1000, 97)])
def test_int8_gemm_on_amx_is_exact(a_dtype, b_dtype, M, Kd, N, monkeypatch):
    """igemm.gemm on the tile unit: the exact int32 (A - za)(B - zb), zero points per
    column, every signedness pair (igemm flips B's to the one opposite A's); the same
    array as the VNNI path."""
    from graph_api.kernels import igemm

    rng = np.random.default_rng(M + N)
    info_a, info_b = np.iinfo(a_dtype), np.iinfo(b_dtype)
    a = rng.integers(info_a.min, info_a.max + 1, (M, Kd)).astype(a_dtype)
    b = rng.integers(info_b.min, info_b.max + 1, (Kd, N)).astype(b_dtype)
    za, zb = 3, rng.integers(-5, 6, N)
    packed = igemm.PackedB(b, a_dtype, zb)
    monkeypatch.setattr(igemm, "SERIAL_BELOW", 0)  # the parallel driver, which runs on AMX
    got = igemm.gemm(a, packed, za).copy()
    want = (a.astype(np.int64) - za) @ (b.astype(np.int64) - zb)
    assert np.array_equal(got, want)
    monkeypatch.setattr(igemm, "USE_AMX", False)
    assert np.array_equal(igemm.gemm(a, packed, za), got)

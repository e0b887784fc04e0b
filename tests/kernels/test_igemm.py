"""The exact int8 GEMM (kernels/igemm.py) against int64 numpy, bit for bit.

Integer results have no tolerance: every case must equal
``(A - za) @ (B - zb)`` computed in int64.  Shapes are ragged on purpose
(M not a multiple of the 6-row micro-tile or the 96-row block, N not a
multiple of the 64-column panel, K not a multiple of 4 or of the K block),
and the operands include the extreme values (-128, 127, 0, 255).
"""
from __future__ import annotations

import numpy as np
import pytest

from graph_api.kernels import igemm

RNG = np.random.default_rng(7)
INFO = {np.uint8: (0, 255), np.int8: (-128, 127)}
PAIRS = [(np.uint8, np.int8), (np.int8, np.uint8), (np.uint8, np.uint8), (np.int8, np.int8)]
SHAPES = [(1, 1, 1), (1, 5, 64), (7, 13, 70), (6, 256, 64), (13, 257, 129), (97, 40, 65), (200, 1001, 3)]


def _operand(shape, dtype, extreme=False):
    lo, hi = INFO[dtype]
    if extreme:  # only the two ends of the range: the largest products and sums
        return np.where(RNG.random(shape) < 0.5, lo, hi).astype(dtype)
    return RNG.integers(lo, hi + 1, shape).astype(dtype)


def _want(a, b, za, zb):
    return (a.astype(np.int64) - za) @ (b.astype(np.int64) - np.asarray(zb, np.int64))


@pytest.fixture(params=["vnni", "portable"])
def kernel(request, monkeypatch):
    """Both micro-kernels: the VNNI one (skipped where the CPU lacks it) and plain Numba."""
    if request.param == "vnni" and not igemm.HAVE_VNNI:
        pytest.skip("no AVX-512 VNNI on this CPU")
    monkeypatch.setattr(igemm, "HAVE_VNNI", request.param == "vnni")
    return request.param


@pytest.mark.parametrize("a_dt,b_dt", PAIRS)
@pytest.mark.parametrize("shape", SHAPES)
def test_random_operands_and_zero_points(kernel, a_dt, b_dt, shape):
    M, K, N = shape
    a, b = _operand((M, K), a_dt), _operand((K, N), b_dt)
    za = int(_operand((), a_dt))
    zb = _operand((N,), b_dt).astype(np.int64)  # per output column
    got = igemm.gemm(a, igemm.PackedB(b, a_dt, zb), za)
    assert got.dtype == np.int32 and np.array_equal(got, _want(a, b, za, zb))


@pytest.mark.parametrize("a_dt,b_dt", PAIRS)
def test_extreme_values_and_the_longest_exact_reduction(kernel, a_dt, b_dt):
    """K = 33024: |sum| up to K * 255 * 255 = 2.1e9, just inside int32 (exact_in_int32)."""
    M, K, N = 7, 33024 if kernel == "vnni" else 2052, 66
    assert igemm.exact_in_int32(K, 255, 255) == (K <= 33025)
    a, b = _operand((M, K), a_dt, extreme=True), _operand((K, N), b_dt, extreme=True)
    a[0], b[:, 0] = INFO[a_dt][1], INFO[b_dt][1]  # one all-max row and column: the largest sum
    za, zb = INFO[a_dt][0], INFO[b_dt][0]  # the zero point at the other end of the range
    got = igemm.gemm(a, igemm.PackedB(b, a_dt, zb), za)
    assert np.array_equal(got, _want(a, b, za, zb))


def test_strided_operands_and_an_output_view(kernel):
    a = _operand((40, 30), np.uint8).T  # [30, 40], column-major
    b = _operand((50, 40), np.int8)[::2].T  # [40, 25], strided
    out = np.full((30, 32), -1, np.int32)
    igemm.gemm(a, igemm.PackedB(b, np.uint8, 3), 100, out=out[:, 2:27])
    assert np.array_equal(out[:, 2:27], _want(a, b, 100, 3))
    assert (out[:, :2] == -1).all() and (out[:, 27:] == -1).all()  # nothing written outside the view


@pytest.mark.parametrize("shape", [(0, 8, 4), (3, 0, 4), (3, 8, 0)])
def test_empty_dimensions(shape):
    M, K, N = shape
    got = igemm.gemm(np.ones((M, K), np.uint8), igemm.PackedB(np.ones((K, N), np.int8), np.uint8), 1)
    assert got.shape == (M, N) and not got.any()


def test_mismatched_operands_are_refused():
    packed = igemm.PackedB(np.ones((8, 4), np.int8), np.uint8)
    with pytest.raises(ValueError):
        igemm.gemm(np.ones((2, 8), np.int8), packed)  # packed for u8 A
    with pytest.raises(ValueError):
        igemm.gemm(np.ones((2, 9), np.uint8), packed)
    with pytest.raises(TypeError):
        igemm.PackedB(np.ones((8, 4), np.int16), np.uint8)


def test_conv_contract_int_gemm(kernel):
    """Same contract as kernels.conv.int_gemm: f32 integer operands, f64 [G*O, P]."""
    G, O, J, P = 2, 5, 300, 70
    cols = (RNG.integers(0, 256, (G, J, P)) - 100).astype(np.float32)  # u8 minus a zero point
    w2 = RNG.integers(-128, 128, (G, O, J)).astype(np.float32)
    got = igemm.int_gemm(cols, w2, 514)
    want = np.matmul(w2.astype(np.int64), cols.astype(np.int64)).reshape(G * O, P)
    assert got.dtype == np.float64 and np.array_equal(got, want)
    with pytest.raises(ValueError):
        igemm.int_gemm(cols * 2, w2)  # the columns span more than 8 bits


def test_the_serial_and_the_parallel_driver_have_distinct_cache_keys():
    """Numba's on-disk cache keys a closure on its bytecode and closure-cell values, not
    on its decorator: the serial and the parallel driver must differ in their cells, or
    a process loads whichever of the two was saved last as both (it loaded the serial
    code as the parallel driver after a test run)."""
    cells = lambda f: tuple(c.cell_contents for c in f.py_func.__closure__)
    for vnni in (False, True):
        assert cells(igemm._make_gemm(vnni, False)) != cells(igemm._make_gemm(vnni, True))

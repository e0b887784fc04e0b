"""numpy's OpenBLAS from Numba (kernels/openblas.py): the sgemm intrinsic vs a
float64 product, and the thread count held at one and restored.

Tolerance of sgemm: K products (exact in float64 from f32 inputs, rounded once
in f32) summed in f32 in any order, plus ``beta * C``: at most K + 1 roundings,
each ``<= u = 2**-24`` relative to ``B = |A| @ |B| + |beta C|``."""
import threading

import numpy as np
import pytest
from numba import njit

from graph_api.kernels import openblas

U = 2.0 ** -24
pytestmark = pytest.mark.skipif(not openblas.available(), reason="numpy's OpenBLAS (64-bit integers) not found")


@njit(cache=False)
def _call(fn, m, n, k, a, a_off, lda, b, b_off, ldb, beta, c, c_off, ldc):
    openblas.sgemm(fn, m, n, k, a, a_off, lda, b, b_off, ldb, beta, c, c_off, ldc)


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_sgemm_offsets_strides_and_beta(beta):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((9, 40)).astype(np.float32)   # A = a[2:7, 3:20]: 5 x 17, lda 40
    b = rng.standard_normal((30, 33)).astype(np.float32)  # B = b[1:18, 4:15]: 17 x 11, ldb 33
    c = rng.standard_normal((8, 21)).astype(np.float32)   # C = c[1:6, 6:17]: 5 x 11, ldc 21
    c0 = c.copy()
    _call(openblas.sgemm_address(), 5, 11, 17, a, 2 * 40 + 3, 40, b, 1 * 33 + 4, 33, np.float32(beta), c, 1 * 21 + 6, 21)
    A, B, C = a[2:7, 3:20].astype(np.float64), b[1:18, 4:15].astype(np.float64), c0[1:6, 6:17].astype(np.float64)
    want = A @ B + beta * C
    bound = 18 * U * (np.abs(A) @ np.abs(B) + abs(beta) * np.abs(C))
    assert np.all(np.abs(c[1:6, 6:17] - want) <= bound)
    mask = np.ones_like(c, bool)
    mask[1:6, 6:17] = False
    assert np.array_equal(c[mask], c0[mask])  # nothing outside C is written


def test_single_threaded_nests_across_threads_and_restores():
    get = openblas._funcs[0]
    before = get()
    inside = []
    gate = threading.Barrier(2)

    def user():
        with openblas.single_threaded():
            gate.wait()
            inside.append(get())
            gate.wait()

    t = threading.Thread(target=user)
    t.start()
    with openblas.single_threaded():
        gate.wait()
        inside.append(get())
        gate.wait()
    t.join()
    assert inside == [1, 1]
    assert get() == before

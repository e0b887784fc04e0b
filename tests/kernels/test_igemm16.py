"""The exact int16-pair GEMM of AVX2 CPUs without VNNI (kernels/convolution/igemm16.py) against int64
numpy, bit for bit (integer sums: no tolerance)."""
from __future__ import annotations

import numpy as np
import pytest

from graph_api.kernels.convolution import igemm16

RNG = np.random.default_rng(5)

pytestmark = pytest.mark.skipif(not igemm16.HAVE_AVX2, reason="no AVX2 on this CPU")


# M past the 96-row task block and not a multiple of the 6-row tile, K odd and past the
# 256-pair K block (the tile resumes from C), N not a multiple of the 16-column panel
@pytest.mark.parametrize("M,K,N", [(1, 1, 1), (7, 5, 3), (100, 300, 130), (97, 1153, 64), (13, 2, 17)])
def test_extreme_operands_sum_exactly(M, K, N):
    """The largest products (-128 * -255) and sums: int32 exact while K * 255 * 128 < 2^31."""
    a = np.where(RNG.random((M, K)) < 0.5, -128, 127).astype(np.int8)
    b = np.where(RNG.random((K, N)) < 0.5, -255, 255).astype(np.int16)
    b[:, ::3] = -255
    a[::2] = -128  # rows whose every product is +32640: the largest positive sums
    assert igemm16.exact(K, 128, 255)
    np.testing.assert_array_equal(igemm16.matmul(a, b), a.astype(np.int64) @ b.astype(np.int64))


def test_random_operands_sum_exactly():
    a = RNG.integers(-128, 128, (64, 576)).astype(np.int8)
    b = RNG.integers(-255, 256, (576, 3136)).astype(np.int16)
    np.testing.assert_array_equal(igemm16.matmul(a, b), a.astype(np.int64) @ b.astype(np.int64))


def test_exactness_bound():
    assert igemm16.exact(65793, 128, 255)  # 65793 * 32640 < 2^31
    assert not igemm16.exact(65794, 128, 255)
    assert not igemm16.exact(1, 128, 2 ** 15)  # past int16: the pairs cannot hold the operand


def test_packed_layouts():
    """``bp[p, k2, j, t] = B[2*k2 + t, p*NR + j]``, ``ap[g, k2, i, t] = A[g*MR + i, 2*k2 + t]``, zero padded."""
    b = RNG.integers(-255, 256, (5, 20)).astype(np.int16)
    bp = igemm16.pack_b(b).reshape(2, 3, igemm16.NR, 2)
    assert bp[1, 2, 3, 0] == b[4, igemm16.NR + 3] and bp[1, 2, 3, 1] == 0 and bp[1, 0, 5, 0] == 0
    a = RNG.integers(-128, 128, (7, 3)).astype(np.int8)
    ap = igemm16.pack_a(a).reshape(2, 2, igemm16.MR, 2)
    assert ap[1, 0, 0, 1] == a[6, 1] and ap[1, 1, 0, 0] == a[6, 2] and ap[1, 1, 0, 1] == 0 and ap[1, 0, 1, 0] == 0

"""kernels/store.py ``gemm_store``: row tiles of ``a @ b`` by single-threaded sgemm, each
stored through the epilogue while in cache, rows with an inf or a NaN redone in float64.

Tolerance: K products (exact in float64 from f32 inputs) summed in f32 in any order:
at most K roundings of ``u = 2**-24`` relative to ``|A| @ |B|`` (no epilogue), plus one
rounding of the bias add and the output's own (2u relative to the result, ReLU exact).
Rows redone in float64 are the reference's float64 sum rounded once: ``u |exact|``.
"""
import numpy as np
import pytest

import graph_api as ga
from graph_api.kernels import openblas, store
from graph_api.kernels.weight_compressed import wmatmul as wm
from tests.patterns import graphs
from tests.patterns.builder import dt

U = 2.0 ** -24
pytestmark = pytest.mark.skipif(not openblas.available(), reason="numpy's OpenBLAS (64-bit integers) not found")


def _dense(R, N):
    return np.arange(R, dtype=np.int64) * N, np.arange(N, dtype=np.int64)


def _run(a, b, ops=(), head=store.NO_HEAD, direct=False):
    R, N = a.shape[0], b.shape[1]
    out = np.full(R * N, np.nan, np.float32)
    roff, coff = _dense(R, N)
    store.gemm_store(a, b, out, roff, coff, 0, wm.make_epilogue(list(ops), R, N), N, head, direct)
    return out.reshape(R, N)


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("R,K,N", [(300, 70, 130), (2, 5, 40000), (1031, 3, 64)])
def test_product_within_the_f32_bound(direct, R, K, N):
    rng = np.random.default_rng(R)
    a = rng.standard_normal((R, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    got = _run(a, b, direct=direct)
    A, B = a.astype(np.float64), b.astype(np.float64)
    assert np.all(np.abs(got - A @ B) <= (K + 1) * U * (np.abs(A) @ np.abs(B)))


def test_bias_head_and_relu():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((256, 48)).astype(np.float32)
    b = rng.standard_normal((48, 200)).astype(np.float32)
    bias = rng.standard_normal(200).astype(np.float32)
    got = _run(a, b, ops=[("relu", None)], head=bias)
    A, B = a.astype(np.float64), b.astype(np.float64)
    exact = A @ B + bias
    bound = (48 + 2) * U * (np.abs(A) @ np.abs(B) + np.abs(bias))
    assert np.all(np.abs(got - np.maximum(exact, 0)) <= bound)
    assert not np.any(np.signbit(got) & (got != 0))  # ReLU: no negative value


@pytest.mark.parametrize("direct", [False, True])
def test_overflowing_f32_sums_are_redone_in_float64(direct):
    """Row 7: 1e20 * 1e19 overflows f32 (inf - inf = NaN in sgemm) where the float64 sum
    is finite; row 300 holds a NaN.  Only their rows (with no epilogue: their tiles) are
    redone; the others stay f32."""
    rng = np.random.default_rng(3)
    R, K, N = 600, 16, 96
    a = rng.standard_normal((R, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    a[7, :2] = 1e20
    b[0, :], b[1, :] = 1e19, -1e19
    a[300, 3] = np.nan
    got = _run(a, b, direct=direct)
    A, B = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore"):
        exact = A @ B
    assert np.isnan(got[300]).all() and np.isnan(exact[300]).all()
    rows = np.arange(R) != 300
    assert np.all(np.abs(got[7] - exact[7]) <= U * np.abs(exact[7]))  # float64 sum rounded once
    assert np.all(np.isfinite(got[rows]))


def test_overflow_row_redone_with_an_in_place_residual():
    """A residual add whose operand is the output buffer itself (the bound BERT step writes
    ``out = a @ b + bias + out``): the row whose f32 sums overflow is redone in float64
    from the residual as it was (the row is not stored before the check), its neighbours
    in the same tile are stored once (a second store would add the residual twice)."""
    rng = np.random.default_rng(8)
    R, K, N = 400, 16, 96  # one tile per thread: rows 9 and 10 share theirs
    a = rng.standard_normal((R, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    a[9, :2], a[9, 2:] = 1e20, 0.0  # f32: inf - inf; float64: exactly 0 in any order
    b[0, :], b[1, :] = 1e19, -1e19
    bias = rng.standard_normal(N).astype(np.float32)
    res = rng.standard_normal((R, N)).astype(np.float32)
    out = res.reshape(-1).copy()  # the residual operand and the destination: one buffer
    ep = wm.make_epilogue([("add", out.reshape(R, N))], R, N)
    roff, coff = _dense(R, N)
    store.gemm_store(a, b, out, roff, coff, 0, ep, N, bias)
    A, B = a.astype(np.float64), b.astype(np.float64)
    exact = A @ B + bias + res
    got = out.reshape(R, N)
    # row 9: the float64 sum is 0, then the bias and residual adds (two roundings, and a
    # residual added twice would be off by |res|); the others: the f32 bound plus those two
    bound = (K + 3) * U * (np.abs(A) @ np.abs(B) + np.abs(bias) + np.abs(res))
    bound[9] = 2 * U * (np.abs(bias) + np.abs(res[9]))
    assert np.all(np.abs(got - exact) <= bound)

@pytest.mark.parametrize("kwargs", [
    dict(post=("gelu",), bias="op"),
    dict(post=(), bias="op", tail="reshape_transpose_reshape"),
    dict(post=(), bias=None),  # no epilogue: sgemm writes the output
    dict(post=("relu", "add"), bias="input"),
    dict(post=(), bias="input", out_cast=dt.bf16),  # bf16 output bits through the store
], ids=["bias_gelu", "transposed_store", "direct", "relu_add", "bf16_out"])
def test_plan_takes_the_fused_path(kwargs, check_mode, monkeypatch):
    """Partitions large enough for the fused path run it (counted) and match the
    reference (check mode compares every output with it)."""
    calls = []
    real = store.gemm_store
    monkeypatch.setattr(store, "gemm_store", lambda *a, **k: calls.append(1) or real(*a, **k))
    graph = graphs.matmul_chain(m=256, k=40, n=192, **kwargs)
    from graph_api.fill import fill_inputs

    feeds = fill_inputs(graph, 0)
    parts = [p for p in graph.get_partitions() if p.is_supported()]
    run = ga.run_graph(graph, feeds, partitions=parts)
    assert [r.compiled.plan.name for r in run.partitions][0].startswith("blas_matmul_epilogue")
    assert calls


@pytest.mark.parametrize("R,K,N", [(64, 576, 3136), (3, 7, 20000), (8, 8, 8)])
def test_matmul_into_column_blocks(R, K, N):
    """A convolution's GEMM shape (few rows, long ones), a thin one, and one small enough
    for numpy's matmul; a NaN and an f32 overflow (float64 sum finite) in two columns."""
    rng = np.random.default_rng(K)
    a = rng.standard_normal((R, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    b[0, N - 1] = np.nan
    a[0, :2], b[:2, 1] = 1e20, (1e19, -1e19)
    out = np.full((R, N), -7.0, np.float32)
    store.matmul_into(a, b, out)
    A, B = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore"):
        exact = A @ B
    assert np.isnan(out[:, N - 1]).all() and np.isnan(exact[:, N - 1]).all()
    fin = np.ones(N, bool)
    fin[N - 1] = False
    fin[1] = R * N >= store.SERIAL_BELOW  # numpy's f32 product overflows there; ours is redone
    bound = (K + 1) * U * (np.abs(A) @ np.abs(np.nan_to_num(B)))
    assert np.all(np.abs(out[:, fin] - exact[:, fin]) <= bound[:, fin])
    if R * N >= store.SERIAL_BELOW:
        assert np.all(np.abs(out[:, 1] - exact[:, 1]) <= U * np.abs(exact[:, 1]) + bound[:, 1])

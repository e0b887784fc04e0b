"""Deterministic mode (docs/determinism.md): with ``ga.set_deterministic(True)`` each kernel
whose work split used to follow the thread count gives bit-identical results with 1 and 2
Numba threads; the numbers also match float64 numpy.  Every run builds a fresh graph, so no
compiled partition or bound step carries a split over from the other thread count."""
import numpy as np
import pytest

import graph_api as ga
from graph_api.config import settings
from graph_api.kernels import threads as kthreads
from graph_api.kernels.numba_setup import numba

from ..patterns.builder import G, K, dt, same_bits

C = ga.PropertyType.constant
RNG = np.random.default_rng(2026)
pytestmark = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 Numba threads")


@pytest.fixture
def deterministic():
    saved, threads = settings.deterministic, numba.get_num_threads()
    ga.set_deterministic(True)
    yield
    settings.deterministic = saved
    numba.set_num_threads(threads)


def _sdpa_decode(S=2048, H=2, D=64):
    """One query row against S keys: the decode form whose K/V splits followed the thread count."""
    g = G()
    q, k, v = g.input((1, H, 1, D)), g.input((1, H, S, D)), g.input((1, H, S, D))
    scale = g.input((1,))
    s = g.op(K.MatMul, q, k, attrs={"transpose_b": True})
    s = g.op(K.Divide, s, scale)
    p = g.op(K.SoftMax, s, attrs={"axis": -1})
    g.op(K.MatMul, p, v)
    return g.done()


def _sdpa_want(f):
    q, k, v, scale = (f[i].astype(np.float64) for i in range(4))
    s = q @ np.swapaxes(k, -1, -2) / scale[0]
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def _compressed_decode(Kd=4096, N=64):
    """x [1, K] @ DynamicDequantize(s8 [K, N], per-group scales along K): decode, K split in parts."""
    g = G()
    x = g.input((1, Kd))
    w, s = g.input((Kd, N), dt.s8, C), g.input((Kd // 32, N), dt.f32, C)
    d = g.op(K.DynamicDequantize, w, s, dtype=dt.f32, attrs={"qtype": "per_group", "group_shape": [32, 1]})
    g.op(K.MatMul, x, d)
    return g.done()


def _compressed_want(f):
    w = f[1].astype(np.float64) * np.repeat(f[2].astype(np.float64), 32, axis=0)
    return f[0].astype(np.float64) @ w


def _linear(M=256, Kd=192, N=256):
    """x @ constant W -> ReLU: the sgemm row tiles of kernels.store.gemm_store."""
    g = G()
    y = g.op(K.MatMul, g.input((M, Kd)), g.input((Kd, N), dt.f32, C))
    g.op(K.ReLU, y)
    return g.done()


def _linear_want(f):
    return np.maximum(f[0].astype(np.float64) @ f[1].astype(np.float64), 0)


def _conv(C_=16, HW=32):
    """3x3 Convolution -> ReLU: bands of output rows (kernels.convolution)."""
    g = G()
    attrs = {"strides": [1, 1], "pads_begin": [1, 1], "pads_end": [1, 1], "dilations": [1, 1],
             "groups": 1, "data_format": "NCX", "weights_format": "OIX"}
    y = g.op(K.Convolution, g.input((1, C_, HW, HW)), g.input((C_, C_, 3, 3), dt.f32, C), attrs=attrs)
    g.op(K.ReLU, y)
    return g.done()


def _conv_want(f):
    x, w = f[0].astype(np.float64), f[1].astype(np.float64)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    H, W = x.shape[2:]
    out = np.zeros((1, w.shape[0], H, W))
    for i in range(3):
        for j in range(3):
            out += np.einsum("oc,nchw->nohw", w[:, :, i, j], xp[:, :, i:i + H, j:j + W])
    return np.maximum(out, 0)


CASES = {
    "sdpa_decode": (_sdpa_decode, _sdpa_want, 1e-5),
    "compressed_matmul_decode": (_compressed_decode, _compressed_want, 1e-4),
    "matmul_gemm_store": (_linear, _linear_want, 1e-4),
    "convolution_bands": (_conv, _conv_want, 1e-4),
}


def _feeds(graph):
    feeds = {}
    for tid in graph.input_ids:
        lt = graph.tensors[tid]
        if lt.dtype == dt.s8:
            feeds[tid] = RNG.integers(-128, 128, lt.shape).astype(np.int8)
        elif lt.shape == (1,):
            feeds[tid] = np.array([8.0], np.float32)
        else:
            feeds[tid] = RNG.standard_normal(lt.shape).astype(np.float32) * (0.05 if lt.shape[0] > 1000 else 1)
    return feeds


@pytest.mark.parametrize("case", list(CASES))
def test_bit_identical_across_thread_counts(case, deterministic):
    build, want, tol = CASES[case]
    feeds = _feeds(build())
    outs = []
    for nthreads in (1, 2, 1):
        numba.set_num_threads(nthreads)
        graph = build()  # fresh partitions and plans: nothing bound for the other thread count
        run = ga.run_graph(graph, feeds)
        assert any(p.compiled.plan.name != "reference" for p in run.partitions)
        outs.append(run.outputs[graph.output_ids[0]])
    assert same_bits(outs[0], outs[1]) and same_bits(outs[0], outs[2]), case
    ref = want(feeds)
    np.testing.assert_allclose(outs[0], ref, rtol=tol, atol=tol * max(1.0, float(np.abs(ref).max())))


def test_split_follows_the_thread_count_only_outside_deterministic_mode(deterministic):
    numba.set_num_threads(1)
    assert kthreads.split_threads() == kthreads.DETERMINISTIC_SPLIT
    ga.set_deterministic(False)
    assert kthreads.split_threads() == 1


@pytest.mark.parametrize("bad", ["yes", 2, None, 1.0])
def test_set_deterministic_takes_a_bool(bad):
    with pytest.raises(ga.InvalidArguments, match="set_deterministic"):
        ga.set_deterministic(bad)

"""The constant tensor cache (oneDNN's set_constant_tensor_cache_capacity and friends).

Prepared constants live in one process-wide table keyed on the plan, the
preparation and every source buffer: one compiled partition executed with two
constant weights keeps two prepared copies and never answers one weight with the
other's; an entry goes with its source's memory; capacity 0 disables caching.
Numbers are checked against float64 numpy.
"""
import gc

import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api import constant_cache
from graph_api.constant_cache import CACHE, MB, UNLIMITED

C, V = ga.PropertyType.constant, ga.PropertyType.variable
RNG = np.random.default_rng(34)
M, KD, N = 16, 64, 48


@pytest.fixture(autouse=True)
def restore_capacity():
    saved = (ga.get_constant_tensor_cache_capacity(ga.EngineKind.cpu),
             ga.get_constant_tensor_cache_capacity(ga.EngineKind.gpu))
    yield
    ga.set_constant_tensor_cache_capacity(ga.EngineKind.cpu, saved[0])
    ga.set_constant_tensor_cache_capacity(ga.EngineKind.gpu, saved[1])


def _bf16(a):
    return np.asarray(a, np.float32).astype(ga.dtypes.numpy_dtype(dt.bf16)).astype(np.float64)


def _matmul_relu():
    """x [M, K] @ constant w [K, N] -> ReLU under fpmath bf16 (the plan keeps a rounded copy of w)."""
    g = ga.Graph(ga.EngineKind.cpu, "bf16")
    x, w = ga.LogicalTensor(0, dt.f32, [M, KD]), ga.LogicalTensor(1, dt.f32, [KD, N], property=C)
    y, z = ga.LogicalTensor(2, dt.f32, [M, N]), ga.LogicalTensor(3, dt.f32, [M, N])
    g.add_op(ga.Op(0, K.MatMul, [x, w], [y]))
    g.add_op(ga.Op(1, K.ReLU, [y], [z]))
    g.finalize()
    (part,) = g.get_partitions()
    return part.compile([x, w], [z]), (x, w, z)


def _compressed():
    """x [M, K] @ DynamicDequantize(constant s8 w [K, N], constant per-channel scales [N])."""
    g = ga.Graph(ga.EngineKind.cpu)
    x = ga.LogicalTensor(0, dt.f32, [M, KD])
    w, s = ga.LogicalTensor(1, dt.s8, [KD, N], property=C), ga.LogicalTensor(2, dt.f32, [N], property=C)
    d, y = ga.LogicalTensor(3, dt.f32, [KD, N]), ga.LogicalTensor(4, dt.f32, [M, N])
    g.add_op(ga.Op(0, K.DynamicDequantize, [w, s], [d], attrs=dict(qtype="per_channel", axis=1)))
    g.add_op(ga.Op(1, K.MatMul, [x, d], [y]))
    g.finalize()
    (part,) = g.get_partitions()
    return part.compile([x, w, s], [y]), (x, w, s, y)


def _run(cp, lts, arrays):
    eng = ga.Engine()
    out = ga.Tensor(cp.query_logical_tensor(lts[-1].id), eng)
    cp.execute(ga.Stream(eng), [ga.Tensor(lt, eng, a) for lt, a in zip(lts[:-1], arrays)], [out])
    return out.numpy().copy()


def test_two_weights_on_one_compiled_partition_keep_their_own_copies():
    cp, lts = _matmul_relu()
    x = RNG.standard_normal((M, KD)).astype(np.float32)
    w1, w2 = (RNG.standard_normal((KD, N)).astype(np.float32) for _ in range(2))
    want = {i: np.maximum(_bf16(x) @ _bf16(w), 0) for i, w in ((1, w1), (2, w2))}
    for i, w in ((1, w1), (2, w2), (1, w1), (2, w2)):
        np.testing.assert_allclose(_run(cp, lts, (x, w)), want[i], rtol=1e-5, atol=1e-5)
    entries = CACHE.entries_of(cp.plan)
    assert len(entries) == 2, entries  # one prepared copy per weight buffer, both kept
    assert CACHE.hits >= 2


def test_compressed_weights_follow_their_buffer_and_die_with_it():
    cp, lts = _compressed()
    x = RNG.standard_normal((M, KD)).astype(np.float32)
    s = (RNG.random(N) * 0.1 + 0.01).astype(np.float32)
    w1 = RNG.integers(-128, 128, (KD, N)).astype(np.int8)
    w2 = RNG.integers(-128, 128, (KD, N)).astype(np.int8)
    ref = lambda w: x.astype(np.float64) @ (w.astype(np.float64) * s.astype(np.float64))
    before = len(CACHE)
    for w in (w1, w2, w1):
        np.testing.assert_allclose(_run(cp, lts, (x, w, s)), ref(w), rtol=1e-5, atol=1e-4)
    assert len(CACHE) == before + 2
    w2_copy = w2.copy()
    del w2
    gc.collect()
    assert len(CACHE) == before + 1  # the entry went with its source's memory
    # a new weight (possibly at the freed address) is prepared anew, never served the old copy
    w3 = -w2_copy
    np.testing.assert_allclose(_run(cp, lts, (x, w3, s)), ref(w3), rtol=1e-5, atol=1e-4)


def test_capacity_zero_disables_and_results_stay_right():
    ga.set_constant_tensor_cache_capacity(ga.EngineKind.cpu, 0)
    assert ga.get_constant_tensor_cache_capacity(ga.EngineKind.cpu) == 0
    assert len(CACHE) == 0  # setting the capacity flushed it
    cp, lts = _matmul_relu()
    x = RNG.standard_normal((M, KD)).astype(np.float32)
    w = RNG.standard_normal((KD, N)).astype(np.float32)
    for _ in range(2):
        np.testing.assert_allclose(_run(cp, lts, (x, w)), np.maximum(_bf16(x) @ _bf16(w), 0), rtol=1e-5, atol=1e-5)
    assert CACHE.entries_of(cp.plan) == []


def test_full_cache_takes_no_new_entries():
    ga.set_constant_tensor_cache_capacity(ga.EngineKind.cpu, 1)  # 1 MB
    big = [np.zeros(300_000, np.float32) for _ in range(2)]  # 1.2 MB each as prepared data
    owner = type("Plan", (), {})()
    for i, src in enumerate(big):
        got = CACHE.get(owner, "copy", [src], lambda: src.copy())
        np.testing.assert_array_equal(got, src)
    assert CACHE.entries_of(owner) == []  # neither fits: built and returned, not kept
    small = np.ones(1000, np.float32)
    first = CACHE.get(owner, "copy", [small], lambda: small * 2)
    assert CACHE.get(owner, "copy", [small], lambda: small * 3) is first
    assert CACHE.size() == small.nbytes
    del owner
    gc.collect()
    assert len(CACHE) == 0  # the plan's entries go with the plan


def test_views_of_the_source_are_not_counted_as_prepared_bytes():
    owner = type("Plan", (), {})()
    src = np.ones((64, 64), np.float32)
    CACHE.get(owner, "view", [src], lambda: (src.T, 1.0))
    assert CACHE.size() == 0


def test_api_mirrors_onednn():
    assert ga.get_constant_tensor_cache() == 1  # the project's default: on, unlimited
    ga.set_constant_tensor_cache_capacity(ga.EngineKind.cpu, 512)
    assert ga.get_constant_tensor_cache_capacity("cpu") == 512
    assert CACHE.capacity() == 512 * MB
    ga.set_constant_tensor_cache(0)
    assert ga.get_constant_tensor_cache() == 0
    assert ga.get_constant_tensor_cache_capacity(ga.EngineKind.gpu) == 0
    ga.set_constant_tensor_cache(1)
    assert ga.get_constant_tensor_cache_capacity(ga.EngineKind.cpu) == UNLIMITED // MB


@pytest.mark.parametrize("call", [
    lambda: ga.set_constant_tensor_cache(-1),
    lambda: ga.set_constant_tensor_cache(True),
    lambda: ga.set_constant_tensor_cache_capacity(ga.EngineKind.cpu, -5),
    lambda: ga.set_constant_tensor_cache_capacity(ga.EngineKind.cpu, 1.5),
    lambda: ga.set_constant_tensor_cache_capacity(ga.EngineKind.any, 8),
    lambda: ga.set_constant_tensor_cache_capacity("tpu", 8),
    lambda: ga.get_constant_tensor_cache_capacity(ga.EngineKind.any),
])
def test_bad_arguments_raise_invalid_arguments(call):
    with pytest.raises(ga.InvalidArguments, match="constant_tensor_cache"):
        call()


def test_environment_capacity_text():
    assert constant_cache.parse_capacities("cpu:1024;gpu:0") == {ga.EngineKind.cpu: 1024, ga.EngineKind.gpu: 0}
    assert constant_cache.parse_capacities("") == {}
    for bad in ("cpu", "cpu:-1", "npu:4", "cpu:4MB"):
        with pytest.raises(ga.InvalidArguments, match="CONSTANT_TENSOR_CACHE_CAPACITY"):
            constant_cache.parse_capacities(bad)

"""Composite ops at get_partitions: the fast kernel as one partition, or the
decomposition inlined and partitioned; both paths against independent numpy formulas."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api import composite as C
from graph_api.config import settings

RNG = np.random.default_rng(13)


def _silu(g):
    return g / (1.0 + np.exp(-g))


def _softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


# name -> (input arrays, attrs, float64 formula, output shape)
def _cases():
    x = RNG.uniform(-9, 9, (4, 16)).astype(np.float32)
    xs = RNG.uniform(-4, 4, (3, 24)).astype(np.float32)
    gamma = RNG.uniform(0.5, 1.5, (24,)).astype(np.float32)
    m, k, n = 4, 32, 48
    mlp = [RNG.standard_normal((m, k)).astype(np.float32),
           (RNG.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32),
           (RNG.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32),
           (RNG.standard_normal((n, k)) / math.sqrt(n)).astype(np.float32)]
    b, h, s, d = 1, 2, 8, 16
    q, kk, v = (RNG.standard_normal((b, h, s, d)).astype(np.float32) for _ in range(3))
    scale = np.array([1 / math.sqrt(d)], np.float32)
    mask = np.where(np.tril(np.ones((s, s))) > 0, 0.0, -np.inf).astype(np.float32)[None, None]
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    return {
        "tanh": ([x], {}, lambda a: np.tanh(f64(a[0])), x.shape),
        "gelu_tanh": ([x], {}, lambda a: _gelu_tanh(f64(a[0])), x.shape),
        "rms_norm": ([xs, gamma], {"epsilon": 1e-5},
                     lambda a: f64(a[0]) / np.sqrt((f64(a[0]) ** 2).mean(-1, keepdims=True) + 1e-5)
                     * f64(a[1]), xs.shape),
        "gated_mlp": (mlp, {}, lambda a: (_silu(f64(a[0]) @ f64(a[1])) * (f64(a[0]) @ f64(a[2])))
                      @ f64(a[3]), (m, k)),
        "sdpa": ([q, kk, v, scale, mask], {},
                 lambda a: _softmax(f64(a[0]) @ np.swapaxes(f64(a[1]), -1, -2) * f64(a[3])
                                    + f64(a[4])) @ f64(a[2]), (b, h, s, d)),
    }


CASES = _cases()


def composite_graph(name, inputs, attrs, out_shape):
    """One Composite op over graph inputs 0..n-1, output tensor 100."""
    lts = [ga.LogicalTensor(i, dt.f32, x.shape) for i, x in enumerate(inputs)]
    out = ga.LogicalTensor(100, dt.f32, out_shape)
    g = ga.Graph()
    g.add_op(C.composite_op(0, lts, [out], name, **attrs))
    g.finalize()
    return g


def run(g, inputs, reference: bool):
    with C.reference_mode(reference):
        parts = g.get_partitions()
        result = ga.run_graph(g, dict(enumerate(inputs)), partitions=parts)
    return parts, result


# Tolerances.  The fast path and the inlined decomposition both compute in f32; the
# formulas are float64.  tanh: the decomposition's rational approximation is within
# 3.7e-7 of tanh on [-9, 9] (test_tanh_error), the Tanh op within 1 ulp; GELU scales
# that by |x|/2 <= 4.5.  RMSNorm: a 24-term f32 mean and a sqrt, a few ulps.  Gated MLP
# and SDPA: K = 32..48-term f32 dot products, error ~ sqrt(K) * 6e-8 * sum|terms|;
# 2e-5 of max|out| (check.py's F32_RTOL) covers them with margin.
TOLERANCE = {"tanh": 5e-7, "gelu_tanh": 2.5e-6, "rms_norm": 2e-6, "gated_mlp": 2e-5, "sdpa": 2e-5}


@pytest.mark.parametrize("reference", [False, True], ids=["fast", "inlined"])
@pytest.mark.parametrize("name", list(CASES))
def test_shipped_composite_on_both_paths(name, reference):
    inputs, attrs, formula, out_shape = CASES[name]
    before = [x.copy() for x in inputs]
    g = composite_graph(name, inputs, attrs, out_shape)
    parts, result = run(g, inputs, reference)
    kinds = [p.get_kind() for p in parts]
    if reference:
        assert "composite" not in kinds
        assert all(op.kind != K.Composite for p in parts for op in p.ops)
        assert sum(len(p.ops) for p in parts) > 1
    else:
        assert kinds == ["composite"], kinds
        plan = result.partitions[0].compiled.plan.name
        assert plan.startswith(f"composite '{name}' v1")
        if name in ("gated_mlp", "sdpa"):  # the existing fused Numba kernels serve them
            assert "numba" in plan or "sdpa" in plan, plan
    expected = formula(inputs)
    got = result.outputs[100].astype(np.float64)
    err = np.abs(got - expected).max() / max(1.0, np.abs(expected).max())
    assert err <= TOLERANCE[name], f"{name}: error {err:.3e}"
    for x, y in zip(inputs, before):
        assert np.array_equal(x, y)


def test_both_paths_agree_and_check_mode_compares_them():
    """Check mode re-runs the fast partition through the decomposition (REFERENCE
    of the Composite op) and applies check.py's rule: it passes."""
    inputs, attrs, _, shape = CASES["gelu_tanh"]
    g = composite_graph("gelu_tanh", inputs, attrs, shape)
    settings.check = True
    try:
        _, fast = run(g, inputs, False)
    finally:
        settings.check = False
    _, inlined = run(g, inputs, True)
    # both within 2.5e-6 of the formula (above), so within 5e-6 of each other
    np.testing.assert_allclose(fast.outputs[100], inlined.outputs[100], rtol=0, atol=5e-6)


def test_inlined_ops_fuse_with_their_neighbours():
    """MatMul -> Composite tanh, inlined: the decomposition's first op (Clamp) and
    what follows it fuse into the MatMul's partition as post-ops."""
    a = ga.LogicalTensor(0, dt.f32, [4, 8])
    w = ga.LogicalTensor(1, dt.f32, [8, 16])
    h = ga.LogicalTensor(2, dt.f32, [4, 16])
    y = ga.LogicalTensor(3, dt.f32, [4, 16])
    g = ga.Graph()
    g.add_op(ga.Op(0, K.MatMul, [a, w], [h]))
    g.add_op(C.composite_op(1, [h], [y], "tanh"))
    g.finalize()
    feeds = {0: RNG.standard_normal((4, 8)).astype(np.float32),
             1: RNG.standard_normal((8, 16)).astype(np.float32)}
    parts, result = run(g, list(feeds.values()), True)
    first = next(p for p in parts if 0 in p.get_ops())
    assert first.get_kind() == "matmul_post_ops" and len(first.ops) > 1
    assert any(op.kind == K.Clamp for op in first.ops)
    expected = np.tanh(feeds[0].astype(np.float64) @ feeds[1].astype(np.float64))
    assert np.abs(result.outputs[3] - expected).max() < 5e-6  # K=8 f32 dot + 3.7e-7 tanh
    _, fast = run(g, list(feeds.values()), False)
    assert np.abs(fast.outputs[3] - expected).max() < 5e-6


def test_explain_and_verbose_say_which_path(capsys):
    inputs, attrs, _, shape = CASES["rms_norm"]
    g = composite_graph("rms_norm", inputs, attrs, shape)
    text = str(g.explain_partitions())
    assert "composite 'rms_norm' v1: one partition running the runtime's RMSNorm op" in text
    settings.verbose = True
    try:
        with C.reference_mode():
            g.get_partitions()
            text = str(g.explain_partitions())
    finally:
        settings.verbose = False
    assert "inlined as ops" in text and "the reference path is forced" in text
    assert "graph_api_verbose,composite,op 0 (Composite" in capsys.readouterr().err


def test_shapes_that_do_not_suit_the_fast_kernel_inline():
    """SDPA's fused kernel needs concrete shapes; unknown dims in the graph inline it."""
    lts = [ga.LogicalTensor(i, dt.f32, [-1, 2, 8, 16]) for i in range(3)]
    lts += [ga.LogicalTensor(3, dt.f32, [1]), ga.LogicalTensor(4, dt.f32, [1, 1, 8, 8])]
    g = ga.Graph()
    g.add_op(C.composite_op(0, lts, [ga.LogicalTensor(100, dt.f32)], "sdpa"))
    g.finalize()
    assert g.tensors[100].shape == (-1, 2, 8, 16)  # inferred through the decomposition
    text = str(g.explain_partitions())
    assert "does not suit these shapes" in text and "no concrete shape" in text
    assert all(p.get_kind() != "composite" for p in g.get_partitions())


def test_debug_policy_inlines():
    inputs, attrs, _, shape = CASES["tanh"]
    g = composite_graph("tanh", inputs, attrs, shape)
    parts = g.get_partitions(ga.PartitionPolicy.debug)
    assert len(parts) > 1 and all(len(p.ops) == 1 and p.ops[0].kind != K.Composite for p in parts)


def test_environment_switch_forces_the_reference_path():
    code = ("import graph_api.config as c, graph_api.composite as C; "
            "assert c.settings.composite_reference; C.use_reference(False); "
            "assert not c.settings.composite_reference; print('ok')")
    env = dict(os.environ, GRAPH_API_COMPOSITE_REFERENCE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.stdout.strip() == "ok", out.stderr

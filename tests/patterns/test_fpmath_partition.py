"""Partition-level fpmath (int4 RFC option 1): one partition, two modes, two
compiled partitions with different arithmetic, each equal to a numpy
reference computed with that mode (docs/fpmath.md)."""
import numpy as np
import pytest

import graph_api as ga
from graph_api import dtypes
from graph_api.dtypes import DataType as dt

from . import graphs as gr
from .builder import K, the_fusion

RNG = np.random.default_rng(7)


def _mm(a, b):
    """The reference MatMul sum: f64 then one rounding to f32."""
    return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)


def _round(x, mode):
    x = np.asarray(x, np.float32)
    if mode == "tf32":
        return dtypes.round_to_tf32(x).astype(np.float32)
    if mode in ("bf16", "f16", "any"):
        return dtypes.round_through(x, dt.bf16 if mode in ("bf16", "any") else dt.f16).astype(np.float32)
    return x


def _close(got, want) -> bool:
    """Equal up to summation order (a fast kernel may sum in another order)."""
    return np.allclose(got, want, rtol=1e-5, atol=1e-5)


def _run(graph, part, feeds, mode, apply_to_int):
    part.set_fpmath_mode(mode, apply_to_int)
    run = ga.run_graph(graph, feeds, partitions=[part])
    (out,) = graph.output_ids
    return run.partitions[0].compiled, np.asarray(run.outputs[out], np.float32)


# ------------------------------------------------------------------ weight-compressed MatMul
M, KD, N = 4, 16, 8


def _wc_feeds(graph):
    op = graph.ops[graph.topological_op_ids()[0]]
    assert op.kind == K.DynamicDequantize
    w, s, z = (graph.tensors[lt.id] for lt in op.inputs)
    x = next(t for t in graph.input_ids if t not in (w.id, s.id, z.id))
    return {w.id: RNG.integers(-8, 8, w.shape), s.id: RNG.uniform(0.05, 0.3, s.shape).astype(np.float32),
            z.id: RNG.integers(-2, 3, z.shape), x: RNG.standard_normal((M, KD)).astype(np.float32)}, (x, w.id, s.id, z.id)


def _wc_reference(feeds, ids, mode, apply_to_int):
    x, w, s, z = (feeds[i] for i in ids)
    scales = np.repeat(s, 4, axis=0)
    zps = np.repeat(z, 4, axis=0).astype(np.float32)
    weights = ((w.astype(np.float32) - zps) * scales).astype(np.float32)
    a = _round(x, mode)
    b = _round(weights, mode) if apply_to_int else weights
    return np.maximum(_mm(a, b), 0)


@pytest.mark.parametrize("mode,apply_to_int", [("bf16", True), ("f16", True), ("tf32", True),
                                               ("bf16", False), ("any", True)])
def test_weight_compressed_matmul_two_modes_two_compiled_partitions(mode, apply_to_int):
    graph = gr.compressed_matmul(wdt=dt.s4, m=M, k=KD, n=N)
    part = the_fusion(graph)
    assert part.pattern_name == "matmul_compressed"
    feeds, ids = _wc_feeds(graph)
    strict_cp, strict = _run(graph, part, feeds, "strict", False)
    mode_cp, got = _run(graph, part, feeds, mode, apply_to_int)
    assert strict_cp is not mode_cp
    assert mode_cp.request.fpmath == ga.FPMath.make(mode, apply_to_int)
    want_strict = _wc_reference(feeds, ids, "strict", False)
    want_mode = _wc_reference(feeds, ids, mode, apply_to_int)
    assert _close(strict, want_strict) and not _close(strict, want_mode)
    assert _close(got, want_mode) and not _close(got, want_strict)
    # compiling again under strict gives back the first compiled partition (cache key)
    again, _ = _run(graph, part, feeds, "strict", False)
    assert again is strict_cp


def test_partition_override_leaves_the_graph_and_other_partitions_alone():
    graph = gr.compressed_matmul()
    part = graph.get_partitions()[0]
    part.set_fpmath_mode("f16", True)
    assert graph.get_fpmath_mode() == (ga.FPMathMode.strict, False)
    assert graph.get_partitions()[0].get_fpmath_mode() == (ga.FPMathMode.strict, False)
    assert part.get_fpmath_mode() == (ga.FPMathMode.f16, True)


def test_apply_to_int_decides_only_for_weights_dequantized_inside_the_partition():
    """bf16 without apply_to_int: fused, the dequantized weights stay f32; unfused
    (debug), the MatMul sees an ordinary f32 tensor and rounds it."""
    graph = gr.compressed_matmul(m=M, k=KD, n=N)
    feeds, ids = _wc_feeds(graph)
    fused = the_fusion(graph)
    _, got = _run(graph, fused, feeds, "bf16", False)
    assert _close(got, _wc_reference(feeds, ids, "bf16", False))
    assert not _close(got, _wc_reference(feeds, ids, "bf16", True))
    singles = graph.get_partitions(ga.PartitionPolicy.debug)
    for p in singles:
        p.set_fpmath_mode("bf16", False)
    run = ga.run_graph(graph, feeds, partitions=singles)
    unfused = np.asarray(run.outputs[graph.output_ids[0]], np.float32)
    assert _close(unfused, _wc_reference(feeds, ids, "bf16", True))


# ------------------------------------------------------------------ SDPA
def _softmax(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def _sdpa_reference(q, k, v, scale, mask, mode):
    s = _mm(_round(q, mode), np.swapaxes(_round(k, mode), -1, -2))
    s = (s / scale).astype(np.float32) + mask
    return _mm(_round(_softmax(s), mode), _round(v, mode))


@pytest.mark.parametrize("mode", ["bf16", "f16", "tf32"])
def test_sdpa_two_modes_two_compiled_partitions(mode):
    graph = gr.sdpa()  # f32 Q, K, V; Divide by a scale; additive mask
    part = the_fusion(graph)
    assert part.pattern_name == "sdpa"
    qk = graph.ops[part.fusion.bindings["qk_matmul"]]
    q_id, k_id = (lt.id for lt in qk.inputs)
    scale_id = graph.ops[part.fusion.bindings["scale"]].inputs[1].id
    mask_id = graph.ops[part.fusion.bindings["mask_add"]].inputs[1].id
    v_id = graph.ops[part.fusion.bindings["pv_matmul"]].inputs[1].id
    feeds = {t: RNG.standard_normal(graph.tensors[t].shape).astype(np.float32) for t in (q_id, k_id, v_id)}
    feeds[scale_id] = np.array([2.8284271], np.float32)
    feeds[mask_id] = np.where(np.tril(np.ones((gr.S, gr.S))) > 0, 0, -np.inf).astype(np.float32)[None, None]
    strict_cp, strict = _run(graph, part, feeds, "strict", False)
    mode_cp, got = _run(graph, part, feeds, mode, False)
    assert strict_cp is not mode_cp
    args = [feeds[t] for t in (q_id, k_id, v_id, scale_id, mask_id)]
    want_strict = _sdpa_reference(*args, "strict")
    want_mode = _sdpa_reference(*args, mode)
    assert _close(strict, want_strict) and not _close(strict, want_mode)
    assert _close(got, want_mode) and not _close(got, want_strict)


def test_compressed_sdpa_int4_k_follows_apply_to_int():
    """f32 compressed SDPA under bf16: K dequantized from s4 is rounded only with apply_to_int."""
    graph = gr.sdpa(k_dequant=dt.s4)
    part = the_fusion(graph)
    assert part.pattern_name == "sdpa_compressed"
    feeds = {}
    for t in graph.input_ids:
        lt = graph.tensors[t]
        if lt.dtype == dt.s4:
            feeds[t] = RNG.integers(-8, 8, lt.shape)
        elif lt.shape in ((1,), ()):
            feeds[t] = np.array([2.0], np.float32)
        elif lt.shape[:2] == (1, 1):
            feeds[t] = np.zeros(lt.shape, np.float32)
        else:
            feeds[t] = RNG.uniform(0.05, 0.3, lt.shape).astype(np.float32)
    _, strict = _run(graph, part, feeds, "strict", False)
    _, no_int = _run(graph, part, feeds, "bf16", False)
    _, with_int = _run(graph, part, feeds, "bf16", True)
    assert not np.array_equal(strict, no_int)  # Q, V and probabilities rounded
    assert not np.array_equal(no_int, with_int)  # plus the dequantized K

"""benchdnn-style input filling (graph_api.fill) and run-time rewrites (graph_api.rewrite)."""
from pathlib import Path

import numpy as np
import pytest

import graph_api as ga
from graph_api import fill, rewrite

CONFORMANCE = Path(__file__).resolve().parents[1] / "data" / "onednn-graphs"
MHA = CONFORMANCE / "complex_fusion/mha"


def roles_of(path) -> dict:
    graph = ga.load(path)
    return graph, {tid: r.name for tid, r in fill.input_roles(graph).items()}


def test_sdpa_roles_and_values():
    graph, roles = roles_of(MHA / "MHA-GPT-inf-fp32-bs1.json")
    # MatMul(4, 5) -> Select(3, ., 7) -> Divide(., 2) -> Add(., 1) -> SoftMax -> MatMul(., 0)
    assert roles == {4: "src", 5: "weights", 3: "select_cond", 7: "select_fill", 2: "scale_div",
                     1: "mask", 0: "weights"}
    feeds = fill.fill_inputs(graph)
    assert feeds[7] == -np.inf and float(feeds[2]) in (2, 4, 8)
    cond = feeds[3][0, 0]  # 32x33: scores at Select port 1, so True keeps them (bottom-right causal)
    assert cond[0, :2].all() and not cond[0, 2:].any() and cond[-1].all()
    assert set(np.unique(feeds[4])) <= set(range(-4, 5))
    k = graph.tensors[4].shape[-1]  # K = 256 -> weights scaled by 2^-4
    assert set(np.unique(feeds[5] * 2 ** fill.weight_exponent(k))) <= set(range(-2, 3))
    assert fill.weight_exponent(k) == 4


def test_backward_stats_are_the_logsumexp_of_the_scores():
    graph, roles = roles_of(MHA / "sdpa-plain-training-backward-f32.json")
    (stats_id,) = [t for t, r in roles.items() if r == "stats"]
    feeds = fill.fill_inputs(graph)
    subtract = next(op for op in graph.ops.values()
                    if op.kind == ga.OpKind.Subtract and op.inputs[1].id == stats_id)
    scores = fill.reference_arrays(graph, feeds, [subtract.inputs[0].id])[subtract.inputs[0].id]
    probs = np.exp(scores.astype(np.float64) - feeds[stats_id])
    assert np.allclose(probs.sum(axis=-1), 1.0, rtol=1e-5)  # a proper softmax


def test_implicit_causal_mask_scalars_and_dropout():
    graph, roles = roles_of(MHA / "gqa-plain-training-fwd-w-dropout-bf16-f32.json")
    feeds = fill.fill_inputs(graph)
    by_role = {r: feeds[t] for t, r in roles.items()}
    assert by_role["dropout_seed"] == 123456 and by_role["dropout_offset"] == 1
    assert by_role["dropout_prob"] == np.float32(0.5) and by_role["dropout_seed"].shape == ()


def test_compressed_k_roles_and_narrow_ints():
    graph, roles = roles_of(MHA / "sdpa-compressed-kv-int4-gs32.json")
    assert roles[0] == "ddq_src" and roles[1] == "ddq_scales" and roles[2] == "ddq_zps"
    feeds = fill.fill_inputs(graph)
    assert feeds[0].dtype == np.dtype("int4") and np.abs(feeds[0].astype(int)).max() <= 2
    e = fill.weight_exponent(128)  # K of the MatMul the dequantized K feeds (head size 128)
    assert set(np.unique(np.log2(feeds[1].astype(np.float64)))) <= {-(e + 1.0), -(e + 2.0)}


def test_fill_is_deterministic_and_seeded():
    graph = ga.load(MHA / "sdpa-plain-simplified-f32.json")
    a, b, c = fill.fill_inputs(graph), fill.fill_inputs(graph), fill.fill_inputs(graph, seed=1)
    assert all(np.array_equal(a[t], b[t]) for t in a)
    assert any(not np.array_equal(a[t], c[t]) for t in a if a[t].size > 1)


@pytest.mark.parametrize("shape, first_row", [((1, 1, 4, 4), [1, 0, 0, 0]), ((3, 5), [1, 1, 1, 0, 0]),
                                               ((1, 1, 1, 6), [1] * 6), ((5, 3), [1, 0, 0])])
def test_keep_pattern_is_bottom_right_causal(shape, first_row):
    keep = fill.keep_pattern(shape).reshape(-1, shape[-1])
    assert keep[0].tolist() == [bool(v) for v in first_row] and keep.any(axis=-1).all()


def test_power_of_two_scales_change_the_run_copy_only():
    path = CONFORMANCE / "pattern/int8/int8_matmul_post_ops_fusion.json"
    graph = ga.load(path)
    rounded = rewrite.power_of_two_scales(graph)
    for op_id, op in rounded.ops.items():
        if op.kind in (ga.OpKind.Quantize, ga.OpKind.Dequantize):
            original = graph.ops[op_id].attrs["scales"]
            assert all(np.log2(s).is_integer() and s >= o for s, o in zip(op.attrs["scales"], original))
    assert rewrite.power_of_two_scales(rounded).to_json() == rounded.to_json()
    assert ga.load(path).to_json() == graph.to_json()


def test_set_batch_keeps_layouts_and_reshapes():
    path = MHA / "JAX-MQA-inf-fp32.json"
    graph, what = rewrite.set_batch(ga.load(path), 2)
    assert what == "mb 32->2"
    assert all(graph.tensors[t].shape[0] == 2 for t in graph.input_ids)
    reshapes = [op.attrs["shape"] for op in graph.ops.values() if op.kind == ga.OpKind.StaticReshape]
    assert reshapes and all(s[0] == 2 for s in reshapes if len(s) > 2)


def test_resized_strides_keep_the_dim_order_and_gaps():
    from graph_api.rewrite import _resized_strides

    acbd = (64 * 16 * 128, 64, 64 * 16, 1)  # (N, H, S, D) stored as (N, S, H, D)
    assert _resized_strides((2, 16, 128, 64), acbd, (2, 4, 128, 64)) == (64 * 4 * 128, 64, 64 * 4, 1)
    cabd = (768, 64, 24576, 1)  # S outermost
    assert _resized_strides((32, 12, 50, 64), cabd, (4, 12, 50, 64)) == (768, 64, 3072, 1)
    assert _resized_strides((2, 3), None, (1, 3)) is None


def test_reduce_batch_fits_the_budget_and_says_what_it_did():
    graph = ga.load(MHA / "torchbench-sdpa-bwd-bf16-f32.json")
    small, what = rewrite.reduce_batch(graph, 16_000_000)
    # best effort: 1500x1500 scores per head stay, so batch and heads both go to 1
    assert what == "mb 8->1, heads 6->1"
    # every tensor but the host-scalar scale shrinks 8 * 6 = 48 times
    assert rewrite.total_elements(small) == (rewrite.total_elements(graph) - 1) // 48 + 1
    fits, what = rewrite.reduce_batch(graph, 200_000_000)
    assert what == "mb 8->1" and rewrite.total_elements(fits) <= 200_000_000
    same, nothing = rewrite.reduce_batch(fits, 200_000_000)
    assert same is fits and nothing is None

"""MatMul / BatchReduceMatMul ``indexing_maps`` (linalg matmul with affine maps, seed 001).

Every valid map the seed lists (and combinations) verifies at add_op, infers C's
shape, and computes, in the reference kernel and in the fast dot plan, what an
explicit float64 loop over the loop domain computes.  Invalid maps are
``invalid_graph_op`` naming the broken rule.  Transposes and unit reshapes
feeding a MatMul fold into its maps (one partition, the producer not run).
"""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api import indexing_maps
from graph_api.errors import InvalidGraphOp
from graph_api.kernels.reference import REFERENCE, RefContext

SIZES = {"b": 2, "m": 3, "n": 4, "k": 5}
NAMES = {"dB": "b", "d0": "m", "d1": "n", "d2": "k"}


def m3(*results):
    return f"(d0, d1, d2) -> ({', '.join(results)})"


def m4(*results):
    return f"(dB, d0, d1, d2) -> ({', '.join(results)})"


def letters(text):
    return [NAMES[r.strip()] for r in text.split("->")[1].strip(" ()").split(",") if r.strip()]


def shape(text):
    return tuple(SIZES[d] for d in letters(text))


def loops(maps, a, b):
    """C[c] += A[a] * B[b] over every point of the loop domain (float64)."""
    domain = "bmnk" if maps[0].startswith("(dB") else "mnk"
    la, lb, lc = (letters(t) for t in maps)
    out = np.zeros([SIZES[d] for d in lc])
    for point in itertools.product(*(range(SIZES[d]) for d in domain)):
        at = dict(zip(domain, point))
        out[tuple(at[d] for d in lc)] += a[tuple(at[d] for d in la)] * b[tuple(at[d] for d in lb)]
    return out


D3 = [m3("d0", "d2"), m3("d2", "d1"), m3("d0", "d1")]
D4 = [m4("dB", "d0", "d2"), m4("dB", "d2", "d1"), m4("dB", "d0", "d1")]
BR = [m4("dB", "d0", "d2"), m4("dB", "d2", "d1"), m4("d0", "d1")]


def replaced(base, **maps):
    out = list(base)
    for which, text in maps.items():
        out["abc".index(which)] = text
    return out


#: the seed's valid maps, one replaced map each, then combinations
VALID = {
    "matmul transposed B": replaced(D3, b=m3("d1", "d2")),
    "matmul broadcast col A + transposed B": replaced(D3, a=m3("d0"), b=m3("d1", "d2")),
    "transpose_a": replaced(D4, a=m4("dB", "d2", "d0")),
    "transpose_b": replaced(D4, b=m4("dB", "d1", "d2")),
    "transpose_c": replaced(D4, c=m4("dB", "d2", "d1")),
    "broadcast_col_a": replaced(D4, a=m4("dB", "d0")),
    "broadcast_row_a (= transpose_broadcast_col_a)": replaced(D4, a=m4("dB", "d1")),
    "broadcast_batch_a": replaced(D4, a=m4("d0", "d2")),
    "broadcast_col_b": replaced(D4, b=m4("dB", "d2")),
    "broadcast_row_b": replaced(D4, b=m4("dB", "d1")),
    "broadcast_batch_b": replaced(D4, b=m4("d2", "d1")),
    "broadcast_col_c": replaced(D4, c=m4("dB", "d1")),
    "broadcast_row_c": replaced(D4, c=m4("dB", "d0")),
    "broadcast_batch_c": replaced(D4, c=m4("d0", "d1")),
    "transpose_a + transpose_b": replaced(D4, a=m4("dB", "d2", "d0"), b=m4("dB", "d1", "d2")),
    "broadcast_batch_a + transpose_b": replaced(D4, a=m4("d0", "d2"), b=m4("dB", "d1", "d2")),
    "broadcast_col_a + broadcast_batch_b": replaced(D4, a=m4("dB", "d0"), b=m4("d2", "d1")),
    "transpose_a + broadcast_batch_b + transpose_c":
        replaced(D4, a=m4("dB", "d2", "d0"), b=m4("d2", "d1"), c=m4("dB", "d2", "d1")),
    "real C transpose (N x M)": replaced(D4, c=m4("dB", "d1", "d0")),
}
BATCH_REDUCE = {
    "default (explicit)": BR,
    "transpose_a": replaced(BR, a=m4("dB", "d2", "d0")),
    "transpose_b": replaced(BR, b=m4("dB", "d1", "d2")),
    "broadcast_batch_a": replaced(BR, a=m4("d0", "d2")),
    "broadcast_col_b + transpose_a": replaced(BR, a=m4("dB", "d2", "d0"), b=m4("dB", "d2")),
}
CASES = [(K.MatMul, n, m) for n, m in VALID.items()] + \
        [(K.BatchReduceMatMul, n, m) for n, m in BATCH_REDUCE.items()]


def graph_of(kind, maps, fpmath="strict", declare_c=True, **attrs):
    g = ga.Graph(ga.EngineKind.cpu, fpmath)
    a, b = ga.LogicalTensor(0, dt.f32, shape(maps[0])), ga.LogicalTensor(1, dt.f32, shape(maps[1]))
    c = ga.LogicalTensor(2, dt.f32, shape(maps[2]) if declare_c else None)
    g.add_op(ga.Op(0, kind, [a, b], [c], attrs={"indexing_maps": maps, **attrs}))
    g.finalize()
    return g


def operands(maps, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape(t)).astype(np.float32) for t in maps[:2]]


@pytest.mark.parametrize("kind, name, maps", CASES, ids=[f"{k.name}:{n}" for k, n, _ in CASES])
def test_valid_maps_verify_infer_and_compute(kind, name, maps):
    graph = graph_of(kind, maps)
    assert graph.tensors[2].shape == shape(maps[2])
    a, b = operands(maps)
    want = loops(maps, a.astype(np.float64), b.astype(np.float64))
    op = graph.ops[0]
    ref = REFERENCE[kind](op, [a, b], [graph.tensors[2]], RefContext())[0]
    run = ga.run_graph(graph, {0: a, 1: b})
    assert run.partitions[0].compiled.plan.name.endswith("_maps")
    # f32 sums of <= 10 terms of size ~1: a few f32 ulps of the terms' magnitude
    tol = 1e-5 * (np.abs(a).max() * np.abs(b).max() * 10)
    np.testing.assert_allclose(ref, want, atol=tol, rtol=0)
    np.testing.assert_allclose(run.outputs[2], want, atol=tol, rtol=0)


def test_a_dim_only_c_reads_needs_c_declared():
    maps = VALID["broadcast_row_a (= transpose_broadcast_col_a)"]  # m is read by C only
    graph = graph_of(K.MatMul, maps, declare_c=False)
    assert graph.tensors[2].shape == (SIZES["b"], -1, SIZES["n"])


@pytest.mark.parametrize("kind, maps", [(K.MatMul, D3), (K.MatMul, D4), (K.BatchReduceMatMul, BR)])
def test_default_maps_are_dropped_and_not_written(kind, maps):
    graph = graph_of(kind, maps)
    assert "indexing_maps" not in graph.ops[0].attrs
    assert "indexing_maps" not in json.loads(graph.to_json())["graph"][0]["attrs"]


def test_maps_round_trip_through_json_in_canonical_spelling():
    maps = ["affine_map<(i, j, l) -> (i, l)>", "(i, j, l) -> (j, l)", "(i, j, l) -> (i, j)"]
    graph = graph_of(K.MatMul, [m3("d0", "d2"), m3("d1", "d2"), m3("d0", "d1")])
    text = graph.to_json()
    entry = json.loads(text)["graph"][0]["attrs"]["indexing_maps"]
    assert entry == {"type": "string[]", "value": [m3("d0", "d2"), m3("d1", "d2"), m3("d0", "d1")]}
    assert ga.Graph.from_json(text).to_json() == text
    g = ga.Graph()
    g.add_op(ga.Op(0, K.MatMul, [ga.LogicalTensor(0, dt.f32, (3, 5)), ga.LogicalTensor(1, dt.f32, (4, 5))],
                   [ga.LogicalTensor(2, dt.f32, (3, 4))], attrs={"indexing_maps": maps}))
    assert g.ops[0].attrs["indexing_maps"] == entry["value"]  # any dim names, written canonically


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("ta, tb", [(True, False), (False, True), (True, True)])
def test_transpose_flags_mean_the_same_as_their_maps(batched, ta, tb):
    maps = indexing_maps.from_flags(batched, ta, tb).strings()
    a, b = operands(maps, seed=3)
    flagged = ga.Graph()
    flagged.add_op(ga.Op(0, K.MatMul, [ga.LogicalTensor(0, dt.f32, a.shape), ga.LogicalTensor(1, dt.f32, b.shape)],
                         [ga.LogicalTensor(2, dt.f32, None)], attrs={"transpose_a": ta, "transpose_b": tb}))
    flagged.finalize()
    mapped = graph_of(K.MatMul, maps)
    assert flagged.tensors[2].shape == mapped.tensors[2].shape
    want = loops(maps, a.astype(np.float64), b.astype(np.float64))
    for graph in (flagged, mapped):
        np.testing.assert_allclose(ga.run_graph(graph, {0: a, 1: b}).outputs[2], want, atol=1e-5)


# ------------------------------------------------------------------ invalid maps
INVALID = [
    ("count", [m3("d0", "d2"), m3("d2", "d1")]),
    ("syntax", [m3("d0", "d2"), "d2, d1", m3("d0", "d1")]),
    ("syntax", ["(d0, d0, d2) -> (d0)", m3("d2", "d1"), m3("d0", "d1")]),
    ("projected", [m3("d0", "d0"), m3("d2", "d1"), m3("d0", "d1")]),
    ("projected", [m3("d0 + d1", "d2"), m3("d2", "d1"), m3("d0", "d1")]),
    ("projected", [m3("0", "d2"), m3("d2", "d1"), m3("d0", "d1")]),
    ("domain", [m3("d0", "d2"), m4("dB", "d2", "d1"), m3("d0", "d1")]),
    ("domain_size", ["(d0, d1) -> (d0, d1)"] * 3),
    ("domain_size", ["(e, dB, d0, d1, d2) -> (d0, d2)"] * 3),
    ("batch_first", [m4("d0", "dB", "d2"), m4("dB", "d2", "d1"), m4("dB", "d0", "d1")]),
    ("batch_first", [m4("dB", "d0", "d2"), m4("d2", "dB", "d1"), m4("dB", "d0", "d1")]),
    ("batch_first", [m4("dB", "d0", "d2"), m4("dB", "d2", "d1"), m4("d0", "d1", "dB")]),
    ("matrix", [m3("d0", "d1", "d2"), m3("d2", "d1"), m3("d0", "d1")]),
    ("matrix", [m4("dB"), m4("dB", "d2", "d1"), m4("dB", "d0", "d1")]),
    ("read", [m3("d0"), m3("d1"), m3("d0", "d1")]),
]


@pytest.mark.parametrize("rule, maps", INVALID, ids=[f"{r}-{i}" for i, (r, _) in enumerate(INVALID)])
def test_invalid_maps_name_their_rule(rule, maps):
    g = ga.Graph()
    op = ga.Op(9, K.MatMul, [ga.LogicalTensor(0, dt.f32, None), ga.LogicalTensor(1, dt.f32, None)],
               [ga.LogicalTensor(2, dt.f32, None)], attrs={"indexing_maps": maps})
    with pytest.raises(InvalidGraphOp) as err:
        g.add_op(op)
    assert f"rule '{rule}'" in str(err.value) and "op 9" in str(err.value)


def test_shape_and_kind_rules():
    def add(kind, a, b, c=None, **attrs):
        g = ga.Graph()
        g.add_op(ga.Op(9, kind, [ga.LogicalTensor(0, dt.f32, a), ga.LogicalTensor(1, dt.f32, b)],
                       [ga.LogicalTensor(2, dt.f32, c)], attrs=attrs))
        return g

    with pytest.raises(InvalidGraphOp, match="rule 'brgemm_c'"):
        add(K.BatchReduceMatMul, (2, 3, 5), (2, 5, 4), indexing_maps=D4)
    with pytest.raises(InvalidGraphOp, match="rule 'domain_size'"):
        add(K.BatchReduceMatMul, (3, 5), (5, 4), indexing_maps=D3)
    with pytest.raises(InvalidGraphOp, match="rule 'flags'"):
        add(K.MatMul, (3, 5), (4, 5), indexing_maps=replaced(D3, b=m3("d1", "d2")), transpose_b=True)
    with pytest.raises(InvalidGraphOp, match="rule 'rank'"):
        add(K.MatMul, (2, 3, 5), (5, 4), indexing_maps=replaced(D3, b=m3("d1", "d2")))
    with pytest.raises(InvalidGraphOp, match="rule 'sizes'"):
        add(K.MatMul, (3, 5), (4, 6), indexing_maps=replaced(D3, b=m3("d1", "d2")))
    with pytest.raises(InvalidGraphOp, match="rule 'sizes'"):  # a size-1 batch does not broadcast
        add(K.MatMul, (1, 3, 5), (2, 5, 4), indexing_maps=replaced(D4, c=m4("dB", "d1", "d0")))
    with pytest.raises(InvalidGraphOp, match="rule 'sizes'"):  # the declared C disagrees
        add(K.MatMul, (3, 5), (4, 5), (3, 7), indexing_maps=replaced(D3, b=m3("d1", "d2")))
    with pytest.raises(InvalidGraphOp, match="rule 'rank'"):  # BatchReduceMatMul default maps
        add(K.BatchReduceMatMul, (3, 5), (5, 4))


# ------------------------------------------------------------------ folding
def folding_graph(order=(1, 0), b_src=(4, 5), a_shape=(3, 5), other_user=False, post=False, **attrs):
    """A @ StaticTranspose(Bsrc) [-> ReLU], optionally with another user of the transpose."""
    g = ga.Graph()
    b_t = ga.LogicalTensor(11, dt.f32, None)
    g.add_op(ga.Op(0, K.StaticTranspose, [ga.LogicalTensor(1, dt.f32, b_src)], [b_t], attrs={"order": list(order)}))
    g.add_op(ga.Op(1, K.MatMul, [ga.LogicalTensor(0, dt.f32, a_shape), b_t], [ga.LogicalTensor(2, dt.f32, None)],
                   attrs=attrs))
    if post:
        g.add_op(ga.Op(2, K.ReLU, [ga.LogicalTensor(2, dt.f32, None)], [ga.LogicalTensor(3, dt.f32, None)]))
    if other_user:
        g.add_op(ga.Op(3, K.Abs, [b_t], [ga.LogicalTensor(4, dt.f32, None)]))
    g.finalize()
    return g


def run_and_check(graph, feeds, want_id, want):
    run = ga.run_graph(graph, feeds)
    np.testing.assert_allclose(run.outputs[want_id], want, atol=1e-5 * np.abs(want).max())
    return run


def test_a_transpose_folds_into_the_maps_one_partition_no_copy():
    graph = folding_graph(post=True, algorithm="bf16_6x")
    parts = graph.get_partitions()
    assert [p.get_kind() for p in parts] == ["matmul_indexing_maps"]
    from graph_api.patterns.library.dot_maps import folded_matmul

    folded = folded_matmul(graph, parts[0].fusion.bindings)
    assert [lt.id for lt in folded.inputs] == [0, 1]  # reads the transpose's source
    assert folded.attrs["indexing_maps"] == [m3("d0", "d2"), m3("d1", "d2"), m3("d0", "d1")]
    rng = np.random.default_rng(4)
    a, bsrc = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    run = run_and_check(graph, {0: a, 1: bsrc}, 3, np.maximum(a.astype(np.float64) @ bsrc.T, 0))
    plan = run.partitions[0].compiled.plan
    assert plan.name == "dot_bf16_6x_maps"
    assert [op.kind for _, op, _, _ in plan.tail.steps] == [K.ReLU]  # the transpose never runs


def test_folded_default_maps_are_dropped():
    graph = folding_graph(transpose_b=True, b_src=(5, 4))  # transpose of a transpose_b operand
    from graph_api.patterns.library.dot_maps import folded_matmul

    part = graph.get_partitions()[0]
    folded = folded_matmul(graph, part.fusion.bindings)
    assert "indexing_maps" not in folded.attrs and folded.attrs["transpose_b"] is False
    rng = np.random.default_rng(5)
    a, bsrc = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    run_and_check(graph, {0: a, 1: bsrc}, 2, a.astype(np.float64) @ bsrc)


def test_a_transpose_with_other_users_is_left_alone():
    graph = folding_graph(other_user=True)
    kinds = sorted(p.get_kind() for p in graph.get_partitions())
    assert "matmul_indexing_maps" not in kinds and len(kinds) == 3


def test_a_transpose_moving_the_batch_dim_does_not_fold():
    graph = folding_graph(order=(1, 0, 2), b_src=(5, 2, 4), a_shape=(2, 3, 5))
    assert "matmul_indexing_maps" not in [p.get_kind() for p in graph.get_partitions()]


def test_a_batch_transpose_folds():
    graph = folding_graph(order=(0, 2, 1), b_src=(2, 4, 5), a_shape=(2, 3, 5))
    assert [p.get_kind() for p in graph.get_partitions()] == ["matmul_indexing_maps"]
    rng = np.random.default_rng(6)
    a, bsrc = rng.standard_normal((2, 3, 5)).astype(np.float32), rng.standard_normal((2, 4, 5)).astype(np.float32)
    run_and_check(graph, {0: a, 1: bsrc}, 2, a.astype(np.float64) @ np.swapaxes(bsrc, 1, 2))


def test_a_unit_reshape_folds_as_a_batch_broadcast():
    g = ga.Graph()
    a3 = ga.LogicalTensor(10, dt.f32, None)
    g.add_op(ga.Op(0, K.StaticReshape, [ga.LogicalTensor(0, dt.f32, (3, 5))], [a3],
                   attrs={"shape": [1, 3, 5], "special_zero": False}))
    g.add_op(ga.Op(1, K.MatMul, [a3, ga.LogicalTensor(1, dt.f32, (2, 5, 4))], [ga.LogicalTensor(2, dt.f32, None)]))
    g.finalize()
    parts = g.get_partitions()
    assert [p.get_kind() for p in parts] == ["matmul_indexing_maps"]
    from graph_api.patterns.library.dot_maps import folded_matmul

    assert folded_matmul(g, parts[0].fusion.bindings).attrs["indexing_maps"][0] == m4("d0", "d2")
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((2, 5, 4)).astype(np.float32)
    run_and_check(g, {0: a, 1: b}, 2, a.astype(np.float64) @ b)


def test_a_batch_reduce_with_a_folded_transpose():
    g = ga.Graph()
    at = ga.LogicalTensor(10, dt.f32, None)
    g.add_op(ga.Op(0, K.StaticTranspose, [ga.LogicalTensor(0, dt.f32, (2, 5, 3))], [at], attrs={"order": [0, 2, 1]}))
    g.add_op(ga.Op(1, K.BatchReduceMatMul, [at, ga.LogicalTensor(1, dt.f32, (2, 5, 4))],
                   [ga.LogicalTensor(2, dt.f32, None)]))
    g.finalize()
    assert [p.get_kind() for p in g.get_partitions()] == ["matmul_indexing_maps"]
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((2, 5, 3)).astype(np.float32), rng.standard_normal((2, 5, 4)).astype(np.float32)
    want = sum(a[i].T.astype(np.float64) @ b[i] for i in range(2))
    run_and_check(g, {0: a, 1: b}, 2, want)


def test_maps_with_a_bias_and_an_algorithm():
    """C = A @ B^T (maps) + bias under bf16_6x: within f32 accuracy of the float64 result."""
    g = ga.Graph()
    ins = [ga.LogicalTensor(0, dt.f32, (3, 64)), ga.LogicalTensor(1, dt.f32, (4, 64)),
           ga.LogicalTensor(3, dt.f32, (4,))]
    g.add_op(ga.Op(0, K.MatMul, ins, [ga.LogicalTensor(2, dt.f32, None)],
                   attrs={"indexing_maps": replaced(D3, b=m3("d1", "d2")), "algorithm": "bf16_6x"}))
    g.finalize()
    rng = np.random.default_rng(9)
    a, b, bias = (rng.standard_normal(lt.shape).astype(np.float32) for lt in ins)
    run = run_and_check(g, {0: a, 1: b, 3: bias}, 2, a.astype(np.float64) @ b.T + bias)
    assert run.partitions[0].compiled.plan.name == "dot_bf16_6x_maps"

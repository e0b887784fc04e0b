"""MatMul ``algorithm`` (StableHLO dot algorithm, seed 000): checks, numerics, fusion, JSON.

Precision is measured against float64 products of the f32 inputs: per
algorithm, the max and mean relative error on well-conditioned data (positive
terms, condition number 1) and on cancellation-heavy data (each output is a
difference of two nearly equal sums, condition number ~2^11).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api import dot_algorithm
from graph_api.errors import InvalidGraphOp, Unimplemented
from graph_api.rewrite import rebuild
from graph_api.kernels.reference import REFERENCE, RefContext
from tests.patterns import graphs

U = 2.0**-24  # f32 unit roundoff
M, KD, N = 32, 512, 24


def matmul_graph(attrs, shape_a=(M, KD), shape_b=(KD, N), fpmath="strict", out_dt=dt.f32):
    g = ga.Graph(ga.EngineKind.cpu, fpmath)
    a, b = ga.LogicalTensor(0, dt.f32, shape_a), ga.LogicalTensor(1, dt.f32, shape_b)
    g.add_op(ga.Op(0, K.MatMul, [a, b], [ga.LogicalTensor(2, out_dt, None)], attrs=attrs))
    g.finalize()
    return g


def add(attrs, ins=("f32", "f32"), out="f32"):
    """add_op of one 4x8 x 8x3 MatMul; returns the stored op."""
    g = ga.Graph()
    a, b = ga.LogicalTensor(0, ins[0], (4, 8)), ga.LogicalTensor(1, ins[1], (8, 3))
    g.add_op(ga.Op(7, K.MatMul, [a, b], [ga.LogicalTensor(2, out, (4, 3))], attrs=attrs))
    return g.ops[7]


# ------------------------------------------------------------------ add_op checks
@pytest.mark.parametrize("name", list(dot_algorithm.PRESETS))
def test_presets_are_accepted_and_kept_by_name(name):
    assert add({"algorithm": name}).attrs["algorithm"] == name


def test_a_dict_gets_every_field_written_in():
    op = add({"algorithm": {"lhs_type": "bf16", "rhs_type": "bf16", "accum_type": "f32",
                            "lhs_component_count": 3, "rhs_component_count": 3,
                            "num_primitive_ops": 6}})
    assert op.attrs["algorithm"] == dict(dot_algorithm.PRESETS["bf16_6x"].as_dict())
    assert add({"algorithm": {"lhs_type": "tf32", "rhs_type": "tf32", "accum_type": "f32"}}
               ).attrs["algorithm"]["num_primitive_ops"] == 1


BF16 = {"lhs_type": "bf16", "rhs_type": "bf16", "accum_type": "f32"}
INVALID = [
    ({**BF16, "lhs_component_count": 0}, "(C20) lhs_component_count >= 1"),
    ({**BF16, "rhs_component_count": -2}, "(C21) rhs_component_count >= 1"),
    ({**BF16, "num_primitive_ops": 0}, "(C22) num_primitive_ops >= 1"),
    ({**BF16, "lhs_type": "s8"}, "not a floating element type"),
    ({**BF16, "accum": "f32"}, "unknown field"),
    ({"lhs_type": "bf16", "rhs_type": "bf16"}, "missing field"),
    ({**BF16, "allow_imprecise_accum": "yes"}, "must be a bool"),
    ({**BF16, "lhs_component_count": 2, "rhs_component_count": 2, "num_primitive_ops": 5},
     "exceeds the 4 part pairs"),
    ({"lhs_type": "f32", "rhs_type": "f32", "accum_type": "bf16"}, "narrower than lhs_type"),
    ("bf16_9x", "unknown preset"),
    (3, "must be string|dict"),
]


@pytest.mark.parametrize("value, fragment", INVALID, ids=[f for _, f in INVALID])
def test_invalid_algorithms_are_invalid_graph_op(value, fragment):
    with pytest.raises(InvalidGraphOp, match="op 7") as err:
        add({"algorithm": value})
    assert fragment in str(err.value)
    assert err.value.status == ga.Status.invalid_graph_op


UNIMPLEMENTED = [
    ({"lhs_type": "f16", "rhs_type": "f16", "accum_type": "f16"}, "accum_type f16"),
    ({**BF16, "lhs_component_count": 3, "rhs_component_count": 3, "num_primitive_ops": 5},
     "not a whole number of significance levels"),
    ({"lhs_type": "f16", "rhs_type": "f16", "accum_type": "f32", "lhs_component_count": 2,
      "rhs_component_count": 2, "num_primitive_ops": 3}, "multi-component f16"),
    ({"lhs_type": "f64", "rhs_type": "f64", "accum_type": "f64"}, "accum_type f64"),
    ({**BF16, "rhs_type": "tf32", "lhs_component_count": 2, "rhs_component_count": 2,
      "num_primitive_ops": 3}, "multi-component bf16 x tf32"),
]


@pytest.mark.parametrize("value, fragment", UNIMPLEMENTED, ids=[f for _, f in UNIMPLEMENTED])
def test_valid_but_unimplemented_algorithms_name_the_algorithm(value, fragment):
    with pytest.raises(Unimplemented) as err:
        add({"algorithm": value})
    message = str(err.value)
    assert "dot algorithm {lhs_type=" in message and fragment in message and "op 7" in message


def test_an_algorithm_fixes_the_accumulator():
    with pytest.raises(InvalidGraphOp, match="accumulation_mode f16 conflicts"):
        add({"algorithm": "bf16", "accumulation_mode": "f16"})


# ------------------------------------------------------------------ parts
def test_bf16_parts_are_the_digits_of_x():
    """Three bf16 parts hold all 24 significand bits: hi + mid + lo == x exactly."""
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32) * 1e3
    hi, mid, lo = dot_algorithm.split(x, "bf16", 3)
    for part in (hi, mid, lo):
        assert np.array_equal(dot_algorithm.round_to(part, "bf16"), part)
    assert np.array_equal(hi.astype(np.float64) + mid + lo, x.astype(np.float64))
    assert (np.abs(mid) <= np.abs(x) * 2.0**-8).all() and (np.abs(lo) <= np.abs(x) * 2.0**-16).all()
    hi2, lo2 = dot_algorithm.split(x, "tf32", 2)  # 2 x 11 bits: 2 bits are lost at most
    assert (np.abs(x - (hi2.astype(np.float64) + lo2)) <= np.abs(x) * 2.0**-22).all()


def test_the_primitive_dots_are_the_most_significant_pairs():
    assert set(dot_algorithm.PRESETS["bf16_3x"].pairs()) == {(0, 0), (0, 1), (1, 0)}
    assert set(dot_algorithm.PRESETS["bf16_6x"].pairs()) == {
        (0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (2, 0)}
    assert dot_algorithm.PRESETS["bf16_6x"].pairs()[-1] == (0, 0)  # biggest summed last


# ------------------------------------------------------------------ precision
def well_conditioned(rng):
    return rng.uniform(0.5, 1, (M, KD)).astype(np.float32), rng.uniform(0.5, 1, (KD, N)).astype(np.float32)


def cancelling(rng):
    """[A, A] @ [B; -(B + d)] = -A @ d with d ~ 2^-10 B: outputs ~2^-11 of their terms."""
    a = rng.uniform(0.5, 1, (M, KD // 2)).astype(np.float32)
    b = rng.uniform(0.5, 1, (KD // 2, N)).astype(np.float32)
    b2 = (b + rng.uniform(0.5, 1, b.shape) * 2.0**-10).astype(np.float32)
    return np.concatenate([a, a], 1), np.concatenate([b, -b2], 0)


def measure(name, a, b):
    """(max, mean) relative error of the graph's MatMul under ``name`` vs float64."""
    graph = matmul_graph({"algorithm": name})
    run = ga.run_graph(graph, {0: a, 1: b})
    assert run.partitions[0].compiled.plan.name.startswith("dot_")
    exact = a.astype(np.float64) @ b.astype(np.float64)
    rel = np.abs(run.outputs[2] - exact) / np.abs(exact)
    return float(rel.max()), float(rel.mean())


def condition(a, b):
    exact = a.astype(np.float64) @ b.astype(np.float64)
    return float((np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)) / np.abs(exact)).max())


@pytest.mark.parametrize("data", [well_conditioned, cancelling])
def test_measured_precision_per_algorithm(data):
    a, b = data(np.random.default_rng(5))
    kappa = condition(a, b)
    err = {name: measure(name, a, b) for name in dot_algorithm.PRESETS}
    f32 = err["f32"][0]
    # f32 itself: a rounding per product and per addition, amplified by kappa
    assert f32 <= kappa * KD * U
    # bf16_6x: every kept product is exact; only the mid.lo/lo.mid/lo.lo terms
    # (< 3 * 2^-24 relative per term) and f32 summation remain: f32's error + a few ulps
    assert err["bf16_6x"][0] <= f32 + 4 * U * kappa
    # bf16_3x/tf32_3x: 2 parts of 8 (11) bits leave ~2^-17 (2^-21) per term
    assert err["bf16_3x"][0] <= 2 * f32 + 2.0**-16 * kappa
    assert err["tf32_3x"][0] <= 2 * f32 + 2.0**-20 * kappa
    # one bf16 rounding per operand: up to 2^-8 per product, and clearly not f32
    assert 2.0**-12 <= err["bf16"][0] <= 2.0**-8 * kappa
    assert err["bf16"][1] >= 2.0**-16
    for name, bits in (("tf32", 10), ("f16", 10), ("f8_e4m3", 3), ("f8_e5m2", 2)):
        assert err[name][0] <= 2.0**-bits * kappa, name
        assert err[name][0] >= 2.0**-(bits + 6), name  # the rounding really happened
    if data is cancelling:  # the cancellation separates the algorithms by orders of magnitude
        assert err["bf16"][0] > 0.05 > 100 * err["bf16_6x"][0]


def test_reference_kernel_agrees_with_the_fast_plan():
    a, b = cancelling(np.random.default_rng(1))
    for name in ("bf16", "bf16_3x", "bf16_6x", "tf32_3x", "f8_e4m3"):
        graph = matmul_graph({"algorithm": name})
        fast = ga.run_graph(graph, {0: a, 1: b}).outputs[2]
        op = graph.ops[0]
        ref = REFERENCE[K.MatMul](op, [a, b], [graph.tensors[2]], RefContext())[0]
        terms = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
        # the two differ only by f32 summation order over KD terms (reference: one rounding)
        assert (np.abs(fast - ref) <= KD * U * terms).all(), name


# ------------------------------------------------------------------ fpmath
def test_the_algorithm_wins_over_the_fpmath_mode():
    a, b = cancelling(np.random.default_rng(2))
    exact = a.astype(np.float64) @ b.astype(np.float64)
    err = lambda g: np.abs(ga.run_graph(g, {0: a, 1: b}).outputs[2] - exact).max() / np.abs(exact).max()
    bf16_mode = err(matmul_graph({}, fpmath="bf16"))
    f32_algo_in_bf16_mode = err(matmul_graph({"algorithm": "f32"}, fpmath="bf16"))
    bf16_algo_in_strict = err(matmul_graph({"algorithm": "bf16"}))
    assert bf16_mode > 0.05 and bf16_algo_in_strict > 0.05
    assert f32_algo_in_bf16_mode < bf16_mode / 20  # f32 errors, amplified by cancellation
    same = [ga.run_graph(matmul_graph({"algorithm": "f32"}, fpmath=mode), {0: a, 1: b}).outputs[2]
            for mode in ("bf16", "strict")]
    assert np.array_equal(*same)  # the mode changes nothing once an algorithm is set


# ------------------------------------------------------------------ fused patterns
def with_algorithm(graph, value, fpmath=None):
    def edit(op):
        if op.kind == K.MatMul:
            op.attrs["algorithm"] = value
    return rebuild(graph, op_fn=edit, fpmath=fpmath)


FUSED = {
    "sdpa": lambda: graphs.sdpa(),
    "gated_mlp": lambda: graphs.gated_mlp(k=64, n=48),
    "matmul_compressed": lambda: graphs.compressed_matmul(wdt=dt.s8, qtype="per_channel", k=64),
    "matmul_post_ops": lambda: graphs.matmul_chain(post=("relu",)),
}


def outputs(graph, feeds):
    run = ga.run_graph(graph, feeds)
    return {t: run.outputs[t] for t in graph.output_ids}, run


@pytest.mark.parametrize("kind", list(FUSED))
def test_fused_patterns_honour_the_algorithm(kind):
    """fpmath bf16 would round the MatMul inputs; algorithm f32 on every MatMul
    must give the strict result, whatever kernel the partition gets."""
    from graph_api.fill import fill_inputs
    from graph_api.fpmath import FPMath

    strict = FUSED[kind]()
    feeds = fill_inputs(strict, 3)
    feeds = {t: (v * 1.37).astype(v.dtype) if v.dtype == np.float32 else v for t, v in feeds.items()}
    bf16 = rebuild(strict, fpmath=FPMath.make("bf16"))
    algo = with_algorithm(strict, "f32", fpmath=FPMath.make("bf16"))
    want, _ = outputs(strict, feeds)
    rounded, _ = outputs(bf16, feeds)
    got, run = outputs(algo, feeds)
    assert [p.partition.get_kind() for p in run.partitions if len(p.partition.ops) > 1] == [kind]
    plans = {p.compiled.plan.name for p in run.partitions}
    assert plans <= {"reference"} | {n for n in plans if n.startswith("dot_")}
    for t in want:
        scale = np.abs(want[t]).max()
        assert np.abs(got[t] - want[t]).max() <= 1e-5 * scale, t
        assert np.abs(rounded[t] - want[t]).max() > 1e-4 * scale, t  # bf16 mode does differ


def test_a_post_op_partition_runs_the_dot_plan():
    graph = with_algorithm(graphs.matmul_chain(post=("relu",)), "bf16_6x")
    part = graph.get_partitions()[0]
    compiled = part.compile(part.get_input_ports(), part.get_output_ports())
    assert part.get_kind() == "matmul_post_ops" and compiled.plan.name == "dot_bf16_6x"


# ------------------------------------------------------------------ JSON
@pytest.mark.parametrize("value", ["bf16_3x", dict(dot_algorithm.PRESETS["tf32_3x"].as_dict())])
def test_json_round_trip(value):
    graph = matmul_graph({"algorithm": value}, shape_a=(4, 8), shape_b=(8, 3))
    text = graph.to_json()
    entry = json.loads(text)["graph"][0]["attrs"]["algorithm"]
    assert entry == {"type": "string" if isinstance(value, str) else "dict", "value": value}
    again = ga.Graph.from_json(text)
    assert again.ops[0].attrs["algorithm"] == value
    assert again.to_json() == text


def test_json_with_an_unimplemented_algorithm_fails_to_load():
    doc = json.loads(matmul_graph({"algorithm": "bf16"}, shape_a=(4, 8), shape_b=(8, 3)).to_json())
    doc["graph"][0]["attrs"]["algorithm"] = {"type": "dict", "value": {
        "lhs_type": "bf16", "rhs_type": "bf16", "accum_type": "bf16"}}
    with pytest.raises(Unimplemented, match="accum_type bf16"):
        ga.Graph.from_json(doc)
    doc["graph"][0]["attrs"]["algorithm"] = {"type": "s64", "value": 3}
    with pytest.raises(InvalidGraphOp, match="wrong attribute type"):
        ga.Graph.from_json(doc)

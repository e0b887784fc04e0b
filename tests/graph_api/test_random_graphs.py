"""Property-based random graphs from the opset (issue 8, standing test).

Valid graphs: chains the pattern library fuses (MatMul [+bias] + eltwise/binary
post-ops, DynamicDequantize -> MatMul with int4/int8 weights, SoftMax or
LayerNorm + post-ops, binary chains) and chains it does not (an intermediate
that escapes, reductions, transposes, concatenation) with random shapes, data
types and attributes.  Each runs under both partition policies and every
fpmath mode and every graph output must equal the unfused numpy reference
(``REFERENCE``, itself tested against float64 formulas in tests/kernels)
within :func:`graph_api.check.compare`'s tolerance.

Invalid graphs: a valid one with one defect (a K that does not match, a
declared output shape or data type that clashes, inputs whose types must agree
but do not, a missing input or feed, an
unknown or mistyped attribute, an axis out of range, 13 dims, two producers,
a feed of the wrong shape) must raise a ``GraphError`` subclass somewhere in
``add_op`` / ``finalize`` / ``get_partitions`` / compile / execute, and nothing
else.

Inputs are filled as benchdnn does (:mod:`graph_api.fill`), seeded by
hypothesis.  Examples are derandomized (the same every run); the short
version runs in the default suite, ``pytest -m long`` runs many more.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api import fill
from graph_api.check import compare
from graph_api.errors import GraphError

SHORT_VALID_PER_FAMILY, SHORT_INVALID = 4, 40
LONG_VALID = int(os.environ.get("GRAPH_API_RANDOM_GRAPHS", "300"))
LONG_INVALID = 4 * LONG_VALID

FLOATS = [dt.f32, dt.bf16, dt.f16]
MODES = list(ga.FPMathMode)
POLICIES = [ga.PartitionPolicy.fusion, ga.PartitionPolicy.debug]
#: every tally the tests print at the end (examples, runs, outcomes)
TALLY: Counter = Counter()


# ====================================================================== graph specs
@dataclass
class Spec:
    """A graph as data, so one drawn graph can be rebuilt for every fpmath mode
    and corrupted for the invalid-graph tests."""

    tensors: dict = field(default_factory=dict)  # id -> [dtype, shape, property]
    ops: list = field(default_factory=list)  # [kind, input ids, output ids, attrs]
    family: str = ""
    apply_to_int: bool = False
    seed: int = 0

    def tensor(self, dtype, shape, prop=ga.PropertyType.variable) -> int:
        tid = len(self.tensors)
        self.tensors[tid] = [dtype, list(shape), prop]
        return tid

    def op(self, kind, inputs, out_dtype, out_shape, **attrs) -> int:
        out = self.tensor(out_dtype, out_shape)
        self.ops.append([kind, list(inputs), [out], dict(attrs)])
        return out

    def build(self, mode=ga.FPMathMode.strict) -> ga.Graph:
        graph = ga.Graph(ga.EngineKind.cpu, mode, self.apply_to_int)
        lts = {tid: ga.LogicalTensor(tid, d, s, property=p) for tid, (d, s, p) in self.tensors.items()}
        for i, (kind, ins, outs, attrs) in enumerate(self.ops):
            graph.add_op(ga.Op(i, kind, [lts[t] for t in ins], [lts[t] for t in outs], attrs=attrs))
        graph.finalize()
        return graph


UNARY = {  # kind -> attrs strategy
    K.Abs: st.just({}), K.Exp: st.just({}), K.HardSwish: st.just({}), K.Mish: st.just({}),
    K.ReLU: st.just({}), K.Round: st.just({}), K.Sigmoid: st.just({}), K.Square: st.just({}),
    K.Tanh: st.just({}), K.Log: st.just({}), K.Sqrt: st.just({}),
    K.GELU: st.fixed_dictionaries({"mode": st.sampled_from(["gelu_erf", "gelu_tanh"])}),
    K.Elu: st.fixed_dictionaries({"alpha": st.sampled_from([0.5, 1.0, 2.0])}),
    K.LeakyReLU: st.fixed_dictionaries({"alpha": st.sampled_from([0.01, 0.2, -1.5])}),
    K.HardSigmoid: st.fixed_dictionaries({"alpha": st.sampled_from([0.2, 1 / 6]),
                                          "beta": st.sampled_from([0.5, 0.0])}),
    K.SoftPlus: st.fixed_dictionaries({"beta": st.sampled_from([1.0, 2.0, -1.0])}),
    K.Clamp: st.sampled_from([{"min": -1.0, "max": 1.0}, {"min": 0.0, "max": 6.0}, {"min": 0.5, "max": 0.5}]),
}
BINARY = [K.Add, K.Subtract, K.Multiply, K.Divide, K.Maximum, K.Minimum]


@st.composite
def post_ops(draw, spec: Spec, x: int, dtype, shape, at_most=3) -> int:
    """0..at_most unary or binary post-ops (the other operand full or broadcast)."""
    for _ in range(draw(st.integers(0, at_most))):
        if draw(st.booleans()):
            kind = draw(st.sampled_from(sorted(UNARY, key=lambda k: k.name)))
            x = spec.op(kind, [x], dtype, shape, **draw(UNARY[kind]))
        else:
            kind = draw(st.sampled_from(BINARY))
            other_shape = draw(st.sampled_from([list(shape), [1] * (len(shape) - 1) + [shape[-1]],
                                                list(shape[:-1]) + [1], [1]]))
            other = spec.tensor(dtype, other_shape)
            x = spec.op(kind, [x, other] if draw(st.booleans()) else [other, x], dtype, shape)
    return x


@st.composite
def matmul_chain(draw, spec: Spec) -> None:
    dtype = draw(st.sampled_from(FLOATS))
    m, k, n = draw(st.integers(1, 9)), draw(st.integers(1, 40)), draw(st.integers(1, 40))
    batch = draw(st.sampled_from([[], [2], [2, 3]]))
    ta, tb = draw(st.booleans()), draw(st.booleans())
    x = spec.tensor(dtype, batch + ([k, m] if ta else [m, k]))
    w_prop = draw(st.sampled_from([ga.PropertyType.variable, ga.PropertyType.constant]))
    w = spec.tensor(dtype, ([n, k] if tb else [k, n]), w_prop)
    inputs = [x, w]
    bias = draw(st.sampled_from(["none", "input", "BiasAdd", "Add"]))
    if bias == "input":
        inputs.append(spec.tensor(dtype, [n]))
    out_dtype = draw(st.sampled_from([dtype, dt.f32]))
    y = spec.op(K.MatMul, inputs, out_dtype, batch + [m, n], transpose_a=ta, transpose_b=tb)
    if bias in ("BiasAdd", "Add"):
        y = spec.op(K[bias], [y, spec.tensor(out_dtype, [n])], out_dtype, batch + [m, n])
    y = draw(post_ops(spec, y, out_dtype, batch + [m, n]))
    if out_dtype == dt.f32 and draw(st.booleans()):
        spec.op(K.TypeCast, [y], draw(st.sampled_from([dt.bf16, dt.f16])), batch + [m, n])


@st.composite
def wmatmul_chain(draw, spec: Spec) -> None:
    """DynamicDequantize(W int4/int8, scales[, zps]) -> MatMul -> post-ops."""
    act = draw(st.sampled_from(FLOATS))
    wdt = draw(st.sampled_from([dt.s4, dt.u4, dt.s8, dt.u8]))
    group = draw(st.sampled_from([2, 4, 8, 16]))
    k = group * draw(st.integers(1, 4))
    m, n = draw(st.integers(1, 6)), draw(st.integers(1, 36))
    tb = draw(st.booleans())
    qtype = draw(st.sampled_from(["per_group"] if wdt in (dt.s4, dt.u4) else
                                 ["per_group", "per_channel", "per_tensor"]))
    w_shape = [n, k] if tb else [k, n]
    attrs = {"qtype": qtype}
    if qtype == "per_group":
        attrs["group_shape"] = [1, group] if tb else [group, 1]
        s_shape = [n, k // group] if tb else [k // group, n]
    elif qtype == "per_channel":
        attrs["axis"] = 0 if tb else 1
        s_shape = [n]
    else:
        s_shape = [1]
    prop = draw(st.sampled_from([ga.PropertyType.variable, ga.PropertyType.constant]))
    inputs = [spec.tensor(wdt, w_shape, prop), spec.tensor(act, s_shape, prop)]
    if draw(st.booleans()):
        inputs.append(spec.tensor(draw(st.sampled_from([wdt, dt.s32] if qtype != "per_tensor" else [wdt])),
                                  s_shape, prop))
    wf = spec.op(K.DynamicDequantize, inputs, act, w_shape, **attrs)
    x = spec.tensor(act, [m, k])
    y = spec.op(K.MatMul, [x, wf], act, [m, n], transpose_b=tb)
    draw(post_ops(spec, y, act, [m, n], at_most=2))
    spec.apply_to_int = draw(st.booleans())


@st.composite
def norm_chain(draw, spec: Spec) -> None:
    """SoftMax or LayerNorm over the last dim, then post-ops."""
    dtype = draw(st.sampled_from(FLOATS))
    shape = draw(st.sampled_from([[3, 17], [2, 4, 9], [1, 64], [5, 1]]))
    x = spec.tensor(dtype, shape)
    if draw(st.booleans()):
        axis = draw(st.sampled_from([-1, len(shape) - 1]))
        y = spec.op(K.SoftMax, [x], dtype, shape, axis=axis,
                    mode=draw(st.sampled_from(["none", "inf_as_zero"])))
    else:
        affine = draw(st.booleans())
        ins = [x] + ([spec.tensor(dt.f32, [shape[-1]]), spec.tensor(dt.f32, [shape[-1]])] if affine else [])
        y = spec.op(K.LayerNorm, ins, dtype, shape, begin_norm_axis=-1, use_affine=affine,
                    keep_stats=False, epsilon=draw(st.sampled_from([1e-5, 1e-2])))
    draw(post_ops(spec, y, dtype, shape))


@st.composite
def binary_chain(draw, spec: Spec) -> None:
    dtype = draw(st.sampled_from(FLOATS))
    shape = draw(st.sampled_from([[4, 7], [2, 3, 5], [16]]))
    x = spec.op(draw(st.sampled_from(BINARY)), [spec.tensor(dtype, shape), spec.tensor(dtype, shape)],
                dtype, shape)
    draw(post_ops(spec, x, dtype, shape))


@st.composite
def unfused_chain(draw, spec: Spec) -> None:
    """Ops no pattern takes whole: a MatMul output read twice by its post-ops
    or escaping to the tail, then a reduction, transpose, concatenation or Pow."""
    dtype = draw(st.sampled_from(FLOATS))
    m, k, n = draw(st.integers(1, 6)), draw(st.integers(1, 12)), draw(st.integers(1, 12))
    y = spec.op(K.MatMul, [spec.tensor(dtype, [m, k]), spec.tensor(dtype, [k, n])], dtype, [m, n])
    relu = spec.op(K.ReLU, [y], dtype, [m, n])
    both = spec.op(K.Add, [y, relu], dtype, [m, n])  # a post-op reading y twice
    if draw(st.booleans()):
        both = y  # y escapes to the tail: MatMul, ReLU and Add cannot fuse whole
    kind = draw(st.sampled_from(["reduce", "transpose", "concat", "pow"]))
    if kind == "reduce":
        spec.op(draw(st.sampled_from([K.ReduceSum, K.ReduceMax, K.ReduceMean])), [both], dtype, [m, 1],
                axes=[1], keep_dims=True)
    elif kind == "transpose":
        spec.op(K.StaticTranspose, [both], dtype, [n, m], order=[1, 0])
    elif kind == "concat":
        spec.op(K.Concat, [both, relu], dtype, [2 * m, n], axis=0)
    else:
        spec.op(K.Pow, [both], dtype, [m, n], beta=draw(st.sampled_from([2.0, 0.5, -1.0])))


FAMILIES = {"matmul": matmul_chain, "wmatmul": wmatmul_chain, "norm": norm_chain,
            "binary": binary_chain, "unfused": unfused_chain}


@st.composite
def specs(draw, families=tuple(sorted(FAMILIES))) -> Spec:
    spec = Spec(family=draw(st.sampled_from(families)), seed=draw(st.integers(0, 2**16)))
    draw(FAMILIES[spec.family](spec))
    return spec


# ====================================================================== running
def run_and_compare(spec: Spec) -> None:
    """Every policy and fpmath mode against the composed reference."""
    for mode in MODES:
        graph = spec.build(mode)
        feeds = fill.fill_inputs(graph, spec.seed)
        expected = fill.reference_arrays(graph, feeds)
        ops = list(graph.ops.values())
        for policy in POLICIES:
            run = ga.run_graph(graph, feeds, policy)
            TALLY["runs"] += 1
            TALLY["fused partitions"] += sum(len(r.partition.ops) > 1 for r in run.partitions)
            for tid in graph.output_ids:
                verdict = compare(expected[tid], run.outputs[tid], graph.tensors[tid].dtype, graph.fpmath, ops)
                assert verdict.ok, (f"{spec.family} graph, fpmath {mode.name}, policy {policy.name}, "
                                    f"output {tid}: {verdict.message}\n{graph}")


CORRUPTIONS = ["k_mismatch", "out_shape", "out_dtype", "in_dtype", "missing_input", "unknown_attr", "attr_type",
               "axis_range", "rank13", "two_producers", "missing_feed", "feed_shape",
               "execute_shape", "execute_dtype"]


def corrupt(spec: Spec, how: str, data) -> tuple[Spec, str] | None:
    """``spec`` with one defect, or None when ``how`` does not apply to it."""
    kind0, ins0, outs0, attrs0 = spec.ops[0]
    if how == "k_mismatch":
        mm = next((o for o in spec.ops if o[0] == K.MatMul), None)
        if mm is None or spec.ops.index(mm) > 0:  # none, or a dequantized weight
            return None
        w = spec.tensors[mm[1][1]]
        if spec.tensors[mm[1][0]][1][-1 if not mm[3].get("transpose_a") else -2] != \
                w[1][-1 if mm[3].get("transpose_b") else -2]:
            return None
        w[1][-1 if mm[3].get("transpose_b") else -2] += 1
    elif how == "out_shape":
        spec.tensors[spec.ops[-1][2][0]][1][-1] += 1
    elif how == "out_dtype":
        out = spec.tensors[spec.ops[-1][2][0]]
        if spec.ops[-1][0] not in set(UNARY) | {K.Maximum, K.Minimum} or out[0] not in FLOATS:
            return None  # only these tie dst's type to src's
        out[0] = next(d for d in FLOATS if d != out[0])
    elif how == "in_dtype":  # src and weights of a MatMul, or Maximum's inputs, share one type
        op = next((o for o in spec.ops if o[0] in (K.MatMul, K.Maximum, K.Minimum)), None)
        if op is None or spec.ops.index(op) > 0:
            return None
        second = spec.tensors[op[1][1]]
        second[0] = next(d for d in FLOATS if d != second[0])
    elif how == "missing_input":  # below every op's minimum (optional inputs come last)
        del ins0[2 if kind0 == K.LayerNorm and len(ins0) == 3 else 1 if len(ins0) > 1 else 0:]
    elif how == "unknown_attr":
        attrs0["bogus_attribute"] = 1
    elif how == "attr_type":
        if not attrs0:
            return None
        key = data.draw(st.sampled_from(sorted(attrs0)))
        attrs0[key] = data.draw(st.sampled_from([[1, 2], object(), {"a": 1}]))
    elif how == "axis_range":
        norm = next((o for o in spec.ops if o[0] in (K.SoftMax, K.LayerNorm, K.ReduceSum, K.Concat)), None)
        if norm is None:
            return None
        rank = len(spec.tensors[norm[1][0]][1])
        key = {K.SoftMax: "axis", K.LayerNorm: "begin_norm_axis", K.Concat: "axis"}.get(norm[0], "axes")
        bad = data.draw(st.sampled_from([rank, rank + 3, -rank - 1, 2**40]))
        norm[3][key] = [bad] if key == "axes" else bad
    elif how == "rank13":
        spec.tensors[ins0[0]][1] = [1] * 13
    elif how == "two_producers":
        if len(spec.ops) < 2:
            return None
        spec.ops[1][2] = list(outs0)
    elif how in ("missing_feed", "feed_shape", "execute_shape", "execute_dtype"):
        pass  # applied to the feeds or the execute call
    return spec, how


def run_invalid(spec: Spec, how: str) -> None:
    graph = spec.build()
    for policy in POLICIES:
        graph.get_partitions(policy)
    feeds = fill.fill_inputs(graph, spec.seed)
    first = graph.input_ids[0]
    if how in ("execute_shape", "execute_dtype"):  # compile right, execute with a wrong output tensor
        part = graph.get_partitions()[-1]
        cp = part.compile(part.get_input_ports(), part.get_output_ports(), ga.Engine())
        engine = ga.Engine()
        ins = [ga.Tensor(cp.query_logical_tensor(t), engine) for t in part.input_ids]
        good = cp.query_logical_tensor(part.output_ids[0])
        wrong = (ga.LogicalTensor(good.id, good.dtype, list(good.shape) + [2]) if how == "execute_shape" else
                 ga.LogicalTensor(good.id, dt.s32 if good.dtype != dt.s32 else dt.f32, good.shape))
        cp.execute(ga.Stream(engine), ins, [ga.Tensor(wrong, engine)])
    elif how == "missing_feed":
        del feeds[first]
    elif how == "feed_shape":
        feeds[first] = feeds[first].reshape(-1)[:-1] if feeds[first].size > 1 else feeds[first].reshape(1, 1, 1, 1)
    ga.run_graph(graph, feeds)


# ====================================================================== tests
def _valid(examples: int, families=tuple(sorted(FAMILIES))):
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(specs(families))
    def check(spec):
        TALLY["valid examples"] += 1
        TALLY[f"family {spec.family}"] += 1
        run_and_compare(spec)

    return check


def _invalid(examples: int):
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(specs(), st.sampled_from(CORRUPTIONS), st.data())
    def check(spec, how, data):
        corrupted = corrupt(spec, how, data)
        if corrupted is None:
            TALLY["invalid: not applicable"] += 1
            return
        TALLY["invalid examples"] += 1
        try:
            run_invalid(*corrupted)
        except GraphError as err:
            TALLY[f"invalid -> {type(err).__name__}"] += 1
            return
        raise AssertionError(f"a {how} graph ({spec.family}) ran without a typed error")

    return check


def _report(name: str):
    print(f"\n{name}: " + ", ".join(f"{k} {v}" for k, v in sorted(TALLY.items())))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_random_valid_graphs_match_the_reference(family):
    TALLY.clear()
    _valid(SHORT_VALID_PER_FAMILY, (family,))()
    _report(f"random valid {family} graphs")
    assert TALLY["valid examples"] >= SHORT_VALID_PER_FAMILY
    assert TALLY["runs"] == TALLY["valid examples"] * len(MODES) * len(POLICIES)


def test_random_invalid_graphs_raise_typed_errors():
    TALLY.clear()
    _invalid(SHORT_INVALID)()
    _report("random invalid graphs")
    assert TALLY["invalid examples"] > SHORT_INVALID // 2


@pytest.mark.long
def test_random_valid_graphs_long():
    TALLY.clear()
    _valid(LONG_VALID)()
    _report("random valid graphs (long)")


@pytest.mark.long
def test_random_invalid_graphs_long():
    TALLY.clear()
    _invalid(LONG_INVALID)()
    _report("random invalid graphs (long)")


# ====================================================================== regressions found here
@pytest.mark.parametrize("tail", ["mul_self", "add_self", "add_relu"])
@pytest.mark.parametrize("weights", ["f32", "s4"])
def test_a_post_op_reading_the_matmul_output_twice(tail, weights):
    """Multiply(y, y), Add(y, y), Add(y, ReLU(y)) after a fused MatMul raised
    KeyError in the fused plan (issue 8.4); now the partition's answer is the
    float64 formula's."""
    spec, m, k, n = Spec(seed=3), 3, 32, 8
    if weights == "s4":
        w = spec.op(K.DynamicDequantize, [spec.tensor(dt.s4, [k, n], ga.PropertyType.constant),
                                          spec.tensor(dt.f32, [1, n], ga.PropertyType.constant)],
                    dt.f32, [k, n], qtype="per_group", group_shape=[k, 1])
    else:
        w = spec.tensor(dt.f32, [k, n])
    x = spec.tensor(dt.f32, [m, k])
    y = spec.op(K.MatMul, [x, w], dt.f32, [m, n])
    if tail == "add_relu":
        spec.op(K.Add, [y, spec.op(K.ReLU, [y], dt.f32, [m, n])], dt.f32, [m, n])
    else:
        spec.op(K.Multiply if tail == "mul_self" else K.Add, [y, y], dt.f32, [m, n])
    graph = spec.build()
    assert len(graph.get_partitions()) == 1
    feeds = fill.fill_inputs(graph, 1)
    if weights == "s4":  # per-group scales with one group over K: a scale per column
        wf = feeds[0].astype(np.float64) * feeds[1].astype(np.float64)
    else:
        wf = feeds[w].astype(np.float64)
    y64 = feeds[x].astype(np.float64) @ wf
    want = {"mul_self": y64 * y64, "add_self": 2 * y64, "add_relu": y64 + np.maximum(y64, 0)}[tail]
    got = ga.run_graph(graph, feeds).outputs[graph.output_ids[0]]
    # the filler's integer activations and power-of-two weights make y exact in f32;
    # one f32 rounding of the tail remains
    np.testing.assert_allclose(got, want, rtol=2**-23, atol=0)


@pytest.mark.parametrize("m", [3, 40])  # decode (GEMV) and prefill kernels
@pytest.mark.parametrize("n", [16, 32])  # 32: the natural-layout int4 path of variable weights
@pytest.mark.parametrize("prop", [ga.PropertyType.constant, ga.PropertyType.variable])
@pytest.mark.parametrize("wdt", [dt.s4, dt.u4, dt.s8])
@pytest.mark.parametrize("transposed", [False, True])
def test_zero_points_of_compressed_weights_are_applied(wdt, prop, n, transposed, m):
    """s4 weights with zero points: the fused kernel ignored them (issue 8.1);
    all-zero weights with zero point 3 gave 0 where the answer is -3 * scale * sum(x)."""
    k, group = 64, 32
    spec = Spec(seed=2)
    w_shape, s_shape = ([n, k], [n, k // group]) if transposed else ([k, n], [k // group, n])
    ins = [spec.tensor(wdt, w_shape, prop), spec.tensor(dt.f32, s_shape, prop), spec.tensor(wdt, s_shape, prop)]
    wf = spec.op(K.DynamicDequantize, ins, dt.f32, w_shape, qtype="per_group",
                 group_shape=[1, group] if transposed else [group, 1])
    x = spec.tensor(dt.f32, [m, k])
    spec.op(K.MatMul, [x, wf], dt.f32, [m, n], transpose_b=transposed)
    graph = spec.build()
    feeds = fill.fill_inputs(graph, 4)
    feeds[2] = np.full(s_shape, 3 if wdt != dt.u4 else 11, feeds[2].dtype)
    feeds[0] = np.zeros(w_shape, feeds[0].dtype) if wdt == dt.s4 else feeds[0]
    run = ga.run_graph(graph, feeds)
    assert run.partitions[0].compiled.plan.name == "numba_wmatmul"
    rep = lambda a: np.repeat(a.astype(np.float64), group, axis=1 if transposed else 0)  # noqa: E731
    wf64 = (feeds[0].astype(np.float64) - rep(feeds[2])) * rep(feeds[1])
    want = feeds[x].astype(np.float64) @ (wf64.T if transposed else wf64)
    # integer activations and power-of-two scales: every product and sum is exact in f32
    np.testing.assert_array_equal(run.outputs[graph.output_ids[0]], want.astype(np.float32))

"""Composite ops: decompositions, the library contract (R1-R4), boundary checks, JSON."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api import composite as C
from graph_api.composite import LIBRARY, Decomposition, composite_op
from graph_api.composite_inline import expand
from graph_api.composite_library import Builder
from graph_api.kernels.reference import RefContext
from graph_api.kernels.reference.composite import run_reference


@pytest.fixture(autouse=True)
def scoped_library():
    """User definitions of one test never leak into another."""
    C._ensure_shipped()  # the shipped ones load on first use: outside the scope
    with LIBRARY.scope():
        yield


def lt(i, shape=None, dtype=dt.f32):
    return ga.LogicalTensor(i, dtype, shape)


def scaled_abs(name="t.scaled_abs", version=1, factor=2.0, dtype=dt.f32, shape=None) -> Decomposition:
    """|x| * factor + offset (offset: the composite's attribute, default 0.5)."""
    b = Builder()
    x = b.port(shape)
    if dtype != dt.f32:
        x = ga.LogicalTensor(x.id, dtype, shape)
    y = b.op(K.Add, b.op(K.Multiply, b.op(K.Abs, x), b.const(factor)), b.const("offset"))
    return b.decomposition(name, [x], [y], {"offset": 0.5}) if version == 1 else \
        Decomposition(name, [x], [y], b.ops, version, b.constants, {"offset": 0.5})


def calls(name, callee, extra_op=K.ReLU) -> Decomposition:
    """``extra_op(callee(x))``: a decomposition nesting another composite."""
    b = Builder()
    x = b.port()
    y = b.op(extra_op, b.composite(callee, x))
    return b.decomposition(name, [x], [y])


def one_op_graph(op, *more):
    g = ga.Graph()
    for o in (op,) + more:
        g.add_op(o)
    g.finalize()
    return g


def reference(op, *inputs):
    out_lts = [o.with_shape(np.shape(inputs[0])) for o in op.outputs]
    return run_reference(op, list(inputs), out_lts, RefContext())[0]


# ------------------------------------------------------------------ R1: tanh
def test_tanh_decomposition_max_error_over_minus9_9():
    """The shipped tanh (Horner-style rational approximation, f32) against numpy's
    tanh in float64 over [-9, 9]: measured max |error| 3.71e-7 (at x = -5.78, about
    6 f32 ulps of 1.0); f32 Tanh itself is within 6e-8."""
    x = np.linspace(-9, 9, 200_001, dtype=np.float32)
    op = ga.Op(0, K.Composite, [lt(0, x.shape)], [lt(1, x.shape)], attrs={"name": "tanh"})
    one_op_graph(op)  # valid as an op
    y = reference(op, x)
    err = np.abs(y.astype(np.float64) - np.tanh(x.astype(np.float64)))
    print(f"tanh decomposition: max |error| vs numpy tanh over [-9, 9] = {err.max():.3e} "
          f"at x = {x[err.argmax()]:.4f}")
    assert 1e-8 < err.max() < 4e-7
    assert y[0] == np.float32(-1.0) and y[-1] == np.float32(1.0)
    # no final clamp (as in the seed's form): f32 rounding may overshoot 1 by an ulp
    assert np.abs(y).max() <= 1 + 2.0 ** -23


def test_shipped_library():
    assert {("tanh", 1), ("gelu_tanh", 1), ("rms_norm", 1), ("gated_mlp", 1), ("sdpa", 1)} \
        <= set(LIBRARY.keys())
    assert LIBRARY.get("gelu_tanh").references() == [("tanh", 1)]


# ------------------------------------------------------------------ R4: user composites
def test_user_composite_runs_and_infers_shapes():
    dec = C.define(scaled_abs())
    g = one_op_graph(composite_op(0, [lt(0, [2, 3])], [lt(1)], "t.scaled_abs", offset=1.5))
    assert g.tensors[1].shape == (2, 3)
    op = g.ops[0]
    assert op.attrs == {"name": "t.scaled_abs", "version": 1, "offset": 1.5}
    x = np.array([[-1, 2, -3], [0.5, 0, 4]], np.float32)
    np.testing.assert_array_equal(reference(op, x), np.abs(x) * 2 + 1.5)  # exact in f32
    result = ga.run_graph(g, {0: x})
    np.testing.assert_array_equal(result.outputs[1], np.abs(x) * 2 + 1.5)
    assert C.resolve(op) is dec


def test_default_and_required_attributes():
    C.define(scaled_abs())
    g = one_op_graph(composite_op(0, [lt(0, [3])], [lt(1, [3])], "t.scaled_abs"))
    assert g.ops[0].attrs["offset"] == 0.5
    with pytest.raises(ga.InvalidGraphOp, match="has no attribute 'scale'.*takes: offset"):
        ga.Graph().add_op(composite_op(0, [lt(0, [3])], [lt(1)], "t.scaled_abs", scale=1.0))
    with pytest.raises(ga.InvalidGraphOp, match="must be a number"):
        ga.Graph().add_op(composite_op(0, [lt(0, [3])], [lt(1)], "t.scaled_abs", offset="x"))


# ------------------------------------------------------------------ R3: nesting
def test_nesting_three_deep():
    """c -> b -> a -> (ops): each level adds an op; shapes and values through all levels."""
    C.define(scaled_abs("t.a"))
    LIBRARY.define_all([calls("t.c", "t.b", K.Sqrt), calls("t.b", "t.a", K.Exp)])
    op = composite_op(0, [lt(0, [5])], [lt(1)], "t.c")
    g = one_op_graph(op)
    assert g.tensors[1].shape == (5,)
    x = np.array([-2, -0.5, 0, 1, 3], np.float32)
    expected = np.sqrt(np.exp(np.abs(x.astype(np.float64)) * 2 + 0.5))
    np.testing.assert_allclose(reference(g.ops[0], x), expected, rtol=1e-6)  # 3 f32 ops
    for ref_path in (False, True):  # user composites have no fast kernel: inlined either way
        with C.reference_mode(ref_path):
            parts = g.get_partitions()
            assert all(o.kind != K.Composite for p in parts for o in p.ops)
            np.testing.assert_allclose(ga.run_graph(g, {0: x}, partitions=parts).outputs[1],
                                       expected, rtol=1e-6)
    decisions = {d.composite: d for d in expand(g).decisions}
    assert set(decisions) == {"'t.c' v1", "'t.b' v1", "'t.a' v1"}
    assert decisions["'t.a' v1"].inside is not None


def test_nested_composite_with_a_fast_kernel_stays_one_partition():
    """Inlining a user composite that calls gelu_tanh keeps the gelu as one fast partition."""
    C.define(calls("t.relu_gelu", "gelu_tanh"))
    g = one_op_graph(composite_op(0, [lt(0, [2, 4])], [lt(1, [2, 4])], "t.relu_gelu"))
    kinds = sorted(p.get_kind() for p in g.get_partitions())
    assert kinds == ["composite", "single op"]
    x = np.linspace(-3, 3, 8, dtype=np.float32).reshape(2, 4)
    got = ga.run_graph(g, {0: x}).outputs[1]
    xd = x.astype(np.float64)
    want = np.maximum(0.5 * xd * (1 + np.tanh(np.sqrt(2 / np.pi) * (xd + 0.044715 * xd ** 3))), 0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # f32 GELU op: a few ulps


def test_cycles_are_rejected():
    with pytest.raises(ga.InvalidGraph, match=r"cycle: 't.p' v1 -> 't.q' v1 -> 't.p' v1"
                                              r"|cycle: 't.q' v1 -> 't.p' v1 -> 't.q' v1"):
        LIBRARY.define_all([calls("t.p", "t.q"), calls("t.q", "t.p")])
    with pytest.raises(ga.InvalidGraph, match="cycle: 't.self' v1 -> 't.self' v1"):
        C.define(calls("t.self", "t.self"))
    assert ("t.p", 1) not in LIBRARY and ("t.self", 1) not in LIBRARY  # rolled back


# ------------------------------------------------------------------ R2: stable contract
def test_redefinition_rules():
    first = C.define(scaled_abs())
    assert C.define(scaled_abs()) is first  # identical: the one stored definition
    with pytest.raises(ga.InvalidGraphOp, match="changes input port 0 from f32.* to bf16"):
        C.define(scaled_abs(dtype=dt.bf16))
    with pytest.raises(ga.InvalidGraphOp, match="changes input port 0 from f32\\[\\?\\] to f32\\[4\\]"):
        C.define(scaled_abs(shape=[4]))
    with pytest.raises(ga.InvalidGraphOp, match="same ports but another body"):
        C.define(scaled_abs(factor=3.0))
    v2 = C.define(scaled_abs(factor=3.0, version=2))  # a new version is a new contract
    assert LIBRARY.get("t.scaled_abs", 2) is v2 and LIBRARY.get("t.scaled_abs", 1) is first
    with pytest.raises(ga.InvalidGraphOp, match="changes input port 0"):
        C.define(Decomposition("tanh", [lt(1, None, dt.bf16)], [lt(2, None, dt.bf16)],
                               [ga.Op(0, K.Tanh, [lt(1, None, dt.bf16)], [lt(2, None, dt.bf16)])]))


# ------------------------------------------------------------------ boundary checks
def test_boundary_type_errors_name_the_composite_and_the_port():
    with pytest.raises(ga.InvalidGraphOp, match=r"op 3 .*input 0 \(tensor 0\) is bf16; "
                                                r"input port 0 of composite 'tanh' v1 is f32"):
        ga.Graph().add_op(composite_op(3, [lt(0, [4], dt.bf16)], [lt(1, [4], dt.bf16)], "tanh"))
    with pytest.raises(ga.InvalidGraphOp, match="composite 'rms_norm' v1 takes 2 inputs"):
        ga.Graph().add_op(composite_op(3, [lt(0, [4, 8])], [lt(1)], "rms_norm"))
    with pytest.raises(ga.InvalidGraphOp, match=r"input 1 \(tensor 1\).*rms_norm.*is given shape "
                                                r"\[2, 8\]; the port is f32\[\?\]"):
        ga.Graph().add_op(composite_op(3, [lt(0, [4, 8]), lt(1, [2, 8])], [lt(2)], "rms_norm"))
    g = ga.Graph()  # after inference: the declared output clashes with the decomposition
    g.add_op(composite_op(3, [lt(0, [4, 8]), lt(1, [4])], [lt(2, [4, 8])], "rms_norm"))
    with pytest.raises(ga.GraphError, match="op 3 .*rms_norm"):
        g.finalize()  # gamma [4] does not broadcast against x [4, 8] in the decomposition
    g = ga.Graph()
    g.add_op(composite_op(3, [lt(0, [4, 8])], [lt(1, [4, 9])], "tanh"))
    with pytest.raises(ga.InvalidGraphOp, match=r"output 0 \(tensor 1\) is declared f32\[4,9\] "
                                                r"but composite 'tanh' v1 gives \[4, 8\]"):
        g.finalize()


def test_unknown_composites():
    with pytest.raises(ga.InvalidGraphOp, match="unknown composite 't.none' v1.*known: .*'tanh' v1"):
        ga.Graph().add_op(composite_op(0, [lt(0, [2])], [lt(1)], "t.none"))
    with pytest.raises(ga.InvalidGraphOp, match="unknown composite 'tanh' v7"):
        ga.Graph().add_op(composite_op(0, [lt(0, [2])], [lt(1)], "tanh", version=7))
    with pytest.raises(ga.InvalidGraphOp, match="'t.outer' v1 calls composite 't.missing' v1, which has no"):
        C.define(calls("t.outer", "t.missing"))


def test_decomposition_structure_errors():
    x, y, z = lt(1), lt(2), lt(3)
    with pytest.raises(ga.InvalidGraph, match="output port 0 .* is produced by no op"):
        Decomposition("t.bad", [x], [z], [ga.Op(0, K.Abs, [x], [y])])
    with pytest.raises(ga.InvalidGraph, match=r"tensors \[2\] are produced but neither used"):
        Decomposition("t.bad", [x], [z], [ga.Op(0, K.Abs, [x], [y]), ga.Op(1, K.Abs, [x], [z])])
    with pytest.raises(ga.InvalidGraph, match=r"tensors \[9\] are used but"):
        Decomposition("t.bad", [x], [y], [ga.Op(0, K.Add, [x, lt(9)], [y])])


# ------------------------------------------------------------------ sharing
def test_one_definition_shared_by_many_sites():
    """Eight RMSNorm call sites: one decomposition object, one JSON entry."""
    g = ga.Graph()
    x = lt(0, [2, 16])
    gamma = lt(1, [16], dt.f32)
    for i in range(8):
        y = lt(10 + i, [2, 16])
        g.add_op(composite_op(i, [x, gamma], [y], "rms_norm", epsilon=1e-5 * (i + 1)))
        x = y
    g.finalize()
    decs = {id(C.resolve(op)) for op in g.ops.values()}
    assert len(decs) == 1
    doc = json.loads(g.to_json())
    assert [d["name"] for d in doc["graph_api.decompositions"]] == ["rms_norm"]
    xs = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    gam = np.linspace(0.5, 1.5, 16, dtype=np.float32)
    want = xs.astype(np.float64)
    for i in range(8):  # independent formula, epsilon per site
        want = want / np.sqrt((want ** 2).mean(-1, keepdims=True) + 1e-5 * (i + 1)) * gam
    with C.reference_mode():
        got = ga.run_graph(g, {0: xs, 1: gam}).outputs[17]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # 8 chained f32 norms


# ------------------------------------------------------------------ JSON
def _user_graph():
    C.define(scaled_abs())
    C.define(calls("t.wrap", "t.scaled_abs"))
    g = ga.Graph()
    g.add_op(composite_op(0, [lt(0, [3, 4])], [lt(1, [3, 4])], "t.wrap"))
    g.add_op(composite_op(1, [lt(1, [3, 4])], [lt(2, [3, 4])], "gelu_tanh"))
    g.add_op(composite_op(2, [lt(2, [3, 4])], [lt(3, [3, 4])], "t.scaled_abs", offset=-1.25))
    g.finalize()
    return g


def test_json_round_trip_is_exact():
    g = _user_graph()
    text = g.to_json()
    doc = json.loads(text)
    names = [d["name"] for d in doc["graph_api.decompositions"]]
    assert names == ["t.scaled_abs", "t.wrap", "tanh", "gelu_tanh"]  # callees first, each once
    assert list(doc)[-1] == "graph_api.decompositions"
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    want = ga.run_graph(g, {0: x}).outputs[3]
    with LIBRARY.scope():  # a fresh process: the file brings its own definitions
        for key in [("t.scaled_abs", 1), ("t.wrap", 1)]:
            del LIBRARY._entries[key]
        back = ga.Graph.from_json(text)
        assert back.to_json() == text
        assert C.resolve(back.ops[0]).fingerprint() == LIBRARY.get("t.wrap").fingerprint()
        np.testing.assert_array_equal(ga.run_graph(back, {0: x}).outputs[3], want)


def test_json_errors():
    g = _user_graph()
    doc = json.loads(g.to_json())
    no_decs = dict(doc)
    del no_decs["graph_api.decompositions"]
    with LIBRARY.scope():
        del LIBRARY._entries[("t.wrap", 1)]
        with pytest.raises(ga.InvalidGraphOp, match="<json>: op 0 .*unknown composite 't.wrap' v1"):
            ga.Graph.from_json(no_decs)
    changed = json.loads(json.dumps(doc))  # R2 across files: tanh v1 redefined with bf16 ports
    tanh_doc = next(d for d in changed["graph_api.decompositions"] if d["name"] == "tanh")
    tanh_doc["inputs"][0]["dtype"] = "bf16"
    with pytest.raises(ga.InvalidGraphOp, match="graph_api.decompositions: redefinition of composite 'tanh'"):
        ga.Graph.from_json(changed)
    cyclic = json.loads(json.dumps(doc))  # t.scaled_abs v1 made to call t.wrap: a cycle
    with LIBRARY.scope():
        del LIBRARY._entries[("t.wrap", 1)]
        del LIBRARY._entries[("t.scaled_abs", 1)]
        entry = cyclic["graph_api.decompositions"][0]
        abs_op = entry["graph"][0]
        abs_op.update(kind="Composite", attrs={"name": {"type": "string", "value": "t.wrap"},
                                               "version": {"type": "s64", "value": 1}})
        with pytest.raises(ga.InvalidGraph, match="cycle"):
            ga.Graph.from_json(cyclic)


def test_attribute_constant_must_fit_its_tensor():
    C.define(scaled_abs())
    with pytest.raises(ga.InvalidGraphOp, match=r"offset=\[1.0, 2.0\] .* broadcasting to \[1\]"):
        ga.Graph().add_op(composite_op(0, [lt(0, [3])], [lt(1)], "t.scaled_abs", offset=[1.0, 2.0]))
    with pytest.raises(ga.InvalidGraph, match="constant tensor 2: value"):
        Decomposition("t.bad", [lt(1)], [lt(3)], [ga.Op(0, K.Add, [lt(1), lt(2, [2])], [lt(3)])],
                      constants={2: [[1.0], [2.0, 3.0]]})


def test_a_scope_opened_first_keeps_the_shipped_library():
    """Regression: a LIBRARY.scope() entered before anything loaded the shipped decompositions
    loaded them inside the block, and its end dropped them for the rest of the process."""
    code = ("from graph_api import composite\n"
            "with composite.LIBRARY.scope():\n"
            "    pass\n"
            "print(composite.LIBRARY.get('tanh', 1) is not None, composite.LIBRARY.get('sdpa', 1) is not None)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.stdout.split() == ["True", "True"], done.stderr

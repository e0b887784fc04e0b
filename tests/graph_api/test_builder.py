"""GraphBuilder: one generated method per op kind, ids/dtypes/shapes inferred, a model that runs."""
import inspect

import ml_dtypes
import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api.builder import GraphBuilder, method_name
from graph_api.opset import OP_SCHEMAS
from graph_api.schema import NO_DEFAULT, REQUIRED
from tests.cases.op_cases import OP_CASES
from tests.kernels.test_reference import assert_matches

#: one op case per kind: enough to show each generated method builds and runs its op
FIRST_CASE = {}
for _case in OP_CASES:
    FIRST_CASE.setdefault(_case.kind, _case)
RUNNABLE = [c for k, c in FIRST_CASE.items() if k not in (ga.OpKind.End, ga.OpKind.Wildcard)]


def test_method_names():
    assert [method_name(k) for k in (ga.OpKind.MatMul, ga.OpKind.ReLU, ga.OpKind.LeakyReLU,
                                     ga.OpKind.SoftMax, ga.OpKind.DynamicDequantize,
                                     ga.OpKind.RMSNorm, ga.OpKind.GELU, ga.OpKind.PReLU)] == \
        ["matmul", "relu", "leaky_relu", "softmax", "dynamic_dequantize", "rms_norm", "gelu", "prelu"]
    names = [method_name(k) for k in OP_SCHEMAS]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("kind", list(OP_SCHEMAS), ids=lambda k: k.name)
def test_every_op_kind_has_a_method_with_the_schema_attrs(kind):
    schema = OP_SCHEMAS[kind]
    method = getattr(GraphBuilder, method_name(kind))
    params = inspect.signature(method).parameters
    for attr in schema.attrs:
        param = params[attr.name]
        assert param.kind == inspect.Parameter.KEYWORD_ONLY
        if attr.default is REQUIRED:
            assert param.default is inspect.Parameter.empty
        elif attr.default is not NO_DEFAULT:
            assert param.default == attr.default
        assert attr.name in method.__doc__
    for port in schema.inputs:
        assert port.name in method.__doc__


#: kinds without an op case (their builder method is still checked against the schema above)
NO_CASE = {ga.OpKind.InterpolateBackward: "tested as the adjoint of Interpolate (tests/kernels/test_backward_window.py)"}


def test_every_op_kind_that_runs_has_a_case_here():
    kinds = set(OP_SCHEMAS) - {ga.OpKind.End, ga.OpKind.Wildcard} - set(NO_CASE)
    assert kinds <= set(FIRST_CASE), sorted(k.name for k in kinds - set(FIRST_CASE))


@pytest.mark.parametrize("case", RUNNABLE, ids=lambda c: c.name)
def test_op_case_through_the_builder(case):
    b = GraphBuilder(case.fpmath)
    values = [b.input(spec.dtype, spec.shape,
                      ga.PropertyType.host_scalar if spec.host_scalar else ga.PropertyType.variable)
              for spec in case.inputs]
    method = getattr(b, method_name(case.kind))
    attrs = {k: (list(v) if isinstance(v, tuple) else v) for k, v in case.attrs.items()}
    outs = method(*values, **attrs, out_dtypes=[o.dtype for o in case.outputs],
                  num_outputs=len(case.outputs))
    outs = outs if isinstance(outs, tuple) else (outs,)
    assert [o.shape for o in outs] == [tuple(o.shape) for o in case.outputs]  # shapes inferred
    b.output(*outs)
    model = b.compile()
    arrays = case.make_inputs()
    results = model(*arrays)
    results = results if isinstance(results, tuple) else (results,)
    expected = case.expected(arrays, dict(case.attrs))
    for i, (got, spec, want) in enumerate(zip(results, case.outputs, expected)):
        assert_matches(got, np.reshape(want, spec.shape), case.tolerance(i), f"{case.name} output {i}")


def test_dtypes_are_inferred_from_the_schema():
    b = GraphBuilder()
    x = b.input(dt.bf16, [2, 8])
    s = b.constant(np.ones([1], np.float32))
    assert b.relu(x).dtype == dt.bf16  # same type variable as the input
    assert b.softmax(b.type_cast(x, out_dtype=dt.f32), num_outputs=2)[1].dtype == dt.f32  # stats: f32 only
    assert b.constant(np.zeros([8, 4], ml_dtypes.int4)).dtype == dt.s4  # from the array's dtype
    w = b.constant(np.zeros([8, 4], np.int8))
    assert b.dynamic_dequantize(w, s, qtype="per_tensor").dtype == dt.f32  # first allowed input type
    with pytest.raises(ga.InvalidArguments, match="out_dtype"):
        b.quantize(b.input(dt.f32, [2]), scales=[1.0], zps=[0])  # s8 or u8: must be said


def test_wrong_calls_are_typed_errors():
    b = GraphBuilder()
    x = b.input(dt.f32, [2, 3])
    with pytest.raises(ga.InvalidArguments):
        b.relu(x, x)  # one input port
    with pytest.raises(ga.InvalidArguments, match="Values"):
        b.relu(np.zeros(3))
    with pytest.raises(ga.InvalidGraphOp, match="unknown attribute"):
        b.make_op(ga.OpKind.ReLU, [x], {"alpha": 1.0})
    with pytest.raises(ga.InvalidShape):
        b.matmul(x, b.input(dt.f32, [4, 5]))  # K mismatch found while building


def test_int4_weight_compressed_matmul_model_runs_many_times():
    rng = np.random.default_rng(0)
    n, k, group = 64, 128, 32
    q = rng.integers(-8, 8, (n, k))
    scale = rng.uniform(0.01, 0.02, (n, k // group)).astype(np.float32)
    b = GraphBuilder()
    x = b.input(dt.f32, [-1, k])  # M unknown until run time
    w = b.dynamic_dequantize(b.constant(q.astype(ml_dtypes.int4)), b.constant(scale),
                             qtype="per_group", group_shape=[1, group])
    y = b.matmul(x, w, transpose_b=True)
    model = b.compile()
    assert [p.get_kind() for p in model.partitions] == ["matmul_compressed"]
    w64 = q * np.repeat(scale.astype(np.float64), group, axis=1)
    for m in (1, 1, 3):  # the second call reuses the compiled partition; M=3 compiles again
        xa = rng.standard_normal((m, k)).astype(np.float32)
        got = model(xa)
        want = xa.astype(np.float64) @ w64.T
        # strict f32: |error| <= K * eps * sum|x||w| (a K-term f32 dot product's bound)
        bound = k * 2.0 ** -24 * (np.abs(xa) @ np.abs(w64).T)
        assert got.shape == (m, n) and np.all(np.abs(got - want) <= bound)
    assert len(model.graph._compiled_graphs) == 2  # compile_graph: one per input-shape signature
    assert y.id in model.run({x: xa})

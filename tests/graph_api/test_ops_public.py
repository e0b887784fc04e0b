"""Every op case run through the public API as a single-op graph.

Graph -> add_op -> finalize -> get_partitions -> compile -> execute, with the
case's fpmath set on the graph, compared with the case's independent formula
(the same records the reference-kernel tests use, ``tests/cases``).
"""
import numpy as np
import pytest

import graph_api as ga
from graph_api import dtypes
from graph_api.dtypes import DataType
from tests.cases.op_cases import OP_CASES
from tests.kernels.test_reference import assert_matches

RUNNABLE = [c for c in OP_CASES if c.kind not in (ga.OpKind.End, ga.OpKind.Wildcard)]


def make_tensor(lt, value, engine):
    if lt.property == ga.PropertyType.host_scalar:
        return ga.make_scalar_tensor(lt, value)
    return ga.Tensor(lt, engine, value)


@pytest.mark.parametrize("case", RUNNABLE, ids=lambda c: c.name)
def test_op_case_through_public_api(case):
    graph = ga.Graph(ga.EngineKind.cpu, case.fpmath)
    graph.add_op(case.make_op())
    graph.finalize()
    parts = graph.get_partitions()
    # a Composite op with a fast kernel is one partition of kind "composite"
    single = "composite" if case.kind == ga.OpKind.Composite else "single op"
    assert len(parts) == 1 and parts[0].is_supported() and parts[0].get_kind() == single
    part = parts[0]
    engine, stream = ga.Engine(), None
    stream = ga.Stream(engine)
    in_lts, out_lts = case.input_lts(), case.output_lts()
    compiled = part.compile(in_lts, [ga.LogicalTensor(lt.id, lt.dtype) for lt in out_lts], engine)
    for lt in out_lts:  # shapes inferred at compile equal the case's
        assert compiled.query_logical_tensor(lt.id).shape == lt.shape
    inputs = case.make_inputs()
    before = [x.copy() for x in inputs]
    in_tensors = [make_tensor(lt, x, engine) for lt, x in zip(in_lts, inputs)]
    out_tensors = [ga.Tensor(lt, engine) for lt in out_lts]
    compiled.execute(stream, in_tensors, out_tensors)
    expected = case.expected(inputs, dict(case.attrs))
    for i, (t, spec, want) in enumerate(zip(out_tensors, case.outputs, expected)):
        got = t.numpy()
        assert got.dtype == dtypes.numpy_dtype(DataType[spec.dtype])
        assert_matches(got, np.reshape(want, spec.shape), case.tolerance(i), f"{case.name} output {i}")
    for x, y in zip(inputs, before):
        assert x.tobytes() == y.tobytes(), "an input was modified"


def test_end_alone_is_an_unsupported_partition():
    graph = ga.Graph()
    graph.add_op(ga.Op(0, ga.OpKind.End, [ga.LogicalTensor(0, DataType.f32, [2])], []))
    graph.finalize()
    (part,) = graph.get_partitions()
    assert not part.is_supported()

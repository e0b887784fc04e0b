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

"""QDQ int8 models from ONNX Runtime's static quantizer through the ONNX front door.

The f32 models (``graph_api.frontend.onnx_models``: Gemm layers, MatMul + bias + residual on
3-D tokens, a CNN with a residual block, depthwise and strided Convs) are written with
``onnx.helper`` as ``torch.onnx.export`` writes them (opset 17), random-initialised, then
quantized by ``onnxruntime.quantization.quantize_static`` (QDQ format, s8 weights per tensor
or per channel, u8 or s8 activations, MinMax calibration over 4 random batches).

Tolerance.  Both runtimes dequantize the same integers with the same scales and accumulate
the int8 products exactly (int32); they differ only in how a requantization is rounded:
graph_api computes ``acc * (s_x * s_w)`` (+ bias) then divides by ``s_y`` and rounds half to
even, ONNX Runtime's QLinear kernels multiply by one precomputed f32 ``s_x s_w / s_y``.  The
two f32 values can land on opposite sides of a .5 rounding boundary when the exact value is
within a few ulps of it, so **one requantization on the same integer input** may differ by
one unit there.  :func:`_assert_each_layer_within_one_unit` checks exactly that: each
MatMul/Gemm/Conv cut out of the file (``onnx.utils.Extractor``: its input's integers ->
DequantizeLinear -> op -> QuantizeLinear) runs on ONNX Runtime's own integer input, and its
integer output is within one unit of ONNX Runtime's, in at most 1% of the elements.

End to end, a flipped unit travels: the next layer's exact value moves by
``sum |w| s_in / s_out`` of its steps, which can exceed one (a 64x64 CNN at batch 8 shows up
to 3 units at the 7th requantization, in 0.2% of the elements).  The end-to-end check
(:func:`_assert_matches_ort`) holds each tensor to one unit per requantization on its way
(its depth), an envelope rather than a proof, and the final f32 ``y`` to as many steps of
its scale.  With the small shapes and seeds here every integer agrees.
"""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime.quantization")

from onnx import numpy_helper  # noqa: E402

import graph_api as ga  # noqa: E402
from graph_api.frontend import onnx_models as om  # noqa: E402

QUANTIZED_KINDS = {ga.OpKind.MatMul: "matmul_quantized", ga.OpKind.Convolution: "conv_quantized"}


def _partitions(imported):
    return [p for seg in imported.segments for p in seg.graph.get_partitions(imported.policy)]


def _assert_compute_is_int8(imported, expected_matmuls: int, expected_convs: int):
    """Every MatMul / Convolution op sits in an int8 fused partition, on s8 weights."""
    found = {ga.OpKind.MatMul: 0, ga.OpKind.Convolution: 0}
    for part in _partitions(imported):
        for op in part.ops:
            if op.kind in QUANTIZED_KINDS:
                assert part.get_kind() == QUANTIZED_KINDS[op.kind], (op.kind, part.get_kind())
                found[op.kind] += 1
                wei = [o for o in part.ops if o.kind == ga.OpKind.Dequantize
                       and any(out.id == op.inputs[1].id for out in o.outputs)]
                assert wei and wei[0].inputs[0].dtype == ga.DataType.s8
    assert found == {ga.OpKind.MatMul: expected_matmuls, ga.OpKind.Convolution: expected_convs}


def _depths(qdq) -> dict:
    """QuantizeLinear output -> how many QuantizeLinears lie on its longest path from x."""
    producer = {o: n for n in qdq.graph.node for o in n.output}
    memo: dict = {}

    def depth(name):
        if name not in memo:
            node = producer.get(name)
            memo[name] = 0 if node is None else \
                max((depth(i) for i in node.input if i), default=0) + (node.op_type == "QuantizeLinear")
        return memo[name]
    return {n.output[0]: depth(n.output[0]) for n in qdq.graph.node if n.op_type == "QuantizeLinear"}


def _assert_matches_ort(qdq, x):
    """End to end: each requantized integer tensor within one unit per requantization on its
    way from x (see the module docstring), y within as many steps of its scale."""
    model = om.with_quantized_outputs(qdq)
    got = ga.import_onnx(model).run({"x": x})
    ref = om.ort_run(model, {"x": x})
    assert set(got) == set(ref)
    depths = _depths(qdq)
    for name, want in ref.items():
        if name == "y":
            continue
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        diff = np.abs(got[name].astype(np.int32) - want.astype(np.int32))
        assert diff.max() <= depths[name], (name, int(diff.max()), depths[name])
    deepest = max(depths.values())
    assert np.abs(got["y"] - ref["y"]).max() <= deepest * om.output_scale(qdq) * (1 + 1e-6)
    return got, ref


def _assert_each_layer_within_one_unit(qdq, x) -> int:
    """Each MatMul/Gemm/Conv whose output a QuantizeLinear reads, cut out of the file and run
    by both runtimes on ONNX Runtime's integer input: outputs within one unit, in at most 1% of
    the elements.  Returns the number of layers checked."""
    from onnx.utils import Extractor

    extractor = Extractor(onnx.shape_inference.infer_shapes(qdq))
    full = om.with_quantized_outputs(qdq)
    ints = om.ort_run(full, {"x": x})
    producer = {o: n for n in qdq.graph.node for o in n.output}
    readers: dict = {}
    for n in qdq.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    checked = 0
    for node in qdq.graph.node:
        if node.op_type not in ("MatMul", "Gemm", "Conv"):
            continue
        src_dq = producer[node.input[0]]
        quant = [r for r in readers.get(node.output[0], []) if r.op_type == "QuantizeLinear"]
        if src_dq.op_type != "DequantizeLinear" or len(quant) != 1:
            continue
        src, out = src_dq.input[0], quant[0].output[0]
        layer = extractor.extract_model([src], [out])
        layer.ir_version = om.IR_VERSION
        feed = {src: ints[src]} if src != "x" else {"x": x}
        want = om.ort_run(layer, feed)[out].astype(np.int32)
        got = ga.import_onnx(layer).run(feed)[out].astype(np.int32)
        diff = np.abs(got - want)
        assert diff.max() <= 1 and np.mean(diff > 0) <= 0.01, (node.name, int(diff.max()), float(np.mean(diff > 0)))
        checked += 1
    return checked


SETTINGS = [(False, "u8"), (True, "u8"), (True, "s8")]


@pytest.mark.parametrize("per_channel,activations", SETTINGS)
def test_static_quantized_gemm_layers_run_as_int8_matmuls(per_channel, activations):
    """Three Gemm(transB) layers with ReLUs: each Gemm -> one matmul_quantized partition (the
    quantizer drops the ReLUs into the u8 range or keeps them as post-ops); dynamic batch."""
    qdq = om.quantize_qdq(om.gemm_mlp(), (8, 64), per_channel=per_channel, activations=activations)
    imported = ga.import_onnx(qdq)
    assert not imported.host_steps
    _assert_compute_is_int8(imported, expected_matmuls=3, expected_convs=0)
    for batch in (8, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 64)).astype(np.float32)
        _assert_matches_ort(qdq, x)
    assert _assert_each_layer_within_one_unit(qdq, x) == 3


@pytest.mark.parametrize("per_channel,activations", SETTINGS)
def test_static_quantized_matmul_bias_residual_on_tokens(per_channel, activations):
    """MatMul + Add(bias) -> Relu -> MatMul + Add(bias) + residual on [batch, seq, 64]: the
    quantizer's one DequantizeLinear of x feeds the first MatMul and the residual Add; the
    importer gives each reader its own, so the first MatMul still fuses."""
    qdq = om.quantize_qdq(om.matmul_residual(), (2, 8, 64), per_channel=per_channel, activations=activations)
    imported = ga.import_onnx(qdq)
    _assert_compute_is_int8(imported, expected_matmuls=2, expected_convs=0)
    for shape in ((2, 8, 64), (1, 5, 64)):
        x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
        _assert_matches_ort(qdq, x)
    assert _assert_each_layer_within_one_unit(qdq, x) == 2


@pytest.mark.parametrize("per_channel,activations", SETTINGS)
def test_static_quantized_conv_net_runs_as_int8_convs(per_channel, activations):
    """Six Convs (3x3, a residual pair, strided, depthwise, 1x1) -> conv_quantized, the final
    Gemm -> matmul_quantized, MaxPool -> pool_quantized."""
    qdq = om.quantize_qdq(om.conv_net(), (2, 3, 16, 16), per_channel=per_channel, activations=activations)
    imported = ga.import_onnx(qdq)
    assert not imported.host_steps
    _assert_compute_is_int8(imported, expected_matmuls=1, expected_convs=6)
    assert "pool_quantized" in [p.get_kind() for p in _partitions(imported)]
    x = np.random.default_rng(3).standard_normal((2, 3, 16, 16)).astype(np.float32)
    _assert_matches_ort(qdq, x)
    assert _assert_each_layer_within_one_unit(qdq, x) == 7


def test_qdq_int32_bias_folds_and_weights_stay_int8():
    """The quantizer's int32 bias DequantizeLinear (opset 17: no reference-evaluator form) is
    folded at load to f32 ((q - 0) * s_x s_w, exact in int32, one f32 product); the weights'
    DequantizeLinear stays a Dequantize of s8 constants, one per Gemm."""
    qdq = om.quantize_qdq(om.gemm_mlp(), (8, 64), per_channel=True)
    assert any(n.op_type == "DequantizeLinear" and "bias" in n.input[0] for n in qdq.graph.node)
    graph = ga.from_onnx(qdq)
    assert isinstance(graph, ga.Graph)
    dequant = [op for op in graph.ops.values() if op.kind == ga.OpKind.Dequantize
               and op.inputs[0].id in graph.constants]
    assert len(dequant) == 3 and all(op.inputs[0].dtype == ga.DataType.s8 for op in dequant)
    assert all(op.attrs["qtype"] == "per_channel" for op in dequant)
    bias = [graph.constants[op.inputs[2].id] for op in graph.ops.values()
            if op.kind == ga.OpKind.MatMul and len(op.inputs) > 2]
    assert len(bias) == 3 and all(b.numpy().dtype == np.float32 for b in bias)


def test_a_weight_dequantize_after_a_host_step_stays_in_its_reader_segment():
    """A weight DequantizeLinear sits at the top of the file (where the quantizer writes it)
    but its MatMul comes after a host step (Erf): the Dequantize is made in the MatMul's
    segment, so the weights never cross a segment boundary as f32 and the MatMul still fuses."""
    from onnx import TensorProto as TP
    from onnx import helper

    rng = np.random.default_rng(4)
    wq = rng.integers(-127, 128, (16, 8)).astype(np.int8)
    inits = {"wq": wq, "ws": np.array(0.01, np.float32), "s": np.array(0.05, np.float32),
             "z": np.array(0, np.int8), "sy": np.array(0.1, np.float32)}
    nodes = [helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"], name="w_dq"),
             helper.make_node("Erf", ["x"], ["e"], name="erf"),
             helper.make_node("QuantizeLinear", ["e", "s", "z"], ["eq"], name="e_q"),
             helper.make_node("DequantizeLinear", ["eq", "s", "z"], ["ed"], name="e_dq"),
             helper.make_node("MatMul", ["ed", "w"], ["m"], name="mm"),
             helper.make_node("QuantizeLinear", ["m", "sy", "z"], ["mq"], name="m_q"),
             helper.make_node("DequantizeLinear", ["mq", "sy", "z"], ["y"], name="y_dq")]
    model = om.make_model(nodes, [("x", TP.FLOAT, [4, 16])], [("y", TP.FLOAT, [4, 8])], inits, opset=17)
    imported = ga.import_onnx(model)
    assert [type(s).__name__ for s in imported.stages] == ["HostStep", "Segment"]
    _assert_compute_is_int8(imported, expected_matmuls=1, expected_convs=0)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    got, ref = imported.run({"x": x})["y"], om.ort_run(model, {"x": x})["y"]
    assert np.abs(got - ref).max() <= 0.1 * (1 + 1e-6)  # one requantization: one output step


def test_a_per_channel_scale_of_the_wrong_length_names_the_node():
    qdq = om.quantize_qdq(om.gemm_mlp(), (8, 64), per_channel=True)
    for init in qdq.graph.initializer:
        if init.name == "fc1.weight_scale":
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init)[:-3], init.name))
    with pytest.raises(ga.GraphError, match='fc1.weight_DequantizeLinear'):
        ga.import_onnx(qdq)

"""QDQ int8 models from ONNX Runtime's static quantizer through the ONNX front door.

The f32 models (``graph_api.frontend.onnx_models``: Gemm layers, MatMul + bias + residual on
3-D tokens, a CNN with a residual block, depthwise and strided Convs) are written with
``onnx.helper`` as ``torch.onnx.export`` writes them (opset 17), random-initialised, then
quantized by ``onnxruntime.quantization.quantize_static`` (QDQ format, s8 weights per tensor
or per channel, u8 or s8 activations, MinMax calibration over 4 random batches).

Tolerance.  Both runtimes dequantize the same integers with the same scales and accumulate
the int8 products exactly (int32); they differ only in how the requantization is rounded:
graph_api computes ``acc * (s_x * s_w)`` (+ bias) then divides by ``s_y`` and rounds half to
even, ONNX Runtime's QLinear kernels multiply by one precomputed f32 ``s_x s_w / s_y``.  The
two f32 values can land on opposite sides of a .5 rounding boundary when the exact value is
within a few ulps of it, so a requantized integer may differ by one unit there.  The tests
compare the integer output of **every** QuantizeLinear (all exposed as model outputs, which
keeps every fusion: a Quantize output ends its pattern) and allow at most one unit and at
most 1% of the elements; the final f32 output then differs by at most one step of its
scale.  (With the seeds here every integer agrees; the bound is what the two rounding
orders allow, not what was observed.)
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


def _assert_matches_ort(qdq, x):
    """Every requantized integer tensor within one unit of ONNX Runtime's (see the module
    docstring), and y within one step of its scale."""
    model = om.with_quantized_outputs(qdq)
    got = ga.import_onnx(model).run({"x": x})
    ref = om.ort_run(model, {"x": x})
    assert set(got) == set(ref)
    differing = total = 0
    for name, want in ref.items():
        if name == "y":
            continue
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        diff = np.abs(got[name].astype(np.int32) - want.astype(np.int32))
        assert diff.max() <= 1, (name, int(diff.max()))
        differing, total = differing + int((diff > 0).sum()), total + diff.size
    assert differing <= 0.01 * total, (differing, total)
    y_scale = _output_scale(qdq)
    assert np.abs(got["y"] - ref["y"]).max() <= y_scale * (1 + 1e-6)
    return got, ref


def _output_scale(qdq) -> float:
    dq = next(n for n in qdq.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == "y")
    init = next(i for i in qdq.graph.initializer if i.name == dq.input[1])
    return float(numpy_helper.to_array(init).max())


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
    assert np.abs(got - ref).max() <= 0.1 * (1 + 1e-6)  # one output step (module docstring)


def test_a_per_channel_scale_of_the_wrong_length_names_the_node():
    qdq = om.quantize_qdq(om.gemm_mlp(), (8, 64), per_channel=True)
    for init in qdq.graph.initializer:
        if init.name == "fc1.weight_scale":
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init)[:-3], init.name))
    with pytest.raises(ga.GraphError, match='fc1.weight_DequantizeLinear'):
        ga.import_onnx(qdq)

"""oneDNN's own Graph API examples written with this API give oneDNN's partition
counts, and run.

* ``examples/graph/cpu_getting_started.cpp``: conv0 -> BiasAdd -> ReLU ->
  conv1 -> BiasAdd -> ReLU, logical tensors without shapes at partitioning,
  concrete input shapes at compile, output shapes queried: 2 partitions.
* ``examples/graph/cpu_inference_int8.cpp``: Dequantize(u8) and
  Dequantize(s8 constant weights, per channel) -> Convolution (bias input) ->
  ReLU -> Quantize(u8): 1 partition.
"""
import numpy as np

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api.check import compare

CONST = ga.PropertyType.constant


def _conv_attrs(strides, data_format, weights_format):
    return {"strides": strides, "pads_begin": [0, 0], "pads_end": [0, 0], "dilations": [1, 1],
            "groups": 1, "data_format": data_format, "weights_format": weights_format}


def _run_like_the_example(graph, concrete: dict, data: dict) -> dict:
    """The examples' loop: inputs get concrete shapes (or the producing partition's
    queried tensor), outputs unknown rank; compile, query, execute."""
    engine = ga.Engine(ga.EngineKind.cpu)
    stream = ga.Stream(engine)
    queried, tensors = {}, {}
    for part in graph.get_partitions():
        assert part.is_supported()
        inputs = [queried.get(lt.id) or ga.LogicalTensor(lt.id, lt.dtype, concrete[lt.id],
                                                         property=lt.property)
                  for lt in part.get_input_ports()]
        outputs = [ga.LogicalTensor(lt.id, lt.dtype, None) for lt in part.get_output_ports()]
        compiled = part.compile(inputs, outputs, engine)
        outs = []
        for lt in outputs:
            queried[lt.id] = compiled.query_logical_tensor(lt.id)
            outs.append(ga.Tensor(queried[lt.id], engine))
        ins = [tensors.get(lt.id) or ga.Tensor(lt, engine, data[lt.id]) for lt in inputs]
        compiled.execute(stream, ins, outs)
        tensors.update({t.get_logical_tensor().id: t for t in outs})
    return tensors


def getting_started_graph():
    lt = lambda i, d=dt.f32: ga.LogicalTensor(i, d)  # noqa: E731  (no shapes, as the example)
    g = ga.Graph(ga.EngineKind.cpu)
    g.add_op(ga.Op(0, K.Convolution, [lt(0), lt(1)], [lt(2)], "conv0", _conv_attrs([4, 4], "NCX", "OIX")))
    g.add_op(ga.Op(1, K.BiasAdd, [lt(2), lt(3)], [lt(4)], "conv0_bias_add", {"data_format": "NCX"}))
    g.add_op(ga.Op(2, K.ReLU, [lt(4)], [lt(5)], "relu0"))
    g.add_op(ga.Op(3, K.Convolution, [lt(5), lt(6)], [lt(7)], "conv1", _conv_attrs([1, 1], "NCX", "OIX")))
    g.add_op(ga.Op(4, K.BiasAdd, [lt(7), lt(8)], [lt(9)], "conv1_bias_add", {"data_format": "NCX"}))
    g.add_op(ga.Op(5, K.ReLU, [lt(9)], [lt(10)], "relu1"))
    g.finalize()
    return g


def test_cpu_getting_started_gives_two_partitions_and_runs():
    graph = getting_started_graph()
    parts = graph.get_partitions()
    assert [(p.get_kind(), sorted(p.get_ops())) for p in parts] == \
        [("conv_post_ops", [0, 1, 2]), ("conv_post_ops", [3, 4, 5])]
    # the example's shapes with a smaller batch and image (N=8, 225x225 in oneDNN)
    n, ic, hw, oc = 2, 3, 61, 96
    shapes = {0: [n, ic, hw, hw], 1: [oc, ic, 11, 11], 3: [oc], 6: [oc, oc, 1, 1], 8: [oc]}
    rng = np.random.default_rng(0)
    data = {i: rng.standard_normal(s).astype(np.float32) / (11 if i == 1 else 1) for i, s in shapes.items()}
    tensors = _run_like_the_example(graph, shapes, data)
    x = data[0].astype(np.float64)
    oh = (hw - 11) // 4 + 1
    y = np.zeros((n, oc, oh, oh))
    for i in range(11):
        for j in range(11):
            y += np.einsum("nchw,oc->nohw", x[:, :, i:i + 4 * (oh - 1) + 1:4, j:j + 4 * (oh - 1) + 1:4],
                           data[1][:, :, i, j].astype(np.float64))
    y = np.maximum(y + data[3].reshape(1, -1, 1, 1), 0)
    y = np.einsum("nchw,oc->nohw", y, data[6][:, :, 0, 0].astype(np.float64))
    want = np.maximum(y + data[8].reshape(1, -1, 1, 1), 0)
    # two f32 convolutions summed by BLAS (363 and 96 terms): the scale-aware f32 rule
    verdict = compare(want, tensors[10].numpy(), dt.f32)
    assert verdict.ok, verdict.message


def inference_int8_graph(weight_axis=1):
    """As the example: its weight Dequantize says axis 1 of an XIO [1, 1, 256, 64]
    tensor with 64 scales (meaning the output channels, which oneDNN's fused kernel
    takes them for); ``weight_axis=3`` names that axis, so the unfused reference
    Dequantize computes the same thing."""
    g = ga.Graph(ga.EngineKind.cpu)
    lt = ga.LogicalTensor
    g.add_op(ga.Op(2, K.Dequantize, [lt(0, dt.u8)], [lt(1, dt.f32)], "dequant0",
                   {"qtype": "per_tensor", "scales": [0.1], "zps": [10]}))
    g.add_op(ga.Op(5, K.Dequantize, [lt(3, dt.s8, property=CONST)], [lt(4, dt.f32, property=CONST)],
                   "dequant1", {"qtype": "per_channel", "scales": [0.1] * 64, "zps": [0] * 64,
                                "axis": weight_axis}))
    g.add_op(ga.Op(8, K.Convolution, [lt(1, dt.f32), lt(4, dt.f32, property=CONST),
                                      lt(6, dt.f32, property=CONST)], [lt(7, dt.f32)], "conv",
                   _conv_attrs([1, 1], "NXC", "XIO")))
    g.add_op(ga.Op(10, K.ReLU, [lt(7, dt.f32)], [lt(9, dt.f32)], "relu"))
    g.add_op(ga.Op(12, K.Quantize, [lt(9, dt.f32)], [lt(11, dt.u8)], "quant",
                   {"qtype": "per_tensor", "scales": [0.1], "zps": [10]}))
    g.finalize()
    return g


def test_cpu_inference_int8_gives_one_partition():
    parts = inference_int8_graph().get_partitions()
    assert [(p.get_kind(), sorted(p.get_ops())) for p in parts] == [("conv_quantized", [2, 5, 8, 10, 12])]


def test_cpu_inference_int8_runs_on_exact_integer_accumulation():
    graph = inference_int8_graph(weight_axis=3)
    assert len(graph.get_partitions()) == 1
    n, hw, ic, oc = 2, 14, 256, 64  # the example has N=8, 56x56
    shapes = {0: [n, hw, hw, ic], 3: [1, 1, ic, oc], 6: [oc]}
    rng = np.random.default_rng(1)
    data = {0: rng.integers(0, 256, shapes[0]).astype(np.uint8),
            3: rng.integers(-128, 128, shapes[3]).astype(np.int8),
            6: rng.standard_normal(oc).astype(np.float32)}
    tensors = _run_like_the_example(graph, shapes, data)
    acc = (data[0].astype(np.int64) - 10).reshape(-1, ic) @ data[3].astype(np.int64).reshape(ic, oc)
    y = np.maximum(acc * (np.float32(0.1) * np.float64(np.float32(0.1))) + data[6], 0)
    want = np.clip(np.rint(y / np.float32(0.1) + 10), 0, 255).reshape(n, hw, hw, oc)
    got = tensors[11].numpy().astype(np.int64)
    # the exact integer sum is scaled once; the only freedom is the final rounding,
    # off by one where the value lands within f32 rounding of a .5 boundary
    assert np.abs(got - want).max() <= 1
    assert (got == want).mean() > 0.999


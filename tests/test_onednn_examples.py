"""oneDNN's own Graph API examples written with this API give oneDNN's partition
counts, and run.

* ``examples/graph/cpu_getting_started.cpp``: conv0 -> BiasAdd -> ReLU ->
  conv1 -> BiasAdd -> ReLU, logical tensors without shapes at partitioning,
  concrete input shapes at compile, output shapes queried: 2 partitions.
* ``examples/graph/cpu_inference_int8.cpp``: Dequantize(u8) and
  Dequantize(s8 constant weights, per channel) -> Convolution (bias input) ->
  ReLU -> Quantize(u8): 1 partition.
* ``examples/graph/cpu_single_op_partition.cpp``: ``partition(op, engine_kind)`` of a
  MatMul, output rank unknown at compile, queried after.
* ``examples/graph/sdpa.cpp``, ``gqa.cpp``, ``mqa.cpp``, ``sdpa_stacked_qkv.cpp``,
  ``sdpa_bottom_right_causal_mask.cpp``: the attention graphs
  (MatMul -> Divide -> Add(mask) -> SoftMax -> MatMul; 5-D GQA with a host-scalar
  scale; MQA with single-head K/V), written line by line after the C++
  (``bench_sdpa``/``bench_gqa``/``bench_mqa``, with an engine made by
  ``make_engine_with_allocator``) at reduced shapes, in f32 and bf16: 1 partition,
  checked against a float64 formula (f32) or the unfused reference (bf16).
* ``examples/graph/gated_mlp.cpp``, ``gated_mlp_wei_combined.cpp`` (weights as strided
  halves of one buffer), ``gated_mlp_int4.cpp`` (u4 per-group DynamicDequantize
  weights): f32, bf16, f16, 1 gated-MLP partition.
* ``examples/graph/sdpa_quantized.cpp``: f8_e4m3, f8_e5m2, s8, u8 Q/K/V/output with
  quantized probabilities: 1 partition, against float64 with both quantizations.
* ``examples/graph/gqa_training.cpp``: forward with SoftMax stats, then the backward
  graph: 1 partition each, outputs, stats and dQ/dK/dV against float64 (f32).

These are all the CPU examples of oneDNN's main branch (the others there,
``gpu_opencl_*`` and ``sycl_*``, need a GPU or SYCL runtime). Examples found only on
oneDNN development branches follow, each marked with its branch and commit:
``int8_sdpa.cpp`` and ``fp8_sdpa.cpp`` (scalar ``scales``/``zps`` attributes),
``matmul_sel.cpp``, ``multiple_binary_ops.cpp``, ``grouped_matmul.cpp`` (one
``grouped_matmul`` partition), ``sdpa_dynamic_quantized.cpp`` (the quantization ``mask``
and f8 dynamic quantization); ``sdpa_training.cpp`` is a strict xfail naming what is missing.
"""
import itertools
import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api import OpKind as K_  # where the example names a dimension K
from graph_api.check import compare
from graph_api.fill import reference_arrays

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



# ---------------------------------------------------------------- sdpa.cpp, gqa.cpp, mqa.cpp
# The examples' helpers (graph_example_utils.hpp and the top of each example).
layout_type = ga.LayoutType
property_type = ga.PropertyType
logical_tensor = ga.LogicalTensor
op = ga.Op
tensor = ga.Tensor


def create_allocator(ekind):
    """The CPU branch of graph_example_utils.hpp: the default allocator."""
    return ga.Allocator()


def product(dims) -> int:
    return math.prod(dims)


def fill_random(out: np.ndarray) -> None:
    """1037 uniform values in [-1, 1), repeated (the examples' fill_random)."""
    random_data_f = np.random.default_rng(0).uniform(-1.0, 1.0, 1037).astype(np.float32)
    out[:] = np.resize(random_data_f, out.size)


def fill_mask(mask: np.ndarray, seq_len: int) -> None:
    """The first 3/4 of every row 0, the rest -inf."""
    pos = seq_len * 3 // 4
    mask[:] = np.where(np.arange(mask.size) % seq_len < pos, 0.0, -np.inf)


def write_to_dnnl_tensor(data: np.ndarray, ts) -> None:
    """Copy host data into the tensor (converted to its data type)."""
    ts.write(data.reshape(ts.get_logical_tensor().get_dims()))


@dataclass
class SdpaDims:
    mb: int
    seq_len: int
    head_num: int
    head_size: int
    query_num: int


def bench_sdpa(ekind, dt_, p: SdpaDims):
    """``bench_sdpa`` of sdpa.cpp; returns the partitions, the user data and the output."""
    alloc = create_allocator(ekind)
    eng = ga.make_engine_with_allocator(ekind, 0, alloc)
    strm = ga.Stream(eng)
    qv_sz = [p.mb, p.head_num, p.query_num, p.head_size]
    k_sz = [p.mb, p.head_num, p.seq_len, p.head_size]
    score_sz = [p.mb, p.head_num, p.query_num, p.seq_len]
    scale_sz = [1]
    mask_sz = [p.mb, 1, p.query_num, p.seq_len]
    id_ = itertools.count()
    dt_inter = dt.f32

    query = logical_tensor(next(id_), dt_, qv_sz, layout_type.strided)
    key = logical_tensor(next(id_), dt_, k_sz, layout_type.strided)
    score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    bmm1 = op(next(id_), K.MatMul, "bmm1")
    bmm1.set_attr(ga.OpAttr.transpose_b, True)
    bmm1.add_inputs([query, key])
    bmm1.add_outputs([score])

    scale = logical_tensor(next(id_), dt_, scale_sz, layout_type.strided)
    scaled_score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    scale_div = op(next(id_), K.Divide, "scale_div")
    scale_div.add_inputs([score, scale])
    scale_div.add_outputs([scaled_score])

    mask = logical_tensor(next(id_), dt_, mask_sz, layout_type.strided)
    masked_score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    mask_add = op(next(id_), K.Add, "mask_add")
    mask_add.add_inputs([scaled_score, mask])
    mask_add.add_outputs([masked_score])

    probs = logical_tensor(next(id_), dt_, score_sz, layout_type.strided)
    softmax = op(next(id_), K.SoftMax, "softmax")
    softmax.set_attr(ga.OpAttr.axis, -1)
    softmax.set_attr(ga.OpAttr.mode, "inf_as_zero")
    softmax.add_inputs([masked_score])
    softmax.add_outputs([probs])

    value = logical_tensor(next(id_), dt_, k_sz, layout_type.strided)
    output = logical_tensor(next(id_), dt_, qv_sz, layout_type.strided)
    bmm2 = op(next(id_), K.MatMul, "bmm2")
    bmm2.add_inputs([probs, value])
    bmm2.add_outputs([output])

    sdpa = ga.Graph(ekind)
    sdpa.add_op(bmm1)
    sdpa.add_op(scale_div)
    sdpa.add_op(mask_add)
    sdpa.add_op(softmax)
    sdpa.add_op(bmm2)
    sdpa.finalize()

    partitions = sdpa.get_partitions()
    if len(partitions) != 1:
        return partitions, None, None
    cp = partitions[0].compile([query, key, scale, mask, value], [output], eng)

    ts_query, ts_key, ts_scale = tensor(query, eng), tensor(key, eng), tensor(scale, eng)
    ts_mask, ts_value, ts_output = tensor(mask, eng), tensor(value, eng), tensor(output, eng)

    query_data = np.empty(product(qv_sz), np.float32)
    key_data = np.empty(product(k_sz), np.float32)
    scale_data = np.full(product(scale_sz), math.sqrt(p.head_size), np.float32)
    mask_data = np.empty(product(mask_sz), np.float32)
    value_data = np.empty(product(k_sz), np.float32)

    fill_random(query_data)
    fill_random(key_data)
    fill_random(value_data)
    fill_mask(mask_data, p.seq_len)

    write_to_dnnl_tensor(query_data, ts_query)
    write_to_dnnl_tensor(key_data, ts_key)
    write_to_dnnl_tensor(scale_data, ts_scale)
    write_to_dnnl_tensor(mask_data, ts_mask)
    write_to_dnnl_tensor(value_data, ts_value)

    cp.execute(strm, [ts_query, ts_key, ts_scale, ts_mask, ts_value], [ts_output])
    strm.wait()
    cp.execute(strm, [ts_query, ts_key, ts_scale, ts_mask, ts_value], [ts_output])
    strm.wait()
    inputs = [ts_query, ts_key, ts_scale, ts_mask, ts_value]
    return partitions, {t.get_logical_tensor().id: t.numpy() for t in inputs}, ts_output


@dataclass
class GqaDims:
    mb: int
    seq_len: int
    q_head_num: int
    kv_head_num: int
    head_size: int


def bench_gqa(ekind, dt_, p: GqaDims):
    """``bench_gqa`` of gqa.cpp (5-D, a host-scalar scale)."""
    alloc = create_allocator(ekind)
    eng = ga.make_engine_with_allocator(ekind, 0, alloc)
    strm = ga.Stream(eng)
    dt_inter = dt.f32
    head_rep = p.q_head_num // p.kv_head_num
    q_sz = [p.mb, p.kv_head_num, head_rep, p.seq_len, p.head_size]
    kv_sz = [p.mb, p.kv_head_num, 1, p.seq_len, p.head_size]
    score_sz = [p.mb, p.kv_head_num, head_rep, p.seq_len, p.seq_len]
    mask_sz = [p.mb, 1, 1, 1, p.seq_len]
    id_ = itertools.count()

    query = logical_tensor(next(id_), dt_, q_sz, layout_type.strided)
    key = logical_tensor(next(id_), dt_, kv_sz, layout_type.strided)
    score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    bmm1 = op(next(id_), K.MatMul, "bmm1")
    bmm1.set_attr(ga.OpAttr.transpose_b, True)
    bmm1.add_inputs([query, key])
    bmm1.add_outputs([score])

    dt_scale = dt.f32
    scale = logical_tensor(next(id_), dt_scale, 0, layout_type.strided, property_type.host_scalar)
    scaled_score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    scale_div = op(next(id_), K.Divide, "scale_div")
    scale_div.add_inputs([score, scale])
    scale_div.add_outputs([scaled_score])

    mask = logical_tensor(next(id_), dt_, mask_sz, layout_type.strided)
    masked_score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    mask_add = op(next(id_), K.Add, "mask_add")
    mask_add.add_inputs([scaled_score, mask])
    mask_add.add_outputs([masked_score])

    probs = logical_tensor(next(id_), dt_, score_sz, layout_type.strided)
    softmax = op(next(id_), K.SoftMax, "softmax")
    softmax.set_attr(ga.OpAttr.axis, -1)
    softmax.set_attr(ga.OpAttr.mode, "inf_as_zero")
    softmax.add_inputs([masked_score])
    softmax.add_outputs([probs])

    value = logical_tensor(next(id_), dt_, kv_sz, layout_type.strided)
    output = logical_tensor(next(id_), dt_, q_sz, layout_type.strided)
    bmm2 = op(next(id_), K.MatMul, "bmm2")
    bmm2.add_inputs([probs, value])
    bmm2.add_outputs([output])

    gqa = ga.Graph(ekind)
    gqa.add_op(bmm1)
    gqa.add_op(scale_div)
    gqa.add_op(mask_add)
    gqa.add_op(softmax)
    gqa.add_op(bmm2)
    gqa.finalize()

    partitions = gqa.get_partitions()
    if len(partitions) != 1:
        return partitions, None, None
    cp = partitions[0].compile([query, key, scale, mask, value], [output], eng)

    query_data = np.empty(product(q_sz), np.float32)
    key_data = np.empty(product(kv_sz), np.float32)
    mask_data = np.empty(product(mask_sz), np.float32)
    value_data = np.empty(product(kv_sz), np.float32)
    fill_random(query_data)
    fill_random(key_data)
    fill_random(value_data)
    fill_mask(mask_data, p.seq_len)

    ts_query, ts_key, ts_mask = tensor(query, eng), tensor(key, eng), tensor(mask, eng)
    ts_value, ts_output = tensor(value, eng), tensor(output, eng)
    scale_data = np.float32(math.sqrt(p.head_size))
    ts_scale = tensor.make_scalar_tensor(scale, scale_data)

    write_to_dnnl_tensor(query_data, ts_query)
    write_to_dnnl_tensor(key_data, ts_key)
    write_to_dnnl_tensor(mask_data, ts_mask)
    write_to_dnnl_tensor(value_data, ts_value)

    cp.execute(strm, [ts_query, ts_key, ts_scale, ts_mask, ts_value], [ts_output])
    strm.wait()
    inputs = [ts_query, ts_key, ts_scale, ts_mask, ts_value]
    return partitions, {t.get_logical_tensor().id: t.numpy() for t in inputs}, ts_output


@dataclass
class MqaDims:
    mb: int
    seq_len: int
    q_head_num: int
    head_size: int


def bench_mqa(ekind, dt_, p: MqaDims):
    """``bench_mqa`` of mqa.cpp (K and V with one head; every tensor of type ``dt``)."""
    alloc = create_allocator(ekind)
    eng = ga.make_engine_with_allocator(ekind, 0, alloc)
    strm = ga.Stream(eng)
    q_sz = [p.mb, p.q_head_num, p.seq_len, p.head_size]
    kv_sz = [p.mb, 1, p.seq_len, p.head_size]
    score_sz = [p.mb, p.q_head_num, p.seq_len, p.seq_len]
    scale_sz = [1]
    mask_sz = [p.mb, 1, 1, p.seq_len]
    id_ = itertools.count()

    query = logical_tensor(next(id_), dt_, q_sz, layout_type.strided)
    key = logical_tensor(next(id_), dt_, kv_sz, layout_type.strided)
    score = logical_tensor(next(id_), dt_, score_sz, layout_type.strided)
    bmm1 = op(next(id_), K.MatMul, "bmm1")
    bmm1.set_attr(ga.OpAttr.transpose_b, True)
    bmm1.add_inputs([query, key])
    bmm1.add_outputs([score])

    scale = logical_tensor(next(id_), dt_, scale_sz, layout_type.strided)
    scaled_score = logical_tensor(next(id_), dt_, score_sz, layout_type.strided)
    scale_div = op(next(id_), K.Divide, "scale_div")
    scale_div.add_inputs([score, scale])
    scale_div.add_outputs([scaled_score])

    mask = logical_tensor(next(id_), dt_, mask_sz, layout_type.strided)
    masked_score = logical_tensor(next(id_), dt_, score_sz, layout_type.strided)
    mask_add = op(next(id_), K.Add, "mask_add")
    mask_add.add_inputs([scaled_score, mask])
    mask_add.add_outputs([masked_score])

    probs = logical_tensor(next(id_), dt_, score_sz, layout_type.strided)
    softmax = op(next(id_), K.SoftMax, "softmax")
    softmax.set_attr(ga.OpAttr.axis, -1)
    softmax.add_inputs([masked_score])
    softmax.add_outputs([probs])

    value = logical_tensor(next(id_), dt_, kv_sz, layout_type.strided)
    output = logical_tensor(next(id_), dt_, q_sz, layout_type.strided)
    bmm2 = op(next(id_), K.MatMul, "bmm2")
    bmm2.add_inputs([probs, value])
    bmm2.add_outputs([output])

    mqa = ga.Graph(ekind)
    mqa.add_op(bmm1)
    mqa.add_op(scale_div)
    mqa.add_op(mask_add)
    mqa.add_op(softmax)
    mqa.add_op(bmm2)
    mqa.finalize()

    partitions = mqa.get_partitions()
    if len(partitions) != 1:
        return partitions, None, None
    cp = partitions[0].compile([query, key, scale, mask, value], [output], eng)

    ts_query, ts_key, ts_scale = tensor(query, eng), tensor(key, eng), tensor(scale, eng)
    ts_mask, ts_value, ts_output = tensor(mask, eng), tensor(value, eng), tensor(output, eng)

    query_data = np.empty(product(q_sz), np.float32)
    key_data = np.empty(product(kv_sz), np.float32)
    scale_data = np.full(product(scale_sz), math.sqrt(p.head_size), np.float32)
    mask_data = np.empty(product(mask_sz), np.float32)
    value_data = np.empty(product(kv_sz), np.float32)
    fill_random(query_data)
    fill_random(key_data)
    fill_random(value_data)
    fill_mask(mask_data, p.seq_len)

    write_to_dnnl_tensor(query_data, ts_query)
    write_to_dnnl_tensor(key_data, ts_key)
    write_to_dnnl_tensor(scale_data, ts_scale)
    write_to_dnnl_tensor(mask_data, ts_mask)
    write_to_dnnl_tensor(value_data, ts_value)

    cp.execute(strm, [ts_query, ts_key, ts_scale, ts_mask, ts_value], [ts_output])
    strm.wait()
    inputs = [ts_query, ts_key, ts_scale, ts_mask, ts_value]
    return partitions, {t.get_logical_tensor().id: t.numpy() for t in inputs}, ts_output


def _attention_f64(q, k, v, scale, mask):
    """softmax(q k^T / scale + mask) v in float64 (K/V heads broadcast over Q's)."""
    q, k, v, mask = (np.asarray(a, np.float64) for a in (q, k, v, mask))
    s = q @ np.swapaxes(k, -1, -2) / float(np.asarray(scale).reshape(-1)[0]) + mask
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def _check(partitions, data, out, dt_):
    assert len(partitions) == 1 and partitions[0].get_kind().startswith("sdpa"), partitions
    q, k, scale, mask, v = (data[i] for i in sorted(data))
    if dt_ == dt.f32:
        # f32 dot products of D = 16 and S = 16..32 terms of O(1) values, an f32 exp and
        # softmax: a few f32 ulps of the O(1) outputs; 1e-5 leaves ~100x room and is far
        # below any real error (a wrong mask or scale changes outputs by ~1e-1)
        np.testing.assert_allclose(out.numpy(), _attention_f64(q, k, v, scale, mask), rtol=1e-5, atol=1e-5)
        return
    # bf16: the unfused reference rounds where the graph's types say; the rule of graph_api.check
    graph = partitions[0].graph
    want = reference_arrays(graph, data)[graph.output_ids[0]]
    verdict = compare(want, out.numpy(), dt_, graph.fpmath, partitions[0].ops)
    assert verdict.ok, verdict.message


@pytest.mark.parametrize("dt_", [dt.f32, dt.bf16], ids=lambda d: d.name)
def test_sdpa_example(dt_):
    # sdpa.cpp's defaults are {mb 1? seq 384, 16 heads, head 64, queries 384}: reduced
    _check(*bench_sdpa(ga.EngineKind.cpu, dt_, SdpaDims(1, 32, 2, 16, 32)), dt_)


@pytest.mark.parametrize("dt_", [dt.f32, dt.bf16], ids=lambda d: d.name)
def test_gqa_example(dt_):
    # gqa.cpp's defaults are {2, 128, 16, 2, 64}: reduced
    _check(*bench_gqa(ga.EngineKind.cpu, dt_, GqaDims(2, 16, 4, 2, 16)), dt_)


@pytest.mark.parametrize("dt_", [dt.f32, dt.bf16], ids=lambda d: d.name)
def test_mqa_example(dt_):
    # mqa.cpp's defaults are {2, 128, 16, 64}: reduced
    _check(*bench_mqa(ga.EngineKind.cpu, dt_, MqaDims(2, 16, 4, 16)), dt_)


def bench_sdpa_stacked_qkv(ekind, dt_, p: MqaDims):
    """``bench_sdpa`` of sdpa_stacked_qkv.cpp: Q, K and V are strided views of one
    [mb, seq_len, head_num, 3, head_size] buffer, made with tensor(lt, eng, handle + offset)."""
    alloc = create_allocator(ekind)
    eng = ga.make_engine_with_allocator(ekind, 0, alloc)
    strm = ga.Stream(eng)
    head_num = p.q_head_num
    stacked_qkv_sz = [p.mb, p.seq_len, head_num, 3, p.head_size]
    qkv_strides = [p.seq_len * head_num * 3 * p.head_size, 3 * p.head_size, head_num * 3 * p.head_size, 1]
    qkv_sz = [p.mb, head_num, p.seq_len, p.head_size]
    score_sz = [p.mb, head_num, p.seq_len, p.seq_len]
    scale_sz = [1]
    mask_sz = [p.mb, 1, 1, p.seq_len]
    id_ = itertools.count()
    dt_inter = dt.f32

    qkv = logical_tensor(next(id_), dt_, stacked_qkv_sz, layout_type.strided)

    query = logical_tensor(next(id_), dt_, qkv_sz, qkv_strides)
    key = logical_tensor(next(id_), dt_, qkv_sz, qkv_strides)
    score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    bmm1 = op(next(id_), K.MatMul, "bmm1")
    bmm1.set_attr(ga.OpAttr.transpose_b, True)
    bmm1.add_inputs([query, key])
    bmm1.add_outputs([score])

    scale = logical_tensor(next(id_), dt_, scale_sz, layout_type.strided)
    scaled_score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    scale_div = op(next(id_), K.Divide, "scale_div")
    scale_div.add_inputs([score, scale])
    scale_div.add_outputs([scaled_score])

    mask = logical_tensor(next(id_), dt_, mask_sz, layout_type.strided)
    masked_score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    mask_add = op(next(id_), K.Add, "mask_add")
    mask_add.add_inputs([scaled_score, mask])
    mask_add.add_outputs([masked_score])

    probs = logical_tensor(next(id_), dt_, score_sz, layout_type.strided)
    softmax = op(next(id_), K.SoftMax, "softmax")
    softmax.set_attr(ga.OpAttr.axis, -1)
    softmax.set_attr(ga.OpAttr.mode, "inf_as_zero")
    softmax.add_inputs([masked_score])
    softmax.add_outputs([probs])

    value = logical_tensor(next(id_), dt_, qkv_sz, qkv_strides)
    output = logical_tensor(next(id_), dt_, qkv_sz, layout_type.strided)
    bmm2 = op(next(id_), K.MatMul, "bmm2")
    bmm2.add_inputs([probs, value])
    bmm2.add_outputs([output])

    sdpa = ga.Graph(ekind)
    sdpa.add_op(bmm1)
    sdpa.add_op(scale_div)
    sdpa.add_op(mask_add)
    sdpa.add_op(softmax)
    sdpa.add_op(bmm2)
    sdpa.finalize()

    partitions = sdpa.get_partitions()
    if len(partitions) != 1:
        return partitions, None, None
    cp = partitions[0].compile([query, key, scale, mask, value], [output], eng)

    ts_qkv, ts_scale = tensor(qkv, eng), tensor(scale, eng)
    ts_mask, ts_output = tensor(mask, eng), tensor(output, eng)

    qkv_data = np.empty(product(stacked_qkv_sz), np.float32)
    scale_data = np.full(product(scale_sz), math.sqrt(p.head_size), np.float32)
    mask_data = np.empty(product(mask_sz), np.float32)
    fill_random(qkv_data)
    fill_mask(mask_data, p.seq_len)

    write_to_dnnl_tensor(qkv_data, ts_qkv)
    write_to_dnnl_tensor(scale_data, ts_scale)
    write_to_dnnl_tensor(mask_data, ts_mask)

    # handle + k * sizeof(dt) in C++ is the element offset k here
    handle = ts_qkv.get_data_handle()
    ts_query = tensor(query, eng, handle)
    ts_key = tensor(key, eng, handle, offset=p.head_size)
    ts_value = tensor(value, eng, handle, offset=2 * p.head_size)

    cp.execute(strm, [ts_query, ts_key, ts_scale, ts_mask, ts_value], [ts_output])
    strm.wait()
    stacked = ts_qkv.numpy()  # [mb, seq, heads, 3, D] -> the three [mb, heads, seq, D] views
    assert np.shares_memory(ts_key.get_data_handle(), handle)  # zero copy, as the handle arithmetic
    data = {query.id: stacked[:, :, :, 0].transpose(0, 2, 1, 3), key.id: stacked[:, :, :, 1].transpose(0, 2, 1, 3),
            scale.id: ts_scale.numpy(), mask.id: ts_mask.numpy(),
            value.id: stacked[:, :, :, 2].transpose(0, 2, 1, 3)}
    return partitions, data, ts_output


@pytest.mark.parametrize("dt_", [dt.f32, dt.bf16], ids=lambda d: d.name)
def test_sdpa_stacked_qkv_example(dt_):
    # sdpa_stacked_qkv.cpp's defaults are {2, 128, 16, 64}: reduced
    _check(*bench_sdpa_stacked_qkv(ga.EngineKind.cpu, dt_, MqaDims(2, 16, 4, 16)), dt_)


# ---------------------------------------------------------------- cpu_single_op_partition.cpp
DNNL_GRAPH_UNKNOWN_NDIMS = -1


def allocate_graph_mem(tensors, lts, data_buffer, eng):
    """graph_example_utils.hpp: a tensor over a new buffer for each logical tensor."""
    for lt in lts:
        buffer = np.empty(lt.get_mem_size() // np.dtype(np.float32).itemsize, np.float32)
        data_buffer.append(buffer)
        tensors.append(tensor(lt, eng, buffer))


def test_cpu_single_op_partition_example():
    """``cpu_single_op_partition_tutorial``, the example's shapes; inputs get values
    before execute (the example runs on uninitialised memory) so the result is checked."""
    data_type = dt
    M, K, N = 32, 1024, 2048
    src0_dims = [M, K]
    src1_dims = [K, N]

    matmul_src0_desc = logical_tensor(0, data_type.f32)
    matmul_src1_desc = logical_tensor(1, data_type.f32)
    matmul_dst_desc = logical_tensor(2, data_type.f32)
    matmul = op(0, K_.MatMul, [matmul_src0_desc, matmul_src1_desc], [matmul_dst_desc], "matmul")
    matmul.set_attr(ga.OpAttr.transpose_a, False)
    matmul.set_attr(ga.OpAttr.transpose_b, False)

    alloc = ga.Allocator()
    eng = ga.make_engine_with_allocator(ga.EngineKind.cpu, 0, alloc)
    strm = ga.Stream(eng)
    data_buffer = []
    concrete_shapes = {0: src0_dims, 1: src1_dims}

    part = ga.Partition(matmul, ga.EngineKind.cpu)
    assert part.is_supported()
    inputs = part.get_input_ports()
    outputs = part.get_output_ports()
    for i, input_ in enumerate(inputs):
        id_ = input_.get_id()
        inputs[i] = logical_tensor(id_, input_.get_data_type(), concrete_shapes[id_], layout_type.strided)
    for i, output in enumerate(outputs):
        id_ = output.get_id()
        outputs[i] = logical_tensor(id_, output.get_data_type(), DNNL_GRAPH_UNKNOWN_NDIMS, layout_type.strided)

    cp = part.compile(inputs, outputs, eng)
    for i, output in enumerate(outputs):
        outputs[i] = cp.query_logical_tensor(output.get_id())

    inputs_ts, outputs_ts = [], []
    allocate_graph_mem(inputs_ts, inputs, data_buffer, eng)
    allocate_graph_mem(outputs_ts, outputs, data_buffer, eng)
    rng = np.random.default_rng(0)
    for t in inputs_ts:  # not in the example: values to check
        t.write(rng.integers(-4, 5, t.get_logical_tensor().get_dims()).astype(np.float32))

    cp.execute(strm, inputs_ts, outputs_ts)
    strm.wait()

    assert outputs[0].get_dims() == (M, N)
    a, b = (t.numpy().astype(np.float64) for t in inputs_ts)
    # small integers: every product and partial sum (|sum| <= 1024 * 16) is exact in f32
    np.testing.assert_array_equal(outputs_ts[0].numpy(), a @ b)


# ---------------------------------------------------------------- sdpa_bottom_right_causal_mask.cpp
def bench_sdpa_bottom_right_causal_mask(ekind, dt_, p: SdpaDims):
    """``bench_sdpa`` of sdpa_bottom_right_causal_mask.cpp: the causal mask made in
    the graph (GenIndex, Add/Subtract of host-scalar lengths, GreaterEqual, Select)."""
    data_type = dt
    alloc = create_allocator(ekind)
    eng = ga.make_engine_with_allocator(ekind, 0, alloc)
    strm = ga.Stream(eng)
    qv_sz = [p.mb, p.head_num, p.query_num, p.head_size]
    k_sz = [p.mb, p.head_num, p.seq_len, p.head_size]
    score_sz = [p.mb, p.head_num, p.query_num, p.seq_len]
    id_ = itertools.count()
    dt_inter = dt.f32

    query = logical_tensor(next(id_), dt_, qv_sz, layout_type.strided)
    key = logical_tensor(next(id_), dt_, k_sz, layout_type.strided)
    score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    bmm1 = op(next(id_), K.MatMul, "bmm1")
    bmm1.set_attr(ga.OpAttr.transpose_b, True)
    bmm1.add_inputs([query, key])
    bmm1.add_outputs([score])

    dt_scale = dt.f32
    scale = logical_tensor(next(id_), dt_scale, 0, layout_type.strided, property_type.host_scalar)
    scaled_score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    scale_mul = op(next(id_), K.Multiply, "scale_mul")
    scale_mul.add_inputs([score, scale])
    scale_mul.add_outputs([scaled_score])

    index_row = logical_tensor(next(id_), data_type.s32, score_sz, layout_type.strided)
    gen_index_row = op(next(id_), K.GenIndex, "gen_index_row")
    gen_index_row.set_attr(ga.OpAttr.axis, -2)
    gen_index_row.add_inputs([scaled_score])
    gen_index_row.add_outputs([index_row])

    seq_len_kv = logical_tensor(next(id_), data_type.s32, 0, layout_type.strided, property_type.host_scalar)
    mask_add_out = logical_tensor(next(id_), data_type.s32, score_sz, layout_type.strided)
    mask_add = op(next(id_), K.Add, "mask_add")
    mask_add.add_inputs([index_row, seq_len_kv])
    mask_add.add_outputs([mask_add_out])

    seq_len_q = logical_tensor(next(id_), data_type.s32, 0, layout_type.strided, property_type.host_scalar)
    mask_sub_out = logical_tensor(next(id_), data_type.s32, score_sz, layout_type.strided)
    mask_sub = op(next(id_), K.Subtract, "mask_sub")
    mask_sub.add_inputs([mask_add_out, seq_len_q])
    mask_sub.add_outputs([mask_sub_out])

    index_col = logical_tensor(next(id_), data_type.s32, score_sz, layout_type.strided)
    gen_index_col = op(next(id_), K.GenIndex, "gen_index_col")
    gen_index_col.set_attr(ga.OpAttr.axis, -1)
    gen_index_col.add_inputs([scaled_score])
    gen_index_col.add_outputs([index_col])

    mask_ge_out = logical_tensor(next(id_), data_type.boolean, score_sz, layout_type.strided)
    mask_ge = op(next(id_), K.GreaterEqual, "mask_ge")
    mask_ge.add_inputs([mask_sub_out, index_col])
    mask_ge.add_outputs([mask_ge_out])

    neg_inf = logical_tensor(next(id_), dt_scale, 0, layout_type.strided, property_type.host_scalar)
    masked_score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    mask_select = op(next(id_), K.Select, "mask_select")
    mask_select.add_inputs([mask_ge_out, scaled_score, neg_inf])
    mask_select.add_outputs([masked_score])

    probs = logical_tensor(next(id_), dt_, score_sz, layout_type.strided)
    softmax = op(next(id_), K.SoftMax, "softmax")
    softmax.set_attr(ga.OpAttr.axis, -1)
    softmax.set_attr(ga.OpAttr.mode, "inf_as_zero")
    softmax.add_inputs([masked_score])
    softmax.add_outputs([probs])

    value = logical_tensor(next(id_), dt_, k_sz, layout_type.strided)
    output = logical_tensor(next(id_), dt_, qv_sz, layout_type.strided)
    bmm2 = op(next(id_), K.MatMul, "bmm2")
    bmm2.add_inputs([probs, value])
    bmm2.add_outputs([output])

    sdpa = ga.Graph(ekind)
    for o in (bmm1, scale_mul, gen_index_row, mask_add, mask_sub, gen_index_col, mask_ge, mask_select,
              softmax, bmm2):
        sdpa.add_op(o)
    sdpa.finalize()

    partitions = sdpa.get_partitions()
    if len(partitions) != 1:
        return partitions, None, None
    cp = partitions[0].compile([query, key, scale, seq_len_kv, seq_len_q, neg_inf, value], [output], eng)

    query_data = np.empty(product(qv_sz), np.float32)
    key_data = np.empty(product(k_sz), np.float32)
    value_data = np.empty(product(k_sz), np.float32)
    fill_random(query_data)
    fill_random(key_data)
    fill_random(value_data)

    ts_query, ts_key = tensor(query, eng), tensor(key, eng)
    ts_value, ts_output = tensor(value, eng), tensor(output, eng)
    q_len = np.int32(p.query_num)
    kv_len = np.int32(p.seq_len)
    scale_val = np.float32(math.sqrt(p.head_size))
    neg_inf_val = np.float32(-np.inf)
    ts_mask_add = tensor.make_scalar_tensor(seq_len_kv, kv_len)
    ts_mask_sub = tensor.make_scalar_tensor(seq_len_q, q_len)
    ts_scale = tensor.make_scalar_tensor(scale, scale_val)
    ts_neg_inf = tensor.make_scalar_tensor(neg_inf, neg_inf_val)

    write_to_dnnl_tensor(query_data, ts_query)
    write_to_dnnl_tensor(key_data, ts_key)
    write_to_dnnl_tensor(value_data, ts_value)

    inputs = [ts_query, ts_key, ts_scale, ts_mask_add, ts_mask_sub, ts_neg_inf, ts_value]
    cp.execute(strm, inputs, [ts_output])
    strm.wait()
    return partitions, {t.get_logical_tensor().id: t.numpy() for t in inputs}, ts_output


@pytest.mark.parametrize("dt_", [dt.f32, dt.bf16], ids=lambda d: d.name)
def test_sdpa_bottom_right_causal_mask_example(dt_):
    # the example's defaults are {2, 128, 16, 64, 128}; reduced, with fewer queries than
    # keys so that bottom-right alignment differs from top-left
    p = SdpaDims(1, 24, 2, 16, 16)
    partitions, data, out = bench_sdpa_bottom_right_causal_mask(ga.EngineKind.cpu, dt_, p)
    ports = {lt.get_id(): lt for lt in partitions[0].get_input_ports()}
    query_lt, key_lt, value_lt = ports[0], ports[1], ports[24]
    assert len(partitions) == 1 and partitions[0].get_kind().startswith("sdpa"), partitions
    if dt_ == dt.bf16:
        graph = partitions[0].graph
        want = reference_arrays(graph, data)[graph.output_ids[0]]
        verdict = compare(want, out.numpy(), dt_, graph.fpmath, partitions[0].ops)
        assert verdict.ok, verdict.message
        return
    q, k, v = (data[lt.get_id()].astype(np.float64) for lt in (query_lt, key_lt, value_lt))
    s = q @ np.swapaxes(k, -1, -2) * math.sqrt(p.head_size)
    row, col = np.indices(s.shape[-2:])
    s = np.where(row + p.seq_len - p.query_num >= col, s, -np.inf)  # bottom-right causal
    e = np.exp(s - s.max(-1, keepdims=True))
    want = (e / e.sum(-1, keepdims=True)) @ v
    # scores are multiplied by sqrt(16) = 4 after f32 dot products of 16 terms (error
    # <= 16 u |q||k| ~ 1e-5 before scaling): 1e-4 covers that bound, a mask off by one
    # position changes outputs by ~1e-1
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- gated_mlp.cpp
@dataclass
class MlpDims:
    mb: int
    ic: int
    oc: int


def bench_gated_mlp(ekind, dt_, p: MlpDims):
    """``bench_gated_mlp`` of gated_mlp.cpp: fc_gate and fc_up MatMuls, swish
    (Sigmoid, Multiply), Multiply, a TypeCast to ``dt`` below f32, fc_down."""
    alloc = create_allocator(ekind)
    eng = ga.make_engine_with_allocator(ekind, 0, alloc)
    strm = ga.Stream(eng)
    src_sz = [p.mb, p.ic]
    wei0_sz = [p.ic, p.oc]
    hd_sz = [p.mb, p.oc]
    wei2_sz = [p.oc, p.ic]
    out_sz = [p.mb, p.ic]
    id_ = itertools.count()
    dt_inter = dt.f32

    src = logical_tensor(next(id_), dt_, src_sz, layout_type.strided)
    wei0 = logical_tensor(next(id_), dt_, wei0_sz, layout_type.strided)
    out0 = logical_tensor(next(id_), dt_inter, hd_sz, layout_type.strided)
    fc_gate = op(next(id_), K.MatMul, "fc_gate")
    fc_gate.add_inputs([src, wei0])
    fc_gate.add_outputs([out0])

    wei1 = logical_tensor(next(id_), dt_, wei0_sz, layout_type.strided)
    out1 = logical_tensor(next(id_), dt_inter, hd_sz, layout_type.strided)
    fc_up = op(next(id_), K.MatMul, "fc_up")
    fc_up.add_inputs([src, wei1])
    fc_up.add_outputs([out1])

    out2 = logical_tensor(next(id_), dt_inter, hd_sz, layout_type.strided)
    swi_sig = op(next(id_), K.Sigmoid, "swish/sigmoid")
    swi_sig.add_inputs([out0])
    swi_sig.add_outputs([out2])

    out3 = logical_tensor(next(id_), dt_inter, hd_sz, layout_type.strided)
    swi_mul = op(next(id_), K.Multiply, "swish/multiply")
    swi_mul.add_inputs([out0, out2])
    swi_mul.add_outputs([out3])

    out4 = logical_tensor(next(id_), dt_inter, hd_sz, layout_type.strided)
    mul = op(next(id_), K.Multiply, "mul")
    mul.add_inputs([out3, out1])
    mul.add_outputs([out4])

    out4_dt = out4
    typecast = op(next(id_), K.TypeCast, "typecast")
    if dt_ != dt_inter:
        out4_dt = logical_tensor(next(id_), dt_, hd_sz, layout_type.strided)
        typecast.add_inputs([out4])
        typecast.add_outputs([out4_dt])

    wei2 = logical_tensor(next(id_), dt_, wei2_sz, layout_type.strided)
    dst = logical_tensor(next(id_), dt_, out_sz, layout_type.strided)
    fc_down = op(next(id_), K.MatMul, "fc_down")
    fc_down.add_inputs([out4_dt, wei2])
    fc_down.add_outputs([dst])

    mlp = ga.Graph(ekind)
    mlp.add_op(fc_gate)
    mlp.add_op(fc_up)
    mlp.add_op(swi_sig)
    mlp.add_op(swi_mul)
    mlp.add_op(mul)
    if dt_ != dt_inter:
        mlp.add_op(typecast)
    mlp.add_op(fc_down)
    mlp.finalize()

    partitions = mlp.get_partitions()
    if len(partitions) != 1:
        return partitions, None, None
    cp = partitions[0].compile([src, wei0, wei1, wei2], [dst], eng)

    ts_src, ts_wei0, ts_wei1 = tensor(src, eng), tensor(wei0, eng), tensor(wei1, eng)
    ts_wei2, ts_dst = tensor(wei2, eng), tensor(dst, eng)

    src_data = np.empty(product(src_sz), np.float32)
    wei0_data = np.empty(product(wei0_sz), np.float32)
    wei1_data = np.empty(product(wei0_sz), np.float32)
    wei2_data = np.empty(product(wei2_sz), np.float32)
    fill_random(src_data)
    fill_random(wei0_data)
    fill_random(wei1_data)
    fill_random(wei2_data)

    write_to_dnnl_tensor(src_data, ts_src)
    write_to_dnnl_tensor(wei0_data, ts_wei0)
    write_to_dnnl_tensor(wei1_data, ts_wei1)
    write_to_dnnl_tensor(wei2_data, ts_wei2)

    inputs = [ts_src, ts_wei0, ts_wei1, ts_wei2]
    cp.execute(strm, inputs, [ts_dst])
    strm.wait()
    cp.execute(strm, inputs, [ts_dst])
    strm.wait()
    return partitions, {t.get_logical_tensor().id: t.numpy() for t in inputs}, ts_dst


def _gated_mlp_f64(x, w_gate, w_up, w_down):
    x, w_gate, w_up, w_down = (np.asarray(a, np.float64) for a in (x, w_gate, w_up, w_down))
    gate = x @ w_gate
    return (gate / (1 + np.exp(-gate)) * (x @ w_up)) @ w_down


@pytest.mark.parametrize("dt_", [dt.f32, dt.bf16, dt.f16], ids=lambda d: d.name)
def test_gated_mlp_example(dt_):
    # gated_mlp.cpp's defaults are {mb 1, ic 4096, oc 14336}: reduced, with mb > 1
    partitions, data, out = bench_gated_mlp(ga.EngineKind.cpu, dt_, MlpDims(4, 64, 160))
    assert len(partitions) == 1 and "gated_mlp" in partitions[0].get_kind(), partitions
    if dt_ == dt.f32:
        # f32 dot products of 64 and then 160 terms (the repeated fill pattern makes
        # outputs up to ~1e2 with cancellation): the scale-aware f32 rule of graph_api.check
        want = _gated_mlp_f64(*(data[i] for i in sorted(data)))
        verdict = compare(want, out.numpy(), dt.f32)
        assert verdict.ok, verdict.message
        return
    # bf16/f16: the unfused reference rounds where the graph's types say (f32 hidden
    # values, a TypeCast before fc_down); the rule of graph_api.check
    graph = partitions[0].graph
    want = reference_arrays(graph, data)[graph.output_ids[0]]
    verdict = compare(want, out.numpy(), dt_, graph.fpmath, partitions[0].ops)
    assert verdict.ok, verdict.message


# ---------------------------------------------------------------- gated_mlp_wei_combined.cpp
def bench_gated_mlp_wei_combined(ekind, dt_, p: MlpDims):
    """``bench_gated_mlp`` of gated_mlp_wei_combined.cpp: fc_gate's and fc_up's weights
    are the two halves of one [ic, 2 * oc] buffer, strided logical tensors and
    tensors made with tensor(lt, eng, handle + offset)."""
    alloc = create_allocator(ekind)
    eng = ga.make_engine_with_allocator(ekind, 0, alloc)
    strm = ga.Stream(eng)
    src_sz = [p.mb, p.ic]
    wei0_sz = [p.ic, p.oc]
    hd_sz = [p.mb, p.oc]
    wei2_sz = [p.oc, p.ic]
    out_sz = [p.mb, p.ic]
    combined_wei0_sz = [p.ic, 2 * p.oc]
    combined_wei0_st = [2 * p.oc, 1]
    id_ = itertools.count()
    dt_inter = dt.f32

    combined_wei0 = logical_tensor(next(id_), dt_, combined_wei0_sz, layout_type.strided)

    src = logical_tensor(next(id_), dt_, src_sz, layout_type.strided)
    wei0 = logical_tensor(next(id_), dt_, wei0_sz, combined_wei0_st)
    out0 = logical_tensor(next(id_), dt_inter, hd_sz, layout_type.strided)
    fc_gate = op(next(id_), K.MatMul, "fc_gate")
    fc_gate.add_inputs([src, wei0])
    fc_gate.add_outputs([out0])

    wei1 = logical_tensor(next(id_), dt_, wei0_sz, combined_wei0_st)
    out1 = logical_tensor(next(id_), dt_inter, hd_sz, layout_type.strided)
    fc_up = op(next(id_), K.MatMul, "fc_up")
    fc_up.add_inputs([src, wei1])
    fc_up.add_outputs([out1])

    out2 = logical_tensor(next(id_), dt_inter, hd_sz, layout_type.strided)
    swi_sig = op(next(id_), K.Sigmoid, "swish/sigmoid")
    swi_sig.add_inputs([out0])
    swi_sig.add_outputs([out2])

    out3 = logical_tensor(next(id_), dt_inter, hd_sz, layout_type.strided)
    swi_mul = op(next(id_), K.Multiply, "swish/multiply")
    swi_mul.add_inputs([out0, out2])
    swi_mul.add_outputs([out3])

    out4 = logical_tensor(next(id_), dt_inter, hd_sz, layout_type.strided)
    mul = op(next(id_), K.Multiply, "mul")
    mul.add_inputs([out3, out1])
    mul.add_outputs([out4])

    out4_dt = out4
    typecast = op(next(id_), K.TypeCast, "typecast")
    if dt_ != dt_inter:
        out4_dt = logical_tensor(next(id_), dt_, hd_sz, layout_type.strided)
        typecast.add_inputs([out4])
        typecast.add_outputs([out4_dt])

    wei2 = logical_tensor(next(id_), dt_, wei2_sz, layout_type.strided)
    dst = logical_tensor(next(id_), dt_, out_sz, layout_type.strided)
    fc_down = op(next(id_), K.MatMul, "fc_down")
    fc_down.add_inputs([out4_dt, wei2])
    fc_down.add_outputs([dst])

    mlp = ga.Graph(ekind)
    mlp.add_op(fc_gate)
    mlp.add_op(fc_up)
    mlp.add_op(swi_sig)
    mlp.add_op(swi_mul)
    mlp.add_op(mul)
    if dt_ != dt_inter:
        mlp.add_op(typecast)
    mlp.add_op(fc_down)
    mlp.finalize()

    partitions = mlp.get_partitions()
    if len(partitions) != 1:
        return partitions, None, None
    cp = partitions[0].compile([src, wei0, wei1, wei2], [dst], eng)

    ts_src, ts_combined_wei0 = tensor(src, eng), tensor(combined_wei0, eng)
    ts_wei2, ts_dst = tensor(wei2, eng), tensor(dst, eng)

    src_data = np.empty(product(src_sz), np.float32)
    combined_wei0_data = np.empty(product(combined_wei0_sz), np.float32)
    wei2_data = np.empty(product(wei2_sz), np.float32)
    fill_random(src_data)
    fill_random(combined_wei0_data)
    fill_random(wei2_data)

    write_to_dnnl_tensor(src_data, ts_src)
    write_to_dnnl_tensor(combined_wei0_data, ts_combined_wei0)
    write_to_dnnl_tensor(wei2_data, ts_wei2)

    # handle + p.oc * size_of(dt) in C++ is the element offset p.oc here
    handle = ts_combined_wei0.get_data_handle()
    ts_wei0 = tensor(wei0, eng, handle)
    ts_wei1 = tensor(wei1, eng, handle, offset=p.oc)

    inputs = [ts_src, ts_wei0, ts_wei1, ts_wei2]
    cp.execute(strm, inputs, [ts_dst])
    strm.wait()
    cp.execute(strm, inputs, [ts_dst])
    strm.wait()
    assert np.shares_memory(ts_wei1.get_data_handle(), handle)  # zero copy, as the handle arithmetic
    combined = ts_combined_wei0.numpy()
    data = {src.id: ts_src.numpy(), wei0.id: combined[:, :p.oc], wei1.id: combined[:, p.oc:],
            wei2.id: ts_wei2.numpy()}
    return partitions, data, ts_dst


@pytest.mark.parametrize("dt_", [dt.f32, dt.bf16, dt.f16], ids=lambda d: d.name)
def test_gated_mlp_wei_combined_example(dt_):
    # the example's defaults are {1, 4096, 14336}: reduced
    partitions, data, out = bench_gated_mlp_wei_combined(ga.EngineKind.cpu, dt_, MlpDims(4, 64, 160))
    assert len(partitions) == 1 and "gated_mlp" in partitions[0].get_kind(), partitions
    if dt_ == dt.f32:
        # as test_gated_mlp_example; the two weight halves swapped or read contiguously
        # would change outputs by O(1)
        want = _gated_mlp_f64(*(data[i] for i in sorted(data)))
        verdict = compare(want, out.numpy(), dt.f32)
        assert verdict.ok, verdict.message
        return
    graph = partitions[0].graph
    want = reference_arrays(graph, data)[graph.output_ids[0]]
    verdict = compare(want, out.numpy(), dt_, graph.fpmath, partitions[0].ops)
    assert verdict.ok, verdict.message


# ---------------------------------------------------------------- gated_mlp_int4.cpp
@dataclass
class MlpInt4Dims:
    mb: int
    ic: int
    oc: int
    gr: int  # group size for int4 group quantization


def get_fpmath_mode(dt_):
    return {dt.f16: ga.FPMathMode.f16, dt.bf16: ga.FPMathMode.bf16}.get(dt_, ga.FPMathMode.strict)


def bench_gated_mlp_int4(ekind, dt_, p: MlpInt4Dims):
    """``bench_gated_mlp`` of gated_mlp_int4.cpp: u4 weights with per-group ``dt``
    scales and u8 zero points, DynamicDequantize before each MatMul, fpmath mode of ``dt``."""
    data_type = dt
    src_sz = [p.mb, p.ic]
    wei0_sz = [p.ic, p.oc]
    wei0_scales_sz = [p.ic, p.oc // p.gr]
    hd_sz = [p.mb, p.oc]
    wei2_sz = [p.oc, p.ic]
    wei2_scales_sz = [p.oc, p.ic // p.gr]
    out_sz = [p.mb, p.ic]
    alloc = create_allocator(ekind)
    eng = ga.make_engine_with_allocator(ekind, 0, alloc)
    strm = ga.Stream(eng)
    id_ = itertools.count()
    dt_inter = dt.f32

    wei0_int4 = logical_tensor(next(id_), data_type.u4, wei0_sz, layout_type.strided)
    wei0_scales = logical_tensor(next(id_), dt_, wei0_scales_sz, layout_type.strided)
    wei0_zps = logical_tensor(next(id_), data_type.u8, wei0_scales_sz, layout_type.strided)
    wei0_dt = logical_tensor(next(id_), dt_, wei0_sz, layout_type.strided)
    deq_gate = op(next(id_), K.DynamicDequantize, "deq_gate")
    deq_gate.set_attr(ga.OpAttr.qtype, "per_group")
    deq_gate.set_attr(ga.OpAttr.group_shape, [1, p.gr])
    deq_gate.set_attr(ga.OpAttr.axis, -1)
    deq_gate.add_inputs([wei0_int4, wei0_scales, wei0_zps])
    deq_gate.add_outputs([wei0_dt])

    src = logical_tensor(next(id_), dt_, src_sz, layout_type.strided)
    out0 = logical_tensor(next(id_), dt_inter, hd_sz, layout_type.strided)
    fc_gate = op(next(id_), K.MatMul, "fc_gate")
    fc_gate.add_inputs([src, wei0_dt])
    fc_gate.add_outputs([out0])

    wei1_int4 = logical_tensor(next(id_), data_type.u4, wei0_sz, layout_type.strided)
    wei1_scales = logical_tensor(next(id_), dt_, wei0_scales_sz, layout_type.strided)
    wei1_zps = logical_tensor(next(id_), data_type.u8, wei0_scales_sz, layout_type.strided)
    wei1_dt = logical_tensor(next(id_), dt_, wei0_sz, layout_type.strided)
    deq_up = op(next(id_), K.DynamicDequantize, "deq_up")
    deq_up.set_attr(ga.OpAttr.qtype, "per_group")
    deq_up.set_attr(ga.OpAttr.group_shape, [1, p.gr])
    deq_up.set_attr(ga.OpAttr.axis, -1)
    deq_up.add_inputs([wei1_int4, wei1_scales, wei1_zps])
    deq_up.add_outputs([wei1_dt])

    out1 = logical_tensor(next(id_), dt_inter, hd_sz, layout_type.strided)
    fc_up = op(next(id_), K.MatMul, "fc_up")
    fc_up.add_inputs([src, wei1_dt])
    fc_up.add_outputs([out1])

    out2 = logical_tensor(next(id_), dt_inter, hd_sz, layout_type.strided)
    swi_sig = op(next(id_), K.Sigmoid, "swish/sigmoid")
    swi_sig.add_inputs([out0])
    swi_sig.add_outputs([out2])

    out3 = logical_tensor(next(id_), dt_inter, hd_sz, layout_type.strided)
    swi_mul = op(next(id_), K.Multiply, "swish/multiply")
    swi_mul.add_inputs([out0, out2])
    swi_mul.add_outputs([out3])

    out4 = logical_tensor(next(id_), dt_inter, hd_sz, layout_type.strided)
    mul = op(next(id_), K.Multiply, "mul")
    mul.add_inputs([out3, out1])
    mul.add_outputs([out4])

    out4_dt = out4
    typecast = op(next(id_), K.TypeCast, "typecast")
    if dt_ != dt_inter:
        out4_dt = logical_tensor(next(id_), dt_, hd_sz, layout_type.strided)
        typecast.add_inputs([out4])
        typecast.add_outputs([out4_dt])

    wei2_int4 = logical_tensor(next(id_), data_type.u4, wei2_sz, layout_type.strided)
    wei2_scales = logical_tensor(next(id_), dt_, wei2_scales_sz, layout_type.strided)
    wei2_zps = logical_tensor(next(id_), data_type.u8, wei2_scales_sz, layout_type.strided)
    wei2_dt = logical_tensor(next(id_), dt_, wei2_sz, layout_type.strided)
    deq_down = op(next(id_), K.DynamicDequantize, "deq_down")
    deq_down.set_attr(ga.OpAttr.qtype, "per_group")
    deq_down.set_attr(ga.OpAttr.group_shape, [1, p.gr])
    deq_down.set_attr(ga.OpAttr.axis, -1)
    deq_down.add_inputs([wei2_int4, wei2_scales, wei2_zps])
    deq_down.add_outputs([wei2_dt])

    dst = logical_tensor(next(id_), dt_, out_sz, layout_type.strided)
    fc_down = op(next(id_), K.MatMul, "fc_down")
    fc_down.add_inputs([out4_dt, wei2_dt])
    fc_down.add_outputs([dst])

    mlp = ga.Graph(ekind)
    mlp.set_fpmath_mode(get_fpmath_mode(dt_), True)
    mlp.add_op(deq_gate)
    mlp.add_op(deq_up)
    mlp.add_op(fc_gate)
    mlp.add_op(fc_up)
    mlp.add_op(swi_sig)
    mlp.add_op(swi_mul)
    mlp.add_op(mul)
    if dt_ != dt_inter:
        mlp.add_op(typecast)
    mlp.add_op(deq_down)
    mlp.add_op(fc_down)
    mlp.finalize()

    partitions = mlp.get_partitions()
    if len(partitions) != 1:
        return partitions, None, None
    cp = partitions[0].compile([src, wei0_int4, wei0_scales, wei0_zps, wei1_int4, wei1_scales,
                                wei1_zps, wei2_int4, wei2_scales, wei2_zps], [dst], eng)

    ts_src = tensor(src, eng)
    ts_wei0, ts_wei0_scales, ts_wei0_zps = tensor(wei0_int4, eng), tensor(wei0_scales, eng), tensor(wei0_zps, eng)
    ts_wei1, ts_wei1_scales, ts_wei1_zps = tensor(wei1_int4, eng), tensor(wei1_scales, eng), tensor(wei1_zps, eng)
    ts_wei2, ts_wei2_scales, ts_wei2_zps = tensor(wei2_int4, eng), tensor(wei2_scales, eng), tensor(wei2_zps, eng)
    ts_dst = tensor(dst, eng)

    src_data = np.empty(product(src_sz), np.float32)
    wei0_data = np.empty(product(wei0_sz), np.float32)
    wei1_data = np.empty(product(wei0_sz), np.float32)
    wei2_data = np.empty(product(wei2_sz), np.float32)
    fill_random(src_data)
    fill_random(wei0_data)
    fill_random(wei1_data)
    fill_random(wei2_data)

    # the example converts the [-1, 1) fill to u4 (values 0 and 1)
    write_to_dnnl_tensor(src_data, ts_src)
    write_to_dnnl_tensor(wei0_data, ts_wei0)
    write_to_dnnl_tensor(wei1_data, ts_wei1)
    write_to_dnnl_tensor(wei2_data, ts_wei2)
    # not in the example (it leaves scales and zero points uninitialised): values to check
    rng = np.random.default_rng(2)
    for ts in (ts_wei0_scales, ts_wei1_scales, ts_wei2_scales):
        ts.write(rng.uniform(0.01, 0.1, ts.get_logical_tensor().get_dims()).astype(np.float32))
    for ts in (ts_wei0_zps, ts_wei1_zps, ts_wei2_zps):
        ts.write(rng.integers(0, 16, ts.get_logical_tensor().get_dims()).astype(np.uint8))

    inputs = [ts_src, ts_wei0, ts_wei0_scales, ts_wei0_zps, ts_wei1, ts_wei1_scales, ts_wei1_zps,
              ts_wei2, ts_wei2_scales, ts_wei2_zps]
    cp.execute(strm, inputs, [ts_dst])
    strm.wait()
    cp.execute(strm, inputs, [ts_dst])
    strm.wait()
    return partitions, {t.get_logical_tensor().id: t.numpy() for t in inputs}, ts_dst


def _dequantize_per_group_f64(q, scales, zps, group):
    """Groups of ``group`` consecutive elements along the last axis share a scale and zero point."""
    rep = lambda a: np.repeat(np.asarray(a, np.float64), group, axis=-1)  # noqa: E731
    return (np.asarray(q, np.float64) - rep(zps)) * rep(scales)


@pytest.mark.parametrize("dt_", [dt.f32, dt.bf16, dt.f16], ids=lambda d: d.name)
def test_gated_mlp_int4_example(dt_):
    # the example's defaults are {1, 4096, 14336, group 128}: reduced
    p = MlpInt4Dims(4, 64, 128, 32)
    partitions, data, out = bench_gated_mlp_int4(ga.EngineKind.cpu, dt_, p)
    assert len(partitions) == 1 and "gated_mlp" in partitions[0].get_kind(), partitions
    if dt_ == dt.f32:
        x, q0, s0, z0, q1, s1, z1, q2, s2, z2 = (data[i] for i in sorted(data, key=lambda i: (i != 5, i)))
        assert set(np.unique(q0)) <= {0, 1}  # what the example's write gives
        want = _gated_mlp_f64(x, _dequantize_per_group_f64(q0, s0, z0, p.gr),
                              _dequantize_per_group_f64(q1, s1, z1, p.gr),
                              _dequantize_per_group_f64(q2, s2, z2, p.gr))
        # f32 dot products of 64 and 128 terms of exactly dequantized weights: the
        # scale-aware f32 rule; a group or zero point misplaced changes outputs by O(1)
        verdict = compare(want, out.numpy(), dt.f32)
        assert verdict.ok, verdict.message
        return
    graph = partitions[0].graph
    want = reference_arrays(graph, data)[graph.output_ids[0]]
    verdict = compare(want, out.numpy(), dt_, graph.fpmath, partitions[0].ops)
    assert verdict.ok, verdict.message


# ---------------------------------------------------------------- sdpa_quantized.cpp
@dataclass
class QuantizedSdpaDims:
    mb: int
    seq_len: int
    head_num: int
    head_size: int


def bench_quantized_sdpa(ekind, dt_, p: QuantizedSdpaDims, fill_scale=1.0):
    """``bench_quantized_sdpa`` of sdpa_quantized.cpp: Q, K, V and the output in
    ``dt`` (f8_e4m3, f8_e5m2, s8, u8) with per-tensor scale 0.25 Dequantize/Quantize
    around f32 attention, the probabilities quantized and dequantized before bmm2.
    ``fill_scale`` (not in the example) widens the [-1, 1) fill, which s8/u8 store as
    -1, 0, 1 only and then give an all-zero output."""
    data_type = dt
    alloc = create_allocator(ekind)
    eng = ga.make_engine_with_allocator(ekind, 0, alloc)
    strm = ga.Stream(eng)
    qkv_sz = [p.mb, p.head_num, p.seq_len, p.head_size]
    score_sz = [p.mb, p.head_num, p.seq_len, p.seq_len]
    scale_sz = [1]
    mask_sz = [p.mb, 1, 1, p.seq_len]
    id_ = itertools.count()

    q_x8 = logical_tensor(next(id_), dt_, qkv_sz, layout_type.strided)
    q_f32 = logical_tensor(next(id_), data_type.f32, qkv_sz, layout_type.strided)
    q_deq = op(next(id_), K.Dequantize, "q_deq")
    q_deq.set_attr(ga.OpAttr.qtype, "per_tensor")
    q_deq.set_attr(ga.OpAttr.scales, [0.25])
    q_deq.add_input(q_x8)
    q_deq.add_output(q_f32)

    k_x8 = logical_tensor(next(id_), dt_, qkv_sz, layout_type.strided)
    k_f32 = logical_tensor(next(id_), data_type.f32, qkv_sz, layout_type.strided)
    k_deq = op(next(id_), K.Dequantize, "k_deq")
    k_deq.set_attr(ga.OpAttr.qtype, "per_tensor")
    k_deq.set_attr(ga.OpAttr.scales, [0.25])
    k_deq.add_input(k_x8)
    k_deq.add_output(k_f32)

    score = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    bmm1 = op(next(id_), K.MatMul, "bmm1")
    bmm1.set_attr(ga.OpAttr.transpose_b, True)
    bmm1.add_inputs([q_f32, k_f32])
    bmm1.add_output(score)

    scale = logical_tensor(next(id_), data_type.f32, scale_sz, layout_type.strided)
    scaled_score = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    scale_div = op(next(id_), K.Divide, "scale_div")
    scale_div.add_inputs([score, scale])
    scale_div.add_outputs([scaled_score])

    mask = logical_tensor(next(id_), data_type.f32, mask_sz, layout_type.strided)
    masked_score = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    mask_add = op(next(id_), K.Add, "mask_add")
    mask_add.add_inputs([scaled_score, mask])
    mask_add.add_outputs([masked_score])

    probs = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    softmax = op(next(id_), K.SoftMax, "softmax")
    softmax.set_attr(ga.OpAttr.axis, -1)
    softmax.set_attr(ga.OpAttr.mode, "inf_as_zero")
    softmax.add_inputs([masked_score])
    softmax.add_outputs([probs])

    probs_x8 = logical_tensor(next(id_), dt_, score_sz, layout_type.strided)
    p_quant = op(next(id_), K.Quantize, "p_quant")
    p_quant.set_attr(ga.OpAttr.qtype, "per_tensor")
    p_quant.set_attr(ga.OpAttr.scales, [0.25])
    p_quant.add_input(probs)
    p_quant.add_output(probs_x8)

    probs_f32 = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    p_deq = op(next(id_), K.Dequantize, "p_deq")
    p_deq.set_attr(ga.OpAttr.qtype, "per_tensor")
    p_deq.set_attr(ga.OpAttr.scales, [0.25])
    p_deq.add_input(probs_x8)
    p_deq.add_output(probs_f32)

    v_x8 = logical_tensor(next(id_), dt_, qkv_sz, layout_type.strided)
    v_f32 = logical_tensor(next(id_), data_type.f32, qkv_sz, layout_type.strided)
    v_deq = op(next(id_), K.Dequantize, "v_deq")
    v_deq.set_attr(ga.OpAttr.qtype, "per_tensor")
    v_deq.set_attr(ga.OpAttr.scales, [0.25])
    v_deq.add_input(v_x8)
    v_deq.add_output(v_f32)

    output = logical_tensor(next(id_), data_type.f32, qkv_sz, layout_type.strided)
    bmm2 = op(next(id_), K.MatMul, "bmm2")
    bmm2.add_inputs([probs_f32, v_f32])
    bmm2.add_outputs([output])

    output_x8 = logical_tensor(next(id_), dt_, qkv_sz, layout_type.strided)
    o_quant = op(next(id_), K.Quantize, "o_quant")
    o_quant.set_attr(ga.OpAttr.qtype, "per_tensor")
    o_quant.set_attr(ga.OpAttr.scales, [0.25])
    o_quant.add_input(output)
    o_quant.add_output(output_x8)

    sdpa = ga.Graph(ekind)
    for o in (q_deq, k_deq, bmm1, scale_div, mask_add, softmax, p_quant, p_deq, v_deq, bmm2, o_quant):
        sdpa.add_op(o)
    sdpa.finalize()

    partitions = sdpa.get_partitions()
    if len(partitions) != 1:
        return partitions, None, None
    cp = partitions[0].compile([q_x8, k_x8, scale, mask, v_x8], [output_x8], eng)

    ts_query, ts_key, ts_scale = tensor(q_x8, eng), tensor(k_x8, eng), tensor(scale, eng)
    ts_mask, ts_value, ts_output = tensor(mask, eng), tensor(v_x8, eng), tensor(output_x8, eng)

    query_data = np.empty(product(qkv_sz), np.float32)
    key_data = np.empty(product(qkv_sz), np.float32)
    scale_data = np.full(product(scale_sz), math.sqrt(p.head_size), np.float32)
    mask_data = np.empty(product(mask_sz), np.float32)
    value_data = np.empty(product(qkv_sz), np.float32)
    fill_random(query_data)
    fill_random(key_data)
    fill_random(value_data)
    fill_mask(mask_data, p.seq_len)
    for data in (query_data, key_data, value_data):
        data *= fill_scale

    write_to_dnnl_tensor(query_data, ts_query)
    write_to_dnnl_tensor(key_data, ts_key)
    write_to_dnnl_tensor(scale_data, ts_scale)
    write_to_dnnl_tensor(mask_data, ts_mask)
    write_to_dnnl_tensor(value_data, ts_value)

    inputs = [ts_query, ts_key, ts_scale, ts_mask, ts_value]
    cp.execute(strm, inputs, [ts_output])
    strm.wait()
    cp.execute(strm, inputs, [ts_output])
    strm.wait()
    return partitions, {t.get_logical_tensor().id: t.numpy() for t in inputs}, ts_output


QUANTIZED_SDPA_TYPES = [dt.f8_e4m3, dt.f8_e5m2, dt.s8, dt.u8]  # the example's bench() calls


@pytest.mark.parametrize("dt_", QUANTIZED_SDPA_TYPES, ids=lambda d: d.name)
def test_sdpa_quantized_example(dt_):
    # the example's defaults are {2, 128, 16, 64}: reduced
    p = QuantizedSdpaDims(2, 32, 2, 16)
    # integers: stored values in [-8, 8] (dequantized to [-2, 2]), so outputs span several steps
    fill_scale = 8.0 if dt_ in (dt.s8, dt.u8) else 1.0
    partitions, data, out = bench_quantized_sdpa(ga.EngineKind.cpu, dt_, p, fill_scale)
    assert len(partitions) == 1 and partitions[0].get_kind().startswith("sdpa"), partitions
    _check_quantized_sdpa(data, out, dt_)


def _check_quantized_sdpa(data, out, dt_):
    """sdpa_quantized.cpp's output against float64 with both quantizations."""
    q, k, scale, mask, v = (np.asarray(data[i], np.float64) for i in sorted(data))
    quant = _QUANTIZE_F64[dt_]
    s = (q * 0.25) @ np.swapaxes(k * 0.25, -1, -2) / scale[0] + mask
    e = np.exp(s - s.max(-1, keepdims=True))
    probs = quant(e / e.sum(-1, keepdims=True) / 0.25) * 0.25
    want = quant(probs @ (v * 0.25) / 0.25)
    got = out.numpy().astype(np.float64)
    # the two quantizations round f32 values in the kernel and float64 ones here: where a
    # value lands within f32 rounding of a rounding boundary it may go either way, which
    # moves an output by at most one step of its type (a probability step of 0.25 moves
    # the output by <= 0.25 * 0.25 = one quarter of an output step); anything else, such
    # as a scale applied twice or a wrong mask, moves most outputs
    step = _QUANT_STEP[dt_](np.maximum(np.abs(want), np.abs(got)))
    assert (np.abs(got - want) <= step).all(), np.abs(got - want).max()
    assert (got == want).mean() > 0.99
    assert len(np.unique(want)) > 3  # not a degenerate output


def _round_f8(f8_type):
    return lambda x: np.asarray(x, np.float64).astype(f8_type).astype(np.float64)


def _f8_step(mantissa_bits, min_exponent):
    """One unit in the last place of an f8 value of magnitude ``a`` (subnormals included)."""
    return lambda a: 2.0 ** (np.maximum(np.floor(np.log2(np.maximum(a, 2.0 ** min_exponent))), min_exponent)
                             - mantissa_bits)


_QUANTIZE_F64 = {  # Quantize's final rounding to the stored type: nearest (even), saturating
    dt.s8: lambda x: np.clip(np.rint(x), -128, 127),
    dt.u8: lambda x: np.clip(np.rint(x), 0, 255),
    dt.f8_e4m3: _round_f8(ml_dtypes.float8_e4m3fn),
    dt.f8_e5m2: _round_f8(ml_dtypes.float8_e5m2),
}
_QUANT_STEP = {
    dt.s8: lambda a: np.ones_like(a),
    dt.u8: lambda a: np.ones_like(a),
    dt.f8_e4m3: _f8_step(3, -6),
    dt.f8_e5m2: _f8_step(2, -14),
}


# ---------------------------------------------------------------- gqa_training.cpp
def bench_gqa_forward(ekind, dt_, strm, eng, ts_query, ts_key, ts_scale, ts_mask, ts_value):
    """``bench_gqa_forward`` of gqa_training.cpp: SoftMax also gives its stats; the
    output and stats shapes are queried after compile. C++'s out-parameters
    ``ts_output`` and ``ts_stats`` are returned (None, None when unsupported)."""
    dt_inter = dt.f32
    query = ts_query.get_logical_tensor()
    key = ts_key.get_logical_tensor()
    value = ts_value.get_logical_tensor()
    scale = ts_scale.get_logical_tensor()
    mask = ts_mask.get_logical_tensor()
    score_sz = mask.get_dims()
    id_ = itertools.count(1)

    score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    bmm1 = op(next(id_), K.MatMul, "bmm1")
    bmm1.set_attr(ga.OpAttr.transpose_b, True)
    bmm1.add_inputs([query, key])
    bmm1.add_outputs([score])

    scaled_score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    scale_div = op(next(id_), K.Divide, "scale_div")
    scale_div.add_inputs([score, scale])
    scale_div.add_outputs([scaled_score])

    masked_score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    mask_add = op(next(id_), K.Add, "mask_add")
    mask_add.add_inputs([scaled_score, mask])
    mask_add.add_outputs([masked_score])

    probs = logical_tensor(next(id_), dt_, score_sz, layout_type.strided)
    stats = logical_tensor(next(id_), dt_inter, layout_type.strided)
    softmax = op(next(id_), K.SoftMax, "softmax")
    softmax.set_attr(ga.OpAttr.axis, -1)
    softmax.set_attr(ga.OpAttr.mode, "inf_as_zero")
    softmax.add_inputs([masked_score])
    softmax.add_outputs([probs, stats])

    output = logical_tensor(next(id_), dt_, layout_type.strided)
    bmm2 = op(next(id_), K.MatMul, "bmm2")
    bmm2.add_inputs([probs, value])
    bmm2.add_outputs([output])

    gqa = ga.Graph(ekind)
    gqa.add_op(bmm1)
    gqa.add_op(scale_div)
    gqa.add_op(mask_add)
    gqa.add_op(softmax)
    gqa.add_op(bmm2)
    gqa.finalize()

    partitions = gqa.get_partitions()
    if len(partitions) != 1:
        return partitions, None, None
    cp = partitions[0].compile([query, key, scale, mask, value], [output, stats], eng)
    output_w_shape = cp.query_logical_tensor(output.get_id())
    stats_w_shape = cp.query_logical_tensor(stats.get_id())
    ts_output = tensor(output_w_shape, eng)
    ts_stats = tensor(stats_w_shape, eng)
    cp.execute(strm, [ts_query, ts_key, ts_scale, ts_mask, ts_value], [ts_output, ts_stats])
    strm.wait()
    return partitions, ts_output, ts_stats


def bench_gqa_backward(ekind, dt_, strm, eng, ts_query, ts_key, ts_scale, ts_mask, ts_value,
                       ts_output, ts_stats, ts_doutput):
    """``bench_gqa_backward`` of gqa_training.cpp: probabilities recomputed from the
    stats, dV and dK summed over the heads sharing a K/V head (ReduceSum axis 2).
    Returns the partitions and the dQ, dK, dV tensors."""
    dt_inter = dt.f32
    query = ts_query.get_logical_tensor()
    key = ts_key.get_logical_tensor()
    value = ts_value.get_logical_tensor()
    scale = ts_scale.get_logical_tensor()
    mask = ts_mask.get_logical_tensor()
    output = ts_output.get_logical_tensor()
    stats = ts_stats.get_logical_tensor()
    doutput = ts_doutput.get_logical_tensor()
    q_sz = query.get_dims()
    kv_sz = key.get_dims()
    score_sz = mask.get_dims()
    stats_sz = stats.get_dims()
    output_sz = output.get_dims()
    id_ = itertools.count(1)

    score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    bmm1 = op(next(id_), K.MatMul, "bmm1")
    bmm1.set_attr(ga.OpAttr.transpose_b, True)
    bmm1.add_inputs([query, key])
    bmm1.add_outputs([score])

    scaled_score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    scale_div = op(next(id_), K.Divide, "scale_div")
    scale_div.add_inputs([score, scale])
    scale_div.add_outputs([scaled_score])

    masked_score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    mask_add = op(next(id_), K.Add, "mask_add")
    mask_add.add_inputs([scaled_score, mask])
    mask_add.add_outputs([masked_score])

    sub_out = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    subtract = op(next(id_), K.Subtract, "subtract")
    subtract.add_inputs([masked_score, stats])
    subtract.add_outputs([sub_out])

    probs = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    exp = op(next(id_), K.Exp, "exp")
    exp.add_inputs([sub_out])
    exp.add_outputs([probs])

    probs_cast = probs
    typecast = op(next(id_), K.TypeCast, "typecast")
    if dt_ != dt_inter:
        probs_cast = logical_tensor(next(id_), dt_, score_sz, layout_type.strided)
        typecast.add_inputs([probs])
        typecast.add_outputs([probs_cast])

    dvalue = logical_tensor(next(id_), dt_, q_sz, layout_type.strided)
    bmm_p_do = op(next(id_), K.MatMul, "bmm_dv")
    bmm_p_do.set_attr(ga.OpAttr.transpose_a, True)
    bmm_p_do.add_inputs([probs_cast, doutput])
    bmm_p_do.add_outputs([dvalue])

    dvalue_reduced = logical_tensor(next(id_), dt_, kv_sz, layout_type.strided)
    reduce_dv = op(next(id_), K.ReduceSum, "reduce_dv")
    reduce_dv.set_attr(ga.OpAttr.axes, [2])
    reduce_dv.set_attr(ga.OpAttr.keep_dims, True)
    reduce_dv.add_inputs([dvalue])
    reduce_dv.add_outputs([dvalue_reduced])

    dprobs = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    bmm_do_v = op(next(id_), K.MatMul, "bmm_dprobs")
    bmm_do_v.set_attr(ga.OpAttr.transpose_b, True)
    bmm_do_v.add_inputs([doutput, value])
    bmm_do_v.add_outputs([dprobs])

    o_do_out = logical_tensor(next(id_), dt_inter, output_sz, layout_type.strided)
    o_do_mul = op(next(id_), K.Multiply, "mul_o_do")
    o_do_mul.add_inputs([output, doutput])
    o_do_mul.add_outputs([o_do_out])

    correction_out = logical_tensor(next(id_), dt_inter, stats_sz, layout_type.strided)
    correction = op(next(id_), K.ReduceSum, "reducesum_correction")
    correction.set_attr(ga.OpAttr.axes, [4])
    correction.set_attr(ga.OpAttr.keep_dims, True)
    correction.add_inputs([o_do_out])
    correction.add_outputs([correction_out])

    dp_corrected_out = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    dp_corrected_op = op(next(id_), K.Subtract, "sub_dp_corrected")
    dp_corrected_op.add_inputs([dprobs, correction_out])
    dp_corrected_op.add_outputs([dp_corrected_out])

    dmasked_score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    softmax_bwd_mul = op(next(id_), K.Multiply, "mul_softmax_bwd")
    softmax_bwd_mul.add_inputs([probs, dp_corrected_out])
    softmax_bwd_mul.add_outputs([dmasked_score])

    dscaled_score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    scale_div2 = op(next(id_), K.Divide, "scale_div")
    scale_div2.add_inputs([dmasked_score, scale])
    scale_div2.add_outputs([dscaled_score])

    dscaled_score_cast = dscaled_score
    typecast2 = op(next(id_), K.TypeCast, "typecast")
    if dt_ != dt_inter:
        dscaled_score_cast = logical_tensor(next(id_), dt_, score_sz, layout_type.strided)
        typecast2.add_inputs([dscaled_score])
        typecast2.add_outputs([dscaled_score_cast])

    dquery = logical_tensor(next(id_), dt_, q_sz, layout_type.strided)
    bmm_dscaled_score_k = op(next(id_), K.MatMul, "bmm_dq")
    bmm_dscaled_score_k.add_inputs([dscaled_score_cast, key])
    bmm_dscaled_score_k.add_outputs([dquery])

    dkey = logical_tensor(next(id_), dt_, q_sz, layout_type.strided)
    bmm_dscaled_score_q = op(next(id_), K.MatMul, "bmm_dk")
    bmm_dscaled_score_q.set_attr(ga.OpAttr.transpose_a, True)
    bmm_dscaled_score_q.add_inputs([dscaled_score_cast, query])
    bmm_dscaled_score_q.add_outputs([dkey])

    dkey_reduced = logical_tensor(next(id_), dt_, kv_sz, layout_type.strided)
    reduce_dk = op(next(id_), K.ReduceSum, "reduce_dk")
    reduce_dk.set_attr(ga.OpAttr.axes, [2])
    reduce_dk.set_attr(ga.OpAttr.keep_dims, True)
    reduce_dk.add_inputs([dkey])
    reduce_dk.add_outputs([dkey_reduced])

    gqa_bwd = ga.Graph(ekind)
    for o in (bmm1, scale_div, mask_add, subtract, exp, bmm_p_do, bmm_do_v, o_do_mul, correction,
              dp_corrected_op, softmax_bwd_mul, scale_div2, bmm_dscaled_score_q, bmm_dscaled_score_k,
              reduce_dv, reduce_dk):
        gqa_bwd.add_op(o)
    if dt_ != dt_inter:
        gqa_bwd.add_op(typecast)
        gqa_bwd.add_op(typecast2)
    gqa_bwd.finalize()

    partitions = gqa_bwd.get_partitions()
    if len(partitions) != 1:
        return partitions, None
    cp = partitions[0].compile([query, key, scale, mask, value, output, stats, doutput],
                               [dquery, dkey_reduced, dvalue_reduced], eng)
    ts_dquery = tensor(dquery, eng)
    ts_dkey = tensor(dkey_reduced, eng)
    ts_dvalue = tensor(dvalue_reduced, eng)
    cp.execute(strm, [ts_query, ts_key, ts_scale, ts_mask, ts_value, ts_output, ts_stats, ts_doutput],
               [ts_dquery, ts_dkey, ts_dvalue])
    strm.wait()
    return partitions, (ts_dquery, ts_dkey, ts_dvalue)


def bench_gqa_training(ekind, dt_, p: GqaDims):
    """``bench_gqa`` of gqa_training.cpp: the forward graph, then the backward one
    fed with the forward's output and stats."""
    alloc = create_allocator(ekind)
    eng = ga.make_engine_with_allocator(ekind, 0, alloc)
    strm = ga.Stream(eng)
    head_rep = p.q_head_num // p.kv_head_num
    q_sz = [p.mb, p.kv_head_num, head_rep, p.seq_len, p.head_size]
    kv_sz = [p.mb, p.kv_head_num, 1, p.seq_len, p.head_size]
    score_sz = [p.mb, p.kv_head_num, head_rep, p.seq_len, p.seq_len]
    scale_sz = [1]

    query_lt = logical_tensor(100, dt_, q_sz, layout_type.strided)
    key_lt = logical_tensor(101, dt_, kv_sz, layout_type.strided)
    scale_lt = logical_tensor(102, dt_, scale_sz, layout_type.strided)
    mask_lt = logical_tensor(103, dt_, score_sz, layout_type.strided)
    value_lt = logical_tensor(104, dt_, kv_sz, layout_type.strided)
    ts_query = tensor(query_lt, eng)
    ts_key = tensor(key_lt, eng)
    ts_scale = tensor(scale_lt, eng)
    ts_mask = tensor(mask_lt, eng)
    ts_value = tensor(value_lt, eng)

    query_data = np.empty(product(q_sz), np.float32)
    key_data = np.empty(product(kv_sz), np.float32)
    scale_data = np.full(product(scale_sz), math.sqrt(p.head_size), np.float32)
    mask_data = np.empty(product(score_sz), np.float32)
    value_data = np.empty(product(kv_sz), np.float32)
    fill_random(query_data)
    fill_random(key_data)
    fill_random(value_data)
    fill_mask(mask_data, p.seq_len)
    write_to_dnnl_tensor(query_data, ts_query)
    write_to_dnnl_tensor(key_data, ts_key)
    write_to_dnnl_tensor(scale_data, ts_scale)
    write_to_dnnl_tensor(mask_data, ts_mask)
    write_to_dnnl_tensor(value_data, ts_value)

    fwd_partitions, ts_output, ts_stats = bench_gqa_forward(ekind, dt_, strm, eng, ts_query, ts_key,
                                                            ts_scale, ts_mask, ts_value)
    if ts_output is None:
        return fwd_partitions, None, None
    doutput_sz = ts_output.get_logical_tensor().get_dims()
    doutput_lt = logical_tensor(105, dt_, doutput_sz, layout_type.strided)
    ts_doutput = tensor(doutput_lt, eng)
    doutput_data = np.empty(product(doutput_sz), np.float32)
    fill_random(doutput_data)
    write_to_dnnl_tensor(doutput_data, ts_doutput)

    bwd_partitions, grads = bench_gqa_backward(ekind, dt_, strm, eng, ts_query, ts_key, ts_scale, ts_mask,
                                               ts_value, ts_output, ts_stats, ts_doutput)
    tensors = {"query": ts_query, "key": ts_key, "scale": ts_scale, "mask": ts_mask, "value": ts_value,
               "output": ts_output, "stats": ts_stats, "doutput": ts_doutput}
    return (fwd_partitions, bwd_partitions), tensors, grads


@pytest.mark.parametrize("dt_", [dt.f32, dt.bf16, dt.f16], ids=lambda d: d.name)
def test_gqa_training_example(dt_):
    # the example's defaults are {2, 128, 16, 2, 64}: reduced
    p = GqaDims(2, 16, 4, 2, 16)
    (fwd_partitions, bwd_partitions), ts, grads = bench_gqa_training(ga.EngineKind.cpu, dt_, p)
    assert [pp.get_kind() for pp in fwd_partitions] == ["sdpa"]  # one partition each, as the example needs
    assert [pp.get_kind() for pp in bwd_partitions] == ["sdpa_backward"]
    fwd_got = {"output": ts["output"].numpy(), "stats": ts["stats"].numpy()}
    grads_got = dict(zip(("dquery", "dkey", "dvalue"), (g.numpy() for g in grads)))
    assert fwd_got["stats"].shape == (p.mb, p.kv_head_num, p.q_head_num // p.kv_head_num, p.seq_len, 1)
    if dt_ == dt.f32:
        want = _gqa_training_f64(*(ts[n].numpy() for n in ("query", "key", "scale", "mask", "value", "doutput")))
        # f32 dot products of 16 terms, exp/log, and sums over 16 keys and 2 shared heads:
        # the scale-aware f32 rule (a few ulps of the terms' magnitude) of graph_api.check;
        # a wrong stats convention, missing correction or head reduction is off by O(1)
        for name, got in {**fwd_got, **grads_got}.items():
            verdict = compare(want[name], got, dt.f32)
            assert verdict.ok, (name, verdict.message)
        return
    # bf16/f16: each partition against the unfused reference, which rounds where the
    # graph's types say (the backward fed with the forward's own output and stats)
    for partitions, got in ((fwd_partitions, fwd_got), (bwd_partitions, grads_got)):
        graph = partitions[0].graph
        feeds = {t.get_logical_tensor().id: t.numpy() for t in ts.values() if t.get_logical_tensor().id in graph.input_ids}
        names = {"output": ts["output"], "stats": ts["stats"], "dquery": grads[0], "dkey": grads[1], "dvalue": grads[2]}
        ref = reference_arrays(graph, feeds)
        for name, value in got.items():
            lt = names[name].get_logical_tensor()
            verdict = compare(ref[lt.id], value, lt.get_data_type(), graph.fpmath, partitions[0].ops)
            assert verdict.ok, (name, verdict.message)


def _gqa_training_f64(q, k, scale, mask, v, do):
    """Forward (output, log-sum-exp stats) and the gradients, K/V heads shared over axis 2."""
    q, k, scale, mask, v, do = (np.asarray(a, np.float64) for a in (q, k, scale, mask, v, do))
    s = q @ np.swapaxes(k, -1, -2) / scale[0] + mask
    m = s.max(-1, keepdims=True)
    stats = m + np.log(np.exp(s - m).sum(-1, keepdims=True))
    probs = np.exp(s - stats)
    out = probs @ v
    dv = (np.swapaxes(probs, -1, -2) @ do).sum(2, keepdims=True)
    dprobs = do @ np.swapaxes(v, -1, -2)
    ds = probs * (dprobs - (out * do).sum(-1, keepdims=True)) / scale[0]
    dq = ds @ k
    dk = (np.swapaxes(ds, -1, -2) @ q).sum(2, keepdims=True)
    return {"output": out, "stats": stats, "dquery": dq, "dkey": dk, "dvalue": dv}


# ---------------------------------------------------------------- int8_sdpa.cpp
# Not on oneDNN's main branch: examples/graph/int8_sdpa.cpp of branch
# lvtao/main/example-int8-sdpa (commit 19994062b6, 2026-04-29).
def bench_int8_sdpa(ekind, p: QuantizedSdpaDims, fill_scale=1.0, fill_shift=0.0):
    """``bench_int8_sdpa`` of int8_sdpa.cpp: u8 Q/K/V/output and probabilities with
    scale 0.25 and zero point 128, set as scalars (``set_attr<float>(scales, 0.25f)``).
    ``fill_scale``/``fill_shift`` (not in the example) move the [-1, 1) fill around the
    zero point; the example's own fill stores only 0 and 1, far below it."""
    data_type = dt
    alloc = create_allocator(ekind)
    eng = ga.make_engine_with_allocator(ekind, 0, alloc)
    strm = ga.Stream(eng)
    qkv_sz = [p.mb, p.head_num, p.seq_len, p.head_size]
    score_sz = [p.mb, p.head_num, p.seq_len, p.seq_len]
    scale_sz = [1]
    mask_sz = [p.mb, 1, 1, p.seq_len]
    id_ = itertools.count()

    q_u8 = logical_tensor(next(id_), data_type.u8, qkv_sz, layout_type.strided)
    q_f32 = logical_tensor(next(id_), data_type.f32, qkv_sz, layout_type.strided)
    q_deq = op(next(id_), K.Dequantize, "q_deq")
    q_deq.set_attr(ga.OpAttr.qtype, "per_tensor")
    q_deq.set_attr(ga.OpAttr.scales, 0.25)
    q_deq.set_attr(ga.OpAttr.zps, 128)
    q_deq.add_input(q_u8)
    q_deq.add_output(q_f32)

    k_u8 = logical_tensor(next(id_), data_type.u8, qkv_sz, layout_type.strided)
    k_f32 = logical_tensor(next(id_), data_type.f32, qkv_sz, layout_type.strided)
    k_deq = op(next(id_), K.Dequantize, "k_deq")
    k_deq.set_attr(ga.OpAttr.qtype, "per_tensor")
    k_deq.set_attr(ga.OpAttr.scales, 0.25)
    k_deq.set_attr(ga.OpAttr.zps, 128)
    k_deq.add_input(k_u8)
    k_deq.add_output(k_f32)

    score = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    bmm1 = op(next(id_), K.MatMul, "bmm1")
    bmm1.set_attr(ga.OpAttr.transpose_b, True)
    bmm1.add_inputs([q_f32, k_f32])
    bmm1.add_output(score)

    scale = logical_tensor(next(id_), data_type.f32, scale_sz, layout_type.strided)
    scaled_score = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    scale_div = op(next(id_), K.Divide, "scale_div")
    scale_div.add_inputs([score, scale])
    scale_div.add_outputs([scaled_score])

    mask = logical_tensor(next(id_), data_type.f32, mask_sz, layout_type.strided)
    masked_score = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    mask_add = op(next(id_), K.Add, "mask_add")
    mask_add.add_inputs([scaled_score, mask])
    mask_add.add_outputs([masked_score])

    probs = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    softmax = op(next(id_), K.SoftMax, "softmax")
    softmax.set_attr(ga.OpAttr.axis, -1)
    softmax.add_inputs([masked_score])
    softmax.add_outputs([probs])

    probs_u8 = logical_tensor(next(id_), data_type.u8, score_sz, layout_type.strided)
    p_quant = op(next(id_), K.Quantize, "p_quant")
    p_quant.set_attr(ga.OpAttr.qtype, "per_tensor")
    p_quant.set_attr(ga.OpAttr.scales, 0.25)
    p_quant.set_attr(ga.OpAttr.zps, 128)
    p_quant.add_input(probs)
    p_quant.add_output(probs_u8)

    probs_f32 = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    p_deq = op(next(id_), K.Dequantize, "p_deq")
    p_deq.set_attr(ga.OpAttr.qtype, "per_tensor")
    p_deq.set_attr(ga.OpAttr.scales, 0.25)
    p_deq.set_attr(ga.OpAttr.zps, 128)
    p_deq.add_input(probs_u8)
    p_deq.add_output(probs_f32)

    v_u8 = logical_tensor(next(id_), data_type.u8, qkv_sz, layout_type.strided)
    v_f32 = logical_tensor(next(id_), data_type.f32, qkv_sz, layout_type.strided)
    v_deq = op(next(id_), K.Dequantize, "v_deq")
    v_deq.set_attr(ga.OpAttr.qtype, "per_tensor")
    v_deq.set_attr(ga.OpAttr.scales, 0.25)
    v_deq.set_attr(ga.OpAttr.zps, 128)
    v_deq.add_input(v_u8)
    v_deq.add_output(v_f32)

    output = logical_tensor(next(id_), data_type.f32, qkv_sz, layout_type.strided)
    bmm2 = op(next(id_), K.MatMul, "bmm2")
    bmm2.add_inputs([probs_f32, v_f32])
    bmm2.add_outputs([output])

    output_u8 = logical_tensor(next(id_), data_type.u8, qkv_sz, layout_type.strided)
    o_quant = op(next(id_), K.Quantize, "o_quant")
    o_quant.set_attr(ga.OpAttr.qtype, "per_tensor")
    o_quant.set_attr(ga.OpAttr.scales, 0.25)
    o_quant.set_attr(ga.OpAttr.zps, 128)
    o_quant.add_input(output)
    o_quant.add_output(output_u8)

    sdpa = ga.Graph(ekind)
    for o in (q_deq, k_deq, bmm1, scale_div, mask_add, softmax, p_quant, p_deq, v_deq, bmm2, o_quant):
        sdpa.add_op(o)
    sdpa.finalize()

    partitions = sdpa.get_partitions()
    if len(partitions) != 1:
        return partitions, None, None
    cp = partitions[0].compile([q_u8, k_u8, scale, mask, v_u8], [output_u8], eng)

    ts_query, ts_key, ts_scale = tensor(q_u8, eng), tensor(k_u8, eng), tensor(scale, eng)
    ts_mask, ts_value, ts_output = tensor(mask, eng), tensor(v_u8, eng), tensor(output_u8, eng)

    query_data = np.empty(product(qkv_sz), np.float32)
    key_data = np.empty(product(qkv_sz), np.float32)
    scale_data = np.full(product(scale_sz), math.sqrt(p.head_size), np.float32)
    mask_data = np.empty(product(mask_sz), np.float32)
    value_data = np.empty(product(qkv_sz), np.float32)
    fill_random(query_data)
    fill_random(key_data)
    fill_random(value_data)
    fill_mask(mask_data, p.seq_len)
    for data in (query_data, key_data, value_data):
        data[:] = data * fill_scale + fill_shift

    write_to_dnnl_tensor(query_data, ts_query)
    write_to_dnnl_tensor(key_data, ts_key)
    write_to_dnnl_tensor(scale_data, ts_scale)
    write_to_dnnl_tensor(mask_data, ts_mask)
    write_to_dnnl_tensor(value_data, ts_value)

    inputs = [ts_query, ts_key, ts_scale, ts_mask, ts_value]
    cp.execute(strm, inputs, [ts_output])
    strm.wait()
    cp.execute(strm, inputs, [ts_output])
    strm.wait()
    return partitions, {t.get_logical_tensor().id: t.numpy() for t in inputs}, ts_output


def test_int8_sdpa_example():
    # the example's defaults are {32, 384, 16, 64}: reduced; stored values 128 +- 8
    # (dequantized to [-2, 2]) so that outputs span several u8 steps
    partitions, data, out = bench_int8_sdpa(ga.EngineKind.cpu, QuantizedSdpaDims(2, 32, 2, 16), 8.0, 128.0)
    assert len(partitions) == 1 and partitions[0].get_kind().startswith("sdpa"), partitions
    q, k, scale, mask, v = (np.asarray(data[i], np.float64) for i in sorted(data))
    quant = lambda x: np.clip(np.rint(x / 0.25 + 128), 0, 255)  # noqa: E731
    deq = lambda x: (x - 128) * 0.25  # noqa: E731
    s = deq(q) @ np.swapaxes(deq(k), -1, -2) / scale[0] + mask
    e = np.exp(s - s.max(-1, keepdims=True))
    want = quant(deq(quant(e / e.sum(-1, keepdims=True))) @ deq(v))
    got = out.numpy().astype(np.float64)
    # as test_sdpa_quantized_example: a value within f32 rounding of a .5 boundary may
    # round either way, one step; a lost zero point or scale moves most outputs
    assert np.abs(got - want).max() <= 1
    assert (got == want).mean() > 0.99
    assert len(np.unique(want)) > 3


# ---------------------------------------------------------------- matmul_sel.cpp
# Not on oneDNN's main branch: examples/graph/matmul_sel.cpp of branch
# gyh/main/select_post (commit 2378e3e01b, 2025-06-16).
def test_matmul_sel_example():
    """``cpu_getting_started_tutorial`` of matmul_sel.cpp, the example's shapes: a
    MatMul whose output is the ``then`` input of a Select (broadcast condition and
    ``else``): 1 partition. The example executes on uninitialised memory; the
    tensors get values here so the result is checked."""
    data_type = dt
    MB1, MB2, M, K, N = 1, 16, 32, 256, 32
    src_dims = [MB1, MB2, M, K]
    wei_dims = [MB1, MB2, K, N]
    sel_cond_dims = [1, 1, M, N]
    sel_src1_dims = [1]
    dst_dims = [MB1, MB2, M, N]

    mm_src_lt = logical_tensor(0, data_type.f32, src_dims, layout_type.strided)
    mm_weight_lt = logical_tensor(1, data_type.f32, wei_dims, layout_type.strided)
    mm_dst_lt = logical_tensor(2, data_type.f32, dst_dims, layout_type.strided)
    matmul = op(0, K_.MatMul, [mm_src_lt, mm_weight_lt], [mm_dst_lt], "mm")

    select_src1_lt = logical_tensor(3, data_type.f32, sel_src1_dims, layout_type.strided)
    select_cond_lt = logical_tensor(4, data_type.boolean, sel_cond_dims, layout_type.strided)
    select_dst_lt = logical_tensor(5, data_type.f32, dst_dims, layout_type.strided)
    sel = op(1, K_.Select, [select_cond_lt, mm_dst_lt, select_src1_lt], [select_dst_lt], "select")

    g = ga.Graph(ga.EngineKind.cpu)
    g.add_op(matmul)
    g.add_op(sel)
    g.finalize()
    partitions = g.get_partitions()
    assert len(partitions) == 1

    alloc = ga.Allocator()
    eng = ga.make_engine_with_allocator(ga.EngineKind.cpu, 0, alloc)
    strm = ga.Stream(eng)
    cp = partitions[0].compile([mm_src_lt, mm_weight_lt, select_cond_lt, select_src1_lt], [select_dst_lt], eng)
    ts_mm_src = tensor(mm_src_lt, eng)
    ts_mm_wei = tensor(mm_weight_lt, eng)
    ts_sel_cond = tensor(select_cond_lt, eng)
    ts_sel_src1 = tensor(select_src1_lt, eng)
    ts_sel_dst = tensor(select_dst_lt, eng)
    rng = np.random.default_rng(3)  # not in the example: values to check
    ts_mm_src.write(rng.integers(-4, 5, src_dims).astype(np.float32))
    ts_mm_wei.write(rng.integers(-4, 5, wei_dims).astype(np.float32))
    ts_sel_cond.write(rng.random(sel_cond_dims) < 0.5)
    ts_sel_src1.write(np.array([-1000.5], np.float32))

    cp.execute(strm, [ts_mm_src, ts_mm_wei, ts_sel_cond, ts_sel_src1], [ts_sel_dst])
    strm.wait()

    prod = ts_mm_src.numpy().astype(np.float64) @ ts_mm_wei.numpy().astype(np.float64)
    want = np.where(ts_sel_cond.numpy(), prod, -1000.5)
    # small integers: every product and partial sum (|sum| <= 256 * 16) is exact in f32
    np.testing.assert_array_equal(ts_sel_dst.numpy(), want)


# ---------------------------------------------------------------- multiple_binary_ops.cpp
# Not on oneDNN's main branch: examples/graph/multiple_binary_ops.cpp of branch
# dev-v3.8-thunk-preview (commit bf0efd64f9, 2025-08-06).
def multi_binary_ops(ekind, dt_):
    """``multi_binary_ops`` of multiple_binary_ops.cpp: a chain of ten Multiply, a
    TypeCast below f32, a MatMul, ten more Multiply and a TypeCast. The example's 22
    ``src_i`` variables are the list ``src`` here, created in the same id order.
    Returns the partitions and, when there is one (the example returns otherwise),
    the inputs and output."""
    alloc = create_allocator(ekind)
    eng = ga.make_engine_with_allocator(ekind, 0, alloc)
    strm = ga.Stream(eng)
    id_ = itertools.count()
    in_sz = [8, 8, 8, 8]
    dt_inter = dt.f32
    opk = K.Multiply

    src = [logical_tensor(next(id_), dt_, in_sz, layout_type.strided) for _ in range(22)]

    def binary(i, lhs, rhs):  # dst_i = logical_tensor(id++ ...); binary_i = op(id++, opk, ...)
        dst_i = logical_tensor(next(id_), dt_inter, in_sz, layout_type.strided)
        binary_i = op(next(id_), opk, f"binary_{i}")
        binary_i.add_inputs([lhs, rhs])
        binary_i.add_outputs([dst_i])
        return dst_i, binary_i

    def typecast(name, x):
        x_dt = x
        tc = op(next(id_), K.TypeCast, name)
        if dt_ != dt_inter:
            x_dt = logical_tensor(next(id_), dt_, in_sz, layout_type.strided)
            tc.add_input(x)
            tc.add_output(x_dt)
        return x_dt, tc

    dst, binaries = src[0], []
    for i in range(10):
        dst, b = binary(i, dst, src[i + 1])
        binaries.append(b)
    dst_9_dt, tc_0 = typecast("tc_0", dst)

    dst_10 = logical_tensor(next(id_), dt_inter, in_sz, layout_type.strided)
    mm = op(next(id_), K.MatMul, "matmul")
    mm.add_inputs([dst_9_dt, src[11]])
    mm.add_outputs([dst_10])

    dst = dst_10
    for i in range(10, 20):
        dst, b = binary(i, dst, src[i + 2])
        binaries.append(b)
    dst_20_dt, tc_1 = typecast("tc_1", dst)

    gh = ga.Graph(ekind)
    for b in binaries[:10]:
        gh.add_op(b)
    if dt_ != dt_inter:
        gh.add_op(tc_0)
    gh.add_op(mm)
    for b in binaries[10:]:
        gh.add_op(b)
    if dt_ != dt_inter:
        gh.add_op(tc_1)
    gh.finalize()

    partitions = gh.get_partitions()
    if len(partitions) != 1:
        return partitions, None, None
    cp = partitions[0].compile(src, [dst_20_dt], eng)
    ts_src = [tensor(s, eng) for s in src]
    ts_dst_20 = tensor(dst_20_dt, eng)
    rng = np.random.default_rng(4)  # not in the example (uninitialised inputs): values to check
    for ts in ts_src:
        ts.write(rng.uniform(0.5, 1.5, in_sz).astype(np.float32))
    cp.execute(strm, ts_src, [ts_dst_20])
    strm.wait()
    return partitions, [ts.numpy() for ts in ts_src], ts_dst_20


@pytest.mark.parametrize("dt_", [dt.f32, dt.f16, dt.bf16], ids=lambda d: d.name)
def test_multiple_binary_ops_example(dt_):
    partitions, x, out = multi_binary_ops(ga.EngineKind.cpu, dt_)
    assert len(partitions) == 1, [(p.get_kind(), sorted(p.get_ops())) for p in partitions]
    if dt_ == dt.f32:
        x = [a.astype(np.float64) for a in x]
        want = math.prod(x[:11]) @ x[11] * math.prod(x[12:])
        # twenty f32 products (each one rounding) and an 8-term dot product of positive
        # values: ~30 ulps at most, inside the scale-aware f32 rule of graph_api.check;
        # a skipped or repeated factor changes outputs by >= 50 %
        verdict = compare(want, out.numpy(), dt.f32)
        assert verdict.ok, verdict.message
        return
    # f16/bf16: the unfused reference rounds at the two TypeCasts as the graph says
    graph = partitions[0].graph
    want = reference_arrays(graph, dict(enumerate(x)))[graph.output_ids[0]]
    verdict = compare(want, out.numpy(), dt_, graph.fpmath, partitions[0].ops)
    assert verdict.ok, verdict.message


# ---------------------------------------------------------------- grouped_matmul.cpp
# Not on oneDNN's main branch: examples/graph/grouped_matmul.cpp of branch
# lvtao/main/gmm-poc (commit 1c4e16adcb, 2026-06-08).
def grouped_matmul(ekind, k=256, n=1024):
    """``grouped_matmul`` of grouped_matmul.cpp: eight independent MatMuls with
    different M in one graph. Returns the partitions, and when there is one (the
    example returns otherwise) the input and output tensors."""
    alloc = create_allocator(ekind)
    eng = ga.make_engine_with_allocator(ekind, 0, alloc)
    strm = ga.Stream(eng)
    num = 8
    m = [10, 20, 30, 40, 50, 60, 70, 80]
    id_ = itertools.count(100)
    src_ids = [0, 1, 2, 3, 4, 5, 6, 7]
    wei_ids = [8, 9, 10, 11, 12, 13, 14, 15]
    dst_ids = [16, 17, 18, 19, 20, 21, 22, 23]
    dt_ = dt.f32

    gmm = ga.Graph(ekind)
    for i in range(num):
        src = logical_tensor(src_ids[i], dt_, [m[i], k], layout_type.strided)
        wei = logical_tensor(wei_ids[i], dt_, [k, n], layout_type.strided)
        dst = logical_tensor(dst_ids[i], dt_, [m[i], n], layout_type.strided)
        mm = op(next(id_), K.MatMul, "mm_" + str(i))
        mm.add_inputs([src, wei])
        mm.add_outputs([dst])
        gmm.add_op(mm)
    gmm.finalize()

    partitions = gmm.get_partitions()
    if len(partitions) != 1:
        return partitions, None, None
    inputs, outputs = [], []
    for i in range(num):
        inputs.append(logical_tensor(src_ids[i], dt_, [m[i], k], layout_type.strided))
        inputs.append(logical_tensor(wei_ids[i], dt_, [k, n], layout_type.strided))
        outputs.append(logical_tensor(dst_ids[i], dt_, [m[i], n], layout_type.strided))
    cp = partitions[0].compile(inputs, outputs, eng)
    ts_inputs = [tensor(lt, eng) for lt in inputs]
    ts_outputs = [tensor(lt, eng) for lt in outputs]
    rng = np.random.default_rng(5)  # not in the example (uninitialised inputs): values to check
    for ts in ts_inputs:
        ts.write(rng.integers(-4, 5, ts.get_logical_tensor().get_dims()).astype(np.float32))
    cp.execute(strm, ts_inputs, ts_outputs)
    strm.wait()
    return partitions, ts_inputs, ts_outputs


def test_grouped_matmul_example():
    partitions, ts_inputs, ts_outputs = grouped_matmul(ga.EngineKind.cpu, k=64, n=96)  # k 256, n 1024: reduced
    assert len(partitions) == 1, [(p.get_kind(), sorted(p.get_ops())) for p in partitions]
    for i, ts_dst in enumerate(ts_outputs):
        a, b = (t.numpy().astype(np.float64) for t in ts_inputs[2 * i:2 * i + 2])
        # small integers: every product and partial sum (|sum| <= 64 * 16) is exact in f32
        np.testing.assert_array_equal(ts_dst.numpy(), a @ b)


def test_grouped_matmul_graph_is_one_grouped_partition_in_the_examples_loop():
    """The grouped_matmul.cpp graph is one ``grouped_matmul`` partition (the gmm-poc
    branch's group pass), run with the examples' loop (shapes known only at compile)."""
    graph = ga.Graph(ga.EngineKind.cpu)
    m, k, n = [10, 20, 30, 40, 50, 60, 70, 80], 64, 96
    for i in range(8):
        graph.add_op(op(100 + i, K.MatMul, [logical_tensor(i, dt.f32, [m[i], k], layout_type.strided),
                                            logical_tensor(8 + i, dt.f32, [k, n], layout_type.strided)],
                        [logical_tensor(16 + i, dt.f32, [m[i], n], layout_type.strided)], f"mm_{i}"))
    graph.finalize()
    assert [(p.get_kind(), sorted(p.get_ops())) for p in graph.get_partitions()] == \
        [("grouped_matmul", [100 + i for i in range(8)])]
    rng = np.random.default_rng(5)
    shapes = {**{i: [m[i], k] for i in range(8)}, **{8 + i: [k, n] for i in range(8)}}
    data = {i: rng.integers(-4, 5, s).astype(np.float32) for i, s in shapes.items()}
    tensors = _run_like_the_example(graph, shapes, data)
    for i in range(8):
        # small integers: exact in f32, as above
        np.testing.assert_array_equal(tensors[16 + i].numpy(), data[i].astype(np.float64) @ data[8 + i])


# ---------------------------------------------------------------- sdpa_dynamic_quantized.cpp
# Not on oneDNN's main branch: examples/graph/sdpa_dynamic_quantized.cpp (stored commit
# aaaf1e3d87), using the ``mask`` attribute of DynamicQuantize/DynamicDequantize that
# branch lvtao/main/quant-mask adds (commit 58549a26d7, 2026-08-18).
def bench_dynamic_quantized_sdpa(ekind, dt_, p: QuantizedSdpaDims):
    """``bench_quantized_sdpa`` of sdpa_dynamic_quantized.cpp: f8_e4m3 Q/K/V
    dequantized with [mb, head_num] scale tensors selected by ``mask = 3`` (dims 0
    and 1), probabilities dynamically quantized and dequantized, a bf16 output."""
    data_type = dt
    alloc = create_allocator(ekind)
    eng = ga.make_engine_with_allocator(ekind, 0, alloc)
    strm = ga.Stream(eng)
    qkv_sz = [p.mb, p.head_num, p.seq_len, p.head_size]
    score_sz = [p.mb, p.head_num, p.seq_len, p.seq_len]
    scale_sz = [1]
    mask_sz = [p.mb, 1, 1, p.seq_len]
    qkv_scales_sz = [p.mb, p.head_num]
    id_ = itertools.count()

    q_x8 = logical_tensor(next(id_), dt_, qkv_sz, layout_type.strided)
    q_scales = logical_tensor(next(id_), data_type.f32, qkv_scales_sz, layout_type.strided)
    q_f32 = logical_tensor(next(id_), data_type.f32, qkv_sz, layout_type.strided)
    q_deq = op(next(id_), K.DynamicDequantize, "q_deq")
    q_deq.set_attr(ga.OpAttr.mask, 3)  # the branch's new attribute: scales vary on dims 0 and 1
    q_deq.add_inputs([q_x8, q_scales])
    q_deq.add_output(q_f32)

    k_x8 = logical_tensor(next(id_), dt_, qkv_sz, layout_type.strided)
    k_scales = logical_tensor(next(id_), data_type.f32, qkv_scales_sz, layout_type.strided)
    k_f32 = logical_tensor(next(id_), data_type.f32, qkv_sz, layout_type.strided)
    k_deq = op(next(id_), K.DynamicDequantize, "k_deq")
    k_deq.set_attr("mask", 3)
    k_deq.add_inputs([k_x8, k_scales])
    k_deq.add_output(k_f32)

    score = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    bmm1 = op(next(id_), K.MatMul, "bmm1")
    bmm1.set_attr(ga.OpAttr.transpose_b, True)
    bmm1.add_inputs([q_f32, k_f32])
    bmm1.add_output(score)

    scale = logical_tensor(next(id_), data_type.f32, scale_sz, layout_type.strided)
    scaled_score = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    scale_div = op(next(id_), K.Divide, "scale_div")
    scale_div.add_inputs([score, scale])
    scale_div.add_outputs([scaled_score])

    mask = logical_tensor(next(id_), data_type.f32, mask_sz, layout_type.strided)
    masked_score = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    mask_add = op(next(id_), K.Add, "mask_add")
    mask_add.add_inputs([scaled_score, mask])
    mask_add.add_outputs([masked_score])

    probs = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    softmax = op(next(id_), K.SoftMax, "softmax")
    softmax.set_attr(ga.OpAttr.axis, -1)
    softmax.set_attr(ga.OpAttr.mode, "inf_as_zero")
    softmax.add_inputs([masked_score])
    softmax.add_outputs([probs])

    p_quant_scales = logical_tensor(next(id_), data_type.f32, scale_sz, layout_type.strided)
    probs_x8 = logical_tensor(next(id_), dt_, score_sz, layout_type.strided)
    p_quant = op(next(id_), K.DynamicQuantize, "p_quant")
    p_quant.set_attr(ga.OpAttr.qtype, "per_tensor")
    p_quant.add_inputs([probs, p_quant_scales])
    p_quant.add_output(probs_x8)

    p_deq_scales = logical_tensor(next(id_), data_type.f32, scale_sz, layout_type.strided)
    probs_f32 = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    p_deq = op(next(id_), K.DynamicDequantize, "p_deq")
    p_deq.set_attr(ga.OpAttr.qtype, "per_tensor")
    p_deq.add_inputs([probs_x8, p_deq_scales])
    p_deq.add_output(probs_f32)

    v_x8 = logical_tensor(next(id_), dt_, qkv_sz, layout_type.strided)
    v_scales = logical_tensor(next(id_), data_type.f32, qkv_scales_sz, layout_type.strided)
    v_f32 = logical_tensor(next(id_), data_type.f32, qkv_sz, layout_type.strided)
    v_deq = op(next(id_), K.DynamicDequantize, "v_deq")
    v_deq.set_attr("mask", 3)
    v_deq.add_inputs([v_x8, v_scales])
    v_deq.add_output(v_f32)

    output_f32 = logical_tensor(next(id_), data_type.f32, qkv_sz, layout_type.strided)
    bmm2 = op(next(id_), K.MatMul, "bmm2")
    bmm2.add_inputs([probs_f32, v_f32])
    bmm2.add_outputs([output_f32])

    output = logical_tensor(next(id_), data_type.bf16, qkv_sz, layout_type.strided)
    tc = op(next(id_), K.TypeCast, "typecast")
    tc.add_input(output_f32)
    tc.add_output(output)

    sdpa = ga.Graph(ekind)
    for o in (q_deq, k_deq, bmm1, scale_div, mask_add, softmax, p_quant, p_deq, v_deq, bmm2, tc):
        sdpa.add_op(o)
    sdpa.finalize()

    partitions = sdpa.get_partitions()
    if len(partitions) != 1:
        return partitions, None, None
    inputs_lt = [q_x8, q_scales, k_x8, k_scales, scale, mask, p_quant_scales, p_deq_scales, v_x8, v_scales]
    cp = partitions[0].compile(inputs_lt, [output], eng)
    ts_inputs = [tensor(lt, eng) for lt in inputs_lt]
    (ts_query, ts_q_scales, ts_key, ts_k_scales, ts_scale, ts_mask, ts_p_quant_scales, ts_p_deq_scales,
     ts_value, ts_v_scales) = ts_inputs
    ts_output = tensor(output, eng)

    query_data = np.empty(product(qkv_sz), np.float32)
    key_data = np.empty(product(qkv_sz), np.float32)
    qkv_scales_data = np.full(product(qkv_scales_sz), 0.25, np.float32)
    scale_data = np.full(product(scale_sz), math.sqrt(p.head_size), np.float32)
    mask_data = np.empty(product(mask_sz), np.float32)
    pt_scales_data = np.full(product(scale_sz), 0.25, np.float32)
    value_data = np.empty(product(qkv_sz), np.float32)
    fill_random(query_data)
    fill_random(key_data)
    fill_random(value_data)
    fill_mask(mask_data, p.seq_len)

    write_to_dnnl_tensor(query_data, ts_query)
    write_to_dnnl_tensor(qkv_scales_data, ts_q_scales)
    write_to_dnnl_tensor(key_data, ts_key)
    write_to_dnnl_tensor(qkv_scales_data, ts_k_scales)
    write_to_dnnl_tensor(scale_data, ts_scale)
    write_to_dnnl_tensor(mask_data, ts_mask)
    write_to_dnnl_tensor(pt_scales_data, ts_p_quant_scales)
    write_to_dnnl_tensor(pt_scales_data, ts_p_deq_scales)
    write_to_dnnl_tensor(value_data, ts_value)
    write_to_dnnl_tensor(qkv_scales_data, ts_v_scales)

    cp.execute(strm, ts_inputs, [ts_output])
    strm.wait()
    return partitions, {t.get_logical_tensor().id: t.numpy() for t in ts_inputs}, ts_output


def test_sdpa_dynamic_quantized_example():
    # the example's defaults are {2, 128, 16, 64}: reduced
    p = QuantizedSdpaDims(2, 32, 2, 16)
    partitions, data, out = bench_dynamic_quantized_sdpa(ga.EngineKind.cpu, dt.f8_e4m3, p)
    assert len(partitions) == 1 and partitions[0].get_kind().startswith("sdpa"), partitions
    (q, q_scales, k, k_scales, scale, mask, pq_scale, pd_scale, v, v_scales) = (
        np.asarray(data[i], np.float64) for i in sorted(data))
    per_head = lambda x, s: x * s[:, :, None, None]  # noqa: E731  (mask 3: dims 0 and 1)
    f8 = _QUANTIZE_F64[dt.f8_e4m3]
    s = per_head(q, q_scales) @ np.swapaxes(per_head(k, k_scales), -1, -2) / scale[0] + mask
    e = np.exp(s - s.max(-1, keepdims=True))
    probs = f8(e / e.sum(-1, keepdims=True) / pq_scale[0]) * pd_scale[0]
    want = probs @ per_head(v, v_scales)
    # one f8 step of the probabilities may differ where f32 and float64 round differently;
    # the bf16 output adds one bf16 rounding: the rule of graph_api.check for bf16
    verdict = compare(want, out.numpy(), dt.bf16)
    assert verdict.ok, verdict.message


# ---------------------------------------------------------------- fp8_sdpa.cpp
# Not on oneDNN's main branch: examples/graph/fp8_sdpa.cpp of branch
# lvtao/v3.11.2/fp8-sdpa (commit 63c4738123, 2026-04-08).
def bench_fp8_sdpa(ekind, dt_, p: QuantizedSdpaDims):
    """``bench_fp8_sdpa`` of fp8_sdpa.cpp: sdpa_quantized.cpp's graph (which it
    preceded) with the scales set as one float, ``set_attr<float>(scales, 0.25f)``."""
    data_type = dt
    alloc = create_allocator(ekind)
    eng = ga.make_engine_with_allocator(ekind, 0, alloc)
    strm = ga.Stream(eng)
    qkv_sz = [p.mb, p.head_num, p.seq_len, p.head_size]
    score_sz = [p.mb, p.head_num, p.seq_len, p.seq_len]
    scale_sz = [1]
    mask_sz = [p.mb, 1, 1, p.seq_len]
    id_ = itertools.count()

    q_fp8 = logical_tensor(next(id_), dt_, qkv_sz, layout_type.strided)
    q_f32 = logical_tensor(next(id_), data_type.f32, qkv_sz, layout_type.strided)
    q_deq = op(next(id_), K.Dequantize, "q_deq")
    q_deq.set_attr(ga.OpAttr.qtype, "per_tensor")
    q_deq.set_attr(ga.OpAttr.scales, 0.25)
    q_deq.add_input(q_fp8)
    q_deq.add_output(q_f32)

    k_fp8 = logical_tensor(next(id_), dt_, qkv_sz, layout_type.strided)
    k_f32 = logical_tensor(next(id_), data_type.f32, qkv_sz, layout_type.strided)
    k_deq = op(next(id_), K.Dequantize, "k_deq")
    k_deq.set_attr(ga.OpAttr.qtype, "per_tensor")
    k_deq.set_attr(ga.OpAttr.scales, 0.25)
    k_deq.add_input(k_fp8)
    k_deq.add_output(k_f32)

    score = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    bmm1 = op(next(id_), K.MatMul, "bmm1")
    bmm1.set_attr(ga.OpAttr.transpose_b, True)
    bmm1.add_inputs([q_f32, k_f32])
    bmm1.add_output(score)

    scale = logical_tensor(next(id_), data_type.f32, scale_sz, layout_type.strided)
    scaled_score = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    scale_div = op(next(id_), K.Divide, "scale_div")
    scale_div.add_inputs([score, scale])
    scale_div.add_outputs([scaled_score])

    mask = logical_tensor(next(id_), data_type.f32, mask_sz, layout_type.strided)
    masked_score = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    mask_add = op(next(id_), K.Add, "mask_add")
    mask_add.add_inputs([scaled_score, mask])
    mask_add.add_outputs([masked_score])

    probs = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    softmax = op(next(id_), K.SoftMax, "softmax")
    softmax.set_attr(ga.OpAttr.axis, -1)
    softmax.set_attr(ga.OpAttr.mode, "inf_as_zero")
    softmax.add_inputs([masked_score])
    softmax.add_outputs([probs])

    probs_fp8 = logical_tensor(next(id_), dt_, score_sz, layout_type.strided)
    p_quant = op(next(id_), K.Quantize, "p_quant")
    p_quant.set_attr(ga.OpAttr.qtype, "per_tensor")
    p_quant.set_attr(ga.OpAttr.scales, 0.25)
    p_quant.add_input(probs)
    p_quant.add_output(probs_fp8)

    probs_f32 = logical_tensor(next(id_), data_type.f32, score_sz, layout_type.strided)
    p_deq = op(next(id_), K.Dequantize, "p_deq")
    p_deq.set_attr(ga.OpAttr.qtype, "per_tensor")
    p_deq.set_attr(ga.OpAttr.scales, 0.25)
    p_deq.add_input(probs_fp8)
    p_deq.add_output(probs_f32)

    v_fp8 = logical_tensor(next(id_), dt_, qkv_sz, layout_type.strided)
    v_f32 = logical_tensor(next(id_), data_type.f32, qkv_sz, layout_type.strided)
    v_deq = op(next(id_), K.Dequantize, "v_deq")
    v_deq.set_attr(ga.OpAttr.qtype, "per_tensor")
    v_deq.set_attr(ga.OpAttr.scales, 0.25)
    v_deq.add_input(v_fp8)
    v_deq.add_output(v_f32)

    output = logical_tensor(next(id_), data_type.f32, qkv_sz, layout_type.strided)
    bmm2 = op(next(id_), K.MatMul, "bmm2")
    bmm2.add_inputs([probs_f32, v_f32])
    bmm2.add_outputs([output])

    output_fp8 = logical_tensor(next(id_), dt_, qkv_sz, layout_type.strided)
    o_quant = op(next(id_), K.Quantize, "o_quant")
    o_quant.set_attr(ga.OpAttr.qtype, "per_tensor")
    o_quant.set_attr(ga.OpAttr.scales, 0.25)
    o_quant.add_input(output)
    o_quant.add_output(output_fp8)

    sdpa = ga.Graph(ekind)
    for o in (q_deq, k_deq, bmm1, scale_div, mask_add, softmax, p_quant, p_deq, v_deq, bmm2, o_quant):
        sdpa.add_op(o)
    sdpa.finalize()

    partitions = sdpa.get_partitions()
    if len(partitions) != 1:
        return partitions, None, None
    cp = partitions[0].compile([q_fp8, k_fp8, scale, mask, v_fp8], [output_fp8], eng)

    ts_query, ts_key, ts_scale = tensor(q_fp8, eng), tensor(k_fp8, eng), tensor(scale, eng)
    ts_mask, ts_value, ts_output = tensor(mask, eng), tensor(v_fp8, eng), tensor(output_fp8, eng)

    query_data = np.empty(product(qkv_sz), np.float32)
    key_data = np.empty(product(qkv_sz), np.float32)
    scale_data = np.full(product(scale_sz), math.sqrt(p.head_size), np.float32)
    mask_data = np.empty(product(mask_sz), np.float32)
    value_data = np.empty(product(qkv_sz), np.float32)
    fill_random(query_data)
    fill_random(key_data)
    fill_random(value_data)
    fill_mask(mask_data, p.seq_len)

    write_to_dnnl_tensor(query_data, ts_query)
    write_to_dnnl_tensor(key_data, ts_key)
    write_to_dnnl_tensor(scale_data, ts_scale)
    write_to_dnnl_tensor(mask_data, ts_mask)
    write_to_dnnl_tensor(value_data, ts_value)

    inputs = [ts_query, ts_key, ts_scale, ts_mask, ts_value]
    cp.execute(strm, inputs, [ts_output])
    strm.wait()
    cp.execute(strm, inputs, [ts_output])
    strm.wait()
    return partitions, {t.get_logical_tensor().id: t.numpy() for t in inputs}, ts_output


def test_fp8_sdpa_example():
    # the example's defaults are {2, 128, 16, 64}; it runs f8_e4m3 only. The same graph and
    # check as test_sdpa_quantized_example[f8_e4m3], with the scalar scales spelling
    p = QuantizedSdpaDims(2, 32, 2, 16)
    partitions, data, out = bench_fp8_sdpa(ga.EngineKind.cpu, dt.f8_e4m3, p)
    assert len(partitions) == 1 and partitions[0].get_kind().startswith("sdpa"), partitions
    assert partitions[0].ops[0].attrs["scales"] == [0.25]  # the scalar stored as a list, as oneDNN does
    _check_quantized_sdpa(data, out, dt.f8_e4m3)


# ---------------------------------------------------------------- sdpa_training.cpp
# Not on oneDNN's main branch: examples/graph/sdpa_training.cpp of debug branch
# yixin/sdpa-training-impl-debug (stored commit ec3ef44436), which gqa_training.cpp succeeded.
def bench_sdpa_training(ekind, dt_, p: SdpaDims):
    """``bench_sdpa`` of sdpa_training.cpp: the forward (SoftMax with stats), then a
    backward graph with SoftMaxBackward whose logical tensors get new ids
    (``query_b``, ...) but which is executed with the forward's tensors."""
    alloc = create_allocator(ekind)
    eng = ga.make_engine_with_allocator(ekind, 0, alloc)
    strm = ga.Stream(eng)
    qv_sz = [p.mb, p.head_num, p.query_num, p.head_size]
    k_sz = [p.mb, p.head_num, p.seq_len, p.head_size]
    score_sz = [p.mb, p.head_num, p.seq_len, p.seq_len]
    stats_sz = [p.mb, p.head_num, p.seq_len, 1]
    scale_sz = [1]
    mask_sz = [p.mb, p.head_num, p.seq_len, p.seq_len]
    id_ = itertools.count()
    dt_inter = dt.f32

    query = logical_tensor(next(id_), dt_, qv_sz, layout_type.strided)
    key = logical_tensor(next(id_), dt_, k_sz, layout_type.strided)
    score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    bmm1 = op(next(id_), K.MatMul, "bmm1")
    bmm1.set_attr(ga.OpAttr.transpose_b, True)
    bmm1.add_inputs([query, key])
    bmm1.add_outputs([score])
    scale = logical_tensor(next(id_), dt_inter, scale_sz, layout_type.strided)
    scaled_score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    scale_div = op(next(id_), K.Divide, "scale_div")
    scale_div.add_inputs([score, scale])
    scale_div.add_outputs([scaled_score])
    mask = logical_tensor(next(id_), dt_inter, mask_sz, layout_type.strided)
    masked_score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    mask_add = op(next(id_), K.Add, "mask_add")
    mask_add.add_inputs([scaled_score, mask])
    mask_add.add_outputs([masked_score])
    probs = logical_tensor(next(id_), dt_, score_sz, layout_type.strided)
    stats = logical_tensor(next(id_), dt_inter, stats_sz, layout_type.strided)
    softmax = op(next(id_), K.SoftMax, "softmax")
    softmax.set_attr(ga.OpAttr.axis, -1)
    softmax.set_attr(ga.OpAttr.mode, "inf_as_zero")
    softmax.add_inputs([masked_score])
    softmax.add_outputs([probs])
    softmax.add_outputs([stats])
    value = logical_tensor(next(id_), dt_, k_sz, layout_type.strided)
    output = logical_tensor(next(id_), dt_, qv_sz, layout_type.strided)
    bmm2 = op(next(id_), K.MatMul, "bmm2")
    bmm2.add_inputs([probs, value])
    bmm2.add_outputs([output])

    sdpa = ga.Graph(ekind)
    for o in (bmm1, scale_div, mask_add, softmax, bmm2):
        sdpa.add_op(o)
    sdpa.finalize()
    partitions = sdpa.get_partitions()
    if len(partitions) != 1:
        return partitions, None
    cp = partitions[0].compile([query, key, scale, mask, value], [output, stats], eng)
    ts_query, ts_key, ts_scale = tensor(query, eng), tensor(key, eng), tensor(scale, eng)
    ts_mask, ts_value = tensor(mask, eng), tensor(value, eng)
    ts_output, ts_stats = tensor(output, eng), tensor(stats, eng)
    query_data = np.empty(product(qv_sz), np.float32)
    key_data = np.empty(product(k_sz), np.float32)
    scale_data = np.full(product(scale_sz), math.sqrt(p.head_size), np.float32)
    mask_data = np.empty(product(mask_sz), np.float32)
    value_data = np.empty(product(k_sz), np.float32)
    fill_random(query_data)
    fill_random(key_data)
    fill_random(value_data)
    fill_mask(mask_data, p.seq_len)
    write_to_dnnl_tensor(query_data, ts_query)
    write_to_dnnl_tensor(key_data, ts_key)
    write_to_dnnl_tensor(scale_data, ts_scale)
    write_to_dnnl_tensor(mask_data, ts_mask)
    write_to_dnnl_tensor(value_data, ts_value)
    cp.execute(strm, [ts_query, ts_key, ts_scale, ts_mask, ts_value], [ts_output, ts_stats])
    strm.wait()

    query_b = logical_tensor(next(id_), dt_, qv_sz, layout_type.strided)
    key_b = logical_tensor(next(id_), dt_, k_sz, layout_type.strided)
    score_b = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    bmm1_b = op(next(id_), K.MatMul, "bmm1")
    bmm1_b.set_attr(ga.OpAttr.transpose_b, True)
    bmm1_b.add_inputs([query_b, key_b])
    bmm1_b.add_outputs([score_b])
    scale_b = logical_tensor(next(id_), dt_inter, scale_sz, layout_type.strided)
    scaled_score_b = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    scale_div_b = op(next(id_), K.Divide, "scale_div")
    scale_div_b.add_inputs([score_b, scale_b])
    scale_div_b.add_outputs([scaled_score_b])
    mask_b = logical_tensor(next(id_), dt_inter, mask_sz, layout_type.strided)
    masked_score_b = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    mask_add_b = op(next(id_), K.Add, "mask_add")
    mask_add_b.add_inputs([scaled_score_b, mask_b])
    mask_add_b.add_outputs([masked_score_b])
    stats_b = logical_tensor(next(id_), dt_inter, stats_sz, layout_type.strided)
    sub_out_b = logical_tensor(next(id_), dt_, score_sz, layout_type.strided)
    subtract_b = op(next(id_), K.Subtract, "subtract")
    subtract_b.add_inputs([masked_score_b, stats_b])
    subtract_b.add_outputs([sub_out_b])
    probs_b = logical_tensor(next(id_), dt_, score_sz, layout_type.strided)
    exp_b = op(next(id_), K.Exp, "exp")
    exp_b.add_inputs([sub_out_b])
    exp_b.add_outputs([probs_b])
    doutput = logical_tensor(next(id_), dt_, qv_sz, layout_type.strided)
    dvalue = logical_tensor(next(id_), dt_, k_sz, layout_type.strided)
    bmm_p_do = op(next(id_), K.MatMul, "bmm1")
    bmm_p_do.set_attr(ga.OpAttr.transpose_a, True)
    bmm_p_do.add_inputs([probs_b, doutput])
    bmm_p_do.add_outputs([dvalue])
    value_b = logical_tensor(next(id_), dt_, k_sz, layout_type.strided)
    dprobs = logical_tensor(next(id_), dt_, score_sz, layout_type.strided)
    bmm_do_v = op(next(id_), K.MatMul, "bmm2")
    bmm_do_v.set_attr(ga.OpAttr.transpose_b, True)
    bmm_do_v.add_inputs([doutput, value_b])
    bmm_do_v.add_outputs([dprobs])
    dmasked_score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    softmax_grad = op(next(id_), K.SoftMaxBackward, "softmax_bwd")
    softmax_grad.set_attr(ga.OpAttr.axis, -1)
    softmax_grad.add_inputs([dprobs, probs_b])
    softmax_grad.add_outputs([dmasked_score])
    dscaled_score = logical_tensor(next(id_), dt_inter, score_sz, layout_type.strided)
    scale_div_b2 = op(next(id_), K.Divide, "scale_div")
    scale_div_b2.add_inputs([dmasked_score, scale_b])
    scale_div_b2.add_outputs([dscaled_score])
    dquery = logical_tensor(next(id_), dt_, qv_sz, layout_type.strided)
    bmm_dscaled_score_k = op(next(id_), K.MatMul, "bmm3")
    bmm_dscaled_score_k.add_inputs([dscaled_score, key_b])
    bmm_dscaled_score_k.add_outputs([dquery])
    dkey = logical_tensor(next(id_), dt_, k_sz, layout_type.strided)
    bmm_dscaled_score_q = op(next(id_), K.MatMul, "bmm4")
    bmm_dscaled_score_q.set_attr(ga.OpAttr.transpose_a, True)
    bmm_dscaled_score_q.add_inputs([dscaled_score, query_b])
    bmm_dscaled_score_q.add_outputs([dkey])

    sdpa_bwd = ga.Graph(ekind)
    for o in (bmm1_b, scale_div_b, mask_add_b, subtract_b, exp_b, bmm_p_do, bmm_do_v, softmax_grad,
              scale_div_b2, bmm_dscaled_score_k, bmm_dscaled_score_q):
        sdpa_bwd.add_op(o)
    sdpa_bwd.finalize()
    partitions_b = sdpa_bwd.get_partitions()
    if len(partitions_b) != 1:
        return (partitions, partitions_b), None
    cp_b = partitions_b[0].compile([query_b, key_b, scale_b, mask_b, value_b, output, stats_b, doutput],
                                   [dquery, dkey, dvalue], eng)
    ts_doutput, ts_dquery = tensor(doutput, eng), tensor(dquery, eng)
    ts_dkey, ts_dvalue = tensor(dkey, eng), tensor(dvalue, eng)
    doutput_data = np.empty(product(qv_sz), np.float32)
    fill_random(doutput_data)
    write_to_dnnl_tensor(doutput_data, ts_doutput)
    cp_b.execute(strm, [ts_query, ts_key, ts_scale, ts_mask, ts_value, ts_output, ts_stats, ts_doutput],
                 [ts_dquery, ts_dkey, ts_dvalue])
    strm.wait()
    return (partitions, partitions_b), (ts_dquery, ts_dkey, ts_dvalue)


@pytest.mark.xfail(strict=True, reason=(
    "the backward graph with SoftMaxBackward (dprobs, probs) in place of gqa_training's "
    "Multiply/ReduceSum/Subtract/Multiply is not an sdpa_backward pattern: it splits into 7 "
    "partitions (MatMul..Exp, then single ops); were it one, the example's execute still passes "
    "the forward's tensors (ids of query, key, ...) for query_b, key_b, ... and this API matches "
    "tensors to ports by id, not by position"))
def test_sdpa_training_example():
    p = SdpaDims(2, 16, 2, 16, 16)  # the example's defaults are {32, 384, 16, 64, 384}: reduced
    (partitions, partitions_b), grads = bench_sdpa_training(ga.EngineKind.cpu, dt.f32, p)
    assert [pp.get_kind() for pp in partitions] == ["sdpa"]
    assert len(partitions_b) == 1, partitions_b
    assert grads is not None

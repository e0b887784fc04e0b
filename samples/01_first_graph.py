"""First graph: MatMul -> Add -> SoftMax, and an int4 weight-compressed MatMul.

Builds two graphs with the public API, partitions, compiles and executes them,
and prints the max error against a float64 numpy computation of the same math.

    python -m samples 01_first_graph
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

import graph_api as ga
from graph_api import DataType as dt
from samples import gallery


def attention_scores(m: int, k: int, n: int, rng) -> float:
    """scores = softmax(x @ w + bias_mask, axis=-1)."""
    x_lt = ga.LogicalTensor(0, dt.f32, [m, k])
    w_lt = ga.LogicalTensor(1, dt.f32, [k, n])
    mm_lt = ga.LogicalTensor(2, dt.f32, [m, n])
    mask_lt = ga.LogicalTensor(3, dt.f32, [1, n])
    add_lt = ga.LogicalTensor(4, dt.f32, [m, n])
    out_lt = ga.LogicalTensor(5, dt.f32, [m, n])

    graph = ga.Graph(ga.EngineKind.cpu)
    graph.add_op(ga.Op(0, ga.OpKind.MatMul, [x_lt, w_lt], [mm_lt], "matmul"))
    graph.add_op(ga.Op(1, ga.OpKind.Add, [mm_lt, mask_lt], [add_lt], "mask"))
    graph.add_op(ga.Op(2, ga.OpKind.SoftMax, [add_lt], [out_lt], "softmax", {"axis": -1}))
    graph.finalize()
    print(graph)

    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32) / np.sqrt(k)
    mask = np.where(np.arange(n) % 7 == 0, -1e4, 0).astype(np.float32)[None, :]
    result = ga.run_graph(graph, {0: x, 1: w, 3: mask})
    gallery.graph("MatMul -> Add -> SoftMax", graph, result.partitions)

    logits = x.astype(np.float64) @ w.astype(np.float64) + mask
    e = np.exp(logits - logits.max(-1, keepdims=True))
    expected = e / e.sum(-1, keepdims=True)
    return float(np.abs(result.outputs[5] - expected).max())


def int4_matmul(m: int, k: int, n: int, group: int, rng) -> float:
    """y = x @ dequantize(w_s4, per-group scales), weights stored packed [N, K]."""
    w_q = rng.integers(-8, 8, size=(n, k)).astype(ml_dtypes.int4)
    scales = (rng.random((n, k // group)) * 0.02 + 0.01).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)

    wq_lt = ga.LogicalTensor(10, dt.s4, [n, k], property=ga.PropertyType.constant)
    sc_lt = ga.LogicalTensor(11, dt.f32, [n, k // group], property=ga.PropertyType.constant)
    wf_lt = ga.LogicalTensor(12, dt.f32, [n, k])
    x_lt = ga.LogicalTensor(13, dt.f32, [m, k])
    y_lt = ga.LogicalTensor(14, dt.f32, [m, n])
    graph = ga.Graph(ga.EngineKind.cpu)
    graph.add_op(ga.Op(0, ga.OpKind.DynamicDequantize, [wq_lt, sc_lt], [wf_lt], "dequant_w",
                       {"qtype": "per_group", "group_shape": [1, group], "axis": 1}))
    graph.add_op(ga.Op(1, ga.OpKind.MatMul, [x_lt, wf_lt], [y_lt], "matmul", {"transpose_b": True}))
    graph.finalize()

    engine, stream = ga.Engine(ga.EngineKind.cpu), None
    stream = ga.Stream(engine)
    tensors = {10: ga.Tensor(wq_lt, engine, w_q), 11: ga.Tensor(sc_lt, engine, scales),
               13: ga.Tensor(x_lt, engine, x)}
    print(f"  int4 weights: {tensors[10].get_data_handle().nbytes} bytes packed for {n * k} values")
    kernels = {}
    for part in graph.get_partitions():
        inputs = part.get_input_ports()
        compiled = part.compile(inputs, part.get_output_ports(), engine)
        outs = [ga.Tensor(compiled.query_logical_tensor(lt.id), engine) for lt in part.get_output_ports()]
        compiled.execute(stream, [tensors[lt.id] for lt in inputs], outs)
        tensors.update({t.get_logical_tensor().id: t for t in outs})
        kernels[part.get_id()] = compiled.plan.name
    gallery.graph("int4 DynamicDequantize -> MatMul", graph, graph.get_partitions(), kernels)

    w = w_q.astype(np.float64) * np.repeat(scales.astype(np.float64), group, axis=1)
    expected = x.astype(np.float64) @ w.T
    return float(np.abs(tensors[14].numpy() - expected).max() / np.abs(expected).max())


def main(small: bool = False) -> None:
    rng = np.random.default_rng(0)
    m, k, n = (4, 64, 48) if small else (64, 1024, 512)
    # f32 results vs float64: a few f32 ulps of the O(1) probabilities / outputs
    gallery.error("MatMul -> Add -> SoftMax, max abs vs numpy f64", attention_scores(m, k, n, rng), 1e-5)
    gallery.error("int4 DynamicDequantize -> MatMul, max rel vs numpy f64", int4_matmul(m, k, n, 32, rng), 1e-5)


if __name__ == "__main__":
    main()

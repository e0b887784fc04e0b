"""A CNN block: Convolution -> BatchNormInference -> ReLU -> MaxPool.

The partitioner gives oneDNN's two partitions: ``conv_post_ops`` (the
BatchNorm folded into the convolution's weights and bias, the ReLU applied
on each image's output block) and the MaxPool alone.  The result is checked
against a float64 numpy computation of the same math, written independently.

    python -m samples 12_cnn_block
"""
from __future__ import annotations

import time

import numpy as np

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from samples import gallery

CONST = ga.PropertyType.constant


def build(n: int, c: int, hw: int, oc: int) -> ga.Graph:
    lt = ga.LogicalTensor
    x, w, b = lt(0, dt.f32, [n, c, hw, hw]), lt(1, dt.f32, [oc, c, 3, 3], property=CONST), \
        lt(2, dt.f32, [oc], property=CONST)
    bn_params = [lt(i, dt.f32, [oc], property=CONST) for i in (3, 4, 5, 6)]  # gamma beta mean var
    conv_out, bn_out, relu_out, pool_out = lt(7, dt.f32), lt(8, dt.f32), lt(9, dt.f32), lt(10, dt.f32)
    g = ga.Graph(ga.EngineKind.cpu)
    g.add_op(ga.Op(0, K.Convolution, [x, w, b], [conv_out], "conv", {
        "strides": [1, 1], "pads_begin": [1, 1], "pads_end": [1, 1], "dilations": [1, 1],
        "groups": 1, "data_format": "NCX", "weights_format": "OIX"}))
    g.add_op(ga.Op(1, K.BatchNormInference, [conv_out] + bn_params, [bn_out], "bn",
                   {"epsilon": 1e-5, "data_format": "NCX"}))
    g.add_op(ga.Op(2, K.ReLU, [bn_out], [relu_out], "relu"))
    g.add_op(ga.Op(3, K.MaxPool, [relu_out], [pool_out], "pool", {
        "kernel": [3, 3], "strides": [2, 2], "pads_begin": [1, 1], "pads_end": [1, 1],
        "data_format": "NCX"}))
    g.finalize()
    return g


def numpy_block(x, w, b, gamma, beta, mean, var):
    """The same block in float64: conv as a sum over the 9 taps, then BN, ReLU, 3x3/2 max."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, _, hw, _ = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    y = sum(np.einsum("nchw,oc->nohw", xp[:, :, i:i + hw, j:j + hw], w[:, :, i, j])
            for i in range(3) for j in range(3))
    col = lambda v: v.astype(np.float64).reshape(1, -1, 1, 1)  # noqa: E731
    y = col(gamma) * (y + col(b) - col(mean)) / np.sqrt(col(var) + np.float32(1e-5)) + col(beta)
    y = np.pad(np.maximum(y, 0), ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    out = (hw + 2 - 3) // 2 + 1
    return np.max([y[:, :, i:i + 2 * out - 1:2, j:j + 2 * out - 1:2]
                   for i in range(3) for j in range(3)], axis=0)


def main(small: bool = False) -> None:
    n, c, hw, oc = (1, 8, 16, 8) if small else (8, 64, 56, 64)
    rng = np.random.default_rng(0)
    graph = build(n, c, hw, oc)
    feeds = {0: rng.standard_normal((n, c, hw, hw)).astype(np.float32),
             1: (rng.standard_normal((oc, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32),
             2: rng.standard_normal(oc).astype(np.float32),
             3: rng.uniform(0.5, 1.5, oc).astype(np.float32), 4: rng.standard_normal(oc).astype(np.float32),
             5: rng.standard_normal(oc).astype(np.float32) * 0.1, 6: rng.uniform(0.5, 2, oc).astype(np.float32)}
    result = ga.run_graph(graph, feeds, repeat=1 if small else 5)
    gallery.graph("Convolution -> BatchNormInference -> ReLU -> MaxPool", graph, result.partitions)
    assert [r.partition.get_kind() for r in result.partitions] == ["conv_post_ops", "single op"]
    start = time.perf_counter()
    expected = numpy_block(*(feeds[i] for i in range(7)))
    numpy_ms = (time.perf_counter() - start) * 1e3
    total = sum(r.execute_ms for r in result.partitions)
    print(f"[{n}x{c}x{hw}x{hw}] -> {list(result.outputs[10].shape)} in {total:.2f} ms "
          f"(" + ", ".join(f"{r.compiled.plan.name} {r.execute_ms:.2f} ms" for r in result.partitions)
          + f"; numpy f64 {numpy_ms:.1f} ms)")
    err = float(np.abs(result.outputs[10] - expected).max() / np.abs(expected).max())
    # f32 sums of 9 * C terms in BLAS order and one f32 rounding of the folded weights
    gallery.error("CNN block, max rel vs numpy f64", err, 1e-5)

if __name__ == "__main__":
    main()

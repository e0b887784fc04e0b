"""Why an op did not fuse: ``graph.explain_partitions()`` names the nearest pattern and what failed.

Two graphs that almost fuse. In the first, a MatMul's output is also read by an op outside
the would-be partition (an intermediate may not escape a fused partition); in the second,
an attention graph's SoftMax runs on the wrong axis. The explanations say so; fixing each
gives one fused partition.

    python -m samples 09_why_not_fused
"""
from __future__ import annotations

import numpy as np

from graph_api import DataType as dt
from graph_api import GraphBuilder
from samples import gallery


def matmul_relu(leak: bool):
    b = GraphBuilder()
    x, w = b.input(dt.f32, (4, 32)), b.constant(np.eye(32, 16, dtype=np.float32))
    y = b.matmul(x, w)
    b.relu(y)
    if leak:
        b.abs(y)  # reads the MatMul output too
    return b


def attention(axis: int):
    b = GraphBuilder()
    q, k, v = (b.input(dt.f32, (1, 2, 8, 16)) for _ in range(3))
    s = b.matmul(q, k, transpose_b=True)
    b.matmul(b.softmax(s, axis=axis), v)
    return b


def show(title: str, b) -> int:
    graph = b.build()
    parts = graph.get_partitions()
    gallery.graph(title, graph, parts)
    for op_id, why in graph.explain_partitions().items():
        print(f"  why op {op_id} ({graph.ops[op_id].kind.name}) is alone: {why}")
    return len(parts)


def main(small: bool = False) -> None:
    leaked = show("MatMul -> ReLU, MatMul output also read by Abs", matmul_relu(leak=True))
    fused = show("MatMul -> ReLU", matmul_relu(leak=False))
    wrong = show("attention with SoftMax over axis -2", attention(axis=-2))
    right = show("attention with SoftMax over the last axis", attention(axis=-1))
    print(f"partitions: {leaked} -> {fused} once the output stays inside; {wrong} -> {right} with the right axis")
    assert fused == 1 and right == 1 and leaked > 1 and wrong > 1
    # the fused attention computes what numpy computes
    b = attention(axis=-1)
    model = b.compile()
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 8, 16)).astype(np.float32) for _ in range(3))
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2)
    e = np.exp(s - s.max(-1, keepdims=True))
    expected = e / e.sum(-1, keepdims=True) @ v
    gallery.error("fused attention vs numpy f64, max abs", float(np.abs(model(q, k, v) - expected).max()), 1e-5)


if __name__ == "__main__":
    main()

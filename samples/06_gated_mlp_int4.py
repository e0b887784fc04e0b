"""Gated MLP with int4 weights: (silu(x @ Wg) * (x @ Wu)) @ Wd in one fused partition.

The three weight matrices are stored as s4 (two per byte) with an f32 scale per group of
32 along K, each entering through DynamicDequantize. The pattern matcher takes the three
dequantizations, the three MatMuls, the SiLU (Sigmoid and Multiply) and the gating
Multiply as one gated_mlp partition; its kernel dequantizes weights block by block and
never stores the f32 weights. Compared with float64 numpy on the same int4 weights.

    python -m samples 06_gated_mlp_int4
"""
from __future__ import annotations

import time

import ml_dtypes
import numpy as np

from graph_api import DataType as dt
from graph_api import GraphBuilder
from samples import gallery

GROUP = 32


def quantize_s4(w: np.ndarray):
    """Symmetric s4 with one scale per GROUP rows (along K) of a [K, N] matrix."""
    k, n = w.shape
    g = w.reshape(k // GROUP, GROUP, n)
    scale = (np.abs(g).max(1) / 7.0 + 1e-12).astype(np.float32)
    q = np.clip(np.rint(g / scale[:, None, :]), -8, 7).reshape(k, n)
    return q, scale


def main(small: bool = False) -> None:
    rng = np.random.default_rng(0)
    m, hidden, ffn = (4, 128, 256) if small else (1, 2048, 5632)
    b = GraphBuilder()
    x = b.input(dt.f32, (m, hidden))
    weights = {}

    def int4_weight(name, k, n):
        q, scale = quantize_s4((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32))
        weights[name] = q.astype(np.float64) * np.repeat(scale.astype(np.float64), GROUP, axis=0)
        return b.dynamic_dequantize(b.constant(q.astype(ml_dtypes.int4)), b.constant(scale),
                                    qtype="per_group", group_shape=[GROUP, 1])

    gate = b.matmul(x, int4_weight("gate", hidden, ffn))
    up = b.matmul(x, int4_weight("up", hidden, ffn))
    h = b.multiply(b.multiply(gate, b.sigmoid(gate)), up)
    b.matmul(h, int4_weight("down", ffn, hidden))
    model = b.compile()

    xa = rng.standard_normal((m, hidden)).astype(np.float32)
    out = model(xa)
    repeat = 2 if small else 20
    start = time.perf_counter()
    for _ in range(repeat):
        model(xa)
    ms = (time.perf_counter() - start) / repeat * 1e3
    gallery.graph("gated MLP, int4 weights", b.graph, model.partitions, model.kernels)
    w_bytes = 3 * hidden * ffn
    print(f"weights: {w_bytes // 2} bytes int4 (+ {w_bytes // GROUP * 4} bytes of scales) vs {w_bytes * 4} bytes f32")
    print(f"M={m} hidden={hidden} ffn={ffn}: {ms:.3f} ms per call")

    x64 = xa.astype(np.float64)
    g64, u64 = x64 @ weights["gate"], x64 @ weights["up"]
    expected = (g64 / (1 + np.exp(-g64)) * u64) @ weights["down"]
    # strict f32 through three chained matmuls of K <= ffn terms: ~1e-6 relative
    gallery.error("gated MLP vs numpy f64, max rel",
                  float(np.abs(out - expected).max() / np.abs(expected).max()), 1e-5)


if __name__ == "__main__":
    main()

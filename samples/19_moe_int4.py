"""Mixture of experts: top-2 routing over 8 SwiGLU experts with int4 weights, one partition.

Each expert is a gated MLP, ``(silu(x @ Wg) * (x @ Wu)) @ Wd``, its three weights
s4 with an f32 scale per group of 32 along K.  The router (a small f32 MatMul and a
top-2 softmax, here in numpy, as a framework does it) sends every token to two
experts; the tokens of each expert are gathered into one block (oneDNN's grouped
memory: experts one after another), the grouped partition runs every expert, and
the outputs are added back per token with the router's weights.

The graph holds only the 8 experts, unconnected: the ``grouped_matmul`` group
takes them as one partition (oneDNN's grouped-GEMM RFC and its gmm-poc graph
pass), and its kernel runs every decode-size expert in one parallel launch per
stage (gate and up together, then down).  Token counts change every step, so the
expert inputs are declared with an unknown first dim; each new routing shape
compiles once.  Compared with float64 numpy on the same int4 weights.

    python -m samples 19_moe_int4
"""
from __future__ import annotations

import time

import ml_dtypes
import numpy as np

from graph_api import DataType as dt
from graph_api import GraphBuilder
from samples import gallery

GROUP = 32
EXPERTS, TOP_K = 8, 2


def quantize_s4(w: np.ndarray):
    """Symmetric s4 with one scale per GROUP rows (along K) of a [K, N] matrix."""
    k, n = w.shape
    g = w.reshape(k // GROUP, GROUP, n)
    scale = (np.abs(g).max(1) / 7.0 + 1e-12).astype(np.float32)
    q = np.clip(np.rint(g / scale[:, None, :]), -8, 7).reshape(k, n)
    return q, scale


def route(x: np.ndarray, w_router: np.ndarray):
    """(expert ids [T, 2], weights [T, 2]): the two largest logits, softmax over them."""
    logits = x @ w_router
    top = np.argsort(-logits, axis=1)[:, :TOP_K]
    picked = np.take_along_axis(logits, top, axis=1)
    p = np.exp(picked - picked.max(1, keepdims=True))
    return top, (p / p.sum(1, keepdims=True)).astype(np.float32)


def main(small: bool = False) -> None:
    rng = np.random.default_rng(0)
    hidden, ffn = (128, 256) if small else (1024, 2816)
    b = GraphBuilder()
    experts, f64 = [], []
    for _ in range(EXPERTS):
        x = b.input(dt.f32, (-1, hidden))
        w64 = {}

        def int4_weight(name, k, n):
            q, scale = quantize_s4((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32))
            w64[name] = q.astype(np.float64) * np.repeat(scale.astype(np.float64), GROUP, axis=0)
            return b.dynamic_dequantize(b.constant(q.astype(ml_dtypes.int4)), b.constant(scale),
                                        qtype="per_group", group_shape=[GROUP, 1])

        gate = b.matmul(x, int4_weight("gate", hidden, ffn))
        up = b.matmul(x, int4_weight("up", hidden, ffn))
        b.matmul(b.multiply(b.multiply(gate, b.sigmoid(gate)), up), int4_weight("down", ffn, hidden))
        experts.append(x)
        f64.append(w64)
    model = b.compile()
    w_router = (rng.standard_normal((hidden, EXPERTS)) / np.sqrt(hidden)).astype(np.float32)

    def moe_layer(tokens: np.ndarray) -> np.ndarray:
        top, weight = route(tokens, w_router)
        rows = [np.nonzero((top == e).any(1))[0] for e in range(EXPERTS)]  # each expert's tokens
        outs = model(*[tokens[r] for r in rows])
        y = np.zeros_like(tokens)
        for e, (r, out) in enumerate(zip(rows, outs)):
            y[r] += weight[r, np.nonzero(top[r] == e)[1]][:, None] * out
        return y, top, weight

    steps = [1, 4] if small else [1, 4, 64]
    for tokens_n in steps:
        tokens = rng.standard_normal((tokens_n, hidden)).astype(np.float32)
        y, top, weight = moe_layer(tokens)
        repeat = 2 if small else 20
        start = time.perf_counter()
        for _ in range(repeat):
            moe_layer(tokens)
        ms = (time.perf_counter() - start) / repeat * 1e3
        counts = np.bincount(top.reshape(-1), minlength=EXPERTS)
        print(f"{tokens_n:3d} tokens, tokens per expert {counts.tolist()}: {ms:.3f} ms per layer "
              f"(routing and gather/scatter in numpy included)")
        x64, want = tokens.astype(np.float64), np.zeros((tokens_n, hidden))
        for t in range(tokens_n):
            for j in range(TOP_K):
                w = f64[top[t, j]]
                g, u = x64[t] @ w["gate"], x64[t] @ w["up"]
                want[t] += weight[t, j] * ((g / (1 + np.exp(-g)) * u) @ w["down"])
        # strict f32 through three chained products of K <= ffn terms, then a 2-term sum: ~1e-6 relative
        gallery.error(f"MoE layer ({tokens_n} tokens) vs numpy f64, max rel",
                      float(np.abs(y - want).max() / np.abs(want).max()), 1e-5)
    gallery.graph("MoE: 8 int4 SwiGLU experts", b.graph, model.partitions, model.kernels)
    (kind,) = {p.get_kind() for p in model.partitions}
    print(f"partitions: {len(model.partitions)} ({kind}); kernels: {sorted(set(model.kernels.values()))}")


if __name__ == "__main__":
    main()

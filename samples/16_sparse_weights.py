"""Sparse weights: a linear layer whose weight is a sparse tensor (seed 003), one fused partition.

``y = ReLU(x @ W^T + b)`` with W [N, K] marked sparse on its logical tensor only
(``sparse_encoding=``): the MatMul becomes an SpMM with the bias and ReLU fused in its
epilogue (pattern ``sparse_matmul_post_ops``).  The same layer runs with W pruned to

* 2:4 structured sparsity (the 2 largest of every 4 along K: half the values, 2-bit indices),
* 90% unstructured sparsity in CSR,
* 90% block sparsity in BCSR 4x4 (whole 4x4 blocks kept),

prints the bytes each storage takes against the dense f32 weight, and compares every
result with float64 numpy on the same pruned weights.  The graph's JSON carries the
encoding as an extension field.

    python -m samples 16_sparse_weights
"""
from __future__ import annotations

import json
import time

import numpy as np

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api.sparse_storage import prune
from samples import gallery


def pruned(rng, w: np.ndarray, encoding: str) -> np.ndarray:
    """W pruned so that ``encoding`` holds it: 2:4 by magnitude, CSR / BCSR at 90%."""
    if encoding == "2:4":
        return prune(w, "2:4")
    if encoding == "CSR":
        return np.where(np.abs(w) >= np.quantile(np.abs(w), 0.9), w, 0).astype(np.float32)
    blocks = np.abs(w).reshape(w.shape[0] // 4, 4, w.shape[1] // 4, 4).sum((1, 3))
    keep = blocks >= np.quantile(blocks, 0.9)
    return (w * np.kron(keep, np.ones((4, 4)))).astype(np.float32)


def layer(encoding: str, m: int, k: int, n: int):
    g = ga.Graph(ga.EngineKind.cpu)
    x = ga.LogicalTensor(0, dt.f32, [m, k])
    w = ga.LogicalTensor(1, dt.f32, [n, k], property=ga.PropertyType.constant, sparse_encoding=encoding)
    b = ga.LogicalTensor(2, dt.f32, [n], property=ga.PropertyType.constant)
    y = ga.LogicalTensor(3, dt.f32, [m, n])
    z = ga.LogicalTensor(4, dt.f32, [m, n])
    g.add_op(ga.Op(0, K.MatMul, [x, w, b], [y], "fc", {"transpose_b": True}))
    g.add_op(ga.Op(1, K.ReLU, [y], [z], "relu"))
    g.finalize()
    return g, w


def run(rng, encoding: str, m: int, k: int, n: int) -> float:
    g, w_lt = layer(encoding, m, k, n)
    w = pruned(rng, rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k), encoding)
    x = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    weight = ga.Tensor(w_lt, ga.Engine(), w)  # the storage: levels + values, built once
    st = weight.storage
    feeds = {0: x, 1: weight, 2: bias}
    result = ga.run_graph(g, feeds)
    start = time.perf_counter()
    for _ in range(5):
        ga.run_graph(g, feeds)
    ms = (time.perf_counter() - start) / 5 * 1e3
    gallery.graph(f"sparse weight ({encoding}) MatMul -> bias -> ReLU", g, result.partitions)
    print(f"  {encoding}: {st.nse} stored values of {w.size}; storage {st.nbytes()} bytes vs dense "
          f"{st.dense_nbytes()} ({100 * (1 - st.nbytes() / st.dense_nbytes()):.0f}% saved); {ms:.3f} ms")
    if encoding == "2:4":  # the kernel packs the in-block coordinates to 2 bits each
        print(f"  the 2:4 kernel reads {st.values.nbytes + st.values.size // 4} weight bytes "
              f"({st.values.nbytes} values + 2-bit indices) of the dense {st.dense_nbytes()}")
        doc = json.loads(g.to_json())
        print(f"  JSON weight tensor: {json.dumps(doc['graph'][0]['inputs'][1])}")
    want = np.maximum(x.astype(np.float64) @ w.T.astype(np.float64) + bias, 0)
    return float(np.abs(result.outputs[4] - want).max() / np.abs(want).max())


def main(small: bool = False) -> None:
    rng = np.random.default_rng(0)
    m, k, n = (4, 64, 32) if small else (32, 4096, 4096)
    for encoding in ("2:4", "CSR", "BCSR4x4"):
        # f32 sums of at most K stored products: K * 2^-24 relative to sum |x w| at most
        gallery.error(f"{encoding} sparse layer vs numpy f64, max rel", run(rng, encoding, m, k, n),
                      k * 2.0 ** -24 * 4)


if __name__ == "__main__":
    main()

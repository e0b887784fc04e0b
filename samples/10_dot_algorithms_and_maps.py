"""Dot algorithms (StableHLO RFC) and indexing maps (linalg matmul) side by side.

1. One MatMul per algorithm preset: max and mean relative error against a
   float64 product of the same f32 inputs, on well-conditioned data (positive
   terms) and on cancellation-heavy data (each output a difference of two
   nearly equal sums), and the execution time relative to ``f32``.
2. ``A @ StaticTranspose(B)``: two partitions without fusion, one with it —
   the transpose folds into the MatMul's ``indexing_maps`` and never runs.

    python -m samples 10_dot_algorithms_and_maps
"""
from __future__ import annotations

import time

import numpy as np

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api.dot_algorithm import PRESETS
from samples import gallery


def well_conditioned(rng, m, k, n):
    return rng.uniform(0.5, 1, (m, k)).astype(np.float32), rng.uniform(0.5, 1, (k, n)).astype(np.float32)


def cancelling(rng, m, k, n):
    """[A, A] @ [B; -(B + d)], d ~ 2^-10 B: outputs are ~2^-11 of their terms."""
    a = rng.uniform(0.5, 1, (m, k // 2)).astype(np.float32)
    b = rng.uniform(0.5, 1, (k // 2, n)).astype(np.float32)
    b2 = (b + rng.uniform(0.5, 1, b.shape) * 2.0**-10).astype(np.float32)
    return np.concatenate([a, a], 1), np.concatenate([b, -b2], 0)


def compiled_matmul(algorithm, m, k, n):
    graph = ga.Graph(ga.EngineKind.cpu)
    lts = [ga.LogicalTensor(0, dt.f32, (m, k)), ga.LogicalTensor(1, dt.f32, (k, n)),
           ga.LogicalTensor(2, dt.f32, (m, n))]
    graph.add_op(ga.Op(0, K.MatMul, lts[:2], lts[2:], "mm", {"algorithm": algorithm}))
    graph.finalize()
    part = graph.get_partitions()[0]
    return part.compile(part.get_input_ports(), part.get_output_ports()), lts


def run(compiled, lts, a, b, repeat):
    """(result, best execution time in ms)."""
    port = [compiled.query_logical_tensor(lt.id) for lt in lts]
    ins = [ga.Tensor(port[0], data=a), ga.Tensor(port[1], data=b)]
    out = ga.Tensor(port[2])
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        compiled.execute(None, ins, [out])
        best = min(best, time.perf_counter() - start)
    return out.numpy().copy(), best * 1e3


def error_table(m, k, n, repeat) -> dict:
    rng = np.random.default_rng(0)
    data = {"well": well_conditioned(rng, m, k, n), "cancel": cancelling(rng, m, k, n)}
    rows = {}
    for name in PRESETS:
        compiled, lts = compiled_matmul(name, m, k, n)
        row = {}
        for label, (a, b) in data.items():
            got, ms = run(compiled, lts, a, b, repeat)
            exact = a.astype(np.float64) @ b.astype(np.float64)
            rel = np.abs(got - exact) / np.abs(exact)
            row[label] = (float(rel.max()), float(rel.mean()))
            row.setdefault("ms", ms)
        rows[name] = row
    print(f"MatMul {m}x{k} @ {k}x{n}: relative error vs float64, time relative to f32")
    print(f"  {'algorithm':9s} {'well max':>10s} {'well mean':>10s} {'cancel max':>11s} "
          f"{'cancel mean':>11s} {'time':>6s}")
    for name, row in rows.items():
        (wmax, wmean), (cmax, cmean) = row["well"], row["cancel"]
        print(f"  {name:9s} {wmax:10.2e} {wmean:10.2e} {cmax:11.2e} {cmean:11.2e} "
              f"{row['ms'] / rows['f32']['ms']:5.1f}x")
    return rows


def folding_demo(m, k, n) -> float:
    graph = ga.Graph(ga.EngineKind.cpu)
    b_t = ga.LogicalTensor(3, dt.f32, (k, n))
    graph.add_op(ga.Op(0, K.StaticTranspose, [ga.LogicalTensor(1, dt.f32, (n, k))], [b_t], "wT",
                       {"order": [1, 0]}))
    graph.add_op(ga.Op(1, K.MatMul, [ga.LogicalTensor(0, dt.f32, (m, k)), b_t],
                       [ga.LogicalTensor(2, dt.f32, (m, n))], "mm", {"algorithm": "bf16_3x"}))
    graph.finalize()
    print("A @ StaticTranspose(W), W stored [N, K]:")
    for policy in (ga.PartitionPolicy.debug, ga.PartitionPolicy.fusion):
        print(f"  {policy.name:6s}: {graph.get_partitions(policy)}")
    part = graph.get_partitions()[0]
    from graph_api.patterns.library.dot_maps import folded_matmul

    print(f"  folded : {folded_matmul(graph, part.fusion.bindings)!r}")
    rng = np.random.default_rng(1)
    a, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
    result = ga.run_graph(graph, {0: a, 1: w})
    gallery.graph("A @ StaticTranspose(W) folded into the MatMul's maps", graph, result.partitions)
    plan = result.partitions[0].compiled.plan
    print(f"  kernel : {plan.name}; ops run after the MatMul: {[op.kind.name for _, op, _, _ in plan.tail.steps]}")
    exact = a.astype(np.float64) @ w.T.astype(np.float64)
    return float(np.abs(result.outputs[2] - exact).max() / np.abs(exact).max())


def main(small: bool = False) -> None:
    m, k, n, repeat = (16, 256, 16, 1) if small else (256, 2048, 256, 5)
    rows = error_table(m, k, n, repeat)
    assert rows["bf16_6x"]["cancel"][0] < rows["bf16"]["cancel"][0] / 100
    # bf16_3x keeps about 16 significant bits of each product: near f32 (2^-24 * K)
    gallery.error("folded bf16_3x MatMul, max rel vs numpy f64", folding_demo(m, k, n), 1e-5)


if __name__ == "__main__":
    main()

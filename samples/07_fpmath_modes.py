"""Per-partition fpmath modes side by side: the same fused MatMul under strict, tf32, bf16, f16 and any.

oneDNN lets a partition compute in lower precision than its tensors' f32 (the int4 RFC adds
the mode per partition). Here one MatMul + bias + GELU partition is compiled once per mode
with ``Partition.set_fpmath_mode`` and run on the same inputs; the table gives the error
against float64 and the time. What each mode does per pattern is in docs/fpmath.md:
strict keeps f32; tf32/bf16/f16 round the MatMul inputs to that type and accumulate in f32;
``any`` allows the fastest. A mode is a permission to go faster: where the host has a bf16
unit, the bf16 and any partitions multiply their bf16 operands on it (AMX: the plan
``amx_bf16_matmul_epilogue``; AVX512_BF16: ``avx512_bf16_matmul_epilogue``); elsewhere they
round and run the f32 kernel (the units this host's kernels use are printed first;
docs/fpmath.md has the table per ISA).

    python -m samples 07_fpmath_modes
"""
from __future__ import annotations

import time

import numpy as np

import graph_api as ga
from graph_api import DataType as dt
from graph_api import GraphBuilder
from samples import gallery

#: max relative error each mode must stay within: about K^0.5 rounding errors of
#: the input type's unit roundoff (inputs rounded once, f32 accumulation)
BOUND = {"strict": 1e-5, "tf32": 2e-3, "bf16": 2e-2, "f16": 2e-3, "any": 2e-2}


def main(small: bool = False) -> None:
    rng = np.random.default_rng(0)
    m, k, n = (8, 256, 64) if small else (256, 4096, 4096)
    b = GraphBuilder()
    x = b.input(dt.f32, (m, k))
    w_arr = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    bias_arr = rng.standard_normal(n).astype(np.float32)
    b.gelu(b.matmul(x, b.constant(w_arr), b.constant(bias_arr)), mode="gelu_tanh")
    graph = b.build()
    (part,) = graph.get_partitions()
    gallery.graph("MatMul + bias + GELU", graph, [part])

    xa = rng.standard_normal((m, k)).astype(np.float32)
    z = xa.astype(np.float64) @ w_arr.astype(np.float64) + bias_arr
    expected = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))
    engine = ga.Engine()
    stream = ga.Stream(engine)
    tensors = {lt.id: ga.Tensor(lt, engine, arr) for lt, arr in
               zip(part.get_input_ports(), [xa, w_arr, bias_arr])}
    from graph_api.kernels.isa import ISA

    print(f"kernel units on this host: {ISA.describe()}")
    print(f"{'mode':8s} {'kernel':26s} {'max rel error':>14s} {'time ms':>9s}")
    for mode in BOUND:
        part.set_fpmath_mode(mode)
        compiled = part.compile(part.get_input_ports(), part.get_output_ports(), engine)
        out = ga.Tensor(compiled.query_logical_tensor(part.get_output_ports()[0].id), engine)
        ins = [tensors[lt.id] for lt in part.get_input_ports()]
        compiled.execute(stream, ins, [out])
        repeat = 2 if small else 10
        start = time.perf_counter()
        for _ in range(repeat):
            compiled.execute(stream, ins, [out])
        ms = (time.perf_counter() - start) / repeat * 1e3
        err = float(np.abs(out.numpy() - expected).max() / np.abs(expected).max())
        print(f"{mode:8s} {compiled.plan.name:26s} {err:14.3e} {ms:9.3f}")
        gallery.error(f"fpmath {mode}, max rel vs numpy f64", err, BOUND[mode])


if __name__ == "__main__":
    main()

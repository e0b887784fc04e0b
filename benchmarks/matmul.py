"""Dense f32 MatMul (a linear layer with bias, ``[M, K] x [K, N]``, constant weights) built
with the public API, once per fpmath mode: ``strict`` (f32 BLAS) and ``bf16`` (the
operands rounded to bf16, the products on the host's bf16 unit: AMX or AVX512_BF16;
f32 BLAS on the rounded values where the host has neither).  Peers: PyTorch's f32 and
bf16 ``linear`` (oneDNN/MKL underneath).  All operands stay in cache between calls
("hot"): this measures the GEMM, not memory.
"""
from __future__ import annotations

import numpy as np

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K


def build(M, K_, N, mode):
    g = ga.Graph(ga.EngineKind.cpu, ga.FPMathMode[mode])
    lt = ga.LogicalTensor
    x, w = lt(0, dt.f32, [M, K_]), lt(1, dt.f32, [K_, N], property=ga.PropertyType.constant)
    bias, y = lt(2, dt.f32, [N], property=ga.PropertyType.constant), lt(3, dt.f32, [M, N])
    g.add_op(ga.Op(0, K.MatMul, [x, w, bias], [y]))
    g.finalize()
    return g


def bench_matmul(rows, quick=False, peers_on=True, shapes=((128, 4096, 4096), (512, 4096, 4096))):
    from benchmarks import peers
    from benchmarks.suite import bf16_hardware, timeit_interleaved
    from graph_api.kernels import bf16_matmul

    for M, K_, N in shapes[:1] if quick else shapes:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((M, K_)).astype(np.float32)
        w = (rng.standard_normal((K_, N)) / np.sqrt(K_)).astype(np.float32)
        bias = rng.standard_normal(N).astype(np.float32)
        engine = ga.Engine()
        jobs, plans, outs = {}, {}, {}
        for mode in ("strict", "bf16"):
            g = build(M, K_, N, mode)
            feeds = {0: ga.Tensor(g.tensors[0], engine, x), 1: ga.Tensor(g.tensors[1], engine, w),
                     2: ga.Tensor(g.tensors[2], engine, bias)}
            compiled = ga.compile_graph(g, feeds)
            outs[mode] = compiled(feeds)[3].copy()
            unit = bf16_matmul.UNIT if mode == "bf16" else None
            name = f"project fpmath {mode} ({unit or 'f32 BLAS'})"
            jobs[name] = (lambda i, c=compiled, f=feeds: c(f), 1, 5 if quick else 15)
            plans[name] = compiled.steps[0][1].plan.name
        if peers_on and peers.have_torch():
            import torch

            xt, wt, bt = torch.from_numpy(x), torch.from_numpy(w.T.copy()), torch.from_numpy(bias)
            xb, wb, bb = xt.bfloat16(), wt.bfloat16(), bt.bfloat16()
            jobs["torch f32 linear"] = (lambda i: torch.nn.functional.linear(xt, wt, bt), 1, 5 if quick else 15)
            if bf16_hardware():  # without it PyTorch emulates bf16 (minutes per call)
                jobs["torch bf16 linear"] = (lambda i: torch.nn.functional.linear(xb, wb, bb), 1, 5 if quick else 15)
        res = timeit_interleaved(jobs)
        label = f"f32 MatMul + bias, M={M} K={K_} N={N}, constant weights"
        ref = res["project fpmath strict (f32 BLAS)"]
        exact = x.astype(np.float64) @ w.astype(np.float64) + bias
        for name, t in res.items():
            note = f"{2 * M * K_ * N / t * 1e-9:.0f} GFLOP/s"
            if name in plans:
                got = outs["bf16" if "bf16" in name else "strict"]
                note += f"; {plans[name]}; max |err| {np.abs(got - exact).max():.1e}"
            rows.append((label, "hot", name, t * 1e3, t / ref, note))
    return rows

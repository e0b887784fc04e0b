"""Grouped MatMul (mixture of experts): s4 experts (K = N = 1024, groups of 32 along
K), 8 and 64 experts, top-2 routing of a decode step (4 tokens) and a prefill
(512 tokens), random routing (seeded).

Rows: the project's ``grouped_matmul`` partition (one compiled graph of all
experts); a loop of per-expert project calls (one compiled single-expert graph
each, ``matmul_compressed``); PyTorch (where installed) as a per-expert loop of
``_weight_int4pack_mm_for_cpu`` (bf16 activations, what PyTorch's CPU int4 path
offers) and of f32 ``matmul`` on the dequantized weights.  Weights hot (every
expert's weights fit in L3: 8 x 0.5 MiB, 64 x 0.5 MiB).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K

C = ga.PropertyType.constant
GROUP = 32


def routing(tokens: int, experts: int, rng) -> list[int]:
    """Tokens per expert for top-2 routing (two distinct experts per token)."""
    picks = np.argsort(rng.random((tokens, experts)), axis=1)[:, :2]
    return np.bincount(picks.reshape(-1), minlength=experts).tolist()


def build(ms, weights, K_, N):
    """One graph of len(ms) s4 experts; (graph, feeds by tensor id, output ids)."""
    g = ga.Graph()
    feeds, outs, t = {}, [], iter(range(10 ** 6))
    for e, m in enumerate(ms):
        q, s = weights[e]
        x = ga.LogicalTensor(next(t), dt.f32, [m, K_])
        w = ga.LogicalTensor(next(t), dt.s4, [K_, N], property=C)
        sc = ga.LogicalTensor(next(t), dt.f32, [K_ // GROUP, N], property=C)
        wf = ga.LogicalTensor(next(t), dt.f32, [K_, N])
        y = ga.LogicalTensor(next(t), dt.f32, [m, N])
        g.add_op(ga.Op(2 * e, K.DynamicDequantize, [w, sc], [wf],
                       attrs={"qtype": "per_group", "group_shape": [GROUP, 1]}))
        g.add_op(ga.Op(2 * e + 1, K.MatMul, [x, wf], [y]))
        feeds.update({x.id: np.random.default_rng(e).standard_normal((m, K_)).astype(np.float32),
                      w.id: q.astype(ml_dtypes.int4), sc.id: s})
        outs.append(y.id)
    g.finalize()
    engine = ga.Engine()  # Tensors made once: the constant (packed s4) weights keep their buffers
    return g, {tid: ga.Tensor(g.tensors[tid], engine, a) for tid, a in feeds.items()}, outs


def bench_moe(rows, quick=False, peers_on=True, K_=1024, N=1024):
    from benchmarks import peers
    from benchmarks.bert import _best

    rng = np.random.default_rng(0)
    reps = 5 if quick else 20
    for experts in (8, 64):
        weights = [(rng.integers(-8, 8, (K_, N)).astype(np.int8),
                    rng.uniform(0.005, 0.02, (K_ // GROUP, N)).astype(np.float32)) for _ in range(experts)]
        for tokens in (4, 512):
            ms = routing(tokens, experts, rng)
            label = f"MoE s4 experts K=N={K_} g{GROUP}: {experts} experts, top-2 of {tokens} tokens"
            g, feeds, outs = build(ms, weights, K_, N)
            grouped = ga.compile_graph(g, feeds)
            got = grouped(feeds)
            plan = grouped.steps[0][1].plan.name
            t = _best(lambda: grouped(feeds), reps)
            rows.append((label, "hot", "project grouped_matmul (one partition)", t * 1e3, 1.0,
                         f"{plan}; rows per expert {min(ms)}..{max(ms)}"))
            singles = []
            for e, m in enumerate(ms):
                ge, fe, oe = build([m], [weights[e]], K_, N)
                singles.append((ga.compile_graph(ge, fe), fe))
            for c, f in singles:
                c(f)
            tl = _best(lambda: [c(f) for c, f in singles], reps)
            rows.append((label, "hot", "project, loop of per-expert calls", tl * 1e3, tl / t,
                         f"{len(ms)} compiled single-expert graphs"))
            if peers_on and peers.have_torch():
                _torch_rows(rows, label, t, reps, feeds, g, ms, weights, K_, N, got, outs)


def _torch_rows(rows, label, t, reps, feeds, g, ms, weights, K_, N, got, outs):
    import torch

    from benchmarks.bert import _best

    xs = [torch.from_numpy(feeds[op.inputs[0].id].numpy()) for op in g.ops.values() if op.kind == K.MatMul]
    dense = [torch.from_numpy((q.astype(np.float32) * np.repeat(s, GROUP, axis=0))) for q, s in weights]
    tt = _best(lambda: [torch.matmul(x, w) for x, w in zip(xs, dense)], reps)
    diff = max(float(np.abs(torch.matmul(x, w).numpy() - got[o]).max()) if x.shape[0] else 0.0
               for x, w, o in zip(xs, dense, outs))
    rows.append((label, "hot", "torch f32 matmul per expert (dequantized weights)", tt * 1e3, tt / t,
                 f"max |diff| {diff:.1e}"))
    try:
        packed = []
        for q, s in weights:
            wq = torch.from_numpy((q.astype(np.int32) + 8).T.copy())  # [N, K] values 0..15: u = q + 8
            sz = torch.zeros((K_ // GROUP, N, 2), dtype=torch.bfloat16)
            sz[:, :, 0] = torch.from_numpy(s).to(torch.bfloat16)
            packed.append((torch._convert_weight_to_int4pack_for_cpu(wq, 2), sz))
        xb = [x.to(torch.bfloat16) for x in xs]
        run = lambda: [torch._weight_int4pack_mm_for_cpu(x, p, GROUP, sz) for x, (p, sz) in zip(xb, packed)]
        run()
        tt = _best(run, reps)
        rows.append((label, "hot", "torch int4pack_mm per expert (bf16 activations)", tt * 1e3, tt / t,
                     "bf16 activations and scales"))
    except (AttributeError, RuntimeError) as why:  # no CPU int4 kernel in this build
        rows.append((label, "hot", "torch int4pack_mm per expert", float("nan"), float("nan"), str(why)[:60]))

"""SDPA training backward: the fused partition vs its ops on their own plans vs PyTorch autograd.

The graph is oneDNN's ``sdpa-plain-training-backward`` form (f32 Q/K/V/O/dO
``[B, H, S, 64]``, scale, an additive ``[B, 1, S, S]`` mask, the forward's stats
in): dQ, dK, dV.  Rows, interleaved in one process: the partition on the fused
kernel (``numba_sdpa_backward``), the same partition with every op on its
single-op fast plan (``per_op_fast``, what ran before), and PyTorch's backward
of ``F.scaled_dot_product_attention`` with the same mask (``torch.autograd.grad``
of a kept forward graph: the backward alone, as the partition).
"""
from __future__ import annotations

import numpy as np

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K

from benchmarks import peers
from benchmarks.suite import timeit_interleaved

HEAD = 64
SHAPES_QUICK = ((2, 12, 128),)
SHAPES = ((2, 12, 128), (8, 12, 128), (2, 16, 256), (2, 16, 512), (8, 16, 512))


def _graph(B, H, S):
    """(graph, input lts in feed order [q, k, v, o, do, scale, mask, stats], output lts)."""
    ids, n = iter(range(1000)), iter(range(1000))
    lt = lambda shape: ga.LogicalTensor(next(ids), dt.f32, shape)  # noqa: E731
    x4, s4, r4 = [B, H, S, HEAD], [B, H, S, S], [B, H, S, 1]
    ops = []

    def op(kind, ins, shape, **attrs):
        out = lt(shape)
        ops.append(ga.Op(next(n), kind, ins, [out], attrs=attrs))
        return out

    q, k, v, o, do = (lt(x4) for _ in range(5))
    scale, mask, stats = lt([1]), lt([B, 1, S, S]), lt(r4)
    s = op(K.Multiply, [op(K.MatMul, [q, k], s4, transpose_b=True), scale], s4)
    p = op(K.Exp, [op(K.Subtract, [op(K.Add, [s, mask], s4), stats], s4)], s4)
    dv = op(K.MatMul, [p, do], x4, transpose_a=True)
    dp = op(K.MatMul, [do, v], s4, transpose_b=True)
    corr = op(K.ReduceSum, [op(K.Multiply, [o, do], x4)], r4, axes=[-1], keep_dims=True)
    ds = op(K.Multiply, [op(K.Multiply, [p, op(K.Subtract, [dp, corr], s4)], s4), scale], s4)
    dk = op(K.MatMul, [ds, q], x4, transpose_a=True)
    dq = op(K.MatMul, [ds, k], x4)
    g = ga.Graph(ga.EngineKind.cpu)
    for o_ in ops:
        g.add_op(o_)
    g.finalize()
    return g, [q, k, v, o, do, scale, mask, stats], [dq, dk, dv]


def _data(B, H, S, rng):
    """Feeds of a real forward: O and the stats from the masked softmax of the scores."""
    q, k, v, do = (rng.standard_normal((B, H, S, HEAD)).astype(np.float32) for _ in range(4))
    scale = np.float32(HEAD ** -0.5)
    mask = np.where(rng.random((B, 1, S, S)) < 0.1, -1e4, 0).astype(np.float32)
    s = (q @ np.swapaxes(k, -1, -2)) * scale + mask
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    stats = (m + np.log(e.sum(-1, keepdims=True))).astype(np.float32)
    o = ((e / e.sum(-1, keepdims=True)) @ v).astype(np.float32)
    return [q, k, v, o, do, np.array([scale], np.float32), mask, stats]


def _torch_backward(data):
    """``fn(i)``: PyTorch's backward of its SDPA (same mask, default scale 1/sqrt(D))."""
    if not peers.have_torch():
        return None
    import torch

    F = torch.nn.functional
    q, k, v = (torch.from_numpy(a).requires_grad_(True) for a in data[:3])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.from_numpy(data[6]))
    grad = torch.from_numpy(data[4])
    return lambda i: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)


def bench_sdpa_backward(rows, quick=False, peers_on=True):
    from graph_api.kernels import registry
    from graph_api.patterns import library as P

    eng = ga.Engine()
    strm = ga.Stream(eng)
    rng = np.random.default_rng(0)
    for B, H, S in SHAPES_QUICK if quick else SHAPES:
        g, ins, outs = _graph(B, H, S)
        (part,) = g.get_partitions()
        fused = part.compile(ins, outs, eng)
        key = (P.SDPA_BACKWARD, "*", "*")
        saved = registry.KERNELS.pop(key)
        try:  # the same graph built again (compiled partitions are cached per partition)
            g2, ins2, outs2 = _graph(B, H, S)
            (part2,) = g2.get_partitions()
            unfused = part2.compile(ins2, outs2, eng)  # no builder: each op on its fast plan
        finally:
            registry.KERNELS[key] = saved
        data = _data(B, H, S, rng)
        tensors = [ga.Tensor(lt, eng, a) for lt, a in zip(ins, data)]
        res = {c: [ga.Tensor(lt, eng, np.empty(lt.shape, np.float32)) for lt in outs] for c in "fu"}
        heavy = B * H * S * S >= 8 * 16 * 512 * 512
        jobs = {f"project {fused.plan.name}": (lambda i: fused.execute(strm, tensors, res["f"]), 1, 7 if heavy else 15),
                f"project {unfused.plan.name}": (lambda i: unfused.execute(strm, tensors, res["u"]), 1, 3 if heavy else 7)}
        f = _torch_backward(data) if peers_on else None
        if f:
            jobs["torch autograd SDPA backward f32"] = (f, 1, 7 if heavy else 15)
        times = timeit_interleaved(jobs)
        diff = max(float(np.abs(a.numpy() - b.numpy()).max() / np.abs(b.numpy()).max())
                   for a, b in zip(res["f"], res["u"]))
        label = f"SDPA backward f32 {B}x{H}x{S}x{HEAD} (mask)"
        ref = times[f"project {fused.plan.name}"]
        for name, t in times.items():
            rows.append((label, "hot", name, t * 1e3, t / ref, f"max |fused - per_op| / max {diff:.1e}"))
    return rows

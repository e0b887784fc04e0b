"""oneDNN's ``sdpa_quantized`` example (examples/graph/sdpa_quantized.cpp) at its shape.

mb 2, seq 128, 16 heads, head size 64, u8 Q/K/V/output with per-tensor scale
0.25 (``bench_quantized_sdpa`` of the example): Dequantize -> f32 attention with
the probabilities quantized and dequantized -> Quantize, one partition built with
the public API.  Rows: the partition on the attention kernel (``numba_sdpa_quantized``)
vs the same partition with every op on its single-op fast plan (``per_op_fast``,
what ran before), and PyTorch f32 SDPA on the dequantized values (no probability
quantization: the work of an f32 framework), interleaved in one process.
"""
from __future__ import annotations

import numpy as np

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K

from benchmarks import peers
from benchmarks.suite import timeit_interleaved

MB, SEQ, HEADS, HEAD = 2, 128, 16, 64


def _graph():
    """(graph, input logical tensors in feed order, output lt) of the example."""
    ids = iter(range(1000))
    qkv, score = [MB, HEADS, SEQ, HEAD], [MB, HEADS, SEQ, SEQ]
    lt = lambda dtype, shape: ga.LogicalTensor(next(ids), dtype, shape)  # noqa: E731
    ops, n = [], iter(range(1000))

    def op(kind, ins, out, **attrs):
        ops.append(ga.Op(next(n), kind, ins, [out], attrs=attrs))
        return out

    quant = dict(qtype="per_tensor", axis=1, scales=[0.25])
    q8, k8, v8 = lt(dt.u8, qkv), lt(dt.u8, qkv), lt(dt.u8, qkv)
    scale, mask = lt(dt.f32, [1]), lt(dt.f32, [MB, 1, 1, SEQ])
    q = op(K.Dequantize, [q8], lt(dt.f32, qkv), **quant)
    k = op(K.Dequantize, [k8], lt(dt.f32, qkv), **quant)
    s = op(K.MatMul, [q, k], lt(dt.f32, score), transpose_b=True)
    s = op(K.Divide, [s, scale], lt(dt.f32, score))
    s = op(K.Add, [s, mask], lt(dt.f32, score))
    p = op(K.SoftMax, [s], lt(dt.f32, score), axis=-1, mode="inf_as_zero")
    p = op(K.Quantize, [p], lt(dt.u8, score), **quant)
    p = op(K.Dequantize, [p], lt(dt.f32, score), **quant)
    v = op(K.Dequantize, [v8], lt(dt.f32, qkv), **quant)
    o = op(K.MatMul, [p, v], lt(dt.f32, qkv))
    out = op(K.Quantize, [o], lt(dt.u8, qkv), **quant)
    g = ga.Graph(ga.EngineKind.cpu)
    for o_ in ops:
        g.add_op(o_)
    g.finalize()
    return g, [q8, k8, scale, mask, v8], out


def bench_sdpa_quantized(rows, peers_on=True):
    from graph_api.kernels import registry
    from graph_api.patterns import library as P

    g, ins, out = _graph()
    (part,) = g.get_partitions()
    eng, strm = ga.Engine(), None
    rng = np.random.default_rng(0)
    data = [rng.integers(120, 137, lt.shape).astype(np.uint8) for lt in ins[:2]]
    data += [np.full(1, np.sqrt(HEAD), np.float32), np.zeros((MB, 1, 1, SEQ), np.float32),
             rng.integers(120, 137, ins[4].shape).astype(np.uint8)]
    fused = part.compile(ins, [out], eng)
    key = (P.SDPA_QUANTIZED, "*", "*")
    saved = registry.KERNELS.pop(key)
    try:  # the same graph built again (compiled partitions are cached per partition)
        g2, ins2, out2 = _graph()
        (part2,) = g2.get_partitions()
        unfused = part2.compile(ins2, [out2], eng)  # no builder: each op on its fast plan
    finally:
        registry.KERNELS[key] = saved
    tensors = [ga.Tensor(lt, eng, a) for lt, a in zip(ins, data)]
    res_out = {c: ga.Tensor(out, eng, np.empty(out.shape, np.uint8)) for c in ("f", "u")}
    strm = ga.Stream(eng)
    jobs = {f"project {fused.plan.name}": (lambda i: fused.execute(strm, tensors, [res_out["f"]]), 1, 15),
            f"project {unfused.plan.name}": (lambda i: unfused.execute(strm, tensors, [res_out["u"]]), 1, 5)}
    if peers_on:
        deq = [(a.astype(np.float32) - 0) * 0.25 for a in (data[0], data[1], data[4])]
        f = peers.make_torch_sdpa(deq[0], [deq[1]], [deq[2]], "f32")
        if f:
            jobs["torch SDPA f32 (dequantized, no P quantization)"] = (f, 1, 15)
    res = timeit_interleaved(jobs)
    same = np.abs(res_out["f"].numpy().astype(int) - res_out["u"].numpy().astype(int)).max()
    label = f"sdpa_quantized.cpp u8 {MB}x{HEADS}x{SEQ}x{HEAD}"
    ref = res[f"project {fused.plan.name}"]
    for name, t in res.items():
        rows.append((label, "hot", name, t * 1e3, t / ref, f"max |fused - per_op| {same} (u8 steps)"))
    return rows

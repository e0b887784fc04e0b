"""Scaled dot-product attention: causal SDPA, then GQA and MQA decode, each one fused partition.

    scores = Q @ K^T / sqrt(D)  -> causal mask (GenIndex, GreaterEqual, Select)
           -> SoftMax -> @ V

The causal mask is written with ops (oneDNN's implicit-causal form), so no S x S mask
tensor exists. The prefill runs once more under fpmath ``bf16``: Q, K, V and the
probabilities are rounded to bf16 and both products run on the host's bf16 unit
(AVX512_BF16 ``vdpbf16ps``; kernels/sdpa/prefill_bf16.py) where it has one. GQA keeps K/V with fewer heads and broadcasts them over a head group
through a 5-D batch ([B, Hkv, group, S, D] x [B, Hkv, 1, S, D]); MQA is GQA with one KV
head. The fused kernel reads each K/V head once per group. Every result is compared with
a float64 numpy computation.

    python -m samples 04_sdpa
"""
from __future__ import annotations

import time

import numpy as np

from graph_api import DataType as dt
from graph_api import GraphBuilder
from samples import gallery


def attention_graph(q_shape, kv_shape, causal: bool, fpmath: str = "strict"):
    b = GraphBuilder(fpmath)
    q, k, v = b.input(dt.f32, q_shape), b.input(dt.f32, kv_shape), b.input(dt.f32, kv_shape)
    scale = b.constant(np.array([np.sqrt(q_shape[-1])], np.float32))
    s = b.divide(b.matmul(q, k, transpose_b=True), scale)
    if causal:  # keep scores where row >= column
        row = b.gen_index(s, axis=-2, out_dtype=dt.s32)
        col = b.gen_index(s, axis=-1, out_dtype=dt.s32)
        s = b.select(b.greater_equal(row, col), s, b.constant(np.array([-np.inf], np.float32)))
    p = b.softmax(s, axis=-1, mode="inf_as_zero")
    b.matmul(p, v)
    return b


def reference(q, k, v, causal: bool) -> np.ndarray:
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        rows, cols = s.shape[-2:]
        s = np.where(np.arange(rows)[:, None] >= np.arange(cols)[None, :], s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def run(title, q_shape, kv_shape, causal, rng, repeat, fpmath="strict"):
    b = attention_graph(q_shape, kv_shape, causal, fpmath)
    model = b.compile()
    q = rng.standard_normal(q_shape).astype(np.float32)
    k = rng.standard_normal(kv_shape).astype(np.float32)
    v = rng.standard_normal(kv_shape).astype(np.float32)
    out = model(q, k, v)
    start = time.perf_counter()
    for _ in range(repeat):
        model(q, k, v)
    ms = (time.perf_counter() - start) / repeat * 1e3
    gallery.graph(title, b.graph, model.partitions, model.kernels)
    print(f"  {ms:.3f} ms per call")
    # f32 kernel vs float64: softmax weights and the V sum each lose a few f32 ulps.  Under
    # bf16 the reference takes the bf16 roundings of Q, K, V (what the mode multiplies);
    # the probabilities enter P V rounded to bf16: <= 2**-8 relative each, times |v| < 4.5
    if fpmath == "strict":
        want, limit = reference(q, k, v, causal), 2e-5
    else:
        import ml_dtypes

        want = reference(*(x.astype(ml_dtypes.bfloat16) for x in (q, k, v)), causal)
        limit = 4.5 * 2.0 ** -8
    gallery.error(f"{title}, max abs vs numpy f64", float(np.abs(out - want).max()), limit)


def main(small: bool = False) -> None:
    rng = np.random.default_rng(0)
    s, d, hq, hkv, kv_len = (16, 32, 8, 2, 64) if small else (512, 128, 32, 8, 4096)
    repeat = 1 if small else 5
    run(f"causal SDPA prefill, {hq} heads, S={s}", (1, hq, s, d), (1, hq, s, d), True, rng, repeat)
    from graph_api.kernels.sdpa import prefill_bf16

    unit = "vdpbf16ps" if prefill_bf16.AVAILABLE else "no bf16 unit: the reference per-op plans"
    run(f"the same under fpmath bf16 ({unit}), S={max(s, 32)}", (1, hq, max(s, 32), d), (1, hq, max(s, 32), d),
        True, rng, repeat, "bf16")
    group = hq // hkv
    run(f"GQA decode, {hq} query heads over {hkv} KV heads, L={kv_len}",
        (1, hkv, group, 1, d), (1, hkv, 1, kv_len, d), False, rng, repeat)
    run(f"MQA decode, {hq} query heads over 1 KV head, L={kv_len}",
        (1, 1, hq, 1, d), (1, 1, 1, kv_len, d), False, rng, repeat)


if __name__ == "__main__":
    main()

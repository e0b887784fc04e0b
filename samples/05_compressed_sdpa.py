"""Compressed SDPA: attention over an int4 K/V cache with grouped scales and zero points (GQA decode).

K and V are stored as u4 (two values per byte) with one f32 scale and one u4 zero point per
group of 32 values along the head dim, and enter the graph through DynamicDequantize, as
the int4 RFC writes it. The pattern matcher fuses the dequantization into the attention
kernel, so the cache is never expanded to f32 in memory. The sample prints the cache bytes
against f32 and bf16, the kernel's error against float64 attention over the same
dequantized cache (the kernel's own error), and how far int4 moves the output from
attention over the unquantized f32 cache (the quantization's error).

    python -m samples 05_compressed_sdpa
"""
from __future__ import annotations

import time

import ml_dtypes
import numpy as np

from graph_api import DataType as dt
from graph_api import GraphBuilder
from samples import gallery

GROUP = 32


def quantize_u4(x: np.ndarray, axis: int):
    """Asymmetric u4 with one scale and zero point per GROUP values along ``axis``."""
    moved = np.moveaxis(x, axis, -1)
    g = moved.reshape(*moved.shape[:-1], -1, GROUP)
    lo, hi = g.min(-1), g.max(-1)
    scale = ((hi - lo) / 15.0 + 1e-12).astype(np.float32)
    zp = np.clip(np.rint(-lo / scale), 0, 15)
    q = np.clip(np.rint(g / scale[..., None] + zp[..., None]), 0, 15).reshape(moved.shape)
    back = lambda a: np.moveaxis(a, -1, axis)  # noqa: E731
    return back(q), back(scale), back(zp)


def dequantize(q, scale, zp, axis):
    rep = lambda a: np.repeat(a.astype(np.float64), GROUP, axis=axis)  # noqa: E731
    return (q.astype(np.float64) - rep(zp)) * rep(scale)


def attention(q, k_dsl, v) -> np.ndarray:
    """float64 attention with K given as [.., D, L]."""
    s = q.astype(np.float64) @ k_dsl / np.sqrt(q.shape[-1])
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def main(small: bool = False) -> None:
    rng = np.random.default_rng(0)
    hq, hkv, d, kv_len = (8, 2, 64, 128) if small else (32, 8, 128, 4096)
    group = hq // hkv
    k_f32 = rng.standard_normal((1, hkv, 1, d, kv_len)).astype(np.float32)  # K stored [.., D, L]
    v_f32 = rng.standard_normal((1, hkv, 1, kv_len, d)).astype(np.float32)
    kq, ks, kz = quantize_u4(k_f32, axis=3)
    vq, vs, vz = quantize_u4(v_f32, axis=4)

    b = GraphBuilder()
    q = b.input(dt.f32, (1, hkv, group, 1, d))
    u4 = lambda a: b.constant(a.astype(ml_dtypes.uint4))  # noqa: E731
    k = b.dynamic_dequantize(u4(kq), b.constant(ks), u4(kz), qtype="per_group",
                             group_shape=[1, 1, 1, GROUP, 1])
    v = b.dynamic_dequantize(u4(vq), b.constant(vs), u4(vz), qtype="per_group",
                             group_shape=[1, 1, 1, 1, GROUP])
    scores = b.divide(b.matmul(q, k), b.constant(np.array([np.sqrt(d)], np.float32)))
    b.matmul(b.softmax(scores, axis=-1), v)
    model = b.compile()

    x = rng.standard_normal((1, hkv, group, 1, d)).astype(np.float32)
    out = model(x)
    repeat = 5 if small else 20
    start = time.perf_counter()
    for _ in range(repeat):
        model(x)
    ms = (time.perf_counter() - start) / repeat * 1e3
    gallery.graph("compressed SDPA decode (u4 K/V, GQA)", b.graph, model.partitions, model.kernels)

    values = 2 * hkv * d * kv_len
    int4_bytes = values // 2 + 2 * (values // GROUP) * 4 + 2 * (values // GROUP) // 2
    print(f"KV cache: {values} values: int4 {int4_bytes} bytes (values + f32 scales + u4 zero points), "
          f"bf16 {values * 2} bytes, f32 {values * 4} bytes ({values * 4 / int4_bytes:.1f}x smaller)")
    print(f"decode attention, {hq} query heads over {hkv} KV heads, L={kv_len}: {ms:.3f} ms per call")
    exact = attention(x, dequantize(kq, ks, kz, 3), dequantize(vq, vs, vz, 4))
    unquantized = attention(x, k_f32.astype(np.float64), v_f32.astype(np.float64))
    rel = lambda a, ref: float(np.abs(a - ref).max() / np.abs(ref).max())  # noqa: E731
    # the kernel dequantizes exactly and sums in f32: a few f32 ulps of the output's scale
    gallery.error("fused kernel vs float64 attention over the same int4 cache, max rel", rel(out, exact), 1e-5)
    print(f"int4 cache vs unquantized f32 cache (quantization, not the kernel): max rel {rel(out, unquantized):.3e}")


if __name__ == "__main__":
    main()

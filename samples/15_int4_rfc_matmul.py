"""The int4 RFC's weight-compressed MatMul in its two forms, each one fused partition.

1. ``DynamicDequantize(s4 W, scales, zero points) -> MatMul -> bias -> GELU -> DynamicQuantize``:
   f32 activations, u4 weights with per-group scales and zero points (groups of 32 along K),
   and the output quantized to s8 with a given per-tensor scale (the next layer's input).
2. The mixed-precision form: bf16 activations, ``DynamicDequantize`` to f32 then ``TypeCast``
   to bf16 feeding a bf16 MatMul that accumulates in f32 and writes f32.

Both are compared with float64 numpy on the same int4 data; the quantized output may differ
from numpy by one s8 step where the f32 value sits on a rounding boundary.

    python -m samples 15_int4_rfc_matmul
"""
from __future__ import annotations

import time

import ml_dtypes
import numpy as np

from graph_api import DataType as dt
from graph_api import GraphBuilder
from samples import gallery

GROUP = 32


def u4_weights(rng, k: int, n: int):
    """u4 [K, N] values, per-group (along K) f32 scales and u4 zero points, and W in float64."""
    q = rng.integers(0, 16, (k, n))
    scale = rng.uniform(0.005, 0.02, (k // GROUP, n)).astype(np.float32)
    zp = rng.integers(6, 10, (k // GROUP, n))
    w = (q - np.repeat(zp, GROUP, 0)) * np.repeat(scale.astype(np.float64), GROUP, 0)
    return q, scale, zp, w


def gelu_tanh(z):
    return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))


def timed(model, *args) -> float:
    model(*args)
    start = time.perf_counter()
    for _ in range(5):
        model(*args)
    return (time.perf_counter() - start) / 5 * 1e3


def quantized_output(rng, m, k, n):
    q, scale, zp, w = u4_weights(rng, k, n)
    bias = rng.standard_normal(n).astype(np.float32)
    out_scale = np.float32(0.05)
    b = GraphBuilder()
    x = b.input(dt.f32, (m, k))
    wf = b.dynamic_dequantize(b.constant(q.astype(ml_dtypes.uint4)), b.constant(scale),
                              b.constant(zp.astype(ml_dtypes.uint4)), qtype="per_group", group_shape=[GROUP, 1])
    y = b.gelu(b.matmul(x, wf, b.constant(bias)), mode="gelu_tanh")
    b.dynamic_quantize(y, b.constant(np.array([out_scale], np.float32)), qtype="per_tensor", out_dtype=dt.s8)
    model = b.compile()
    xa = rng.standard_normal((m, k)).astype(np.float32)
    got = model(xa)
    ms = timed(model, xa)
    gallery.graph("u4 DynamicDequantize -> MatMul -> bias -> GELU -> DynamicQuantize s8", b.graph,
                  model.partitions, model.kernels)
    exact = gelu_tanh(xa.astype(np.float64) @ w + bias) / out_scale
    want = np.clip(np.rint(exact), -128, 127)
    steps = np.abs(got.astype(np.int64) - want)
    print(f"  M={m} K={k} N={n}: {ms:.3f} ms; s8 outputs off by one step: {int((steps == 1).sum())} "
          f"of {got.size} (each within 1e-4 of a rounding boundary: "
          f"{bool(np.all(np.abs(np.abs(exact - np.trunc(exact)) - 0.5)[steps == 1] < 1e-4))})")
    return float(steps.max())


def mixed_precision(rng, m, k, n):
    q, scale, zp, w = u4_weights(rng, k, n)
    b = GraphBuilder()
    x = b.input(dt.bf16, (m, k))
    wf = b.dynamic_dequantize(b.constant(q.astype(ml_dtypes.uint4)), b.constant(scale),
                              b.constant(zp.astype(ml_dtypes.uint4)), qtype="per_group", group_shape=[GROUP, 1])
    b.matmul(x, b.type_cast(wf, out_dtype=dt.bf16), out_dtype=dt.f32)
    model = b.compile()
    xa = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    got = model(xa)
    ms = timed(model, xa)
    gallery.graph("u4 DynamicDequantize -> TypeCast bf16 -> bf16 MatMul (f32 out)", b.graph,
                  model.partitions, model.kernels)
    w_bf16 = w.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)  # the TypeCast's rounding
    want = xa.astype(np.float64) @ w_bf16
    print(f"  M={m} K={k} N={n}: {ms:.3f} ms")
    return float(np.abs(got - want).max() / np.abs(want).max())


def main(small: bool = False) -> None:
    rng = np.random.default_rng(0)
    m, k, n = (4, 128, 64) if small else (32, 4096, 4096)
    # one s8 step at most: only values on a rounding boundary can flip
    gallery.error("s8 output vs numpy f64, max steps", quantized_output(rng, m, k, n), 1.0)
    # bf16 products are exact in f32; the f32 sum of K terms: K * 2^-24 relative at most
    gallery.error("bf16 mixed-precision form vs numpy f64, max rel", mixed_precision(rng, m, k, n), 1e-5)


if __name__ == "__main__":
    main()

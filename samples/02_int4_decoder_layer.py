"""One LLM decoder layer, decode step: int4 weights, int4 KV cache, GQA.

    x -> RMSNorm -> q = x @ deq(Wq)            (int4 weights, groups of 32 along K)
      -> attention over an int4 K/V cache      (grouped scales + zero points, GQA: 2 query heads per KV head)
      -> o = attn @ deq(Wo) + x                (residual)
      -> RMSNorm -> gated MLP: (silu(h @ deq(Wg)) * (h @ deq(Wu))) @ deq(Wd) + o

Every op is a oneDNN Graph op; the pattern matcher fuses the weight-compressed
MatMuls, the compressed SDPA and the gated MLP.  The result is compared with a
float64 numpy computation of the same formulas.

    python -m samples 02_int4_decoder_layer
"""
from __future__ import annotations

import time

import ml_dtypes
import numpy as np

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from samples import gallery


class Ids:
    """Hands out tensor and op ids."""

    def __init__(self):
        self.tensor = 0
        self.op = 0

    def lt(self, dtype, shape, prop=ga.PropertyType.variable):
        self.tensor += 1
        return ga.LogicalTensor(self.tensor, dtype, shape, property=prop)

    def op_id(self):
        self.op += 1
        return self.op


def quantize_s4(w: np.ndarray, group: int):
    """Symmetric per-group int4 along the last dim: w ~= q * scale."""
    g = w.reshape(*w.shape[:-1], w.shape[-1] // group, group)
    scale = np.abs(g).max(-1) / 7.0 + 1e-8
    q = np.clip(np.rint(g / scale[..., None]), -8, 7)
    return q.reshape(w.shape).astype(ml_dtypes.int4), scale.astype(np.float32)


def quantize_u4(w: np.ndarray, group: int):
    """Asymmetric per-group uint4 along the last dim: w ~= (q - zp) * scale."""
    g = w.reshape(*w.shape[:-1], w.shape[-1] // group, group)
    lo, hi = g.min(-1), g.max(-1)
    scale = (hi - lo) / 15.0 + 1e-8
    zp = np.clip(np.rint(-lo / scale), 0, 15)
    q = np.clip(np.rint(g / scale[..., None] + zp[..., None]), 0, 15)
    return q.reshape(w.shape).astype(ml_dtypes.uint4), scale.astype(np.float32), zp.astype(ml_dtypes.uint4)


def dequant(q, scale, group, zp=None):
    s = np.repeat(scale.astype(np.float64), group, axis=-1)
    z = 0 if zp is None else np.repeat(zp.astype(np.float64), group, axis=-1)
    return (q.astype(np.float64) - z) * s


def build(cfg, ids: Ids):
    """The decoder-layer graph; returns (graph, input lts by name, output lt)."""
    H, Hq, Hkv, D, L, F, G = (cfg[k] for k in ("hidden", "heads", "kv_heads", "head_dim", "kv_len", "ffn", "group"))
    rep = Hq // Hkv
    C = ga.PropertyType.constant
    g = ga.Graph(ga.EngineKind.cpu)
    ins = {}

    def add(kind, inputs, out, **attrs):
        g.add_op(ga.Op(ids.op_id(), kind, inputs, [out], attrs=attrs))
        return out

    def rmsnorm(x, name):
        ins[name] = ids.lt(dt.f32, [H], C)
        return add(K.RMSNorm, [x, ins[name]], ids.lt(dt.f32, [1, H]), epsilon=1e-6)

    def int4_linear(x, name, n, k):
        ins[name] = ids.lt(dt.s4, [n, k], C)
        ins[name + "_scale"] = ids.lt(dt.f32, [n, k // G], C)
        w = add(K.DynamicDequantize, [ins[name], ins[name + "_scale"]], ids.lt(dt.f32, [n, k]),
                qtype="per_group", group_shape=[1, G])
        return add(K.MatMul, [x, w], ids.lt(dt.f32, [1, n]), transpose_b=True)

    def int4_cache(name):
        ins[name] = ids.lt(dt.u4, [1, Hkv, 1, L, D], C)
        ins[name + "_scale"] = ids.lt(dt.f32, [1, Hkv, 1, L, D // G], C)
        ins[name + "_zp"] = ids.lt(dt.u4, [1, Hkv, 1, L, D // G], C)
        return add(K.DynamicDequantize, [ins[name], ins[name + "_scale"], ins[name + "_zp"]],
                   ids.lt(dt.f32, [1, Hkv, 1, L, D]), qtype="per_group", group_shape=[1, 1, 1, 1, G])

    ins["x"] = ids.lt(dt.f32, [1, H])
    h = rmsnorm(ins["x"], "attn_norm")
    q = int4_linear(h, "wq", Hq * D, H)
    q5 = add(K.StaticReshape, [q], ids.lt(dt.f32, [1, Hkv, rep, 1, D]), shape=[1, Hkv, rep, 1, D], special_zero=False)
    k, v = int4_cache("k_cache"), int4_cache("v_cache")
    scores = add(K.MatMul, [q5, k], ids.lt(dt.f32, [1, Hkv, rep, 1, L]), transpose_b=True)
    ins["scale"] = ids.lt(dt.f32, [], ga.PropertyType.host_scalar)
    scaled = add(K.Multiply, [scores, ins["scale"]], ids.lt(dt.f32, [1, Hkv, rep, 1, L]))
    probs = add(K.SoftMax, [scaled], ids.lt(dt.f32, [1, Hkv, rep, 1, L]), axis=-1)
    attn = add(K.MatMul, [probs, v], ids.lt(dt.f32, [1, Hkv, rep, 1, D]))
    attn2 = add(K.StaticReshape, [attn], ids.lt(dt.f32, [1, Hq * D]), shape=[1, Hq * D], special_zero=False)
    o = int4_linear(attn2, "wo", H, Hq * D)
    o = add(K.Add, [o, ins["x"]], ids.lt(dt.f32, [1, H]))
    h2 = rmsnorm(o, "mlp_norm")
    gate = int4_linear(h2, "w_gate", F, H)
    up = int4_linear(h2, "w_up", F, H)
    sig = add(K.Sigmoid, [gate], ids.lt(dt.f32, [1, F]))
    silu = add(K.Multiply, [gate, sig], ids.lt(dt.f32, [1, F]))
    prod = add(K.Multiply, [silu, up], ids.lt(dt.f32, [1, F]))
    down = int4_linear(prod, "w_down", H, F)
    out = add(K.Add, [down, o], ids.lt(dt.f32, [1, H]))
    g.finalize()
    return g, ins, out


def make_weights(cfg, rng):
    H, Hq, Hkv, D, L, F, G = (cfg[k] for k in ("hidden", "heads", "kv_heads", "head_dim", "kv_len", "ffn", "group"))
    w = {"x": rng.standard_normal((1, H)).astype(np.float32),
         "attn_norm": (1 + 0.1 * rng.standard_normal(H)).astype(np.float32),
         "mlp_norm": (1 + 0.1 * rng.standard_normal(H)).astype(np.float32),
         "scale": np.float32(1 / np.sqrt(D))}
    for name, (n, k) in {"wq": (Hq * D, H), "wo": (H, Hq * D), "w_gate": (F, H), "w_up": (F, H),
                         "w_down": (H, F)}.items():
        w[name], w[name + "_scale"] = quantize_s4(rng.standard_normal((n, k)) / np.sqrt(k), G)
    for name in ("k_cache", "v_cache"):
        w[name], w[name + "_scale"], w[name + "_zp"] = quantize_u4(rng.standard_normal((1, Hkv, 1, L, D)), G)
    return w


def reference(cfg, w):
    """The layer in float64 numpy from the dequantized weights."""
    H, Hq, Hkv, D, L, F, G = (cfg[k] for k in ("hidden", "heads", "kv_heads", "head_dim", "kv_len", "ffn", "group"))

    def rms(x, gamma):
        return gamma * x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6)

    def lin(x, name):
        return x @ dequant(w[name], w[name + "_scale"], G).T

    x = w["x"].astype(np.float64)
    q = lin(rms(x, w["attn_norm"]), "wq").reshape(1, Hkv, Hq // Hkv, 1, D)
    k = dequant(w["k_cache"], w["k_cache_scale"], G, w["k_cache_zp"])
    v = dequant(w["v_cache"], w["v_cache_scale"], G, w["v_cache_zp"])
    s = q @ np.swapaxes(k, -1, -2) * float(w["scale"])
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = lin((p @ v).reshape(1, Hq * D), "wo") + x
    h = rms(o, w["mlp_norm"])
    gate, up = lin(h, "w_gate"), lin(h, "w_up")
    return lin(gate / (1 + np.exp(-gate)) * up, "w_down") + o


CONFIGS = {
    "small": dict(hidden=128, heads=4, kv_heads=2, head_dim=32, kv_len=64, ffn=256, group=32),
    "full": dict(hidden=2048, heads=16, kv_heads=4, head_dim=128, kv_len=2048, ffn=5632, group=32),
}


def main(small: bool = False) -> None:
    cfg = CONFIGS["small" if small else "full"]
    rng = np.random.default_rng(0)
    graph, ins, out = build(cfg, Ids())
    weights = make_weights(cfg, rng)
    engine = ga.Engine()
    # Tensors made once: int4 data is packed once and constant weights are prepared once
    feeds = {lt.id: weights[name] if lt.property == ga.PropertyType.host_scalar
             else ga.Tensor(lt, engine, np.asarray(weights[name]).reshape(lt.shape))
             for name, lt in ins.items()}
    result = ga.run_graph(graph, feeds)
    gallery.graph("decoder layer, decode step", graph, result.partitions)
    start = time.perf_counter()
    steps = 1 if small else 5
    for _ in range(steps):
        result = ga.run_graph(graph, feeds, partitions=[r.partition for r in result.partitions])
    per_step = (time.perf_counter() - start) / steps
    expected = reference(cfg, weights)
    err = float(np.abs(result.outputs[out.id] - expected).max() / np.abs(expected).max())
    print(f"decode step {per_step * 1e3:.2f} ms ({1 / per_step:.1f} tokens/s, compile cached)")
    gallery.error("decoder layer, max rel vs numpy f64", err, 1e-5)


if __name__ == "__main__":
    main()

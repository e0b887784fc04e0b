"""LLM decode: a Llama-style decoder stack with int4 weights and an int4 K/V cache that grows every step.

Per layer and step, two graphs built with ``GraphBuilder``:

* ``project``: RMSNorm -> Q/K/V projections (s4 weights, groups of 32, fused with their
  DynamicDequantize) -> rotary embedding (``x*cos + (x @ R)*sin``, R the fixed rotate-half
  matrix: the opset has no slice) -> the new token's K and V quantized to s4 *in the graph*
  with DynamicQuantize, their per-group scales computed in the graph too (Abs, ReduceMax,
  Divide), as the int4 RFC proposes.
* ``attend``: compressed SDPA over the int4 cache (DynamicDequantize fused into the attention
  kernel; GQA: a head group shares each K/V head; a causal mask in the prefill), output
  projection + residual, RMSNorm, gated MLP with int4 weights + residual.

Between them the application appends the new int4 K/V (still packed) to its cache. A prefill
of the prompt runs the same graphs with P rows and a causal mask, then N decode steps.
The sample prints tokens/s, the K/V cache bytes against f32 and bf16, the kernels' error
against a float64 numpy pass over the same int4 weights and cache, and how far int4 moves
the hidden state from the same graphs run with f32 weights and an f32 cache.

    python -m samples 13_llm_decode
"""
from __future__ import annotations

import time

import ml_dtypes
import numpy as np

from graph_api import DataType as dt
from graph_api import GraphBuilder
from samples import gallery

G = 32  # quantization group (weights along K, cache along the head dim)
CONFIGS = {
    "small": dict(layers=2, hidden=128, heads=4, kv_heads=2, head_dim=32, ffn=256, prompt=6, steps=4),
    "full": dict(layers=4, hidden=2048, heads=16, kv_heads=4, head_dim=128, ffn=5632, prompt=64, steps=16),
}


def quantize_s4(w: np.ndarray):
    """Symmetric s4 per group of G along the last dim: w ~= q * scale."""
    g = w.reshape(*w.shape[:-1], -1, G)
    scale = (np.abs(g).max(-1) / 7.0 + 1e-12).astype(np.float32)
    q = np.clip(np.rint(g / scale[..., None]), -8, 7).reshape(w.shape)
    return q, scale


def expand(scale: np.ndarray) -> np.ndarray:
    return np.repeat(scale.astype(np.float64), G, axis=-1)


def rotate_half_matrix(d: int) -> np.ndarray:
    """R with x @ R = concat(-x[d/2:], x[:d/2]) (Llama's rotate_half)."""
    r = np.zeros((d, d), np.float32)
    half = d // 2
    r[half:, :half] = -np.eye(half)
    r[:half, half:] = np.eye(half)
    return r


class Layer:
    """One decoder layer's weights: s4 + scales (``int4``) or the original f32."""

    def __init__(self, cfg, rng):
        h, hq, hkv, d, f = (cfg[k] for k in ("hidden", "heads", "kv_heads", "head_dim", "ffn"))
        shapes = {"wq": (hq * d, h), "wk": (hkv * d, h), "wv": (hkv * d, h), "wo": (h, hq * d),
                  "w_gate": (f, h), "w_up": (f, h), "w_down": (h, f)}
        self.f32 = {n: (rng.standard_normal(s) / np.sqrt(s[1])).astype(np.float32) for n, s in shapes.items()}
        self.q = {n: quantize_s4(w) for n, w in self.f32.items()}
        self.norms = [(1 + 0.1 * rng.standard_normal(h)).astype(np.float32) for _ in range(2)]

    def dequantized(self, name) -> np.ndarray:
        q, scale = self.q[name]
        return q * expand(scale)


class Graphs:
    """Builds the two graphs of a layer for a number of rows and a cache length."""

    def __init__(self, cfg, layer: Layer, mode: str):
        self.cfg, self.layer, self.mode = cfg, layer, mode

    def linear(self, b, x, name):
        if self.mode == "f32":
            return b.matmul(x, b.constant(self.layer.f32[name]), transpose_b=True)
        q, scale = self.layer.q[name]
        w = b.dynamic_dequantize(b.constant(q.astype(ml_dtypes.int4)), b.constant(scale),
                                 qtype="per_group", group_shape=[1, G])
        return b.matmul(x, w, transpose_b=True)

    def project(self, rows: int):
        """x, cos, sin -> q, and the new K/V (s4 + scales, or f32)."""
        c = self.cfg
        hkv, d, rep = c["kv_heads"], c["head_dim"], c["heads"] // c["kv_heads"]
        b = GraphBuilder()
        x = b.input(dt.f32, (rows, c["hidden"]))
        cos, sin = b.input(dt.f32, (1, 1, 1, rows, d)), b.input(dt.f32, (1, 1, 1, rows, d))
        rot = b.constant(rotate_half_matrix(d))
        h = b.rms_norm(x, b.constant(self.layer.norms[0]), epsilon=1e-6)

        def heads(t, n):  # [rows, n*d] -> [1, hkv, n/hkv, rows, d]
            t = b.static_reshape(t, shape=[1, rows, hkv, n // hkv, d], special_zero=False)
            return b.static_transpose(t, order=[0, 2, 3, 1, 4])

        def rope(t):
            return b.add(b.multiply(t, cos), b.multiply(b.matmul(t, rot), sin))

        q = rope(heads(self.linear(b, h, "wq"), hkv * rep))
        k = rope(heads(self.linear(b, h, "wk"), hkv))
        v = heads(self.linear(b, h, "wv"), hkv)
        outs = [q]
        for t in (k, v):
            if self.mode == "f32":
                outs.append(t)
                continue
            groups = b.static_reshape(t, shape=[1, hkv, 1, rows, d // G, G], special_zero=False)
            amax = b.reduce_max(b.abs(groups), axes=[-1])
            scale = b.maximum(b.divide(amax, b.constant(np.array([7.0], np.float32))),
                              b.constant(np.array([1e-12], np.float32)))
            outs += [b.dynamic_quantize(t, scale, qtype="per_group", group_shape=[1, 1, 1, 1, G],
                                        out_dtype=dt.s4), scale]
        b.output(*outs)
        return b

    def attend(self, rows: int, length: int):
        """x, q, the cache (s4 + scales, or f32) -> the layer's output."""
        c = self.cfg
        hkv, d, rep = c["kv_heads"], c["head_dim"], c["heads"] // c["kv_heads"]
        b = GraphBuilder()
        x = b.input(dt.f32, (rows, c["hidden"]))
        q = b.input(dt.f32, (1, hkv, rep, rows, d))
        cache = []
        for _ in ("k", "v"):
            if self.mode == "f32":
                cache.append(b.input(dt.f32, (1, hkv, 1, length, d)))
                continue
            values, scale = b.input(dt.s4, (1, hkv, 1, length, d)), b.input(dt.f32, (1, hkv, 1, length, d // G))
            cache.append(b.dynamic_dequantize(values, scale, qtype="per_group", group_shape=[1, 1, 1, 1, G]))
        s = b.multiply(b.matmul(q, cache[0], transpose_b=True), b.constant(np.array([d ** -0.5], np.float32)))
        if rows > 1:  # causal: the query at row i sees cache positions <= length - rows + i
            row, col = b.gen_index(s, axis=-2, out_dtype=dt.s32), b.gen_index(s, axis=-1, out_dtype=dt.s32)
            # oneDNN's bottom-right causal form: row + S_kv - S_q >= col
            row = b.subtract(b.add(row, b.constant(np.array([length], np.int32))),
                             b.constant(np.array([rows], np.int32)))
            s = b.select(b.greater_equal(row, col), s, b.constant(np.array([-np.inf], np.float32)))
        attn = b.matmul(b.softmax(s, axis=-1, mode="inf_as_zero"), cache[1])
        attn = b.static_reshape(b.static_transpose(attn, order=[0, 3, 1, 2, 4]), shape=[rows, hkv * rep * d],
                                special_zero=False)
        o = b.add(self.linear(b, attn, "wo"), x)
        h = b.rms_norm(o, b.constant(self.layer.norms[1]), epsilon=1e-6)
        gate, up = self.linear(b, h, "w_gate"), self.linear(b, h, "w_up")
        b.output(b.add(self.linear(b, b.multiply(b.multiply(gate, b.sigmoid(gate)), up), "w_down"), o))
        return b


class Decoder:
    """The stack, its caches and its compiled graphs (one per row count / cache length)."""

    def __init__(self, cfg, layers, mode):
        self.cfg, self.mode = cfg, mode
        self.graphs = [Graphs(cfg, layer, mode) for layer in layers]
        self.models: dict = {}
        self.cache = [{"k": [], "v": []} for _ in layers]  # per layer: arrays per token block
        self.q_seen: list = []  # (layer, q) of the last step, for the reference

    def model(self, kind, i, *shape):
        key = (kind, i) + shape
        if key not in self.models:
            builder = getattr(self.graphs[i], kind)(*shape)
            self.models[key] = (builder.compile(), builder)
        return self.models[key][0]

    def step(self, x: np.ndarray, position: int) -> np.ndarray:
        rows, d = x.shape[0], self.cfg["head_dim"]
        cos, sin = rope_tables(position, rows, d)
        self.q_seen = []
        for i in range(len(self.graphs)):
            outs = self.model("project", i, rows)(x, cos, sin)
            q, new = outs[0], outs[1:]
            self.q_seen.append(q)
            blocks = self.cache[i]
            if self.mode == "f32":
                blocks["k"].append(new[0])
                blocks["v"].append(new[1])
            else:
                blocks["k"].append(new[0:2])
                blocks["v"].append(new[2:4])
            length = sum(blk.shape[3] if self.mode == "f32" else blk[0].shape[3] for blk in blocks["k"])
            x = self.model("attend", i, rows, length)(x, q, *self.cache_arrays(i))
        return x

    def cache_arrays(self, i) -> list:
        blocks = self.cache[i]
        if self.mode == "f32":
            return [np.concatenate(blocks[n], axis=3) for n in ("k", "v")]
        return [np.concatenate([blk[j] for blk in blocks[n]], axis=3) for n in ("k", "v") for j in (0, 1)]

    def cache_bytes(self) -> int:
        arrays = [a for i in range(len(self.graphs)) for a in self.cache_arrays(i)]
        if self.mode == "f32":
            return sum(a.nbytes for a in arrays)
        return sum(a.size // 2 if a.dtype == ml_dtypes.int4 else a.nbytes for a in arrays)


def rope_tables(position: int, rows: int, d: int):
    inv = 10000.0 ** (-np.arange(0, d, 2) / d)
    angles = np.outer(np.arange(position, position + rows), inv)
    angles = np.concatenate([angles, angles], -1)
    return (np.cos(angles).astype(np.float32).reshape(1, 1, 1, rows, d),
            np.sin(angles).astype(np.float32).reshape(1, 1, 1, rows, d))


def reference_step(cfg, layers, decoder: Decoder, x: np.ndarray, position: int) -> np.ndarray:
    """float64 numpy of the last step from the same int4 weights and the decoder's int4 cache."""
    hkv, d, hq = cfg["kv_heads"], cfg["head_dim"], cfg["heads"]
    rows = x.shape[0]
    x = x.astype(np.float64)
    cos, sin = (t.astype(np.float64) for t in rope_tables(position, rows, d))
    rot = rotate_half_matrix(d).astype(np.float64)

    def rms(t, gamma):
        return gamma * t / np.sqrt(np.mean(t * t, -1, keepdims=True) + 1e-6)

    for i, layer in enumerate(layers):
        lin = lambda t, n: t @ layer.dequantized(n).T  # noqa: E731
        h = rms(x, layer.norms[0])
        q = lin(h, "wq").reshape(rows, hkv, hq // hkv, d).transpose(1, 2, 0, 3)[None]
        q = q * cos + (q @ rot) * sin
        kq, ks, vq, vs = decoder.cache_arrays(i)
        k, v = kq.astype(np.float64) * expand(ks), vq.astype(np.float64) * expand(vs)
        length = k.shape[3]
        s = q @ np.swapaxes(k, -1, -2) / np.sqrt(d)
        visible = np.arange(rows)[:, None] + length - rows >= np.arange(length)[None, :]
        s = np.where(visible, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        attn = (p / p.sum(-1, keepdims=True)) @ v
        o = lin(attn[0].transpose(2, 0, 1, 3).reshape(rows, hq * d), "wo") + x
        h = rms(o, layer.norms[1])
        gate, up = lin(h, "w_gate"), lin(h, "w_up")
        x = lin(gate / (1 + np.exp(-gate)) * up, "w_down") + o
    return x


def main(small: bool = False) -> None:
    cfg = CONFIGS["small" if small else "full"]
    rng = np.random.default_rng(0)
    layers = [Layer(cfg, rng) for _ in range(cfg["layers"])]
    tokens = rng.standard_normal((cfg["prompt"] + cfg["steps"], cfg["hidden"])).astype(np.float32)
    int4, f32 = Decoder(cfg, layers, "int4"), Decoder(cfg, layers, "f32")
    prompt = tokens[:cfg["prompt"]]
    start = time.perf_counter()
    int4.step(prompt, 0)
    prefill_s = time.perf_counter() - start
    f32.step(prompt, 0)
    builder = int4.models[("attend", 0, cfg["prompt"], cfg["prompt"])][1]
    model = int4.models[("attend", 0, cfg["prompt"], cfg["prompt"])][0]
    gallery.graph("layer 0, attend graph (prefill)", builder.graph, model.partitions, model.kernels)
    project = int4.models[("project", 0, cfg["prompt"])]
    gallery.graph("layer 0, project graph (prefill)", project[1].graph, project[0].partitions, project[0].kernels)

    deviation, worst = 0.0, 0.0
    decode_s = 0.0
    for t in range(cfg["steps"]):
        x = tokens[cfg["prompt"] + t][None]
        position = cfg["prompt"] + t
        start = time.perf_counter()
        got = int4.step(x, position)
        decode_s += time.perf_counter() - start
        want = reference_step(cfg, layers, int4, x, position)
        worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
        full = f32.step(x, position)
        deviation = max(deviation, float(np.abs(got - full).max() / np.abs(full).max()))
    length = cfg["prompt"] + cfg["steps"]
    values = 2 * cfg["layers"] * cfg["kv_heads"] * cfg["head_dim"] * length
    print(f"{cfg['layers']} layers, hidden {cfg['hidden']}, {cfg['heads']} query / {cfg['kv_heads']} KV heads, "
          f"prompt {cfg['prompt']}, {cfg['steps']} decode steps (the first call per cache length compiles its partitions)")
    print(f"prefill {prefill_s * 1e3:.1f} ms; decode {decode_s / cfg['steps'] * 1e3:.2f} ms per token "
          f"({cfg['steps'] / decode_s:.1f} tokens/s)")
    print(f"K/V cache at {length} tokens: int4 {int4.cache_bytes()} bytes (values + f32 scales), "
          f"bf16 {values * 2} bytes, f32 {f32.cache_bytes()} bytes")
    # the kernels sum in f32 through several layers of K <= ffn terms: ~1e-6 relative
    gallery.error("decode steps vs numpy f64 on the same int4 weights and cache, max rel", worst, 1e-4)
    print(f"int4 weights + int4 cache vs the same graphs in f32 (quantization, not the kernels): "
          f"max rel {deviation:.3e}")


if __name__ == "__main__":
    main()

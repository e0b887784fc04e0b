"""LLM decode: a Llama-style decoder stack with int4 weights and a fixed-capacity int4 K/V cache.

Per layer and step, two graphs built with ``GraphBuilder``:

* ``project``: RMSNorm -> Q/K/V projections (s4 weights, groups of 32, fused with their
  DynamicDequantize) -> rotary embedding (``x*cos + (x @ R)*sin``, R the fixed rotate-half
  matrix: the opset has no slice) -> the new token's K and V quantized to s4 *in the graph*
  with DynamicQuantize, their per-group scales computed in the graph too (Abs, ReduceMax,
  Divide), as the int4 RFC proposes.
* ``attend``: compressed SDPA over the whole int4 cache (DynamicDequantize fused into the
  attention kernel; GQA: a head group shares each K/V head) with an additive mask input,
  output projection + residual, RMSNorm, gated MLP with int4 weights + residual.

As static-shape runtimes do, the cache has a fixed capacity (prompt + decode steps),
allocated once per layer; between the graphs the application writes the new int4 K/V and
their scales into their slots in place, and the mask (0 for visible slots, -inf for empty
ones and, in the prefill, for later tokens) hides the rest. So ``attend`` compiles once for
the prefill's P rows and once for the decode's single row, not once per cache length.
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
    """Builds the two graphs of a layer for a number of rows (and the cache capacity)."""

    def __init__(self, cfg, layer: Layer, mode: str):
        self.cfg, self.layer, self.mode = cfg, layer, mode

    def linear(self, b, x, name):
        if self.mode == "f32":
            return b.matmul(x, b.constant(self.layer.f32[name]), transpose_b=True)
        q, scale = self.layer.q[name]
        packed = b.constant(q.astype(ml_dtypes.int4))  # the builder keeps it as packed bytes
        w = b.dynamic_dequantize(packed, b.constant(scale), qtype="per_group", group_shape=[1, G])
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

    def attend(self, rows: int, capacity: int):
        """x, q, the additive mask, the whole cache (s4 + scales, or f32) -> the layer's output."""
        c = self.cfg
        hkv, d, rep = c["kv_heads"], c["head_dim"], c["heads"] // c["kv_heads"]
        b = GraphBuilder()
        x = b.input(dt.f32, (rows, c["hidden"]))
        q = b.input(dt.f32, (1, hkv, rep, rows, d))
        mask = b.input(dt.f32, (1, 1, 1, rows, capacity))  # broadcast over the heads
        cache = []
        for _ in ("k", "v"):
            if self.mode == "f32":
                cache.append(b.input(dt.f32, (1, hkv, 1, capacity, d)))
                continue
            values, scale = b.input(dt.s4, (1, hkv, 1, capacity, d)), b.input(dt.f32, (1, hkv, 1, capacity, d // G))
            cache.append(b.dynamic_dequantize(values, scale, qtype="per_group", group_shape=[1, 1, 1, 1, G]))
        s = b.multiply(b.matmul(q, cache[0], transpose_b=True), b.constant(np.array([d ** -0.5], np.float32)))
        s = b.add(s, mask)
        attn = b.matmul(b.softmax(s, axis=-1, mode="inf_as_zero"), cache[1])
        attn = b.static_reshape(b.static_transpose(attn, order=[0, 3, 1, 2, 4]), shape=[rows, hkv * rep * d],
                                special_zero=False)
        o = b.add(self.linear(b, attn, "wo"), x)
        h = b.rms_norm(o, b.constant(self.layer.norms[1]), epsilon=1e-6)
        gate, up = self.linear(b, h, "w_gate"), self.linear(b, h, "w_up")
        b.output(b.add(self.linear(b, b.multiply(b.multiply(gate, b.sigmoid(gate)), up), "w_down"), o))
        return b


class Decoder:
    """The stack, its fixed-capacity caches and its compiled graphs (one per row count)."""

    def __init__(self, cfg, layers, mode):
        self.cfg, self.mode = cfg, mode
        self.graphs = [Graphs(cfg, layer, mode) for layer in layers]
        self.models: dict = {}
        self.capacity = cfg["prompt"] + cfg["steps"]  # the scales' groups run along d, not along tokens
        self.length = 0  # filled slots
        hkv, d = cfg["kv_heads"], cfg["head_dim"]
        slots = (1, hkv, 1, self.capacity, d)
        # per layer, in the attend graph's input order: [k, v] (f32) or [k, k scales, v, v scales] (int4);
        # empty slots hold zeros (finite, so the mask's -inf is what hides them)
        layout = [(slots, np.float32)] * 2 if mode == "f32" else \
            [(slots, ml_dtypes.int4), (slots[:-1] + (d // G,), np.float32)] * 2
        self.cache = [[np.zeros(shape, dtype) for shape, dtype in layout] for _ in layers]

    def model(self, kind, i, *shape):
        key = (kind, i) + shape
        if key not in self.models:  # attend's shape includes the fixed capacity: compiled once per row count
            builder = getattr(self.graphs[i], kind)(*shape)
            self.models[key] = (builder.compile(), builder)
        return self.models[key][0]

    def compile_decode(self) -> None:
        """Compile the decode graphs and run each once on zeros (the cache is not written), so the
        kernels prepare their copies of the constant weights before the first token."""
        c = self.cfg
        hkv, d, rep = c["kv_heads"], c["head_dim"], c["heads"] // c["kv_heads"]
        x, rope = np.zeros((1, c["hidden"]), np.float32), np.zeros((1, 1, 1, 1, d), np.float32)
        q, mask = np.zeros((1, hkv, rep, 1, d), np.float32), causal_mask(0, 1, self.capacity)
        for i in range(len(self.graphs)):
            self.model("project", i, 1)(x, rope, rope)
            self.model("attend", i, 1, self.capacity)(x, q, mask, *self.cache[i])

    def step(self, x: np.ndarray, position: int) -> np.ndarray:
        rows, d = x.shape[0], self.cfg["head_dim"]
        assert position == self.length and position + rows <= self.capacity, (position, rows, self.capacity)
        cos, sin = rope_tables(position, rows, d)
        mask = causal_mask(position, rows, self.capacity)
        for i in range(len(self.graphs)):
            outs = self.model("project", i, rows)(x, cos, sin)
            q, new = outs[0], outs[1:]
            for slots, block in zip(self.cache[i], new):  # in place: no reallocation, no new shape
                slots[:, :, :, position:position + rows] = block
            x = self.model("attend", i, rows, self.capacity)(x, q, mask, *self.cache[i])
        self.length = position + rows
        return x

    def cache_arrays(self, i) -> list:
        """Layer i's cache, filled slots only."""
        return [a[:, :, :, :self.length] for a in self.cache[i]]

    def cache_bytes(self) -> int:
        arrays = [a for i in range(len(self.graphs)) for a in self.cache_arrays(i)]
        if self.mode == "f32":
            return sum(a.nbytes for a in arrays)
        return sum(a.size // 2 if a.dtype == ml_dtypes.int4 else a.nbytes for a in arrays)


def causal_mask(position: int, rows: int, capacity: int) -> np.ndarray:
    """Additive mask: the query at position + i sees slots <= position + i (filled, not later)."""
    visible = np.arange(capacity)[None, :] <= position + np.arange(rows)[:, None]
    return np.where(visible, 0.0, -np.inf).astype(np.float32).reshape(1, 1, 1, rows, capacity)


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
    builder = int4.models[("attend", 0, cfg["prompt"], int4.capacity)][1]
    model = int4.models[("attend", 0, cfg["prompt"], int4.capacity)][0]
    gallery.graph("layer 0, attend graph (prefill)", builder.graph, model.partitions, model.kernels)
    project = int4.models[("project", 0, cfg["prompt"])]
    gallery.graph("layer 0, project graph (prefill)", project[1].graph, project[0].partitions, project[0].kernels)

    # the decode graphs' shapes no longer depend on the step: compile them once, before decoding
    start = time.perf_counter()
    for decoder in (int4, f32):
        decoder.compile_decode()
    compile_s = time.perf_counter() - start
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
          f"prompt {cfg['prompt']}, {cfg['steps']} decode steps, cache capacity {int4.capacity} "
          f"(attend compiled once for the prefill rows, once for the decode row)")
    print(f"prefill {prefill_s * 1e3:.1f} ms (compiles its graphs); decode graphs compiled and warmed up "
          f"in {compile_s * 1e3:.1f} ms (int4 and f32); decode {decode_s / cfg['steps'] * 1e3:.2f} ms per token "
          f"({cfg['steps'] / decode_s:.1f} tokens/s)")
    print(f"K/V cache at {length} tokens: int4 {int4.cache_bytes()} bytes (values + f32 scales), "
          f"bf16 {values * 2} bytes, f32 {f32.cache_bytes()} bytes")
    # the kernels sum in f32 through several layers of K <= ffn terms: ~1e-6 relative
    gallery.error("decode steps vs numpy f64 on the same int4 weights and cache, max rel", worst, 1e-4)
    print(f"int4 weights + int4 cache vs the same graphs in f32 (quantization, not the kernels): "
          f"max rel {deviation:.3e}")


if __name__ == "__main__":
    main()

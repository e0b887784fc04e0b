"""Soak of the LLM decode loop (issue 33, standing test): sample 13's int4
decoder (projections with int4 weights, attention over an int4 KV cache of fixed
capacity, the gated MLP) decodes step after step; once the cache is full it
starts over behind the prompt, so every step runs the same compiled graphs.
Resident memory must stay flat and the compiled-partition cache must not grow.

The short version (``DECODE_SOAK_SHORT`` steps, a few seconds) runs in the
default suite; ``pytest -m long`` runs ``GRAPH_API_DECODE_SOAK_STEPS`` (default
100,000).
"""
from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

from graph_api import partition_cache

from .test_concurrency_soak import rss_bytes

DECODE_SOAK_SHORT = 300
DECODE_SOAK_LONG = int(os.environ.get("GRAPH_API_DECODE_SOAK_STEPS", "100000"))
#: the decoder's arrays are a few hundred KiB; a leak of one step's output (512 B)
#: or one bound step per call passes this within the long soak
RSS_GROWTH_LIMIT = 16 << 20
CONFIG = dict(layers=2, hidden=128, heads=4, kv_heads=2, head_dim=32, ffn=256, prompt=6, steps=58)


def decode_soak(steps: int) -> None:
    sample = importlib.import_module("samples.13_llm_decode")
    rng = np.random.default_rng(13)
    layers = [sample.Layer(CONFIG, rng) for _ in range(CONFIG["layers"])]
    decoder = sample.Decoder(CONFIG, layers, "int4")
    tokens = rng.standard_normal((CONFIG["prompt"] + CONFIG["steps"], CONFIG["hidden"])).astype(np.float32)
    decoder.step(tokens[:CONFIG["prompt"]], 0)
    decoder.compile_decode()
    lap = CONFIG["steps"]  # decode steps until the cache is full
    warm_up = max(steps // 10, lap)
    worst, first_lap, differ = 0.0, {}, 0
    for t in range(steps):
        if t == warm_up:
            rss, entries, models = rss_bytes(), len(partition_cache.CACHE), len(decoder.models)
        position = decoder.length
        if position == decoder.capacity:  # full: decode again behind the prompt (same shapes, same graphs)
            position = decoder.length = CONFIG["prompt"]
        x = tokens[position][None]
        got = decoder.step(x, position)
        if t < lap:  # the first lap against the numpy reference (on the cache the step wrote); later laps
            want = sample.reference_step(CONFIG, layers, decoder, x, position)  # repeat it bit for bit
            worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
            first_lap[position] = got.copy()
        else:
            differ += not np.array_equal(got, first_lap[position])
    grown = rss_bytes() - rss
    print(f"\ndecode soak: {steps} steps, RSS {rss / 2**20:.1f} MiB after {warm_up} -> "
          f"{(rss + grown) / 2**20:.1f} MiB; {len(partition_cache.CACHE)} cached partitions; "
          f"worst relative deviation from the reference {worst:.2e}")
    # the same bound as the sample's own check of the int4 decoder against its numpy reference
    assert worst < 1e-4 and differ == 0
    assert len(partition_cache.CACHE) == entries and len(decoder.models) == models
    assert grown < RSS_GROWTH_LIMIT


def test_decode_soak_short():
    decode_soak(DECODE_SOAK_SHORT)


@pytest.mark.long
def test_decode_soak_long():
    decode_soak(DECODE_SOAK_LONG)

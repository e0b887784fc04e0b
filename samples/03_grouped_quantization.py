"""Grouped quantization round trip: DynamicQuantize -> DynamicDequantize in s8, u8, s4 and u4.

For each integer type and grouping (per tensor, per channel, groups of 32 and 128 along
the last dim; zero points for the unsigned types), the graph quantizes a weight-like
matrix with scales computed in numpy, dequantizes it again, and the sample prints the
round-trip error in units of each element's scale (at most 1/2: rounding to the nearest
step) and the storage in bytes (int4 is packed two per byte).

    python -m samples 03_grouped_quantization
"""
from __future__ import annotations

import numpy as np

from graph_api import DataType as dt
from graph_api import GraphBuilder
from samples import gallery

RANGES = {dt.s8: (-128, 127), dt.u8: (0, 255), dt.s4: (-8, 7), dt.u4: (0, 15)}
BYTES = {dt.s8: 1.0, dt.u8: 1.0, dt.s4: 0.5, dt.u4: 0.5}


def scales_for(w: np.ndarray, group: int, int_dt):
    """Per-group scale (and zero point for unsigned types) covering each group's range."""
    lo_q, hi_q = RANGES[int_dt]
    g = w.reshape(w.shape[0], -1, group)
    if lo_q < 0:  # symmetric
        scale = np.abs(g).max(-1) / hi_q
        return scale.astype(np.float32), None
    lo, hi = g.min(-1), g.max(-1)
    scale = ((hi - lo) / (hi_q - lo_q)).astype(np.float32)
    zp = np.clip(np.rint(-lo / scale), lo_q, hi_q)
    return scale, zp


def round_trip(w: np.ndarray, int_dt, group: int):
    """The graph's dequantized weights and the per-element scale."""
    n, k = w.shape
    scale, zp = scales_for(w, group, int_dt)
    if group == k and BYTES[int_dt] == 1:  # int4 takes per_group only (a row is one group)
        qtype, attrs, s_shape = "per_channel", {"axis": 0}, [n]
        scale, zp = scale[:, 0], (None if zp is None else zp[:, 0])
    else:
        qtype, attrs, s_shape = "per_group", {"group_shape": [1, group]}, [n, k // group]
    b = GraphBuilder()
    x = b.input(dt.f32, [n, k])
    s = b.constant(scale.reshape(s_shape))
    z = None if zp is None else b.constant(zp.reshape(s_shape).astype(np.int32), dtype=int_dt)
    q = b.dynamic_quantize(x, s, z, qtype=qtype, out_dtype=int_dt, **attrs)
    y = b.dynamic_dequantize(q, s, z, qtype=qtype, **attrs)
    model = b.compile()
    result = model(w)
    picture = (f"{int_dt.name} {qtype}, groups of {group}", b.graph, model.partitions, model.kernels)
    per_elem = np.repeat(scale.reshape(n, -1), k // scale.reshape(n, -1).shape[1], axis=1)
    return result, per_elem, picture


def main(small: bool = False) -> None:
    rng = np.random.default_rng(0)
    n, k = (16, 256) if small else (1024, 4096)
    w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
    print(f"weights {n}x{k} f32: {w.nbytes} bytes")
    print(f"{'type':5s} {'grouping':18s} {'bytes (q+scales)':>16s} {'max |err|/scale':>16s} {'rel RMS err':>12s}")
    shown = False
    for int_dt in (dt.s8, dt.u8, dt.s4, dt.u4):
        for group in (k, 128, 32):
            got, per_elem, picture = round_trip(w, int_dt, group)
            err = np.abs(got.astype(np.float64) - w) / per_elem
            rms = np.sqrt(np.mean((got.astype(np.float64) - w) ** 2) / np.mean(w.astype(np.float64) ** 2))
            stored = int(n * k * BYTES[int_dt] + per_elem[:, ::group].size * 4)
            name = "per row" if group == k else f"groups of {group}"
            print(f"{int_dt.name:5s} {name:18s} {stored:16d} {err.max():16.4f} {rms:12.2e}")
            # rounding to the nearest step: 1/2 a scale, plus the f32 roundings of x/scale + zp (values
            # up to 2^8, whose ulp is 2^-15: two roundings of half an ulp) and of (q - zp) * scale
            # (2^-24 relative of at most 2^8 steps): below 2^-14 of a step in all
            gallery.error(f"{int_dt.name} {name} round trip, max |err| in scales", float(err.max()), 0.5 + 2.0 ** -14)
            if not shown and int_dt == dt.u4:
                gallery.graph(*picture)
                shown = True


if __name__ == "__main__":
    main()

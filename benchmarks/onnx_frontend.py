"""ONNX models through the ONNX front door (``ga.from_onnx``) against ONNX Runtime on the
same file, in the same run.

Models (made on the spot, ``graph_api.frontend.onnx_models.encoder_layer``): a post-LayerNorm
BERT encoder with MiniLM-L6 shapes (hidden 384, 12 heads, FFN 1536, 6 layers) written in ONNX
ops (MatMul + Add projections, opset-23 ``Attention``, LayerNormalization, Gelu), in f32 and
with every projection an int4 ``MatMulNBits`` (blocks of 32, zero points).  The project runs
the imported graph (one ``CompiledGraph``, constants as Tensors); ONNX Runtime runs the
model file with its default threads, MatMulNBits at accuracy level 0 (f32 activations, what
the project computes) and, for reference, level 4 (int8 activations).

Rows as ``benchmarks/bert.py``'s: (label, "hot", who, ms, peer ms / project ms, note).
"""
from __future__ import annotations

import time

import numpy as np

MINILM = dict(hidden=384, heads=12, ffn=1536, layers=6)


def _best(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _with_accuracy_level(model, level: int):
    import onnx

    copy = onnx.ModelProto.FromString(model.SerializeToString())
    for node in copy.graph.node:
        if node.op_type == "MatMulNBits":
            for attr in node.attribute:
                if attr.name == "accuracy_level":
                    attr.i = level
    return copy


def bench_onnx(rows, quick: bool = False, peers_on: bool = True, shapes=((8, 64),)):
    """Append the ONNX front door's rows (f32 and int4 encoders; project vs ONNX Runtime)."""
    try:
        import onnx  # noqa: F401
    except ImportError:
        return rows
    import graph_api as ga
    from graph_api.frontend import onnx_models as om

    reps = 3 if quick else 10
    for batch, seq in shapes:
        x = np.random.default_rng(0).standard_normal((batch, seq, MINILM["hidden"])).astype(np.float32)
        for bits in (0, 4):
            model = om.encoder_layer(**MINILM, bits=bits, block=32)
            what = "f32" if not bits else "int4 MatMulNBits g32"
            label = f"ONNX import: BERT encoder MiniLM-L6 shapes, {what}, batch {batch} x seq {seq}"
            start = time.perf_counter()
            graph = ga.from_onnx(model)
            load_ms = (time.perf_counter() - start) * 1e3
            if not isinstance(graph, ga.Graph):
                rows.append((label, "hot", "project", float("nan"), 1.0,
                             f"not one graph: {len(graph.host_steps)} host steps"))
                continue
            feeds = {**graph.constants, graph.onnx_inputs["x"]: x}
            compiled = ga.compile_graph(graph, feeds)
            compiled(feeds)  # warm: the first calls load the Numba kernels
            out_id = graph.onnx_outputs["y"]
            t = _best(lambda: compiled(feeds), reps)
            got = compiled(feeds)[out_id].copy()
            kinds = [part.get_kind() for part, _, _, _ in compiled.steps]
            rows.append((label, "hot", "project", t * 1e3, 1.0,
                         f"{len(kinds)} partitions ({kinds.count('sdpa')} sdpa, "
                         f"{kinds.count('matmul_compressed')} compressed); import {load_ms:.0f} ms"))
            if not peers_on:
                continue
            try:
                import onnxruntime  # noqa: F401
            except ImportError:
                continue
            for level in ((0,) if not bits else (0, 4)):
                session = om.ort_session(_with_accuracy_level(model, level) if bits else model)
                want = session.run(None, {"x": x})[0]
                err = float(np.abs(got - want).max() / np.abs(want).max())
                tt = _best(lambda: session.run(None, {"x": x}), reps)
                who = "onnxruntime" if not bits else f"ORT MatMulNBits acc{level} ({'f32' if not level else 'int8'} act)"
                rows.append((label, "hot", who, tt * 1e3, tt / t, f"max |diff| / max {err:.1e}"))
    return rows


if __name__ == "__main__":
    import sys

    out = bench_onnx([], quick="--quick" in sys.argv)
    for row in out:
        print(f"{row[0]:<80} {row[2]:<36} {row[3]:>9.3f} ms  x{row[4]:.2f}  {row[5]}")

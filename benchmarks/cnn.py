"""CNN blocks built with the public API, and the same math in PyTorch as the peer.

* ResNet-50 bottleneck (conv2_x, 56x56, NCHW): 1x1 256->64 + bias + ReLU,
  3x3 64->64 + bias + ReLU, 1x1 64->256 + bias + residual Add + ReLU
  (BatchNorm folded into the biases, as deployed graphs have it).
* MobileNetV2 inverted residual (56x56): 1x1 24->144 + bias + ReLU6, depthwise
  3x3 144 + bias + ReLU6, 1x1 144->24 + bias + residual Add.

f32: three ``conv_post_ops`` / ``conv_depthwise`` partitions; peer PyTorch f32
eager (``F.conv2d`` chain).  int8: u8 activations (per-tensor scale), s8
weights (per-output-channel scales), each convolution a Dequantize ->
Convolution -> post-ops -> Quantize partition (oneDNN's int8 fusion); peer
PyTorch's quantized CPU ops (x86 engine, channels-last, ``conv2d_relu``,
``add_relu``), which is what its int8 CNNs run; they requantize the last
convolution's output before the residual add (one more rounding than oneDNN's
fused form), so a few u8 outputs differ by more than 1.
"""
from __future__ import annotations

import time

import numpy as np

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K

CONST = ga.PropertyType.constant
X_SCALE, Y_SCALE = 0.05, 0.05  # activation scales: u8 values ~ N(0, 1) / 0.05 clipped to [0, 255]


#: block name -> [(out channels, kernel, groups, post)] ; post: relu | relu6 | add_relu | add
BLOCKS = {
    "ResNet-50 bottleneck 256-64-64-256": (256, [(64, 1, 1, "relu"), (64, 3, 1, "relu"),
                                                 (256, 1, 1, "add_relu")]),
    "MobileNetV2 inverted residual 24-144-dw144-24": (24, [(144, 1, 1, "relu6"), (144, 3, 144, "relu6"),
                                                           (24, 1, 1, "add")]),
}


class _Builder:
    def __init__(self):
        self.g = ga.Graph(ga.EngineKind.cpu)
        self.tid = self.oid = 0

    def lt(self, shape, dtype=dt.f32, prop=ga.PropertyType.variable):
        t = ga.LogicalTensor(self.tid, dtype, list(shape), property=prop)
        self.tid += 1
        return t

    def op(self, kind, ins, shape, dtype=dt.f32, attrs=None):
        out = self.lt(shape, dtype)
        self.g.add_op(ga.Op(self.oid, kind, ins, [out], attrs=attrs or {}))
        self.oid += 1
        return out


def _conv_attrs(k, groups):
    p = k // 2
    return {"strides": [1, 1], "pads_begin": [p, p], "pads_end": [p, p], "dilations": [1, 1],
            "groups": groups, "data_format": "NCX", "weights_format": "OIX"}


def _q(scales, zps, qtype="per_tensor", axis=1):
    return {"qtype": qtype, "axis": axis, "scales": [float(s) for s in scales], "zps": [int(z) for z in zps]}


def make_params(c_in, layers, rng):
    """f32 weights ~ N(0, 2/fan_in) (He), biases ~ 0.1 N(0, 1); and their s8 form."""
    params, c = [], c_in
    for oc, k, groups, _ in layers:
        fan_in = c // groups * k * k
        w = (rng.standard_normal((oc, c // groups, k, k)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        scales = np.abs(w).reshape(oc, -1).max(axis=1) / 127.0
        w8 = np.clip(np.round(w / scales.reshape(-1, 1, 1, 1)), -127, 127).astype(np.int8)
        params.append((w, (0.1 * rng.standard_normal(oc)).astype(np.float32), w8, scales.astype(np.float32)))
        c = oc
    return params


def build(c_in, layers, params, n, hw, int8):
    """(graph, feeds) of one block; feeds by tensor id."""
    b = _Builder()
    feeds = {}
    x = b.lt((n, c_in, hw, hw), dt.u8 if int8 else dt.f32)
    block_in = x
    for (oc, k, groups, post), (w, bias, w8, scales) in zip(layers, params):
        shape = (n, oc, hw, hw)
        if int8:
            wt = b.lt(w.shape, dt.s8, CONST)
            feeds[wt.id] = w8
            src = b.op(K.Dequantize, [x], x.shape, attrs=_q([X_SCALE], [0]))
            wd = b.op(K.Dequantize, [wt], w.shape, attrs=_q(scales, [0] * oc, "per_channel", 0))
        else:
            wt = b.lt(w.shape, dt.f32, CONST)
            feeds[wt.id] = w
            src, wd = x, wt
        bt = b.lt((oc,), dt.f32, CONST)
        feeds[bt.id] = bias
        y = b.op(K.Convolution, [src, wd, bt], shape, attrs=_conv_attrs(k, groups))
        if post.startswith("add"):
            res = b.op(K.Dequantize, [block_in], block_in.shape, attrs=_q([X_SCALE], [0])) if int8 else block_in
            y = b.op(K.Add, [y, res], shape)
        if post in ("relu", "add_relu"):
            y = b.op(K.ReLU, [y], shape)
        elif post == "relu6":
            y = b.op(K.Clamp, [y], shape, attrs={"min": 0.0, "max": 6.0})
        x = b.op(K.Quantize, [y], shape, dt.u8, _q([Y_SCALE], [0])) if int8 else y
    b.g.finalize()
    return b.g, block_in.id, x.id, feeds


def torch_block(layers, params, x, int8):
    """The block in PyTorch (f32 eager, or quantized x86 ops); returns run()."""
    import torch
    import torch.nn.functional as F

    if not int8:
        ws = [(torch.from_numpy(w), torch.from_numpy(bias)) for w, bias, _, _ in params]
        xt = torch.from_numpy(x)

        @torch.inference_mode()
        def run():
            h = xt
            for (oc, k, groups, post), (w, bias) in zip(layers, ws):
                h2 = F.conv2d(h, w, bias, padding=k // 2, groups=groups)
                if post.startswith("add"):
                    h2 = h2 + xt
                h = F.relu(h2) if "relu" in post and post != "relu6" else \
                    (F.relu6(h2) if post == "relu6" else h2)
            return h.numpy()

        return run
    torch.backends.quantized.engine = "x86"
    xq = torch._make_per_tensor_quantized_tensor(torch.from_numpy(x), X_SCALE, 0)
    xq = xq.contiguous(memory_format=torch.channels_last)
    packed = []
    for (oc, k, groups, post), (w, bias, w8, scales) in zip(layers, params):
        wq = torch._make_per_channel_quantized_tensor(torch.from_numpy(w8), torch.from_numpy(scales.astype(np.float64)),
                                                      torch.zeros(oc, dtype=torch.long), 0)
        packed.append(torch.ops.quantized.conv2d_prepack(wq, torch.from_numpy(bias), [1, 1],
                                                         [k // 2, k // 2], [1, 1], groups))
    ops = torch.ops.quantized

    @torch.inference_mode()
    def run():
        h = xq
        for (oc, k, groups, post), p in zip(layers, packed):
            if post == "relu":
                h = ops.conv2d_relu(h, p, Y_SCALE, 0)
            elif post == "relu6":  # no fused ReLU6 op: conv then clamp on the quantized tensor
                h = torch.clamp(ops.conv2d(h, p, Y_SCALE, 0), 0.0, 6.0)
            else:  # the conv output is requantized before the add (zero point 128 keeps its sign)
                y = ops.conv2d(h, p, Y_SCALE, 128)
                h = ops.add_relu(y, xq, Y_SCALE, 0) if post == "add_relu" else ops.add(y, xq, Y_SCALE, 0)
        return h.int_repr().contiguous().numpy()

    return run


def _best(fn, reps):
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_cnn(rows, quick=False, peers_on=True, batches=(1, 8), hw=56):
    from benchmarks import own_process, peers

    for index, (name, (c_in, layers)) in enumerate(BLOCKS.items()):
        for n, params, x32, x8 in _inputs(c_in, layers, batches, hw):
            for int8 in (False, True):
                g, x_id, out_id, feeds = build(c_in, layers, params, n, hw, int8)
                feeds[x_id] = x8 if int8 else x32
                eng = ga.Engine()
                tensors = {tid: ga.Tensor(g.tensors[tid], eng, v) for tid, v in feeds.items()}
                compiled = ga.compile_graph(g, tensors)
                got = compiled(tensors)[out_id]  # warm: first calls load kernels
                reps = 3 if quick else 10
                t = _best(lambda: compiled(tensors), reps)
                label = f"{name}, {'int8' if int8 else 'f32'}, batch {n} x {hw}x{hw}"
                plans = ",".join(c.plan.name for _, c, _, _ in compiled.steps)
                rows.append((label, "hot", "project", t * 1e3, 1.0,
                             f"{len(compiled.steps)} partitions: {plans}"))
                if peers_on and peers.have_torch():
                    run = torch_block(layers, params, feeds[x_id], int8)
                    want = run()
                    tt = _best(run, reps)
                    diff = np.abs(got.astype(np.float64) - want)
                    agree = (f"max |diff| {diff.max():.1e}" if not int8 else
                             f"{100 * (diff > 1).mean():.2f}% of u8 outputs off by > 1")
                    peer = "torch int8 (x86 quantized ops)" if int8 else "torch f32 eager"
                    rows.append((label, "hot", peer, tt * 1e3, tt / t, agree))
                    own = own_process.run("cnn", index, ",".join(map(str, batches)), n, hw, int(int8), reps)
                    if own is not None:
                        diff = np.abs(got.astype(np.float64) - own[1])
                        agree = (f"max |diff| {diff.max():.1e}" if not int8 else
                                 f"{100 * (diff > 1).mean():.2f}% of u8 outputs off by > 1")
                        rows.append((label, "hot", peer + " (own process, default threads)",
                                     own[0], own[0] / (t * 1e3), agree))
    return rows


def _inputs(c_in, layers, batches, hw):
    """(batch, params, f32 input, u8 input) per batch; the same draws in every process."""
    rng = np.random.default_rng(0)
    params = make_params(c_in, layers, rng)
    for n in batches:
        x32 = rng.standard_normal((n, c_in, hw, hw)).astype(np.float32)
        x8 = np.clip(np.round(np.maximum(x32, 0) / X_SCALE), 0, 255).astype(np.uint8)
        yield n, params, x32, x8


def block_input(c_in, layers, batches, n, hw, int8):
    """(the input of batch ``n``, params) exactly as :func:`bench_cnn` draws them."""
    for m, params, x32, x8 in _inputs(c_in, layers, batches, hw):
        if m == n:
            return (x8 if int8 else x32), params
    raise ValueError(f"batch {n} not in {batches}")

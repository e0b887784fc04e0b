"""A BERT encoder (all-MiniLM-L6-v2 shapes) built with the public API, and the
same math in PyTorch f32 eager as the peer.

Per layer (post-LayerNorm BERT)::

    q, k, v = reshape+transpose(x @ Wq + bq), ...        3 matmul_transpose
    ctx = SDPA(q, k, v, additive mask) -> transpose+reshape
    h   = LayerNorm(ctx @ Wo + bo + x)
    y   = LayerNorm(GELU(h @ W1 + b1) @ W2 + b2 + h)
"""
from __future__ import annotations

import math
import time

import ml_dtypes
import numpy as np

import graph_api as ga
from graph_api import DataType as dt
from graph_api import dtypes
from graph_api import OpKind as K

MINILM = dict(hidden=384, heads=12, ffn=1536, layers=6)


class _Builder:
    def __init__(self):
        self.g = ga.Graph(ga.EngineKind.cpu, ga.FPMathMode.strict)
        self.tid = 0
        self.oid = 0
        self.consts: dict[int, tuple] = {}
        #: s4 weight id -> (scale id, group) of the int4 variant
        self.int4: dict[int, tuple] = {}

    def lt(self, shape, prop=ga.PropertyType.variable, dtype=dt.f32):
        t = ga.LogicalTensor(self.tid, dtype, list(shape), property=prop)
        self.tid += 1
        return t

    def const(self, shape, dtype=dt.f32):
        t = self.lt(shape, ga.PropertyType.constant, dtype)
        self.consts[t.id] = tuple(shape)
        return t

    def op(self, kind, ins, out_shape, attrs=None, outs=None):
        outs = outs or [self.lt(out_shape)]
        self.g.add_op(ga.Op(self.oid, kind, ins, outs, attrs=attrs or {}))
        self.oid += 1
        return outs[0]


def build_encoder(batch, seq, hidden=384, heads=12, ffn=1536, layers=6, group=0):
    """(graph, input id, mask id, output id, {constant id: shape}, scale id, head dim,
    {s4 weight id: (scale id, group)}) of the encoder.

    ``group`` > 0: every projection weight is s4 with one f32 scale per ``group``
    consecutive K values (``DynamicDequantize`` per_group, group_shape [group, 1])
    feeding the MatMul: the weight-compressed form.
    """
    b = _Builder()
    d = hidden // heads
    x = b.lt((batch, seq, hidden))
    mask = b.lt((batch, 1, 1, seq))
    x_id, mask_id = x.id, mask.id
    scale = b.const((1,))
    for _ in range(layers):
        def weight(n_in, n_out):
            w = b.const((n_in, n_out), dt.s4 if group else dt.f32)
            if not group:
                return w
            s = b.lt((n_in // group, n_out), ga.PropertyType.constant)
            b.int4[w.id] = (s.id, group)
            return b.op(K.DynamicDequantize, [w, s], (n_in, n_out),
                        {"qtype": "per_group", "group_shape": [group, 1]})

        def proj(src, n_in, n_out):
            return b.op(K.MatMul, [src, weight(n_in, n_out), b.const((n_out,))], (batch, seq, n_out))

        def heads_of(t):
            t = b.op(K.StaticReshape, [t], (batch, seq, heads, d),
                     {"shape": [batch, seq, heads, d], "special_zero": False})
            return b.op(K.StaticTranspose, [t], (batch, heads, seq, d), {"order": [0, 2, 1, 3]})

        q, k, v = (heads_of(proj(x, hidden, hidden)) for _ in range(3))
        s = b.op(K.MatMul, [q, k], (batch, heads, seq, seq), {"transpose_b": True})
        s = b.op(K.Divide, [s, scale], (batch, heads, seq, seq))
        s = b.op(K.Add, [s, mask], (batch, heads, seq, seq))
        p = b.op(K.SoftMax, [s], (batch, heads, seq, seq), {"axis": -1})
        c = b.op(K.MatMul, [p, v], (batch, heads, seq, d))
        c = b.op(K.StaticTranspose, [c], (batch, seq, heads, d), {"order": [0, 2, 1, 3]})
        c = b.op(K.StaticReshape, [c], (batch, seq, hidden),
                 {"shape": [batch, seq, hidden], "special_zero": False})

        def add_norm(y, res):
            y = b.op(K.Add, [y, res], (batch, seq, hidden))
            return b.op(K.LayerNorm, [y, b.const((hidden,)), b.const((hidden,))], None,
                        {"keep_stats": False, "epsilon": 1e-12}, outs=[b.lt((batch, seq, hidden))])

        h = add_norm(proj(c, hidden, hidden), x)
        f = b.op(K.GELU, [proj(h, hidden, ffn)], (batch, seq, ffn))
        x = add_norm(proj(f, ffn, hidden), h)
    b.g.finalize()
    return b.g, x_id, mask_id, x.id, b.consts, scale.id, d, b.int4


def make_feeds(graph_info, rng):
    g, x_id, mask_id, out_id, consts, scale_id, d, int4 = graph_info
    feeds = {}
    for tid, shape in consts.items():
        if len(shape) == 2:  # weights ~ N(0, 1/fan_in) keep activations O(1)
            feeds[tid] = (rng.standard_normal(shape) / math.sqrt(shape[0])).astype(np.float32)
        else:
            feeds[tid] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        if tid in int4:
            scale_tid, group = int4[tid]
            feeds[tid], feeds[scale_tid] = quantize_s4(feeds[tid], group)
    feeds[scale_id] = np.array([math.sqrt(d)], np.float32)
    xs = g.tensors[x_id].shape
    feeds[x_id] = rng.standard_normal(xs).astype(np.float32)
    mask = np.zeros(g.tensors[mask_id].shape, np.float32)
    mask[..., -xs[1] // 8:] = -1e4  # padding at the end of each sequence
    feeds[mask_id] = mask
    return feeds


def quantize_s4(w, group):
    """Symmetric s4 per ``group`` consecutive rows (K) of ``w [K, N]``: (int4 values, f32 scales
    [K / group, N]) with w ~= q * scale."""
    K, N = w.shape
    wg = w.reshape(K // group, group, N)
    scale = (np.abs(wg).max(axis=1) / 7).astype(np.float32)
    scale[scale == 0] = 1
    q = np.clip(np.rint(wg / scale[:, None]), -8, 7).reshape(K, N)
    return q.astype(ml_dtypes.int4), scale


def torch_encoder(graph_info, feeds):
    """The same encoder in PyTorch f32 eager, weights from ``feeds``; returns run()."""
    import torch
    import torch.nn.functional as F

    g, x_id, mask_id, out_id, consts, scale_id, d, _ = graph_info
    ids = sorted(consts)
    w = {tid: torch.from_numpy(feeds[tid]) for tid in ids}
    x0, mask = torch.from_numpy(feeds[x_id]), torch.from_numpy(feeds[mask_id])
    per_layer = [t for t in ids if t != scale_id]
    B, S, Hd = x0.shape
    heads = Hd // d

    @torch.inference_mode()
    def run():
        x = x0
        it = iter(per_layer)
        for _ in range(len(per_layer) // 16):
            q, k, v = (F.linear(x, w[next(it)].T, w[next(it)]).view(B, S, heads, d).transpose(1, 2)
                       for _ in range(3))
            c = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            c = c.transpose(1, 2).reshape(B, S, Hd)
            h = F.linear(c, w[next(it)].T, w[next(it)]) + x
            h = F.layer_norm(h, (Hd,), w[next(it)], w[next(it)], 1e-12)
            f = F.gelu(F.linear(h, w[next(it)].T, w[next(it)]))
            y = F.linear(f, w[next(it)].T, w[next(it)]) + h
            x = F.layer_norm(y, (Hd,), w[next(it)], w[next(it)], 1e-12)
        return x.numpy()

    return run


def ort_encoder(graph_info, feeds, accuracy_level=0):
    """The same encoder as an ONNX graph (opset 20: LayerNormalization, Gelu) in
    ONNX Runtime, weights from ``feeds``; returns run(), or None without ORT.
    s4 weights become com.microsoft ``MatMulNBits`` (bits 4, block = the group;
    ``accuracy_level`` 0: f32 activations, 4: int8 activations)."""
    from benchmarks import peers

    if not peers.have_ort():
        return None
    from onnx import TensorProto, helper
    import onnxruntime as ort

    g, x_id, mask_id, out_id, consts, scale_id, d, int4 = graph_info
    ids = [t for t in sorted(consts) if t != scale_id]
    B, S, Hd = g.tensors[x_id].shape
    heads = Hd // d
    inits, nodes, names = [], [], iter(range(10 ** 6))

    def init(name, array):
        array = np.asarray(array)
        kind = TensorProto.INT64 if array.dtype == np.int64 else TensorProto.FLOAT
        inits.append(helper.make_tensor(name, kind, array.shape, array.tobytes(), raw=True))
        return name

    def node(kind, ins, **attrs):
        out = f"t{next(names)}"
        nodes.append(helper.make_node(kind, ins, [out], **attrs))
        return out

    for tid in ids:
        if tid in int4:  # MatMulNBits: B [N, K / G, G / 2] bytes of u = q + 8, low nibble first
            q, sc = np.asarray(feeds[tid]).astype(np.int64), feeds[int4[tid][0]]
            Kw, Nw = q.shape
            u = (q + 8).T.reshape(Nw, Kw // 2, 2).astype(np.uint8)
            packed = (u[..., 0] | (u[..., 1] << 4)).reshape(Nw, Kw // int4[tid][1], -1)
            inits.append(helper.make_tensor(f"c{tid}", TensorProto.UINT8, packed.shape, packed.tobytes(), raw=True))
            init(f"s{tid}", np.ascontiguousarray(sc.T).reshape(-1))
        else:
            init(f"c{tid}", feeds[tid])
    init("scale", feeds[scale_id].reshape(()))
    init("heads_shape", np.array([B, S, heads, d], np.int64))
    init("hidden_shape", np.array([B, S, Hd], np.int64))
    it = iter(ids)
    x = "x"
    for _ in range(len(ids) // 16):
        def linear(src):
            tid = next(it)
            if tid in int4:
                K_, N_ = g.tensors[tid].shape
                mm = node("MatMulNBits", [src, f"c{tid}", f"s{tid}"], domain="com.microsoft", K=K_, N=N_,
                          bits=4, block_size=int4[tid][1], accuracy_level=accuracy_level)
            else:
                mm = node("MatMul", [src, f"c{tid}"])
            return node("Add", [mm, f"c{next(it)}"])

        def heads_of(t):
            return node("Transpose", [node("Reshape", [t, "heads_shape"])], perm=[0, 2, 1, 3])

        q, k, v = (heads_of(linear(x)) for _ in range(3))
        s = node("MatMul", [q, node("Transpose", [k], perm=[0, 1, 3, 2])])
        p = node("Softmax", [node("Add", [node("Div", [s, "scale"]), "mask"])], axis=-1)
        c = node("Reshape", [node("Transpose", [node("MatMul", [p, v])], perm=[0, 2, 1, 3]), "hidden_shape"])
        h = node("LayerNormalization", [node("Add", [linear(c), x]), f"c{next(it)}", f"c{next(it)}"],
                 axis=-1, epsilon=1e-12)
        f = node("Gelu", [linear(h)])
        x = node("LayerNormalization", [node("Add", [linear(f), h]), f"c{next(it)}", f"c{next(it)}"],
                 axis=-1, epsilon=1e-12)
    graph = helper.make_graph(
        nodes, "bert", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, Hd]),
                        helper.make_tensor_value_info("mask", TensorProto.FLOAT, [B, 1, 1, S])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [B, S, Hd])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10  # onnx 1.23 writes 14, which ONNX Runtime rejects
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    inputs = {"x": feeds[x_id], "mask": feeds[mask_id]}
    return lambda: session.run(None, inputs)[0]


def bench_bert(rows, quick=False, peers_on=True, shapes=((8, 64),)):
    from benchmarks import own_process, peers

    for batch, seq in shapes:
        rng = np.random.default_rng(0)
        info = build_encoder(batch, seq, **MINILM)
        label = f"BERT encoder MiniLM-L6 shapes, f32, batch {batch} x seq {seq}"
        feeds, project, t, reps = _project_row(rows, label, info, rng, quick)
        out_id = info[3]
        if peers_on and peers.have_torch():
            run = torch_encoder(info, feeds)
            want = run()
            got = project()[out_id]
            err = float(np.abs(got - want).max())
            tt = _best(run, reps)
            rows.append((label, "hot", "torch f32 eager", tt * 1e3, tt / t, f"max |diff| {err:.1e}"))
            own = own_process.run("bert", batch, seq, reps)
            if own is not None:
                err = float(np.abs(got - own[1]).max())
                rows.append((label, "hot", "torch f32 eager (own process, default threads)", own[0],
                             own[0] / (t * 1e3), f"max |diff| {err:.1e}"))
        run = ort_encoder(info, feeds) if peers_on else None
        if run is not None:
            err = float(np.abs(project()[out_id] - run()).max())
            tt = _best(run, reps)
            rows.append((label, "hot", "onnxruntime", tt * 1e3, tt / t, f"max |diff| {err:.1e}"))
        # the same encoder with s4 weights, groups of 32 along K: project vs ORT MatMulNBits
        info = build_encoder(batch, seq, **MINILM, group=INT4_GROUP)
        label = f"BERT encoder MiniLM-L6 shapes, s4 weights g{INT4_GROUP}, batch {batch} x seq {seq}"
        feeds, project, t, reps = _project_row(rows, label, info, rng, quick)
        out_id = info[3]
        for level in (0, 4) if peers_on else ():
            run = ort_encoder(info, feeds, accuracy_level=level)
            if run is None:
                break
            err = float(np.abs(project()[out_id] - run()).max())
            tt = _best(run, reps)
            act = "f32" if level == 0 else "int8"
            rows.append((label, "hot", f"ORT MatMulNBits acc{level} ({act} act)", tt * 1e3, tt / t,
                         f"max |diff| {err:.1e}"))
    return rows


#: the int4 rows' group size along K
INT4_GROUP = 32


def _project_row(rows, label, info, rng, quick):
    """Compile and time the project on the encoder ``info``; appends its row and returns
    (feeds as arrays, a runner of the compiled graph on them as Tensors, best seconds, repetitions)."""
    g = info[0]
    feeds = make_feeds(info, rng)
    tensors = _as_tensors(g, feeds)
    compiled = ga.compile_graph(g, tensors)
    compiled(tensors)  # warm: first calls load the Numba kernels
    reps = 3 if quick else 10
    t = _best(lambda: compiled(tensors), reps)
    slow = sum(c.plan.name == "reference" for _, c, _, _ in compiled.steps)
    rows.append((label, "hot", "project", t * 1e3, 1.0,
                 f"{len(compiled.steps)} partitions, {slow} on the reference"))
    return feeds, lambda: compiled(tensors), t, reps


def _as_tensors(g, feeds):
    """Feeds as Tensors; s4 weights as their packed bytes (a direct tensor, so the kernels
    keep the weight they prepared across runs instead of re-packing a mirror each execute)."""
    eng = ga.Engine()
    return {tid: ga.Tensor(g.tensors[tid], eng, dtypes.pack_int4(v) if g.tensors[tid].dtype == dt.s4 else v)
            for tid, v in feeds.items()}


def _best(fn, reps):
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best

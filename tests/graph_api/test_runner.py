"""run_graph / compile_graph: partitions compiled once per shapes, intermediates
allocated once and handed from producer to consumer without copies."""
import numpy as np

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K


def _two_partitions():
    """MatMul+ReLU (matmul_post_ops) -> SoftMax (single op)."""
    g = ga.Graph()
    x = ga.LogicalTensor(0, dt.f32, [4, 8])
    w = ga.LogicalTensor(1, dt.f32, [8, 6], property=ga.PropertyType.constant)
    y, r, s = (ga.LogicalTensor(i, dt.f32, [4, 6]) for i in (2, 3, 4))
    g.add_op(ga.Op(0, K.MatMul, [x, w], [y]))
    g.add_op(ga.Op(1, K.ReLU, [y], [r]))
    g.add_op(ga.Op(2, K.SoftMax, [r], [s], attrs={"axis": -1}))
    g.finalize()
    return g


def test_compiled_graph_is_reused_and_passes_tensors_without_copies():
    g = _two_partitions()
    rng = np.random.default_rng(0)
    feeds = {0: rng.standard_normal((4, 8)).astype(np.float32),
             1: rng.standard_normal((8, 6)).astype(np.float32)}
    cg = ga.compile_graph(g, feeds)
    assert ga.compile_graph(g, feeds) is cg
    assert len(cg.steps) == 2
    (_, _, _, first_outs), (_, _, second_ins, _) = cg.steps
    assert second_ins == [3] and cg.produced[3] is first_outs[0]  # the same Tensor, no copy
    out = cg(feeds)[4]
    again = cg(feeds)[4]
    assert again is not None and np.shares_memory(out, again)  # preallocated once
    h = np.maximum(feeds[0].astype(np.float64) @ feeds[1], 0)
    want = np.exp(h - h.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    # f32 GEMM + f32 softmax vs f64: a few f32 ulps of the O(1) values
    np.testing.assert_allclose(again, want, rtol=1e-5, atol=1e-6)
    run = ga.run_graph(g, feeds)  # run_graph reuses it and returns copies
    assert run.partitions[0].compiled is cg.steps[0][1]
    assert not np.shares_memory(run.outputs[4], again)


def test_new_shapes_compile_a_new_graph():
    g = ga.Graph()
    x = ga.LogicalTensor(0, dt.f32, [-1, 8])
    y = ga.LogicalTensor(1, dt.f32, [-1, 8])
    g.add_op(ga.Op(0, K.Tanh, [x], [y]))
    g.finalize()
    a = ga.compile_graph(g, {0: np.zeros((2, 8), np.float32)})
    b = ga.compile_graph(g, {0: np.zeros((3, 8), np.float32)})
    assert a is not b
    np.testing.assert_array_equal(b({0: np.zeros((3, 8), np.float32)})[1], np.zeros((3, 8)))


def test_a_fed_array_is_wrapped_once_and_read_each_call():
    """The compiled graph keeps the Tensor viewing a fed array; the values are read
    each call (in-place changes count), and another array gets its own Tensor."""
    g = _two_partitions()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    w = rng.standard_normal((8, 6)).astype(np.float32)
    cg = ga.compile_graph(g, {0: x, 1: w})

    def want(xv):
        h = np.maximum(xv.astype(np.float64) @ w, 0)
        e = np.exp(h - h.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    # f32 GEMM + f32 softmax vs f64: a few f32 ulps of the O(1) values
    np.testing.assert_allclose(cg({0: x, 1: w})[4], want(x), rtol=1e-5, atol=1e-6)
    x *= -1.0  # same array, new values
    np.testing.assert_allclose(cg({0: x, 1: w})[4], want(x), rtol=1e-5, atol=1e-6)
    strided = np.asfortranarray(rng.standard_normal((4, 8)).astype(np.float32))  # copied in, not viewed
    np.testing.assert_allclose(cg({0: strided, 1: w})[4], want(strided), rtol=1e-5, atol=1e-6)
    strided *= 2.0
    np.testing.assert_allclose(cg({0: strided, 1: w})[4], want(strided), rtol=1e-5, atol=1e-6)


def test_execute_checks_every_call_after_a_successful_one():
    """What execute caches (accepted logical tensors, checked layouts) never lets a
    wrong tensor through: each misuse after a good call is still a typed error."""
    g = ga.Graph()
    x, y = ga.LogicalTensor(0, dt.f32, [4, 4]), ga.LogicalTensor(1, dt.f32, [4, 4])
    g.add_op(ga.Op(0, K.Tanh, [x], [y]))
    g.finalize()
    (part,) = g.get_partitions()
    engine = ga.Engine()
    stream = ga.Stream(engine)
    cp = part.compile([x], [y], engine)
    good_in = ga.Tensor(x, engine, np.ones((4, 4), np.float32))
    good_out = ga.Tensor(y, engine)
    cp.execute(stream, [good_in], [good_out])
    np.testing.assert_allclose(good_out.numpy(), np.tanh(np.ones((4, 4))), rtol=1e-6)
    misuse = {
        "shape": ([ga.Tensor(ga.LogicalTensor(0, dt.f32, [2, 8]), engine)], [good_out], ga.InvalidShape),
        "dtype": ([ga.Tensor(ga.LogicalTensor(0, dt.bf16, [4, 4]), engine)], [good_out], ga.InvalidDataType),
        "strides": ([ga.Tensor(ga.LogicalTensor(0, dt.f32, [4, 4], [1, 4]), engine)], [good_out],
                    ga.InvalidArguments),
        "missing": ([], [good_out], ga.InvalidArguments),
        "overlap": ([good_in], [ga.Tensor(y, engine, good_in.buffer[::-1])], ga.InvalidArguments),
    }
    for name, (ins, outs, error) in misuse.items():
        try:
            cp.execute(stream, ins, outs)
        except error:
            continue
        raise AssertionError(f"{name}: no {error.__name__}")
    good_out.buffer.flags.writeable = False
    try:
        cp.execute(stream, [good_in], [good_out])
    except ga.InvalidArguments:
        pass
    else:
        raise AssertionError("read-only output accepted")


def _layout_chain():
    """Tanh -> StaticTranspose -> MatMul -> StaticReshape -> ReLU, and a
    StaticTranspose -> StaticReshape branch whose reshape needs a copy."""
    g = ga.Graph()
    lt = lambda i, shape: ga.LogicalTensor(i, dt.f32, shape)
    g.add_op(ga.Op(0, K.Tanh, [lt(0, [2, 3, 4])], [lt(1, [2, 3, 4])]))
    g.add_op(ga.Op(1, K.StaticTranspose, [lt(1, [2, 3, 4])], [lt(2, [2, 4, 3])], attrs={"order": [0, 2, 1]}))
    g.add_op(ga.Op(2, K.MatMul, [lt(2, [2, 4, 3]), ga.LogicalTensor(3, dt.f32, [3, 5])], [lt(4, [2, 4, 5])]))
    g.add_op(ga.Op(3, K.StaticReshape, [lt(4, [2, 4, 5])], [lt(5, [8, 5])],
                   attrs={"shape": [8, 5], "special_zero": False}))
    g.add_op(ga.Op(4, K.ReLU, [lt(5, [8, 5])], [lt(6, [8, 5])]))
    g.add_op(ga.Op(5, K.StaticReshape, [lt(2, [2, 4, 3])], [lt(7, [2, 12])],
                   attrs={"shape": [2, 12], "special_zero": False}))
    g.finalize()
    return g


def test_layout_partitions_between_partitions_are_views():
    g = _layout_chain()
    rng = np.random.default_rng(2)
    feeds = {0: rng.standard_normal((2, 3, 4)).astype(np.float32),
             3: rng.standard_normal((3, 5)).astype(np.float32)}
    cg = ga.compile_graph(g, feeds, policy=ga.PartitionPolicy.debug)
    kinds = {i: step[0].ops[0].kind for i, step in enumerate(cg.steps)}
    viewed = sorted(kinds[i].name for i in cg.views)
    # the transpose and the dense reshape are views; the reshape of the transposed
    # (non-dense) tensor needs a copy, so that partition runs
    assert viewed == ["StaticReshape", "StaticTranspose"]
    assert np.shares_memory(cg.produced[2].numpy(), cg.produced[1].numpy())
    assert np.shares_memory(cg.produced[5].numpy(), cg.produced[4].numpy())
    assert not np.shares_memory(cg.produced[7].numpy(), cg.produced[2].numpy())
    out = cg(feeds)
    t = np.tanh(feeds[0].astype(np.float64)).transpose(0, 2, 1)
    mm = t @ feeds[3]
    # f32 tanh (a few ulps) and an f32 GEMM of K=3 vs float64
    np.testing.assert_allclose(out[6], np.maximum(mm.reshape(8, 5), 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[7], t.reshape(2, 12), rtol=1e-6, atol=1e-6)
    run = ga.run_graph(g, feeds, policy=ga.PartitionPolicy.debug)  # the same through run_graph
    np.testing.assert_array_equal(run.outputs[6], out[6])
    np.testing.assert_array_equal(run.outputs[2], out[7].reshape(2, 4, 3))


def test_constant_int4_weights_fed_unpacked_are_prepared_once(monkeypatch):
    # ga.Tensor over unpacked ml_dtypes.int4 arrays mirrors the user's memory; the
    # copy for the plan used to be made per execute, at a new address each time, so
    # the prepared (repacked) weights were rebuilt every call (4.5 -> 300 ms a step)
    import importlib

    from graph_api.kernels.weight_compressed import wmatmul

    sample = importlib.import_module("samples.02_int4_decoder_layer")
    cfg = sample.CONFIGS["small"]
    graph, ins, out = sample.build(cfg, sample.Ids())
    weights = sample.make_weights(cfg, np.random.default_rng(0))
    engine = ga.Engine()
    feeds = {lt.id: weights[name] if lt.property == ga.PropertyType.host_scalar
             else ga.Tensor(lt, engine, np.asarray(weights[name]).reshape(lt.shape))
             for name, lt in ins.items()}
    first = ga.run_graph(graph, feeds)
    parts = [r.partition for r in first.partitions]
    calls = []
    real = wmatmul.prepare
    monkeypatch.setattr(wmatmul, "prepare", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = [ga.run_graph(graph, feeds, partitions=parts) for _ in range(3)]
    assert calls == []  # prepared on the first run, reused by the next three
    for result in again:  # and the numbers are the first run's
        np.testing.assert_array_equal(result.outputs[out.id], first.outputs[out.id])


def _encoder_layer(B=4, S=32, H=256, heads=4, F=512, group=0):
    """One BERT encoder layer as ``benchmarks/bert.py`` builds it: Q/K/V projections with
    bias into heads, attention (Divide by a constant scale, Add an additive mask, SoftMax),
    output projection + residual + LayerNorm, GELU FFN + residual + LayerNorm.  Big
    enough (rows x columns >= 32768) for the fused GEMM kernel.  ``group`` > 0: s4
    weights with f32 scales per ``group`` rows (DynamicDequantize -> MatMul).  Returns
    the graph, the feeds, the input / mask / output ids and a float64 numpy reference."""
    import math

    import ml_dtypes

    g = ga.Graph()
    ids = iter(range(1000))
    op_ids = iter(range(1000))
    consts = {}

    def lt(shape, const=False):
        t = ga.LogicalTensor(next(ids), dt.f32, list(shape),
                             property=ga.PropertyType.constant if const else ga.PropertyType.variable)
        if const:
            consts[t.id] = shape
        return t

    def op(kind, ins, shape, attrs=None):
        out = lt(shape)
        g.add_op(ga.Op(next(op_ids), kind, ins, [out], attrs=attrs or {}))
        return out

    d = H // heads
    x, mask, scale = lt((B, S, H)), lt((B, 1, 1, S)), lt((1,), const=True)
    params = []

    int4 = {}  # s4 weight id -> its scale id

    def proj(src, n_in, n_out):
        w, b = lt((n_in, n_out), True), lt((n_out,), True)
        params.append((w.id, b.id))
        if group:
            w = ga.LogicalTensor(w.id, dt.s4, [n_in, n_out], property=ga.PropertyType.constant)
            s = lt((n_in // group, n_out), True)
            int4[w.id] = s.id
            w = op(K.DynamicDequantize, [w, s], (n_in, n_out), {"qtype": "per_group", "group_shape": [group, 1]})
        return op(K.MatMul, [src, w, b], (B, S, n_out))

    def heads_of(t):
        t = op(K.StaticReshape, [t], (B, S, heads, d), {"shape": [B, S, heads, d], "special_zero": False})
        return op(K.StaticTranspose, [t], (B, heads, S, d), {"order": [0, 2, 1, 3]})

    def add_norm(y, res):
        y = op(K.Add, [y, res], (B, S, H))
        gamma, beta = lt((H,), True), lt((H,), True)
        params.append((gamma.id, beta.id))
        return op(K.LayerNorm, [y, gamma, beta], (B, S, H), {"keep_stats": False, "epsilon": 1e-12})

    q, k, v = (heads_of(proj(x, H, H)) for _ in range(3))
    s = op(K.MatMul, [q, k], (B, heads, S, S), {"transpose_b": True})
    s = op(K.Divide, [s, scale], (B, heads, S, S))
    s = op(K.Add, [s, mask], (B, heads, S, S))
    p = op(K.SoftMax, [s], (B, heads, S, S), {"axis": -1})
    c = op(K.MatMul, [p, v], (B, heads, S, d))
    c = op(K.StaticTranspose, [c], (B, S, heads, d), {"order": [0, 2, 1, 3]})
    c = op(K.StaticReshape, [c], (B, S, H), {"shape": [B, S, H], "special_zero": False})
    h = add_norm(proj(c, H, H), x)
    f = op(K.GELU, [proj(h, H, F)], (B, S, F))
    y = add_norm(proj(f, F, H), h)
    g.finalize()

    rng = np.random.default_rng(7)
    feeds = {tid: ((rng.standard_normal(shape) / math.sqrt(shape[0])) if len(shape) == 2
                   else 1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32) for tid, shape in consts.items()}
    feeds[scale.id] = np.array([math.sqrt(d)], np.float32)
    feeds[x.id] = rng.standard_normal((B, S, H)).astype(np.float32)
    feeds[mask.id] = np.zeros((B, 1, 1, S), np.float32)
    feeds[mask.id][..., -S // 4:] = -1e4
    for wid, sid in int4.items():  # symmetric s4 per group of rows; the reference's weights: q * scale
        wg = feeds[wid].reshape(-1, group, feeds[wid].shape[1])
        feeds[sid] = (np.abs(wg).max(axis=1) / 7).astype(np.float32)
        feeds[wid] = np.clip(np.rint(wg / feeds[sid][:, None]), -8, 7).reshape(feeds[wid].shape).astype(ml_dtypes.int4)
    erf = np.vectorize(math.erf)

    def reference(fed):
        w = {tid: fed[tid].astype(np.float64) for tid in fed}
        for wid, sid in int4.items():  # f32 products q * scale, as DynamicDequantize
            w[wid] = (fed[wid].astype(np.float32).reshape(-1, group, w[wid].shape[1]) * fed[sid][:, None]) \
                .reshape(w[wid].shape).astype(np.float64)
        it = iter(params)

        def lin(t):
            wi, bi = next(it)
            return t @ w[wi] + w[bi]

        def ln(t):
            gi, bi = next(it)
            m = t.mean(-1, keepdims=True)
            return (t - m) / np.sqrt(((t - m) ** 2).mean(-1, keepdims=True) + 1e-12) * w[gi] + w[bi]

        xs = w[x.id]
        qh, kh, vh = (lin(xs).reshape(B, S, heads, d).transpose(0, 2, 1, 3) for _ in range(3))
        sc = qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(d) + w[mask.id]
        e = np.exp(sc - sc.max(-1, keepdims=True))
        ctx = ((e / e.sum(-1, keepdims=True)) @ vh).transpose(0, 2, 1, 3).reshape(B, S, H)
        hh = ln(lin(ctx) + xs)
        ff = lin(hh)
        return ln(lin(0.5 * ff * (1 + erf(ff / math.sqrt(2)))) + hh)

    return g, feeds, x.id, mask.id, y.id, reference


def test_bound_steps_run_the_kernels_on_the_tensors_memory():
    """A compiled graph's calls run each partition's bound form (the checks and the
    plans' Python work done once: CompiledPartition.bind): the encoder layer's linear
    layers, LayerNorms and attention all have one.  Results equal the per-call execute
    path bit for bit and the float64 reference within f32 bounds; values changed in
    place are read, another array is bound again."""
    g, feeds, x_id, mask_id, y_id, reference = _encoder_layer()
    cg = ga.compile_graph(g, feeds)
    out = cg(feeds)[y_id].copy()
    runners = cg._runners[1]
    assert len(runners) == 9  # 6 linear layers (Q/K/V feed the attention), attention, 2 LayerNorms
    assert not [r for r in runners if hasattr(r, "per_call_work")]
    cg.run(feeds)  # every step through CompiledPartition.execute
    np.testing.assert_array_equal(out, cg.produced[y_id].numpy())
    # f32 sums over K <= 512 of O(1) products (relative error ~K * 2**-24 each, ~3e-5
    # worst case) through softmax, GELU and two LayerNorms (unit-variance outputs); measured ~2e-6
    np.testing.assert_allclose(out, reference(feeds), rtol=1e-4, atol=1e-4)
    x, mask = feeds[x_id], feeds[mask_id]
    x *= -0.5  # the same arrays, new values: the bound steps read them
    mask[..., :4] = -1e4
    np.testing.assert_allclose(cg(feeds)[y_id], reference(feeds), rtol=1e-4, atol=1e-4)
    assert cg._runners[1] is runners
    other = dict(feeds)
    other[x_id] = np.ascontiguousarray(x[::-1])  # another array: bound again
    np.testing.assert_allclose(cg(other)[y_id], reference(other), rtol=1e-4, atol=1e-4)
    assert cg._runners[1] is not runners
    # another mask array: only the attention (the one step reading the mask) is bound again
    runners = cg._runners[1]
    other[mask_id] = mask.copy()
    other[mask_id][..., 4:8] = -1e4
    np.testing.assert_allclose(cg(other)[y_id], reference(other), rtol=1e-4, atol=1e-4)
    kept = [new is old for new, old in zip(cg._runners[1], runners)]
    assert kept.count(False) == 1 and len(kept) == 9


def test_bound_steps_of_an_int4_encoder_layer():
    """The same layer with s4 weights (groups of 32 rows): every linear layer (bias, GELU,
    residual add) runs bound on the weight's dense f32 copy; the attention reads Q/K/V
    as the strided head views of the projections' outputs (a lone transpose between
    partitions is a view) and runs bound.  Numbers as the per-call execute path and the
    float64 reference."""
    g, feeds, x_id, mask_id, y_id, reference = _encoder_layer(group=32)
    cg = ga.compile_graph(g, feeds)
    out = cg(feeds)[y_id].copy()
    runners = cg._runners[1]
    kinds = [(p.get_kind(), getattr(r, "per_call_work", "bound"))
             for (p, _, _, _), r in zip([s for i, s in enumerate(cg.steps) if i not in cg.views], runners)]
    assert sorted(kinds) == sorted([("matmul_compressed", "bound")] * 6 + [("sdpa", "bound")]
                                   + [("single op", "bound")] * 2), kinds
    cg.run(feeds)
    np.testing.assert_array_equal(out, cg.produced[y_id].numpy())
    # as the f32 layer: the dequantized weights are exact f32 products in both
    np.testing.assert_allclose(out, reference(feeds), rtol=1e-4, atol=1e-4)
    feeds[x_id] *= 3.0
    np.testing.assert_allclose(cg(feeds)[y_id], reference(feeds), rtol=1e-4, atol=1e-4)


def test_bound_element_wise_steps_read_their_inputs_each_call():
    """Element-wise partitions (one op each, debug policy) run bound: the epilogue store
    on the f32 input in place, including a binary op whose second operand is a graph
    input that changes between calls.  Values against numpy in float64."""
    g = ga.Graph()
    x, b = ga.LogicalTensor(0, dt.f32, [64, 48]), ga.LogicalTensor(1, dt.f32, [1, 48])
    t, a, r = (ga.LogicalTensor(i, dt.f32, [64, 48]) for i in (2, 3, 4))
    g.add_op(ga.Op(0, K.Tanh, [x], [t]))
    g.add_op(ga.Op(1, K.Add, [t, b], [a]))
    g.add_op(ga.Op(2, K.ReLU, [a], [r]))
    g.finalize()
    rng = np.random.default_rng(4)
    feeds = {0: rng.standard_normal((64, 48)).astype(np.float32), 1: rng.standard_normal((1, 48)).astype(np.float32)}
    cg = ga.compile_graph(g, feeds, policy=ga.PartitionPolicy.debug)
    for _ in range(2):
        got = cg(feeds)[4]
        assert len(cg._runners[1]) == 3 and not [f for f in cg._runners[1] if hasattr(f, "per_call_work")]
        want = np.maximum(np.tanh(feeds[0].astype(np.float64)) + feeds[1], 0)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # tanh32 within a few ulp; one f32 add
        feeds[0] *= -2.0
        feeds[1] += 0.5

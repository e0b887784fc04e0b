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

    from graph_api.kernels import wmatmul

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

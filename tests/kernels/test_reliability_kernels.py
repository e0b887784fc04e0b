"""Regression tests of the kernel-side reliability defects (issue 8).

Each test is named after its defect: 1 s4 zero points ignored
(``test_s4_weights_with_zero_points_are_not_ignored``), 4 a post-op reading y
twice (``test_post_op_reading_the_matmul_output_twice_runs``), 5 zero-size
dims (``test_zero_size_*``), 8 inf/NaN semantics (``test_inf_*``), 9 the
stale constant cache (``test_constant_weights_are_not_reused_*``,
``test_variable_scales_*``).  Each graph runs through the public API (fused
policy) and is compared with an independent float64 numpy formula, or with
the unfused reference plan (debug policy) where the point is that the fused
plan computes what the unfused ops compute.
"""
import ml_dtypes
import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api.check import compare

C, V = ga.PropertyType.constant, ga.PropertyType.variable
INT_RANGE = {dt.s4: (-8, 7), dt.u4: (0, 15), dt.s8: (-128, 127), dt.u8: (0, 255),
             dt.s32: (-2 ** 31, 2 ** 31 - 1)}


def lt(tid, dtype, shape, prop=V):
    return ga.LogicalTensor(tid, dtype, shape, property=prop)


def run(graph, feeds, policy=ga.PartitionPolicy.fusion):
    """(outputs by id, plan names) of one run of ``graph``."""
    if not graph.is_finalized():
        graph.finalize()
    result = ga.run_graph(graph, feeds, policy=policy)
    return result.outputs, [r.compiled.plan.name for r in result.partitions]


# ------------------------------------------------------- weight-compressed MatMul
def compressed_params(wdt, qtype, K_, N, G, trans):
    """(attrs, parameter shape, parameter shape broadcast to logical [K, N] as [K/G', N'])."""
    int4 = wdt in (dt.s4, dt.u4)
    if qtype == "per_group":
        return (dict(qtype="per_group", group_shape=[1, G] if trans else [G, 1]),
                [N, K_ // G] if trans else [K_ // G, N])
    if qtype == "per_channel":
        if int4:  # int4 needs groups (RFC): one group spanning K is per-channel
            return (dict(qtype="per_group", group_shape=[1, K_] if trans else [K_, 1]),
                    [N, 1] if trans else [1, N])
        return dict(qtype="per_channel", axis=0 if trans else 1), [N]
    if int4:  # one group spanning the whole tensor is per-tensor
        return dict(qtype="per_group", group_shape=[N, K_] if trans else [K_, N]), [1, 1]
    return dict(qtype="per_tensor"), [1]


def logical_params(p, qtype, K_, N, trans):
    """A scale/zp array as its logical [K/G, N]-broadcastable form (f64)."""
    p = np.asarray(p, np.float64)
    if qtype == "per_channel" and p.ndim == 1:
        return p.reshape(1, N)
    if p.ndim == 2 and trans:
        return p.T
    return p.reshape(1, -1) if p.ndim == 1 else p


def wmatmul_graph(wdt, zdt, qtype, *, trans, const, M, N, K_=64, G=32, q=None, zp=None,
                  scales=None, x=None, seed=0, post=None):
    """x [M, K] @ DynamicDequantize(W, scales, zps) (+ post(graph, y) ops); returns
    (graph, feeds, expected f64 [M, N] before post-ops)."""
    rng = np.random.default_rng(seed)
    attrs, pshape = compressed_params(wdt, qtype, K_, N, G, trans)
    wshape = [N, K_] if trans else [K_, N]
    lo, hi = INT_RANGE[wdt]
    q = rng.integers(lo, hi + 1, wshape) if q is None else np.broadcast_to(q, wshape)
    if scales is None:
        scales = 2.0 ** rng.integers(-5, -2, pshape)  # powers of two: exact products
    if zp is None and zdt is not None:
        zlo, zhi = INT_RANGE[zdt]
        zp = rng.integers(max(zlo, -20), min(zhi, 20) + 1, pshape)
    if x is None:
        x = rng.integers(-4, 5, (M, K_)).astype(np.float32)  # small integers: exact sums
    prop = C if const else V
    g = ga.Graph(ga.EngineKind.cpu, "strict")
    ins = [lt(0, wdt, wshape, prop), lt(1, dt.f32, pshape, prop)]
    feeds = {0: ga.dtypes.convert(q, wdt),
             1: np.array(np.broadcast_to(np.asarray(scales, np.float32), pshape))}
    if zdt is not None:
        ins.append(lt(2, zdt, pshape, prop))
        feeds[2] = ga.dtypes.convert(np.broadcast_to(zp, pshape), zdt)
    wf, xl, y = lt(3, dt.f32, wshape), lt(4, dt.f32, [M, K_]), lt(5, dt.f32, [M, N])
    feeds[4] = np.asarray(x, np.float32)
    g.add_op(ga.Op(0, K.DynamicDequantize, ins, [wf], attrs=attrs))
    g.add_op(ga.Op(1, K.MatMul, [xl, wf], [y], attrs={"transpose_b": trans}))
    if post is not None:
        post(g, y, feeds)
    # independent formula: dense float64 weights (q - zp) * s, then x @ W
    qk = np.asarray(q, np.float64).T if trans else np.asarray(q, np.float64)
    s = logical_params(feeds[1], qtype, K_, N, trans)
    z = 0.0 if zdt is None else logical_params(ga.dtypes.to_f32(feeds[2]), qtype, K_, N, trans)
    rows = K_ // s.shape[0] if s.shape[0] else 0
    w64 = (qk - np.repeat(np.broadcast_to(z, s.shape), rows, 0)) * np.repeat(s, rows, 0)
    return g, feeds, np.asarray(x, np.float64) @ w64


#: (constant weights, transpose_b, M, N): the blocked prepared copy (decode and
#: prefill), the direct [N, K] decode kernel, the natural [K, N] blocked view,
#: and the dequantize-panel prefill on the user's buffer.
WMATMUL_PATHS = [(True, True, 1, 40), (True, False, 20, 128), (False, True, 1, 40),
                 (False, False, 1, 128), (False, False, 20, 40)]
WEIGHT_DTYPES = [dt.s4, dt.u4, dt.s8, dt.u8]
ZP_DTYPES = [dt.s4, dt.u4, dt.s8, dt.u8, dt.s32]


@pytest.mark.parametrize("path", WMATMUL_PATHS, ids=lambda p: "const%d-trans%d-m%d-n%d" % p)
@pytest.mark.parametrize("qtype", ["per_tensor", "per_channel", "per_group"])
@pytest.mark.parametrize("zdt", ZP_DTYPES, ids=lambda d: f"zp_{d.name}")
@pytest.mark.parametrize("wdt", WEIGHT_DTYPES, ids=lambda d: f"w_{d.name}")
def test_s4_weights_with_zero_points_are_not_ignored(wdt, zdt, qtype, path):
    """Defect 1: every weight dtype x zero-point dtype x granularity x kernel path.

    Exact comparison: integer activations in [-4, 4], integer weights and zero
    points, power-of-two scales and K = 64 keep every partial sum an integer
    times a power of two below 2**24, so f32 (in any order) is exact.
    """
    const, trans, M, N = path
    # the example first: all-zero weights, zero point 3, scale 1, x = 1 -> -3 * K
    g, feeds, want = wmatmul_graph(wdt, zdt, qtype, trans=trans, const=const, M=M, N=N,
                                   q=0, zp=3, scales=np.ones(1), x=np.ones((M, 64)))
    out, plans = run(g, feeds)
    assert plans == ["numba_wmatmul"]
    np.testing.assert_array_equal(out[5], np.full((M, N), -192.0, np.float32))
    g, feeds, want = wmatmul_graph(wdt, zdt, qtype, trans=trans, const=const, M=M, N=N)
    out, plans = run(g, feeds)
    assert plans == ["numba_wmatmul"]
    np.testing.assert_array_equal(out[5].astype(np.float64), want)


# ------------------------------------------------------------ post-op reading y twice
SELF_BINARY = {K.Multiply: np.multiply, K.Add: np.add, K.Subtract: np.subtract,
               K.Divide: np.divide, K.Maximum: np.maximum, K.Minimum: np.minimum}


def _float_matmul_graph(M, N, K_=64, seed=0):
    """x [M, K] @ W [K, N] with constant f32 weights (the BLAS + epilogue plan)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-4, 5, (M, K_)).astype(np.float32)
    w = (rng.integers(-8, 8, (K_, N)) * 0.125).astype(np.float32)
    g = ga.Graph(ga.EngineKind.cpu, "strict")
    g.add_op(ga.Op(1, K.MatMul, [lt(4, dt.f32, [M, K_]), lt(0, dt.f32, [K_, N], C)],
                   [lt(5, dt.f32, [M, N])]))
    return g, {0: w, 4: x}, x.astype(np.float64) @ w.astype(np.float64)


@pytest.mark.parametrize("weights", ["s4", "f32"])
@pytest.mark.parametrize("kind", list(SELF_BINARY) + ["Add(ReLU(y), y)"],
                         ids=lambda k: getattr(k, "name", k))
def test_post_op_reading_the_matmul_output_twice_runs(kind, weights):
    """Defect 4: ``Multiply(y, y)`` etc. raised KeyError in the fused plan; so did
    a later post-op reading y again (that one now runs outside the epilogue).

    Exact: y is an exact f32 value (integer data, power-of-two scales), so the
    expected value is the f32 operation on it, rounded once, as the epilogue does.
    """
    M, N = 3, 40
    if weights == "s4":
        g, feeds, want = wmatmul_graph(dt.s4, dt.u4, "per_group", trans=True, const=True, M=M, N=N)
    else:
        g, feeds, want = _float_matmul_graph(M, N)
    y, y32 = lt(5, dt.f32, [M, N]), want.astype(np.float32)
    fast = "numba_wmatmul" if weights == "s4" else "blas_matmul_epilogue"
    if kind in SELF_BINARY:
        g.add_op(ga.Op(2, kind, [y, y], [lt(7, dt.f32, [M, N])]))
        with np.errstate(all="ignore"):
            expected = SELF_BINARY[kind](y32, y32)
    else:
        r = lt(6, dt.f32, [M, N])
        g.add_op(ga.Op(2, K.ReLU, [y], [r]))
        g.add_op(ga.Op(3, K.Add, [r, y], [lt(7, dt.f32, [M, N])]))
        # y has two consumers, so no epilogue covers ReLU/Add.  Since the fast plans
        # (fast-plans merge) such a partition no longer runs the reference plan: the
        # s4 partition, refused by the wmatmul builder, runs each op on its single-op
        # fast plan; the BLAS plan computes y and runs the two ops after it as
        # reference steps.  Both compute what the unfused ops compute (checked below).
        expected = np.maximum(y32, 0) + y32
        fast = "per_op_fast" if weights == "s4" else "blas_matmul_epilogue+ref_post[ReLU,Add]"
    out, plans = run(g, feeds)
    assert plans == [fast]
    np.testing.assert_array_equal(out[7], expected)


# ------------------------------------------------------------------- stale cache
def _compile_single(graph, feeds):
    """(compiled partition, stream, engine, input lts, output lts) of a one-partition graph."""
    graph.finalize()
    (part,) = graph.get_partitions()
    engine = ga.Engine()
    in_lts = [graph.tensors[t] for t in part.input_ids]
    out_lts = [graph.tensors[t] for t in part.output_ids]
    return part.compile(in_lts, out_lts, engine), ga.Stream(engine), engine, in_lts, out_lts


def _execute(compiled, stream, engine, in_lts, out_lts, feeds, tensors=None):
    tensors = dict(tensors or {})
    for lt_ in in_lts:
        tensors.setdefault(lt_.id, ga.Tensor(lt_, engine, feeds[lt_.id]))
    outs = [ga.Tensor(lt_, engine) for lt_ in out_lts]
    compiled.execute(stream, [tensors[lt_.id] for lt_ in in_lts], outs)
    return outs[0].numpy(), tensors


@pytest.mark.parametrize("changed", ["zps", "scales", "weights", "handle"])
def test_constant_weights_are_not_reused_for_a_new_zero_point_tensor(changed):
    """Defect 9: prepared constants are keyed on every tensor they were built from.

    The first execute prepares the constant u4 weights; the second gives a new
    buffer for one source (a new Tensor, or ``set_data_handle`` on the same
    Tensor object) with different values and must compute with them.  Exact
    (integer data, power-of-two scales).
    """
    g, feeds, want = wmatmul_graph(dt.u4, dt.u4, "per_group", trans=True, const=True, M=1, N=40)
    compiled, stream, engine, in_lts, out_lts = _compile_single(g, feeds)
    assert compiled.plan.name == "numba_wmatmul"
    got, tensors = _execute(compiled, stream, engine, in_lts, out_lts, feeds)
    np.testing.assert_array_equal(got.astype(np.float64), want)
    rng = np.random.default_rng(1)
    source = {"zps": 2, "scales": 1, "weights": 0, "handle": 2}[changed]
    new = dict(feeds)
    if source == 1:
        new[1] = (2.0 ** rng.integers(-5, -2, feeds[1].shape)).astype(np.float32)
    else:
        new[source] = ga.dtypes.convert(rng.integers(0, 16, feeds[source].shape), dt.u4)
    _, _, want2 = wmatmul_graph(dt.u4, dt.u4, "per_group", trans=True, const=True, M=1, N=40,
                                q=ga.dtypes.to_f32(new[0]), zp=ga.dtypes.to_f32(new[2]),
                                scales=new[1], x=feeds[4])
    lt_ = next(t for t in in_lts if t.id == source)
    if changed == "handle":  # same Tensor object, new memory
        tensors[source].set_data_handle(ga.Tensor(lt_, engine, new[source]).get_data_handle())
    else:
        tensors[source] = ga.Tensor(lt_, engine, new[source])
    got2, _ = _execute(compiled, stream, engine, in_lts, out_lts, new, tensors)
    assert not np.array_equal(want2, want)
    np.testing.assert_array_equal(got2.astype(np.float64), want2)


def test_variable_scales_of_constant_weights_are_read_every_execute():
    """Defect 9 (variant): constant weights with *variable* scales must not be
    prepared once with the first scales: the scales may change in place."""
    g = ga.Graph(ga.EngineKind.cpu, "strict")
    rng = np.random.default_rng(2)
    w = lt(0, dt.u4, [40, 64], C)
    s = lt(1, dt.f32, [40, 2], V)  # variable scales
    g.add_op(ga.Op(0, K.DynamicDequantize, [w, s], [lt(3, dt.f32, [40, 64])],
                   attrs=dict(qtype="per_group", group_shape=[1, 32])))
    g.add_op(ga.Op(1, K.MatMul, [lt(4, dt.f32, [1, 64]), lt(3, dt.f32, [40, 64])],
                   [lt(5, dt.f32, [1, 40])], attrs={"transpose_b": True}))
    q = rng.integers(0, 16, (40, 64))
    feeds = {0: ga.dtypes.convert(q, dt.u4), 1: np.full((40, 2), 0.25, np.float32),
             4: rng.integers(-4, 5, (1, 64)).astype(np.float32)}
    compiled, stream, engine, in_lts, out_lts = _compile_single(g, feeds)
    got, tensors = _execute(compiled, stream, engine, in_lts, out_lts, feeds)
    tensors[1].write(np.full((40, 2), 0.5, np.float32))  # same buffer, new values
    got2, _ = _execute(compiled, stream, engine, in_lts, out_lts, feeds, tensors)
    want = feeds[4].astype(np.float64) @ (q.T * 0.5)
    np.testing.assert_array_equal(got2.astype(np.float64), want)
    np.testing.assert_array_equal(got2, 2 * got)


# --------------------------------------------------------------------- inf / NaN
def _nonfinite_inputs(feeds, scenario, K_, trans=False):
    """Put the scenario's extreme values into the activations (4) or scales (1), in place."""
    x, s = feeds[4], feeds[1]
    if scenario == "cancel":  # 2e38 + 2e38 - 2e38 - 2e38 times one weight: exactly 0
        w = feeds[0]
        if trans:
            w[:, 1:4] = w[:, 0:1]
        else:
            w[1:4] = w[0]
        x[0] = 0
        x[0, :4] = [2e38, 2e38, -2e38, -2e38]
    if scenario == "pos_inf":
        x[0, 5] = np.inf
    elif scenario == "neg_inf":
        x[0, 5] = -np.inf
        x[-1, 7], x[-1, 40] = np.inf, -np.inf  # both signs in one row: NaN everywhere
    elif scenario == "nan":
        x[0, 3] = np.nan
    elif scenario == "huge":  # |x| ~ 1e37, small scales: the exact product is finite
        x[:] = np.where(np.arange(K_) % 2, 1e37, -3e37).astype(np.float32)
        s[:] = 2.0 ** -10
    elif scenario == "inf_scale":
        s.reshape(-1)[0] = np.inf
    elif scenario == "huge_scale":  # (q - z) * s overflows in the reference's weights
        s.reshape(-1)[-1] = 3e37


NONFINITE = ["pos_inf", "neg_inf", "nan", "huge", "cancel", "inf_scale", "huge_scale"]


#: float weights (BLAS + epilogue plan): the "scale" scenarios change the weights
FLOAT_PATHS = [(True, False, 1, 40), (True, False, 20, 40)]
NONFINITE_CASES = [(w, p) for w in (dt.s4, dt.u8) for p in WMATMUL_PATHS] + \
    [(dt.f32, p) for p in FLOAT_PATHS]


@pytest.mark.parametrize("wdt,path", NONFINITE_CASES,
                         ids=lambda v: f"w_{v.name}" if isinstance(v, dt) else
                         "const%d-trans%d-m%d-n%d" % v)
@pytest.mark.parametrize("scenario", NONFINITE)
def test_inf_and_nan_in_the_fused_wmatmul_match_the_reference(scenario, wdt, path):
    """Defect 8: inf/NaN/huge values give the reference's inf/NaN pattern exactly.

    Compared with the unfused reference plan under graph_api.check's rule
    (NaN where it has NaN, the same infinities, finite values within a few
    ulps of max|y|), and the finite ``huge`` case also with the f64 formula.
    """
    const, trans, M, N = path
    if wdt == dt.f32:
        g, feeds, _ = _float_matmul_graph(M, N)
        # a MatMul alone is a single-op partition: a post-op makes it a fused one
        g.add_op(ga.Op(2, K.Multiply, [lt(5, dt.f32, [M, N]), lt(7, dt.f32, [N])],
                       [lt(6, dt.f32, [M, N])]))
        feeds[7] = np.ones(N, np.float32)
        feeds[1] = feeds[0]  # the weights play the scales' part
        _nonfinite_inputs(feeds, scenario, 64)
        fused, plans = run(g, feeds)
        assert plans == ["blas_matmul_epilogue"]
        reference, _ = run(g, feeds, ga.PartitionPolicy.debug)
        verdict = compare(reference[6], fused[6], dt.f32)
        assert verdict.ok, verdict.message
        return
    g, feeds, _ = wmatmul_graph(wdt, dt.u4, "per_group", trans=trans, const=const, M=M, N=N)
    _nonfinite_inputs(feeds, scenario, 64, trans)
    fused, plans = run(g, feeds)
    assert plans == ["numba_wmatmul"]
    reference, _ = run(g, feeds, ga.PartitionPolicy.debug)
    verdict = compare(reference[5], fused[5], dt.f32)
    assert verdict.ok, verdict.message
    if scenario in ("huge", "cancel"):
        assert np.isfinite(fused[5]).all()
        _, _, want = wmatmul_graph(wdt, dt.u4, "per_group", trans=trans, const=const, M=M, N=N,
                                   q=ga.dtypes.to_f32(feeds[0]), zp=ga.dtypes.to_f32(feeds[2]),
                                   scales=feeds[1], x=feeds[4])
        assert compare(want, fused[5], dt.f32).ok


def _sdpa_roles(graph):
    """Tensor ids of Q, K (or its scales), V (or its scales), scale and additive mask."""
    ops = graph.get_ops()
    producer = {o.outputs[0].id: o for o in ops}
    qk, pv = [o for o in ops if o.kind == K.MatMul]

    def data(tid):  # a compressed operand is reached through its scales
        op = producer.get(tid)
        while op is not None and op.kind == K.TypeCast:
            tid, op = op.inputs[0].id, producer.get(op.inputs[0].id)
        return op.inputs[1].id if op is not None and op.kind == K.DynamicDequantize else tid

    roles = {"q": qk.inputs[0].id, "k": data(qk.inputs[1].id), "v": data(pv.inputs[1].id)}
    for o in ops:
        if o.kind in (K.Multiply, K.Divide) and o.inputs[0].id == qk.outputs[0].id:
            roles["scale"] = o.inputs[1].id
        if o.kind == K.Add and graph.tensors[o.inputs[1].id].dtype == dt.f32 and \
                o.inputs[1].id in graph.input_ids:
            roles["mask"] = o.inputs[1].id
    return roles


SDPA_EXTREMES = {"q_inf": ("q", (0, 0, 1, slice(0, 3)), np.inf),
                 "q_nan": ("q", (0, 0, 1, 2), np.nan),
                 "q_huge": ("q", (0, 0, 1), 1e30),
                 "k_inf": ("k", (0, 0, 3), -np.inf),
                 "v_inf": ("v", (0, 0, 3), np.inf),
                 "scale_inf": ("scale", (), np.inf),
                 "scale_nan": ("scale", (), np.nan),
                 "mask_row_neginf": ("mask", (0, 0, 2), -np.inf),
                 "mask_posinf": ("mask", (0, 0, 2, 5), np.inf)}
SDPA_FORMS = {"f32_add_mask": dict(mask="add"), "causal": dict(mask="causal_tl"),
              "s4_kv_zps": dict(mask="add", k_int=dt.s4, v_int=dt.s4, zps=True),
              "f16": dict(mask="add", dtype=dt.f16)}


SDPA_CASES = [(f, e) for f in SDPA_FORMS for e in SDPA_EXTREMES
              if not (f == "causal" and e.startswith("mask"))]  # causal: no additive mask


@pytest.mark.parametrize("mode", ["inf_as_zero", "none"])
@pytest.mark.parametrize("form,extreme", SDPA_CASES)
def test_inf_and_nan_in_the_sdpa_plan_match_the_reference(form, extreme, mode):
    """Defect 8 (SDPA): the fast plan gives the reference's inf/NaN pattern.

    ``inf_as_zero`` rows whose scores are all -inf because of the values (an
    inf scale or K) are 0 in the reference; the kernel's online softmax gave
    NaN there.  Compared with the unfused plan under graph_api.check's rule.
    """
    from tests.kernels.test_fused_sdpa import Builder, attention

    b = Builder()
    attention(b, sm_mode=mode, **SDPA_FORMS[form])
    b.g.finalize()
    role, index, value = SDPA_EXTREMES[extreme]
    tid = _sdpa_roles(b.g)[role]
    arr = np.array(b.feeds[tid])
    arr[index] = value
    b.feeds[tid] = arr
    fused, plans = run(b.g, b.feeds)
    assert plans == ["numba_sdpa"]
    reference, _ = run(b.g, b.feeds, ga.PartitionPolicy.debug)
    (out,) = b.g.output_ids
    verdict = compare(reference[out], fused[out], b.g.tensors[out].dtype)
    assert verdict.ok, verdict.message


@pytest.mark.parametrize("m", [1, 9])
@pytest.mark.parametrize("weights", ["int4", "f32"])
@pytest.mark.parametrize("extreme", ["pos_inf", "neg_inf", "nan", "huge", "cancel", "inf_scale"])
def test_inf_and_nan_in_the_gated_mlp_plan_match_the_reference(extreme, weights, m):
    """Defect 8 (gated MLP): its three projections run the wmatmul/BLAS linears,
    which keep the reference's inf/NaN pattern; compared with the unfused plan.
    ``cancel``: x row 0 is (2e38, 2e38, -2e38, -2e38, 0, ...) against equal
    weight rows, so gate and up are exactly 0 in the reference, and so is y."""
    from tests.kernels.test_fused_wmatmul import Builder

    b = Builder()
    h, f = 64, 96
    x = b.input(dt.f32, [m, h])
    if weights == "int4":
        gw, uw, dw = (b.compressed_weight(wdt, k, n, True, zps=z)
                      for wdt, k, n, z in ((dt.s4, h, f, False), (dt.u4, h, f, True), (dt.s4, f, h, False)))
    else:
        gw, uw, dw = (b.input(dt.f32, s, prop=C) for s in ([h, f], [h, f], [f, h]))
    gate = b.op(K.MatMul, [x, gw], dt.f32, [m, f], transpose_b=weights == "int4")
    s = b.op(K.Sigmoid, [gate], dt.f32, [m, f])
    gate = b.op(K.Multiply, [gate, s], dt.f32, [m, f])
    up = b.op(K.MatMul, [x, uw], dt.f32, [m, f], transpose_b=weights == "int4")
    prod = b.op(K.Multiply, [gate, up], dt.f32, [m, f])
    b.op(K.MatMul, [prod, dw], dt.f32, [m, h], transpose_b=weights == "int4")
    xs = b.feeds[x.id]
    if extreme == "pos_inf":
        xs[0, 3] = np.inf
    elif extreme == "neg_inf":
        xs[0, 3] = -np.inf
    elif extreme == "nan":
        xs[-1, 5] = np.nan
    elif extreme == "huge":
        xs[0] = np.where(np.arange(h) % 2, 1e36, -1e36)
    elif extreme == "cancel":
        xs[0] = 0
        xs[0, :4] = [2e38, 2e38, -2e38, -2e38]
        for op in b.g.get_ops()[:2] if weights == "int4" else ():
            wq = b.feeds[op.inputs[0].id]  # [f, h] (transpose_b)
            wq[:, 1:4] = wq[:, 0:1]
        for w in (gw, uw) if weights == "f32" else ():
            b.feeds[w.id][1:4] = b.feeds[w.id][0]
    else:  # the first scale of the gate projection (or its first weight)
        gate_src = b.g.get_ops()[0].inputs[1].id if weights == "int4" else gw.id
        b.feeds[gate_src].reshape(-1)[0] = np.inf
    fused, plans = run(b.g, b.feeds)
    assert plans == ["numba_gated_mlp"]
    reference, _ = run(b.g, b.feeds, ga.PartitionPolicy.debug)
    (out,) = b.g.output_ids
    verdict = compare(reference[out], fused[out], dt.f32)
    assert verdict.ok, verdict.message
    if extreme == "cancel":
        np.testing.assert_array_equal(fused[out][0], 0.0)


# ------------------------------------------------------------------ zero-size dims
def _bias_relu(g, y, feeds):
    """y + bias[N] -> ReLU as post-ops (output tensor 8)."""
    M, N = y.shape
    g.add_op(ga.Op(2, K.Add, [y, lt(7, dt.f32, [N])], [lt(6, dt.f32, [M, N])]))
    g.add_op(ga.Op(3, K.ReLU, [lt(6, dt.f32, [M, N])], [lt(8, dt.f32, [M, N])]))
    feeds[7] = np.arange(N, dtype=np.float32) - 2


ZERO_MATMULS = [(0, 40, 64), (3, 0, 64), (3, 40, 0), (1, 40, 0), (1, 0, 64)]


@pytest.mark.parametrize("mnk", ZERO_MATMULS, ids=lambda d: "m%d-n%d-k%d" % d)
@pytest.mark.parametrize("weights", ["s4", "u8", "f32"])
def test_zero_size_dims_in_the_fused_matmul(weights, mnk):
    """Defect 5 (fused MatMul): M, N or K = 0 gave ZeroDivisionError/ValueError.

    oneDNN's answer: an empty output, or for K = 0 a sum over no terms, 0,
    followed by the bias and post-ops: ReLU(0 + bias), exactly.
    """
    M, N, K_ = mnk
    if weights == "f32":
        g, feeds, _ = _float_matmul_graph(M, N, K_)
        _bias_relu(g, lt(5, dt.f32, [M, N]), feeds)
    else:
        g, feeds, _ = wmatmul_graph(dt[weights], dt.u4, "per_group", trans=True, const=True,
                                    M=M, N=N, K_=K_, post=_bias_relu)
    out, plans = run(g, feeds)
    assert len(plans) == 1
    want = np.broadcast_to(np.maximum(feeds[7], 0), (M, N))
    assert out[8].shape == (M, N)
    np.testing.assert_array_equal(out[8], want)


@pytest.mark.parametrize("m,f", [(0, 96), (2, 0), (0, 0)])
def test_zero_size_dims_in_the_gated_mlp(m, f):
    """Defect 5 (gated MLP): m = 0 gives an empty output; an intermediate size
    f = 0 makes the down projection a sum over no terms: zeros."""
    from tests.kernels.test_fused_wmatmul import Builder

    b = Builder()
    h = 64
    x = b.input(dt.f32, [m, h])
    gw, uw, dw = (b.compressed_weight(dt.s4, k, n, True) for k, n in ((h, f), (h, f), (f, h)))
    gate = b.op(K.MatMul, [x, gw], dt.f32, [m, f], transpose_b=True)
    s = b.op(K.Sigmoid, [gate], dt.f32, [m, f])
    gate = b.op(K.Multiply, [gate, s], dt.f32, [m, f])
    up = b.op(K.MatMul, [x, uw], dt.f32, [m, f], transpose_b=True)
    prod = b.op(K.Multiply, [gate, up], dt.f32, [m, f])
    b.op(K.MatMul, [prod, dw], dt.f32, [m, h], transpose_b=True)
    out, plans = run(b.g, b.feeds)
    assert len(plans) == 1
    (tid,) = b.g.output_ids
    np.testing.assert_array_equal(out[tid], np.zeros((m, h), np.float32))


@pytest.mark.parametrize("dims", [dict(B=0), dict(Sq=0), dict(S=0), dict(B=0, S=0)],
                         ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
@pytest.mark.parametrize("form", ["f32_add_mask", "causal", "s4_kv_zps"])
def test_zero_size_dims_in_sdpa(form, dims):
    """Defect 5 (SDPA): batch or Sq = 0 gave ZeroDivisionError.  An empty batch
    or query gives an empty output; S = 0 (no keys) an empty softmax and a
    PV product over no terms: zeros."""
    from tests.kernels.test_fused_sdpa import Builder, attention

    b = Builder()
    kw = dict(SDPA_FORMS[form])
    if dims.get("S") == 0 and kw.get("k_int"):
        kw.update(group=32)  # an empty S still has the D groups
    attention(b, sm_mode="inf_as_zero", **kw, **dims)
    out, plans = run(b.g, b.feeds)
    assert len(plans) == 1
    (tid,) = b.g.output_ids
    np.testing.assert_array_equal(out[tid], np.zeros(b.g.tensors[tid].shape, np.float32))


def test_zero_size_softmax_axis():
    """Defect 5 (SoftMax over S = 0 raised ValueError): empty dst, stats = -inf
    (the log of an empty sum), in both modes; LogSoftmax empty."""
    for mode in ("none", "inf_as_zero"):
        g = ga.Graph(ga.EngineKind.cpu, "strict")
        g.add_op(ga.Op(0, K.SoftMax, [lt(0, dt.f32, [2, 3, 0])],
                       [lt(1, dt.f32, [2, 3, 0]), lt(2, dt.f32, [2, 3, 1])],
                       attrs={"axis": -1, "mode": mode}))
        g.add_op(ga.Op(1, K.LogSoftmax, [lt(0, dt.f32, [2, 3, 0])], [lt(3, dt.f32, [2, 3, 0])],
                       attrs={"axis": -1}))
        out, _ = run(g, {0: np.zeros((2, 3, 0), np.float32)})
        assert out[1].shape == (2, 3, 0) and out[3].shape == (2, 3, 0)
        np.testing.assert_array_equal(out[2], np.full((2, 3, 1), -np.inf, np.float32))


def _zero_dim_variant(case, axis):
    """The case with dim ``axis`` of input 0 set to 0 (and of every input of the
    same rank with the same size there, so shapes stay consistent); outputs unknown."""
    import dataclasses

    shape0 = case.inputs[0].shape
    size = shape0[axis]
    inputs = []
    for spec in case.inputs:
        shape = list(spec.shape)
        if len(shape) == len(shape0) and not spec.host_scalar and shape[axis] == size:
            shape[axis] = 0
        values = spec.values
        if values is not None and tuple(shape) != tuple(spec.shape):
            values = np.zeros(shape, np.asarray(values).dtype)
        inputs.append(dataclasses.replace(spec, shape=tuple(shape), values=values))
    outputs = tuple(dataclasses.replace(o, shape=(-1,) * len(o.shape)) for o in case.outputs)
    return dataclasses.replace(case, inputs=tuple(inputs), outputs=outputs)


def _zero_dim_cases():
    from tests.cases.op_cases import OP_CASES

    first = {}
    for case in OP_CASES:
        if case.kind not in (K.End, K.Wildcard) and case.kind not in first:
            first[case.kind] = case
    return [(case, axis) for case in first.values() for axis in range(len(case.inputs[0].shape))]


def _finite_max(dtype) -> float:
    return float(ml_dtypes.finfo(np.dtype(ga.dtypes.numpy_dtype(dtype))).max)


#: oneDNN's reductions over no elements start from their identity and finish
#: as usual: max from the lowest finite value, min from the highest, mean 0/0
EMPTY_REDUCTION = {K.ReduceMax: lambda d: -_finite_max(d), K.ReduceMin: _finite_max,
                   K.ReduceMean: lambda d: np.nan}


#: ops whose statistics outputs are means over the emptied dims: NaN (0/0)
EMPTY_STATISTICS = {K.BatchNormForwardTraining, K.GroupNorm, K.LayerNorm}


@pytest.mark.parametrize("case,axis", _zero_dim_cases(),
                         ids=lambda v: v.kind.name if hasattr(v, "kind") else f"axis{v}")
def test_zero_size_dims_of_every_op_kind(case, axis):
    """Defect 5 (every op kind): a single-op graph through the public API with
    one zero-size dim either is refused with a typed error (shapes that cannot
    be empty there) or runs: empty outputs have the inferred shape, non-empty
    ones (a reduction over an empty axis, a convolution over zero channels,
    statistics over no elements) equal the case's own formula or oneDNN's
    empty-reduction values.  Never an untyped exception.
    """
    from tests.kernels.test_reference import assert_matches

    variant = _zero_dim_variant(case, axis)
    g = ga.Graph(ga.EngineKind.cpu, variant.fpmath)
    try:
        g.add_op(variant.make_op())
        g.finalize()
        (part,) = g.get_partitions()
        engine = ga.Engine()
        compiled = part.compile(variant.input_lts(), variant.output_lts(), engine)
    except ga.GraphError as error:
        assert str(error)  # typed, with a message
        return
    out_lts = [compiled.query_logical_tensor(o.id) for o in variant.output_lts()]
    inputs = variant.make_inputs()
    in_tensors = [ga.make_scalar_tensor(l_, x) if l_.property == ga.PropertyType.host_scalar
                  else ga.Tensor(l_, engine, x) for l_, x in zip(variant.input_lts(), inputs)]
    out_tensors = [ga.Tensor(l_, engine) for l_ in out_lts]
    compiled.execute(ga.Stream(engine), in_tensors, out_tensors)
    got = [t.numpy() for t in out_tensors]
    if all(x.size == 0 for x in got):
        assert all(x.shape == tuple(l_.shape) for x, l_ in zip(got, out_lts))
        return
    if case.kind in EMPTY_REDUCTION:
        want = [np.full(got[0].shape, EMPTY_REDUCTION[case.kind](variant.input_lts()[0].dtype))]
    elif case.kind in EMPTY_STATISTICS:  # dst empty, statistics over no elements 0/0
        want = [np.full(x.shape, np.nan) for x in got]
    else:
        with np.errstate(all="ignore"):
            want = case.expected(inputs, dict(case.attrs))
    for i, (x, w) in enumerate(zip(got, want)):
        assert_matches(x, np.reshape(w, x.shape), case.tolerance(i), f"{case.name} output {i}")


@pytest.mark.parametrize("trans", [True, False])
@pytest.mark.parametrize("mnk", ZERO_MATMULS, ids=lambda d: "m%d-n%d-k%d" % d)
@pytest.mark.parametrize("kind", ["s4", "u8"])
def test_zero_size_dims_in_the_wmatmul_kernel_entry(kind, mnk, trans):
    """Defect 5 (the kernel's own entry point, used by the benchmarks and the
    MLP kernel): empty M/N give an empty result, K = 0 the post-ops of 0."""
    from graph_api.kernels.weight_compressed import wmatmul as W

    M, N, K_ = mnk
    spec = W.WeightSpec(kind, K_, N, 32, trans)
    w = np.zeros(N * K_ // 2 if kind == "s4" else N * K_, np.uint8 if kind == "s4" else np.int8)
    scales = np.ones((N, K_ // 32) if trans else (K_ // 32, N), np.float32)
    bias = np.arange(N, dtype=np.float32) - 2
    y = W.wmatmul(np.ones((M, K_), np.float32), w, spec, scales,
                  post_ops=[("add", bias), ("relu", None)])
    np.testing.assert_array_equal(y, np.broadcast_to(np.maximum(bias, 0), (M, N)))


EPILOGUE_UNARY = [(K.ReLU, {}), (K.GELU, {}), (K.GELU, {"mode": "gelu_tanh"}), (K.Sigmoid, {}),
                  (K.Tanh, {}), (K.Clamp, {"min": -1.0, "max": 2.0}), (K.Elu, {"alpha": 0.5}),
                  (K.LeakyReLU, {"alpha": 0.1}), (K.Abs, {}), (K.Exp, {}), (K.Square, {}),
                  ("swish", {})]
#: Clamp bounds of +-inf (issue 33): the one float attribute add_op lets be infinite
CLAMP_INFINITE = [{"min": -np.inf, "max": np.inf}, {"min": 0.0, "max": np.inf},
                  {"min": -np.inf, "max": 0.5}, {"min": np.inf, "max": np.inf},
                  {"min": -np.inf, "max": -np.inf}]
EPILOGUE_UNARY += [(K.Clamp, bounds) for bounds in CLAMP_INFINITE]


@pytest.mark.parametrize("kind,attrs", EPILOGUE_UNARY,
                         ids=lambda v: getattr(v, "name", v) if not isinstance(v, dict) else
                         "-".join(f"{k}{x}" for k, x in v.items()))
def test_inf_and_nan_through_the_post_op_epilogue_match_the_reference(kind, attrs):
    """Defect 8 (epilogue): post-ops of ±inf, NaN, ±1e30, ±100 and 0 give the
    reference's values, which follow oneDNN's formulas: ReLU(x) = x > 0 ? x :
    x * 0 (NaN at -inf), Clamp of NaN is its min, Sigmoid of NaN is 0."""
    M, N, K_ = 2, 8, 4
    g = ga.Graph(ga.EngineKind.cpu, "strict")
    w = np.zeros((K_, N), np.float32)
    w[0] = [np.inf, -np.inf, np.nan, 1e30, -1e30, 100.0, -100.0, 0.0]  # y = row 0 of w
    g.add_op(ga.Op(1, K.MatMul, [lt(4, dt.f32, [M, K_]), lt(0, dt.f32, [K_, N], C)],
                   [lt(5, dt.f32, [M, N])]))
    y = lt(5, dt.f32, [M, N])
    if kind == "swish":
        g.add_op(ga.Op(2, K.Sigmoid, [y], [lt(6, dt.f32, [M, N])]))
        g.add_op(ga.Op(3, K.Multiply, [y, lt(6, dt.f32, [M, N])], [lt(8, dt.f32, [M, N])]))
    else:
        g.add_op(ga.Op(2, kind, [y], [lt(8, dt.f32, [M, N])], attrs=attrs))
    feeds = {0: w, 4: np.array([[1, 0, 0, 0], [1, 0, 0, 0]], np.float32)}
    fused, plans = run(g, feeds)
    assert plans == ["blas_matmul_epilogue"]
    reference, _ = run(g, feeds, ga.PartitionPolicy.debug)
    verdict = compare(reference[8], fused[8], dt.f32)
    assert verdict.ok, verdict.message


#: Subtract/Divide fuse only with the running value first (oneDNN's patterns)
BINARY_POSITIONS = [(k, s) for k in SELF_BINARY for s in (False, True)
                    if not (s and k in (K.Subtract, K.Divide))]


@pytest.mark.parametrize("kind,swap", BINARY_POSITIONS,
                         ids=lambda v: v.name if hasattr(v, "name") else ["y_first", "y_second"][v])
def test_inf_nan_and_zero_operands_of_binary_post_ops_match_the_reference(kind, swap):
    """Defect 8 (epilogue, binary): Divide by a zero operand raised
    ZeroDivisionError inside the Numba epilogue; Maximum/Minimum dropped a NaN
    operand.  Running values and operands hold ±inf, NaN, ±0 and 1."""
    M, N, K_ = 2, 8, 4
    g = ga.Graph(ga.EngineKind.cpu, "strict")
    w = np.zeros((K_, N), np.float32)
    w[0] = [np.inf, -np.inf, np.nan, 1e30, np.nan, 0.0, -0.0, 1.0]  # y = row 0 of w
    g.add_op(ga.Op(1, K.MatMul, [lt(4, dt.f32, [M, K_]), lt(0, dt.f32, [K_, N], C)],
                   [lt(5, dt.f32, [M, N])]))
    y, other = lt(5, dt.f32, [M, N]), lt(7, dt.f32, [N])
    g.add_op(ga.Op(2, kind, [other, y] if swap else [y, other], [lt(8, dt.f32, [M, N])]))
    feeds = {0: w, 4: np.array([[1, 0, 0, 0], [1, 0, 0, 0]], np.float32),
             7: np.array([np.nan, 1.0, 2.0, -np.inf, np.nan, -0.0, 0.0, 0.0], np.float32)}
    fused, plans = run(g, feeds)
    assert plans == ["blas_matmul_epilogue"]
    reference, _ = run(g, feeds, ga.PartitionPolicy.debug)
    verdict = compare(reference[8], fused[8], dt.f32)
    assert verdict.ok, verdict.message


def _int8_graph(kind, bounds, out_dtype):
    """u8 src and s8 constant weights dequantized, MatMul or 2-D Convolution,
    Clamp(bounds), Quantize to ``out_dtype``: one int8 partition."""
    rng = np.random.default_rng(7)
    g = ga.Graph(ga.EngineKind.cpu, "strict")
    if kind == K.MatMul:
        xs, ws, ys, attrs = [4, 32], [32, 16], [4, 16], {}
    else:
        xs, ws, ys = [1, 8, 6, 6], [16, 8, 3, 3], [1, 16, 6, 6]
        attrs = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1],
                     data_format="NCX", weights_format="OIX")
    q = {"qtype": "per_tensor", "scales": [0.5], "zps": [3]}
    g.add_op(ga.Op(1, K.Dequantize, [lt(0, dt.u8, xs)], [lt(1, dt.f32, xs)], attrs=q))
    g.add_op(ga.Op(2, K.Dequantize, [lt(2, dt.s8, ws, C)], [lt(3, dt.f32, ws)],
                   attrs={"qtype": "per_tensor", "scales": [0.25], "zps": [0]}))
    g.add_op(ga.Op(3, kind, [lt(1, dt.f32, xs), lt(3, dt.f32, ws)], [lt(4, dt.f32, ys)], attrs=attrs))
    g.add_op(ga.Op(4, K.Clamp, [lt(4, dt.f32, ys)], [lt(5, dt.f32, ys)], attrs=bounds))
    g.add_op(ga.Op(5, K.Quantize, [lt(5, dt.f32, ys)], [lt(6, out_dtype, ys)], attrs=q))
    feeds = {0: rng.integers(0, 12, xs).astype(np.uint8), 2: rng.integers(-4, 5, ws).astype(np.int8)}
    return g, feeds


@pytest.mark.parametrize("out_dtype", [dt.s8, dt.u8], ids=lambda d: d.name)
@pytest.mark.parametrize("bounds", CLAMP_INFINITE, ids=lambda b: f"{b['min']}-{b['max']}")
@pytest.mark.parametrize("kind", [K.MatMul, K.Convolution], ids=lambda k: k.name)
def test_clamp_with_infinite_bounds_in_int8_fusions_matches_the_reference(kind, bounds, out_dtype):
    """Issue 33: non-finite float attributes gave fused int8 kernels and the
    reference different answers.  add_op now refuses all but Clamp's +-inf
    bounds; with those the fused int8 MatMul/Convolution store saturates exactly
    as the reference does (min = max = +inf: every output the type's maximum)."""
    g, feeds = _int8_graph(kind, bounds, out_dtype)
    fused, plans = run(g, feeds)
    assert len(plans) == 1 and plans[0] != "reference"
    reference, _ = run(g, feeds, ga.PartitionPolicy.debug)
    np.testing.assert_array_equal(fused[6], reference[6])
    top = np.iinfo(np.int8 if out_dtype == dt.s8 else np.uint8)
    if bounds["min"] == np.inf:
        assert (fused[6] == top.max).all()
    if bounds["max"] == -np.inf:
        assert (fused[6] == top.min).all()


# ---------------------------------------- rank changes found by the JSON fuzzer (issue 33)
def test_a_broadcast_that_adds_a_dim_after_interpolate_matches_the_reference():
    """Interpolate [2, 3, 4] then Add of a [1, 1, 1, 1] operand (output [1, 2, 3, 8]):
    the image-blocked plan ran every op output as [1, ...] and reshaped the
    Interpolate's [2, 3, 8] into (1, 3, 8) (ValueError at execute)."""
    g = ga.Graph(ga.EngineKind.cpu, "strict")
    g.add_op(ga.Op(1, K.Interpolate, [lt(0, dt.f32, [2, 3, 4])], [lt(1, dt.f32, [2, 3, 8])],
                   attrs={"mode": "nearest", "scales": [2.0], "data_format": "NCX"}))
    g.add_op(ga.Op(2, K.Add, [lt(1, dt.f32, [2, 3, 8]), lt(2, dt.f32, [1, 1, 1, 1])],
                   [lt(3, dt.f32, [1, 2, 3, 8])]))
    feeds = {0: np.arange(24, dtype=np.float32).reshape(2, 3, 4), 2: np.full((1, 1, 1, 1), 0.5, np.float32)}
    fused, plans = run(g, feeds)
    assert len(plans) == 1
    reference, _ = run(g, feeds, ga.PartitionPolicy.debug)
    np.testing.assert_array_equal(fused[3], reference[3])
    np.testing.assert_array_equal(fused[3][0], np.repeat(feeds[0], 2, axis=2) + 0.5)


@pytest.mark.parametrize("axis, gamma, beta", [(-1, [8], []), (-1, [], [1]), (1, [8], []), (1, [], [8]),
                                               (1, [1, 8], [4, 1]), (1, [1], [4, 8])])
def test_layer_norm_with_broadcast_gamma_or_beta_matches_the_reference(axis, gamma, beta):
    """gamma/beta that broadcast into the normalized dims ([8] or [4, 8]: a
    scalar, [1], [1, 8]; the shape rule takes them) were read as C values by the
    fused row kernel, which read past them (8.8e-42 for 1.82), and by its numpy
    form (a broadcast error)."""
    g = ga.Graph(ga.EngineKind.cpu, "strict")
    shape = [3, 4, 8]
    g.add_op(ga.Op(1, K.LayerNorm, [lt(0, dt.f32, shape), lt(1, dt.f32, gamma), lt(2, dt.f32, beta)],
                   [lt(3, dt.f32, shape)],
                   attrs={"keep_stats": False, "epsilon": 0.0625, "begin_norm_axis": axis}))
    g.add_op(ga.Op(2, K.GELU, [lt(3, dt.f32, shape)], [lt(4, dt.f32, shape)]))
    feeds = {0: np.random.default_rng(3).integers(-8, 9, shape).astype(np.float32),
             1: np.full(gamma, 1.5, np.float32), 2: np.full(beta, -0.25, np.float32)}
    g.finalize()
    result = ga.run_graph(g, feeds)
    (part,) = result.partitions
    plan = part.compiled.plan
    assert plan.kernel == ("numba_norm" if axis == -1 else "numpy_f32_norm")
    reference, _ = run(g, feeds, ga.PartitionPolicy.debug)
    verdict = compare(reference[4], result.outputs[4], dt.f32)
    assert verdict.ok, verdict.message
    if axis == -1:  # what the row kernel is given (a read past an array is not seen reliably)
        args = plan._rows_args(feeds[0], dict(feeds), np.empty(shape, np.float32))
        assert args[5].size == args[7].size == 8

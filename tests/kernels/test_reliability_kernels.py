"""Regression tests of the kernel-side reliability defects (issue 8).

One test per defect, named after it.  Each graph runs through the public API
(fused policy) and is compared with an independent float64 numpy formula, or
with the unfused reference plan (debug policy) where the point is that the
fused plan computes what the unfused ops compute.
"""
import ml_dtypes
import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K

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
             1: np.ascontiguousarray(np.broadcast_to(np.asarray(scales, np.float32), pshape))}
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
    rows = K_ // s.shape[0]
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
    a later post-op reading y again (that one now runs the reference plan).

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
        expected, fast = np.maximum(y32, 0) + y32, "reference"
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

"""The grouped_matmul partition (mixture of experts) on its kernels.

Every expert is checked against an independent float64 formula (dequantize
``(q - z) * s``, multiply in float64), never against the project's own reference:

* plain and compressed experts: every path sums in f32, so each output is within
  ``(K + 2) * 2**-24 * sum_k |x_k| |w_kn|`` of the float64 value: K roundings of the
  partial sums (a sequential sum's worst case; the kernels' group order and BLAS's
  blocking round less often), one of the dequantized weight ``(q - z) * s`` and one
  of the product;
* gated experts: that bound for the gate ``g`` and up ``u`` products (``dg``, ``du``),
  carried through ``h = silu(g) * u`` (``|silu'| <= 1.1``) plus 8 roundings of the
  f32 sigmoid/exp/multiplies on ``|h|``, then the down product's own bound over ``I``
  terms plus ``|dh| @ |W_down|``.
"""
import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api.errors import InvalidDataType, InvalidShape

C = ga.PropertyType.constant
U = 2.0 ** -24
INT_RANGE = {dt.s4: (-8, 7), dt.u4: (0, 15), dt.s8: (-128, 127), dt.u8: (0, 255)}


class MoE:
    """A graph of unconnected experts and their float64 truth."""

    def __init__(self, seed=3):
        self.g = ga.Graph(ga.EngineKind.cpu)
        self.rng = np.random.default_rng(seed)
        self.t, self.o, self.feeds, self.f64 = 0, 0, {}, {}

    def lt(self, dtype, shape, prop=ga.PropertyType.variable):
        self.t += 1
        return ga.LogicalTensor(self.t, dtype, shape, property=prop)

    def feed(self, dtype, shape, values, prop=ga.PropertyType.variable):
        lt = self.lt(dtype, shape, prop)
        self.feeds[lt.id] = ga.dtypes.convert(np.asarray(values), dtype)
        self.f64[lt.id] = np.asarray(self.feeds[lt.id]).astype(np.float64)
        return lt

    def op(self, kind, inputs, dtype, shape, name="", **attrs):
        self.o += 1
        out = self.lt(dtype, shape)
        self.g.add_op(ga.Op(self.o, kind, inputs, [out], name=name, attrs=attrs))
        return out

    def weight(self, wdt, k, n, group=32, zps=False):
        """(dequantized weight lt, float64 [k, n] truth); float ``wdt``: a plain weight."""
        if wdt == dt.f32:
            w = self.feed(dt.f32, [k, n], self.rng.standard_normal((k, n)) * 0.05, C)
            return w, self.f64[w.id]
        lo, hi = INT_RANGE[wdt]
        q = self.rng.integers(lo, hi + 1, (k, n))
        s = self.rng.uniform(0.005, 0.02, (k // group, n)).astype(np.float32)
        ins = [self.feed(wdt, [k, n], q, C), self.feed(dt.f32, [k // group, n], s, C)]
        z = np.zeros_like(s, np.float64)
        if zps:
            z = self.rng.integers(0, 16 if wdt == dt.u4 else 256 if wdt == dt.u8 else 8, s.shape)
            zdt = dt.u4 if wdt == dt.u4 else dt.u8 if wdt == dt.u8 else dt.s8
            ins.append(self.feed(zdt, list(s.shape), z, C))
        w64 = (q - np.repeat(z, group, axis=0)) * np.repeat(s.astype(np.float64), group, axis=0)
        out = self.op(K.DynamicDequantize, ins, dt.f32, [k, n], qtype="per_group", group_shape=[group, 1])
        return out, w64

    def expert(self, m, k, n, wdt, zps=False, name=""):
        x = self.feed(dt.f32, [m, k], self.rng.standard_normal((m, k)))
        w, w64 = self.weight(wdt, k, n, zps=zps)
        y = self.op(K.MatMul, [x, w], dt.f32, [m, n], name=name)
        x64 = self.f64[x.id]
        return y.id, x64 @ w64, (k + 2) * U * (np.abs(x64) @ np.abs(w64))

    def gated_expert(self, m, h, i, wdt):
        x = self.feed(dt.f32, [m, h], self.rng.standard_normal((m, h)))
        wg, g64 = self.weight(wdt, h, i)
        wu, u64 = self.weight(wdt, h, i)
        wd, d64 = self.weight(wdt, i, h)
        gate = self.op(K.MatMul, [x, wg], dt.f32, [m, i])
        sig = self.op(K.Sigmoid, [gate], dt.f32, [m, i])
        act = self.op(K.Multiply, [gate, sig], dt.f32, [m, i])
        up = self.op(K.MatMul, [x, wu], dt.f32, [m, i])
        hh = self.op(K.Multiply, [act, up], dt.f32, [m, i])
        y = self.op(K.MatMul, [hh, wd], dt.f32, [m, h])
        x64 = self.f64[x.id]
        g, u = x64 @ g64, x64 @ u64
        silu = g / (1 + np.exp(-g))
        h64 = silu * u
        dg, du = ((h + 2) * U * (np.abs(x64) @ np.abs(w)) for w in (g64, u64))
        dh = 1.1 * dg * np.abs(u) + np.abs(silu) * du + 8 * U * np.abs(h64)
        bound = (i + 2) * U * ((np.abs(h64) + dh) @ np.abs(d64)) + dh @ np.abs(d64)
        return y.id, h64 @ d64, bound

    def run(self):
        self.g.finalize()
        return ga.run_graph(self.g, self.feeds)


def _check(result, truths, kernel):
    kinds = [(r.partition.get_kind(), r.compiled.plan.name) for r in result.partitions]
    assert kinds == [("grouped_matmul", kernel)], kinds
    for tid, want, bound in truths:
        got = result.outputs[tid].astype(np.float64)
        assert got.shape == want.shape
        assert np.all(np.abs(got - want) <= bound + 1e-30), (tid, np.max(np.abs(got - want) - bound))


@pytest.fixture
def launches(monkeypatch):
    """Counts the grouped kernels' parallel launches."""
    from graph_api.kernels.grouped import grouped_gemv as gg

    count = {"n": 0}
    for name in ("grouped4", "grouped8"):
        fn = getattr(gg, name)

        def counted(*args, _fn=fn):
            count["n"] += 1
            return _fn(*args)
        monkeypatch.setattr(gg, name, counted)
    return count


#: token counts per expert: one row, none, a register tile's 5, and a prefill-size 40
MS = (1, 0, 5, 40)


@pytest.mark.parametrize("wdt,zps", [(dt.s4, False), (dt.u4, True), (dt.s8, False), (dt.u8, True)])
def test_compressed_experts_run_in_one_launch(wdt, zps, launches):
    moe = MoE()
    truths = [moe.expert(m, 256, 256, wdt, zps) for m in MS]
    result = moe.run()
    _check(result, truths, "numba_grouped_wmatmul")
    # compile's warm-up ran once, execute once: one launch each (the M = 40 expert is a prefill call)
    assert launches["n"] == 2, launches


def test_decode_sized_experts_only_take_the_grouped_kernel(launches, monkeypatch):
    from graph_api.kernels.weight_compressed import wmatmul as wm

    def no_per_expert_call(*args, **kwargs):
        raise AssertionError("a decode-size expert left the grouped launch")
    monkeypatch.setattr(wm, "wmatmul", no_per_expert_call)
    moe = MoE(seed=5)
    truths = [moe.expert(m, 128, 384, dt.s4) for m in (2, 1, 0, 8, 3, 1, 0, 2)]  # 8 experts, top-2 of 5 tokens
    _check(moe.run(), truths, "numba_grouped_wmatmul")
    assert launches["n"] == 2


def test_gated_int4_experts_take_two_launches(launches):
    moe = MoE(seed=11)
    truths = [moe.gated_expert(m, 128, 256, dt.u4) for m in (3, 0, 1, 36)]
    _check(moe.run(), truths, "numba_grouped_gated_mlp")
    assert launches["n"] == 4  # gate+up, down; warm-up and execute


def test_f32_experts_run_their_blas_plans_one_after_the_other():
    moe = MoE(seed=2)
    truths = [moe.expert(m, 64, 48, dt.f32) for m in (4, 0, 17)]
    result = moe.run()
    assert result.partitions[0].compiled.plan.name.startswith("per_expert(")
    _check(result, truths, result.partitions[0].compiled.plan.name)


def _two_matmuls(k1, dtype1=dt.f32):
    g = ga.Graph(ga.EngineKind.cpu)
    lts = [ga.LogicalTensor(i, dt.f32, None) for i in range(6)]
    g.add_op(ga.Op(10, K.MatMul, [lts[0], lts[1]], [lts[2]], name="expert_0"))
    g.add_op(ga.Op(11, K.MatMul, [lts[3], lts[4]], [lts[5]], name="expert_1"))
    g.finalize()
    (part,) = g.get_partitions()
    assert part.get_kind() == "grouped_matmul"
    ins = [ga.LogicalTensor(0, dt.f32, [3, 8]), ga.LogicalTensor(1, dt.f32, [8, 4]),
           ga.LogicalTensor(3, dtype1, [2, k1]), ga.LogicalTensor(4, dtype1, [k1, 4])]
    outs = [ga.LogicalTensor(2, dt.f32, None), ga.LogicalTensor(5, dt.f32, None)]
    return part, ins, outs


def test_experts_with_different_k_at_compile_raise_invalid_shape_naming_the_op():
    part, ins, outs = _two_matmuls(16)
    with pytest.raises(InvalidShape, match=r'expert 1 op 11 \(MatMul "expert_1"\) input 0 .*\[16\].*\[8\]'):
        part.compile(ins, outs, ga.Engine())


def test_an_expert_with_the_wrong_dtype_at_compile_raises_invalid_data_type():
    part, ins, outs = _two_matmuls(8, dt.bf16)
    with pytest.raises(InvalidDataType, match=r'input tensor 3 \(op 11 \(MatMul "expert_1"\) reads it\) is bf16'):
        part.compile(ins, outs, ga.Engine())


def test_experts_known_to_differ_are_not_grouped():
    moe = MoE()
    moe.expert(2, 64, 32, dt.f32)
    moe.expert(2, 128, 32, dt.f32)
    moe.g.finalize()
    assert [p.get_kind() for p in moe.g.get_partitions()] == ["single op", "single op"]

"""Weight-compressed MatMul and gated-MLP partitions on the Numba plans.

Each graph runs fused (fast plan) and unfused (debug policy, reference ops);
outputs must agree under graph_api.check's rule for the partition's fpmath,
and the fused partition must really have taken the fast plan.
"""
import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api.check import compare
from graph_api.config import settings
from graph_api.fpmath import FPMath

C = ga.PropertyType.constant
INT_RANGE = {dt.s4: (-8, 7), dt.u4: (0, 15), dt.s8: (-128, 127), dt.u8: (0, 255)}


class Builder:
    def __init__(self, fpmath="strict", apply_to_int=False):
        self.g = ga.Graph(ga.EngineKind.cpu, fpmath, apply_to_int)
        self.next_t, self.next_op, self.feeds = 100, 0, {}
        self.rng = np.random.default_rng(7)

    def lt(self, dtype, shape, prop=ga.PropertyType.variable):
        self.next_t += 1
        return ga.LogicalTensor(self.next_t, dtype, shape, property=prop)

    def input(self, dtype, shape, values=None, prop=ga.PropertyType.variable):
        lt = self.lt(dtype, shape, prop)
        if values is None:
            values = self.rng.standard_normal(shape)
        self.feeds[lt.id] = ga.dtypes.convert(values, dtype)
        return lt

    def op(self, kind, inputs, out_dtype, out_shape, **attrs):
        self.next_op += 1
        out = self.lt(out_dtype, out_shape)
        self.g.add_op(ga.Op(self.next_op, kind, inputs, [out], attrs=attrs))
        return out

    def compressed_weight(self, wdt, k, n, transposed, qtype="per_group", group=32, zps=False,
                          scale_dt=dt.f32, prop=C, groups_kn=None, zp_dt=None):
        """``groups_kn``: (group along K, group along N) of a per_group weight."""
        shape = [n, k] if transposed else [k, n]
        lo, hi = INT_RANGE[wdt]
        w = self.input(wdt, shape, self.rng.integers(lo, hi + 1, shape), prop)
        if groups_kn is not None:
            gk, gn = groups_kn
            sshape = [n // gn, k // gk] if transposed else [k // gk, n // gn]
            attrs = dict(qtype="per_group", group_shape=[gn, gk] if transposed else [gk, gn])
        elif qtype == "per_group":
            sshape = [n, k // group] if transposed else [k // group, n]
            attrs = dict(qtype="per_group", group_shape=[1, group] if transposed else [group, 1])
        elif qtype == "per_channel":
            sshape = [n]
            attrs = dict(qtype="per_channel", axis=0 if transposed else 1)
        else:
            sshape, attrs = [1], dict(qtype="per_tensor")
        ins = [w, self.input(scale_dt, sshape, self.rng.uniform(0.005, 0.02, sshape), prop)]
        if zps:
            zdt = zp_dt or (dt.u4 if wdt == dt.u4 else dt.u8 if wdt == dt.u8 else dt.s8)
            zlo, zhi = INT_RANGE.get(zdt, (0, 15))
            ins.append(self.input(zdt, sshape, self.rng.integers(max(zlo, 0), min(zhi, 15) + 1, sshape), prop))
        return self.op(K.DynamicDequantize, ins, scale_dt, shape, **attrs)

    def run(self, expect_kernel):
        self.g.finalize()
        fused = ga.run_graph(self.g, self.feeds)
        names = {r.partition.get_kind(): r.compiled.plan.name for r in fused.partitions}
        assert expect_kernel in names.values(), names
        debug = ga.run_graph(self.g, self.feeds, policy=ga.PartitionPolicy.debug)
        for tid in self.g.output_ids:
            lt = self.g.tensors[tid]
            verdict = compare(debug.outputs[tid], fused.outputs[tid], lt.dtype, self.g.fpmath)
            assert verdict.ok, verdict.message
        return fused


@pytest.mark.parametrize("wdt,zps", [(dt.s4, False), (dt.u4, True), (dt.s8, False), (dt.u8, True)])
@pytest.mark.parametrize("transposed", [True, False])
@pytest.mark.parametrize("m", [1, 3, 33])
def test_weight_kinds_orientations_and_m(wdt, zps, transposed, m):
    b = Builder()
    k, n = 128, 160  # n not a multiple of the 128-column block
    w = b.compressed_weight(wdt, k, n, transposed, zps=zps)
    x = b.input(dt.f32, [m, k])
    b.op(K.MatMul, [x, w], dt.f32, [m, n], transpose_b=transposed)
    b.run("numba_wmatmul")


@pytest.mark.parametrize("qtype", ["per_channel", "per_tensor"])
def test_per_channel_and_per_tensor_scales(qtype):
    b = Builder()
    w = b.compressed_weight(dt.s8, 64, 96, True, qtype=qtype)
    x = b.input(dt.f32, [2, 64])
    b.op(K.MatMul, [x, w], dt.f32, [2, 96], transpose_b=True)
    b.run("numba_wmatmul")


def test_bias_and_post_op_chain_with_batch_dims():
    b = Builder()
    k, n = 64, 128
    w = b.compressed_weight(dt.s4, k, n, True)
    x = b.input(dt.f32, [2, 3, k])
    bias = b.input(dt.f32, [n])
    y = b.op(K.MatMul, [x, w, bias], dt.f32, [2, 3, n], transpose_b=True)
    y = b.op(K.GELU, [y], dt.f32, [2, 3, n], mode="gelu_tanh")
    resid = b.input(dt.f32, [2, 3, n])
    y = b.op(K.Add, [resid, y], dt.f32, [2, 3, n])  # running value at input 1
    y = b.op(K.Subtract, [y, b.input(dt.f32, [1, n])], dt.f32, [2, 3, n])
    s = b.op(K.Sigmoid, [y], dt.f32, [2, 3, n])
    y = b.op(K.Multiply, [y, s], dt.f32, [2, 3, n])  # swish
    y = b.op(K.Clamp, [y], dt.f32, [2, 3, n], min=-0.5, max=0.5)
    fused = b.run("numba_wmatmul")
    assert len(fused.partitions) == 1


def test_output_typecast_and_quantize_tail():
    b = Builder()
    w = b.compressed_weight(dt.u4, 64, 64, True, zps=True)
    x = b.input(dt.f32, [4, 64])
    y = b.op(K.MatMul, [x, w], dt.f32, [4, 64], transpose_b=True)
    y = b.op(K.ReLU, [y], dt.f32, [4, 64])
    b.op(K.TypeCast, [y], dt.bf16, [4, 64])
    b.run("numba_wmatmul")


def test_rfc_int4_to_int4_three_op_form():
    b = Builder()
    w = b.compressed_weight(dt.s4, 64, 64, False)
    x = b.input(dt.f32, [2, 64])
    y = b.op(K.MatMul, [x, w], dt.f32, [2, 64])
    scale = b.input(dt.f32, [2, 2], np.full((2, 2), 0.05))
    b.op(K.DynamicQuantize, [y, scale], dt.s4, [2, 64], qtype="per_group", group_shape=[1, 32])
    fused = b.run("numba_wmatmul")
    assert [r.partition.get_ops_num() for r in fused.partitions] == [3]


@pytest.mark.parametrize("mode,apply", [("bf16", True), ("bf16", False), ("f16", True), ("tf32", False)])
def test_fpmath_modes_match_the_reference_arithmetic(mode, apply):
    b = Builder(mode, apply)
    w = b.compressed_weight(dt.s4, 128, 64, True)
    x = b.input(dt.f32, [1, 128])
    b.op(K.MatMul, [x, w], dt.f32, [1, 64], transpose_b=True)
    b.run("numba_wmatmul")


def test_partition_fpmath_changes_the_fast_arithmetic():
    b = Builder()
    w = b.compressed_weight(dt.s4, 256, 64, True)
    x = b.input(dt.f32, [1, 256])
    b.op(K.MatMul, [x, w], dt.f32, [1, 64], transpose_b=True)
    b.g.finalize()
    (part,) = b.g.get_partitions()
    strict = ga.run_graph(b.g, b.feeds, partitions=[part]).outputs
    part.set_fpmath_mode("bf16", True)
    low = ga.run_graph(b.g, b.feeds, partitions=[part])
    assert low.partitions[0].compiled.plan.name == "numba_wmatmul"
    out_id = b.g.output_ids[0]
    assert np.abs(low.outputs[out_id] - strict[out_id]).max() > 1e-6
    debug = ga.Graph(ga.EngineKind.cpu, "bf16", True)
    for op in b.g.get_ops():
        debug.add_op(op)
    debug.finalize()
    ref = ga.run_graph(debug, b.feeds, policy=ga.PartitionPolicy.debug).outputs[out_id]
    assert compare(ref, low.outputs[out_id], dt.f32, FPMath.make("bf16", True)).ok


def test_f16_scales_round_the_dequantized_weights_like_the_reference():
    b = Builder()
    w = b.compressed_weight(dt.u4, 64, 64, True, zps=True, scale_dt=dt.f16)
    x = b.input(dt.f16, [1, 64])
    b.op(K.MatMul, [x, w], dt.f32, [1, 64], transpose_b=True)
    b.run("numba_wmatmul")


def test_variable_weights_take_the_direct_path():
    b = Builder()
    w = b.compressed_weight(dt.s4, 64, 256, False, prop=ga.PropertyType.variable)
    x = b.input(dt.f32, [1, 64])
    b.op(K.MatMul, [x, w], dt.f32, [1, 256])
    b.run("numba_wmatmul")


@pytest.mark.parametrize("act", ["swish", "gelu"])
@pytest.mark.parametrize("m", [1, 9])
def test_gated_mlp_with_int4_weights(act, m):
    b = Builder()
    h, f = 64, 96
    x = b.input(dt.f32, [m, h])
    gw = b.compressed_weight(dt.s4, h, f, True)
    uw = b.compressed_weight(dt.u4, h, f, True, zps=True)
    dw = b.compressed_weight(dt.s4, f, h, True)
    gate = b.op(K.MatMul, [x, gw], dt.f32, [m, f], transpose_b=True)
    if act == "swish":
        s = b.op(K.Sigmoid, [gate], dt.f32, [m, f])
        gate = b.op(K.Multiply, [gate, s], dt.f32, [m, f])
    else:
        gate = b.op(K.GELU, [gate], dt.f32, [m, f])
    up = b.op(K.MatMul, [x, uw], dt.f32, [m, f], transpose_b=True)
    prod = b.op(K.Multiply, [gate, up], dt.f32, [m, f])
    b.op(K.MatMul, [prod, dw], dt.f32, [m, h], transpose_b=True)
    fused = b.run("numba_gated_mlp")
    assert len(fused.partitions) == 1


@pytest.mark.parametrize("groups_kn", [(1, 128), (32, 64), (64, 256)])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("m", [1, 3, 33])
def test_groups_along_n_take_the_fast_plan(groups_kn, transposed, m):
    b = Builder()
    k, n = 128, 256
    w = b.compressed_weight(dt.u4, k, n, transposed, zps=True, groups_kn=groups_kn)
    x = b.input(dt.f32, [m, k])
    b.op(K.MatMul, [x, w], dt.f32, [m, n], transpose_b=transposed)
    b.run("numba_wmatmul")


@pytest.mark.parametrize("fpmath,apply_to_int", [("strict", False), ("f16", True)])
@pytest.mark.parametrize("m", [1, 9])
def test_gated_mlp_int4_example_layout(fpmath, apply_to_int, m):
    """oneDNN's gated_mlp_int4 example / benchdnn case: u4 [K, N] weights, f16
    scales, u8 zero points, group_shape [1, 128] (groups along N)."""
    b = Builder(fpmath, apply_to_int)
    h, f = 128, 256
    x = b.input(dt.f16, [m, h])
    weight = lambda k, n: b.compressed_weight(dt.u4, k, n, False, zps=True, scale_dt=dt.f16,
                                               groups_kn=(1, 128), zp_dt=dt.u8)
    gate = b.op(K.MatMul, [x, weight(h, f)], dt.f32, [m, f])
    s = b.op(K.Sigmoid, [gate], dt.f32, [m, f])
    gate = b.op(K.Multiply, [gate, s], dt.f32, [m, f])
    up = b.op(K.MatMul, [x, weight(h, f)], dt.f32, [m, f])
    prod = b.op(K.Multiply, [gate, up], dt.f32, [m, f])
    prod = b.op(K.TypeCast, [prod], dt.f16, [m, f])
    b.op(K.MatMul, [prod, weight(f, h)], dt.f16, [m, h])
    fused = b.run("numba_gated_mlp")
    assert len(fused.partitions) == 1


def test_check_mode_compares_fast_plans_with_the_reference(monkeypatch):
    monkeypatch.setattr(settings, "check", True)
    b = Builder()
    w = b.compressed_weight(dt.s4, 64, 64, True)
    x = b.input(dt.f32, [1, 64])
    b.op(K.MatMul, [x, w], dt.f32, [1, 64], transpose_b=True)
    b.run("numba_wmatmul")  # would raise ExecutionError on a mismatch


def test_concurrent_execution_from_python_threads():
    """The omp threading layer lets several Python threads run compiled
    partitions at once (the workqueue layer would abort); results agree."""
    from concurrent.futures import ThreadPoolExecutor

    from graph_api.kernels.numba_setup import numba

    b = Builder()
    w = b.compressed_weight(dt.s4, 256, 256, True)
    x = b.input(dt.f32, [1, 256])
    b.op(K.MatMul, [x, w], dt.f32, [1, 256], transpose_b=True)
    b.g.finalize()
    parts = b.g.get_partitions()
    want = ga.run_graph(b.g, b.feeds, partitions=parts).outputs[b.g.output_ids[0]]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: ga.run_graph(b.g, b.feeds, partitions=parts)
                                .outputs[b.g.output_ids[0]], range(16)))
    for got in results:
        np.testing.assert_array_equal(got, want)
    assert numba.threading_layer() in ("omp", "tbb")  # the layer actually launched


@pytest.mark.parametrize("dtype", [dt.f32, dt.f16, dt.bf16])
def test_float_gated_mlp_runs_blas_with_fused_epilogues(dtype):
    b = Builder()
    m, h, f = 3, 64, 96
    x = b.input(dtype, [m, h])
    gw, uw, dw = (b.input(dtype, s, prop=C) for s in ([h, f], [h, f], [f, h]))
    gate = b.op(K.MatMul, [x, gw], dt.f32, [m, f])
    s = b.op(K.Sigmoid, [gate], dt.f32, [m, f])
    gate = b.op(K.Multiply, [gate, s], dt.f32, [m, f])
    up = b.op(K.MatMul, [x, uw], dt.f32, [m, f])
    prod = b.op(K.Multiply, [gate, up], dt.f32, [m, f])
    if dtype != dt.f32:
        prod = b.op(K.TypeCast, [prod], dtype, [m, f])
    b.op(K.MatMul, [prod, dw], dt.f32 if dtype == dt.f32 else dtype, [m, h])
    fused = b.run("numba_gated_mlp")
    assert len(fused.partitions) == 1


@pytest.mark.parametrize("mode", ["strict", "bf16", "tf32"])
def test_float_matmul_post_ops_take_blas_with_epilogue(mode):
    b = Builder(mode)
    x = b.input(dt.f32, [2, 5, 48])
    w = b.input(dt.f32, [32, 48], prop=C)
    bias = b.input(dt.f32, [32])
    y = b.op(K.MatMul, [x, w, bias], dt.f32, [2, 5, 32], transpose_b=True)
    y = b.op(K.ReLU, [y], dt.f32, [2, 5, 32])
    y = b.op(K.Multiply, [y, b.input(dt.f32, [2, 5, 32])], dt.f32, [2, 5, 32])
    b.op(K.TypeCast, [y], dt.bf16, [2, 5, 32])
    # bf16 operands (the mode's rounding) run on the bf16 unit (AMX, AVX512_BF16) where the host has one
    from graph_api.kernels import bf16_matmul
    unit = bf16_matmul.UNIT
    b.run(f"{unit}_matmul_epilogue" if mode in ("bf16", "any") and unit else "blas_matmul_epilogue")


def test_compressed_matmul_writes_into_dense_output_tensors():
    """The plan's kernels write straight into an output tensor that is a dense row-major
    array of the result's type (f32, or bf16 bits as uint16); any other output (another
    type, strided) gets the result written afterwards."""
    import ml_dtypes
    from graph_api.kernels.weight_compressed.wmatmul_plan import _output_memory
    eng = ga.Engine()
    a = np.zeros((2, 3, 4), np.float32)
    t = ga.Tensor(ga.LogicalTensor(1, dt.f32, [2, 3, 4]), eng, a)
    m = _output_memory(t, 6, 4, "f32")
    assert m.shape == (6, 4) and m.dtype == np.float32 and np.shares_memory(m, a)
    assert _output_memory(t, 6, 4, "bf16") is None
    b = np.zeros((6, 4), ml_dtypes.bfloat16)
    m = _output_memory(ga.Tensor(ga.LogicalTensor(2, dt.bf16, [6, 4]), eng, b), 6, 4, "bf16")
    assert m.dtype == np.uint16 and np.shares_memory(m, b)
    col = ga.LogicalTensor(3, dt.f32, [6, 4], strides=[1, 6])  # column-major
    assert _output_memory(ga.Tensor(col, eng, np.zeros(24, np.float32)), 6, 4, "f32") is None
    assert _output_memory(None, 6, 4, "f32") is None

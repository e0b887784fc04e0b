"""The one post-op table (graph_api.postops): every derivation agrees with it,
and every row's epilogue code computes what the reference op computes."""
import numpy as np
import pytest

from graph_api import postops
from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K
from graph_api.fpmath import FPMath
from graph_api.logical_tensor import LogicalTensor
from graph_api.op import Op
from graph_api.opset import OP_SCHEMAS
from graph_api.partition import INPLACE_KINDS
from graph_api.kernels.weight_compressed import wmatmul as W
from graph_api.kernels.fused import epilogue
from graph_api.kernels.reference import REFERENCE, RefContext
from graph_api.patterns.library import common

#: attributes for rows that need some (others use the schema defaults)
ATTRS = {K.Clamp: {"min": -0.5, "max": 1.25}, K.Elu: {"alpha": 0.7}, K.LeakyReLU: {"alpha": 0.1},
         K.HardSigmoid: {"alpha": 0.2, "beta": 0.5}, K.SoftPlus: {"beta": 1.5},
         K.Pow: {"beta": 1.5}}
#: where a formula is defined for its input (log/sqrt/pow: positive)
POSITIVE = {K.Log, K.Sqrt, K.Pow}


def _op(kind, attrs, n_in):
    ins = [LogicalTensor(i, DataType.f32, [64]) for i in range(n_in)]
    op = Op(0, kind, ins, [LogicalTensor(9, DataType.f32, [64])], attrs=dict(attrs))
    for attr in OP_SCHEMAS[kind].attrs:  # schema defaults, as Graph.add_op writes them
        if attr.name not in op.attrs and attr.default is not None:
            op.attrs[attr.name] = attr.default
    return op


def test_derived_tables_agree():
    rows = postops.POST_OPS
    assert common.UNARY == {k for k, p in rows.items() if p.fusable and not p.binary}
    assert common.BINARY == {k for k, p in rows.items() if p.fusable and p.binary}
    assert INPLACE_KINDS == set(rows)
    assert set(epilogue.BINARY) == {k for k, p in rows.items() if p.binary}
    for k, p in rows.items():
        names = p.modes[1].values() if p.modes else [(p.name, p.code)]
        for name, code in names:
            table = W.BINARY_OPS if p.binary else W.UNARY_OPS
            assert table[name] == code, k
    codes = [p.code for p in rows.values()] + [c for p in rows.values() if p.modes
                                               for _, c in p.modes[1].values()]
    assert len(set(codes)) == len({(p.name, p.code) for p in rows.values()}) + 1  # GELU's 2 modes


def _variants():
    for kind, row in postops.POST_OPS.items():
        if row.modes:
            for value in row.modes[1]:
                yield kind, {row.modes[0]: value}, 0
        else:
            for at_input in ((0, 1) if row.binary else (0,)):
                yield kind, ATTRS.get(kind, {}), at_input


@pytest.mark.parametrize("kind,attrs,at_input", list(_variants()), ids=lambda v: str(v))
def test_epilogue_code_matches_reference(kind, attrs, at_input):
    row = postops.POST_OPS[kind]
    rng = np.random.default_rng(1)
    low = 0.05 if kind in POSITIVE else -4.0
    x = rng.uniform(low, 4.0, 64).astype(np.float32)
    x[:4] = [low, 0.5, 1.5, 2.5]  # Round's ties to even
    op = _op(kind, attrs, 2 if row.binary else 1)
    name, code, params = row.step(op.attrs, at_input)
    if row.binary:
        other = rng.uniform(0.5, 3.0, 64).astype(np.float32)
        steps = [(name, other)]
        ref_in = [x, other] if at_input == 0 else [other, x]
    else:
        steps = [(name, params)]
        ref_in = [x]
    ep = W.make_epilogue(steps, 1, 64)
    assert list(ep.ops) == [code]
    got = np.empty((1, 64), np.float32)
    W._store_rows(x.reshape(1, 64), 0, 0, got, W.OUT_F32, ep.ops, ep.fpar, ep.ipar, ep.buf)
    want = REFERENCE[kind](op, ref_in, op.outputs, RefContext(fpmath=FPMath.make("strict")))[0]
    # the reference is the correctly rounded f64 formula; the epilogue's f32
    # libm calls and f32 steps are within a few f32 ulps (2**-23 relative)
    np.testing.assert_allclose(got[0], want, rtol=4e-6, atol=1e-6)


@pytest.mark.parametrize("kind,attrs,at_input,operand",
                         [v + (o,) for v in _variants()
                          for o in (("row", "column", "full") if postops.POST_OPS[v[0]].binary else ("row",))],
                         ids=lambda v: str(v))
def test_row_store_matches_reference(kind, attrs, at_input, operand):
    """kernels.store (one loop per step over each row, then the strided store)
    computes every code as the reference op, with the operand broadcast along
    rows ([1, N]), columns ([R, 1]) or full, and a transposed destination."""
    from graph_api.kernels import store

    row = postops.POST_OPS[kind]
    rng = np.random.default_rng(2)
    R, N = 6, 40
    low = 0.05 if kind in POSITIVE else -4.0
    x = rng.uniform(low, 4.0, (R, N)).astype(np.float32)
    op = _op(kind, attrs, 2 if row.binary else 1)
    name, code, params = row.step(op.attrs, at_input)
    shape = {"row": (1, N), "column": (R, 1), "full": (R, N)}[operand]
    other = rng.uniform(0.5, 3.0, shape).astype(np.float32)
    steps = [(name, other)] if row.binary else [(name, params)]
    ref_in = ([x, other] if at_input == 0 else [other, x]) if row.binary else [x]
    ep = W.make_epilogue(steps, R, N)
    out = np.full(R * N, np.nan, np.float32)  # written as out[n, r]: a transposing store
    roff, coff = np.arange(R, dtype=np.int64), np.arange(N, dtype=np.int64) * R
    store.store(x, out, roff, coff, store.OUT_F32, ep)
    op.outputs[0] = LogicalTensor(9, DataType.f32, [R, N])
    want = REFERENCE[kind](op, ref_in, op.outputs, RefContext(fpmath=FPMath.make("strict")))[0]
    # as above: the reference is the correctly rounded f64 formula, the store's
    # f32 steps are within a few f32 ulps; GELU (bits.gelu_erf32/gelu_tanh32) within 4 u |x|,
    # u = 2**-24: below 9.6e-7 for |x| <= 4, inside atol
    np.testing.assert_allclose(out.reshape(N, R).T, want, rtol=4e-6, atol=1e-6)


def test_row_store_runs_and_threads():
    """Contiguous runs of the destination offsets, and a parallel store over many rows
    (bias + GELU + residual, the BERT FFN chain) equal to the serial element-wise evaluator."""
    from graph_api.kernels import store

    assert store.contiguous_run(np.arange(96)) == 96
    assert store.contiguous_run(np.concatenate([np.arange(32) + 1000 * h for h in range(3)])) == 32
    assert store.contiguous_run(np.arange(12) * 5) == 1
    rng = np.random.default_rng(4)
    R, N = 300, 384  # above SERIAL_BELOW: the parallel kernel
    acc = rng.standard_normal((R, N)).astype(np.float32) * 3
    ep = W.make_epilogue([("add", rng.standard_normal(N).astype(np.float32)), ("gelu_erf", None),
                          ("add", rng.standard_normal((R, N)).astype(np.float32)), ("round_bf16", None)], R, N)
    heads = N // 32  # [R, heads, 32] stored as [heads, R, 32]
    roff = np.arange(R, dtype=np.int64) * 32
    coff = (np.arange(N) // 32 * R * 32 + np.arange(N) % 32).astype(np.int64)
    out = np.empty(R * N, np.uint16)
    store.store(acc, out, roff, coff, store.OUT_BF16, ep)
    want = np.empty((R, N), np.uint16)
    W._store_rows(acc, 0, 0, want, W.OUT_BF16, ep.ops, ep.fpar, ep.ipar, ep.buf)
    got = out.reshape(heads, R, 32).transpose(1, 0, 2).reshape(R, N)
    # gelu_erf32 vs libm erff: a few f32 ulps before the bf16 rounding, so at most one bf16 ulp apart
    diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.99


def test_store_tile_column_panels():
    """store_tile (the int4 prefill's panel store) with a column offset: operands indexed by
    the global column, a panel wider than what is left of N, both equal to the element-wise
    evaluator on the whole result."""
    from graph_api.kernels import store

    rng = np.random.default_rng(6)
    R, N, PW = 70, 200, 128  # panels [0, 128) and [128, 200) of a 128-wide buffer
    for R_ in (R, 400):  # serial, then parallel (above SERIAL_BELOW)
        acc = rng.standard_normal((R_, N)).astype(np.float32)
        ep = W.make_epilogue([("add", rng.standard_normal(N).astype(np.float32)), ("gelu_erf", None),
                              ("mul", rng.standard_normal((R_, N)).astype(np.float32)), ("tanh", None)], R_, N)
        out = np.empty((R_, N), np.float32)
        for n0 in (0, PW):
            panel = np.zeros((R_, PW), np.float32)
            panel[:, :min(PW, N - n0)] = acc[:, n0:n0 + PW]
            store.store_tile(panel, out, n0, store.OUT_F32, ep)
        want = np.empty((R_, N), np.float32)
        W._store_rows(acc, 0, 0, want, W.OUT_F32, ep.ops, ep.fpar, ep.ipar, ep.buf)
        # gelu_erf32 vs libm erff: a few f32 ulps, carried through mul and tanh
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("R", [5, 300])  # the serial and the parallel store
def test_store_head_row_is_the_epilogue_add(R):
    """A bias given to the store as its head row (added as each row is read) gives the
    same bits as the same bias as the program's first add step."""
    from graph_api.kernels import store

    rng = np.random.default_rng(R)
    N = 384
    acc = rng.standard_normal((R, N)).astype(np.float32) * 3
    bias = rng.standard_normal(N).astype(np.float32)
    res = rng.standard_normal((R, N)).astype(np.float32)
    roff, coff = np.arange(R, dtype=np.int64) * N, np.arange(N, dtype=np.int64)
    want = np.empty(R * N, np.float32)
    store.store(acc, want, roff, coff, store.OUT_F32,
                W.make_epilogue([("add", bias), ("gelu_erf", None), ("add", res)], R, N))
    got = np.empty(R * N, np.float32)
    store.store(acc, got, roff, coff, store.OUT_F32, W.make_epilogue([("gelu_erf", None), ("add", res)], R, N),
                head=bias)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))

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
from graph_api.kernels import wmatmul as W
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

"""The closed world of sparse ops against the dense float64 reference, for every encoding."""
import numpy as np
import pytest

import graph_api as ga
from graph_api import sparse_encoding as se
from graph_api.enums import OpKind as K
from graph_api.runner import compile_graph
from tests.graph_api.sparse_cases import ENCODINGS, sparse_matrix

F32 = ga.DataType.f32
OP_ENCODINGS = ["CSR", "CSC", "COO", "DCSR", "BCSR2x4", "2:4"]


def run_op(kind, inputs, out, attrs=None, out_dtype=F32):
    """One op: ``inputs`` is a list of (array, encoding or None), ``out`` = (shape, encoding).
    Returns (dense output, the output tensor after execution, the compiled graph)."""
    g = ga.Graph()
    ins = [ga.LogicalTensor(i, dtype_of(a), a.shape, sparse_encoding=enc) for i, (a, enc) in enumerate(inputs)]
    y = ga.LogicalTensor(len(ins), out_dtype, out[0], sparse_encoding=out[1])
    g.add_op(ga.Op(0, kind, ins, [y], attrs=attrs or {}))
    g.finalize()
    feeds = {i: a for i, (a, _) in enumerate(inputs)}
    compiled = compile_graph(g, feeds)
    compiled.run(feeds)
    tensor = compiled.produced[y.id]
    return tensor.numpy(), tensor, compiled


def dtype_of(a):
    if hasattr(a, "levels"):  # a SparseStorage
        return a.dtype
    return {np.dtype(np.float32): F32, np.dtype(np.float16): ga.DataType.f16}[a.dtype]


def stored(a, enc) -> set:
    """The coordinates an encoding stores for dense data ``a``."""
    from graph_api.sparse_storage import SparseStorage

    return {tuple(c) for c in SparseStorage.from_dense(enc, a).coo()[0]}


def f64(a):
    return np.asarray(a, np.float64)


#: one f32 rounding of an exact or correctly rounded result, plus libm's few-ulp error for tanh/sqrt
ONE_ROUNDING = dict(rtol=6e-7, atol=1e-30)

UNARY = {
    K.Abs: np.abs, K.Sqrt: lambda x: np.sqrt(np.abs(x)), K.Tanh: np.tanh, K.ReLU: lambda x: np.maximum(x, 0),
    K.Square: np.square, K.Round: lambda x: np.round(3 * x),
}


@pytest.mark.parametrize("name", OP_ENCODINGS)
@pytest.mark.parametrize("kind", UNARY, ids=lambda k: k.name)
def test_zero_preserving_unary(name, kind):
    a = sparse_matrix(name)
    if kind == K.Sqrt:
        a = np.abs(a)
    if kind == K.Round:
        a = (3 * a).astype(np.float32)
    ref = UNARY[kind](f64(a)) if kind not in (K.Sqrt, K.Round) else \
        (np.sqrt(f64(a)) if kind == K.Sqrt else np.round(f64(a)))
    out, tensor, _ = run_op(kind, [(a, ENCODINGS[name])], (a.shape, ENCODINGS[name]))
    np.testing.assert_allclose(out, ref, **ONE_ROUNDING)
    assert tensor.storage.encoding == ENCODINGS[name]
    assert tensor.storage.nse == ga.Tensor(ga.LogicalTensor(9, F32, a.shape, sparse_encoding=name), None, a).storage.nse


BINARY = {K.Add: np.add, K.Subtract: np.subtract, K.Multiply: np.multiply}


@pytest.mark.parametrize("name", OP_ENCODINGS)
@pytest.mark.parametrize("kind", BINARY, ids=lambda k: k.name)
def test_binary_sparse_with_sparse(name, kind):
    a, b = sparse_matrix(name, seed=1), sparse_matrix(name, seed=2)
    out, _, _ = run_op(kind, [(a, ENCODINGS[name]), (b, ENCODINGS[name])], (a.shape, None))
    np.testing.assert_allclose(out, BINARY[kind](f64(a), f64(b)), **ONE_ROUNDING)
    # a sparse result in another encoding: the union / intersection of the patterns
    out, tensor, _ = run_op(kind, [(a, ENCODINGS[name]), (b, se.csr())], (a.shape, se.coo()))
    np.testing.assert_allclose(out, BINARY[kind](f64(a), f64(b)), **ONE_ROUNDING)
    stored_a, stored_b = stored(a, ENCODINGS[name]), stored(b, se.csr())  # BCSR/2:4 store explicit zeros
    assert tensor.storage.nse == len(stored_a & stored_b if kind == K.Multiply else stored_a | stored_b)


@pytest.mark.parametrize("name", OP_ENCODINGS)
@pytest.mark.parametrize("kind", BINARY, ids=lambda k: k.name)
def test_binary_sparse_with_dense_broadcast(name, kind):
    a = sparse_matrix(name, seed=3)
    d = np.random.default_rng(4).standard_normal((1, a.shape[1])).astype(np.float32)
    out, _, _ = run_op(kind, [(d, None), (a, ENCODINGS[name])], (a.shape, None))
    np.testing.assert_allclose(out, BINARY[kind](f64(d), f64(a)), **ONE_ROUNDING)


@pytest.mark.parametrize("name", OP_ENCODINGS)
@pytest.mark.parametrize("kind,axis", [(K.ReduceSum, 0), (K.ReduceSum, 1), (K.ReduceMax, 0), (K.ReduceMax, 1)])
def test_reductions(name, kind, axis):
    a = sparse_matrix(name, seed=5) - np.float32(0.0)
    a[a > 0] *= -1  # all stored values negative: ReduceMax must see the implicit zeros
    a[:, 5] = -1.0 - np.arange(a.shape[0], dtype=np.float32)  # a fully stored column: its max is < 0
    if name == "2:4":
        a[:, 4] = 0
    out, _, _ = run_op(kind, [(a, ENCODINGS[name])], ((a.shape[1 - axis],), None), {"axes": [axis]})
    ref = f64(a).sum(axis) if kind == K.ReduceSum else f64(a).max(axis)
    # sums of <= 12 f32 values in f64, rounded once
    np.testing.assert_allclose(out, ref, **ONE_ROUNDING)


@pytest.mark.parametrize("name", OP_ENCODINGS)
def test_transpose_reshape_concat(name):
    a = sparse_matrix(name, seed=6)
    out, tensor, _ = run_op(K.StaticTranspose, [(a, ENCODINGS[name])], (a.shape[::-1], se.csr()),
                            {"order": [1, 0]})
    np.testing.assert_array_equal(out, a.T)
    assert tensor.storage.encoding == se.csr()
    out, _, _ = run_op(K.StaticReshape, [(a, ENCODINGS[name])], ((4, 24), se.coo()),
                       {"shape": [4, 24], "special_zero": False})
    np.testing.assert_array_equal(out, a.reshape(4, 24))
    d = sparse_matrix("CSR", seed=7)
    out, _, _ = run_op(K.Concat, [(a, ENCODINGS[name]), (d, None)], ((16, 12), se.csr()), {"axis": 0})
    np.testing.assert_array_equal(out, np.concatenate([a, d]))


@pytest.mark.parametrize("name", OP_ENCODINGS)
def test_convert_between_dense_and_encodings(name):
    a = sparse_matrix(name, seed=8)
    enc = ENCODINGS[name]
    out, tensor, _ = run_op(K.Reorder, [(a, None)], (a.shape, enc))  # dense -> sparse: the non-zeros
    np.testing.assert_array_equal(out, a)
    assert tensor.storage.nse == ga.Tensor(ga.LogicalTensor(9, F32, a.shape, sparse_encoding=enc), None, a).storage.nse
    out, _, _ = run_op(K.Reorder, [(a, enc)], (a.shape, None))  # sparse -> dense
    np.testing.assert_array_equal(out, a)
    out, tensor, _ = run_op(K.Reorder, [(a, enc)], (a.shape, se.csc()))  # encoding -> encoding
    np.testing.assert_array_equal(out, a)
    assert tensor.storage.encoding == se.csc()
    out, tensor, _ = run_op(K.TypeCast, [(a, enc)], (a.shape, enc), out_dtype=ga.DataType.f16)
    np.testing.assert_array_equal(out, a.astype(np.float16))  # round to nearest even, as numpy
    assert tensor.storage.values.dtype == np.float16


def matmul_bound(a, b):
    """f32 sums of K products, each rounded: |error| <= K * 2^-24 * (|a| @ |b|) (plus one rounding)."""
    return (a.shape[-1] + 1) * 2.0 ** -24 * (np.abs(f64(a)) @ np.abs(f64(b))) + 1e-30


@pytest.mark.parametrize("name", OP_ENCODINGS)
def test_matmul_sparse_a_sparse_b_and_both(name):
    enc = ENCODINGS[name]
    a = sparse_matrix(name, seed=9)  # [8, 12]
    rng = np.random.default_rng(10)
    d = rng.standard_normal((12, 5)).astype(np.float32)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    cases = [
        ([(a, enc), (d, None)], {}, a, d),                                   # SpMM, sparse A
        ([(x, None), (a, enc)], {}, x, a),                                   # dense x sparse weights
        ([(rng.standard_normal((5, 12)).astype(np.float32), None), (a, enc)], {"transpose_b": True}, None, None),
        ([(a, enc), (rng.standard_normal((8, 4)).astype(np.float32), None)], {"transpose_a": True}, None, None),
    ]
    for inputs, attrs, _, _ in cases:
        l = inputs[0][0].T if attrs.get("transpose_a") else inputs[0][0]
        r = inputs[1][0].T if attrs.get("transpose_b") else inputs[1][0]
        out, _, compiled = run_op(K.MatMul, inputs, ((l.shape[0], r.shape[1]), None), attrs)
        assert np.all(np.abs(out - f64(l) @ f64(r)) <= matmul_bound(l, r)), (attrs, compiled.steps[0][1].plan.name)
        assert compiled.steps[0][1].plan.name.startswith("spmm_")
    b = sparse_matrix(name, shape=(12, 8), seed=11)
    out, _, compiled = run_op(K.MatMul, [(a, enc), (b, enc)], ((8, 8), None))  # SpMSpM
    assert np.all(np.abs(out - f64(a) @ f64(b)) <= matmul_bound(a, b))
    assert compiled.steps[0][1].plan.name == "sparse_composed"


def test_matmul_batched_sparse_operand():
    rng = np.random.default_rng(12)
    a = np.stack([sparse_matrix("CSR", seed=s) for s in (13, 14)])  # [2, 8, 12]
    d = rng.standard_normal((12, 5)).astype(np.float32)
    out, _, _ = run_op(K.MatMul, [(a, se.csr(batch=1)), (d, None)], ((2, 8, 5), None))
    ref = f64(a) @ f64(d)
    assert np.all(np.abs(out - ref) <= 13 * 2.0 ** -24 * (np.abs(f64(a)) @ np.abs(f64(d))) + 1e-30)
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)  # a linear layer over [..., K], sparse weights
    w = sparse_matrix("CSR", seed=15)
    out, _, compiled = run_op(K.MatMul, [(x, None), (w, se.csr())], ((2, 3, 12), None))
    assert np.all(np.abs(out - f64(x) @ f64(w)) <= 9 * 2.0 ** -24 * (np.abs(f64(x)) @ np.abs(f64(w))) + 1e-30)


def test_sparse_semantics_skip_zero_times_nan():
    a = np.zeros((4, 8), np.float32)
    a[0, 1] = 2.0
    d = np.ones((4, 8), np.float32)
    d[2, 3] = np.nan  # where a stores nothing
    out, _, _ = run_op(K.Multiply, [(a, se.csr()), (d, None)], (a.shape, None))
    assert not np.isnan(out).any() and out[0, 1] == 2.0
    b = np.ones((8, 3), np.float32)
    b[5] = np.inf  # column 5 of a is not stored: inf * 0 is skipped
    out, _, _ = run_op(K.MatMul, [(a, se.csr()), (b, None)], ((4, 3), None))
    assert np.isfinite(out).all() and out[0, 0] == 2.0


def _graph_with(kind, in_enc, attrs=None, shape=(4, 8)):
    g = ga.Graph()
    x = ga.LogicalTensor(0, F32, list(shape), sparse_encoding=in_enc)
    y = ga.LogicalTensor(1, F32, list(shape))
    return g, ga.Op(7, kind, [x], [y], attrs=attrs or {})


def test_unsupported_op_is_rejected_at_add_op():
    g, op = _graph_with(K.SoftMax, "CSR", {"axis": 1})
    with pytest.raises(ga.Unimplemented, match=r"op 7 \(SoftMax.*\(i, j\) -> \(i : dense, j : compressed\)") as err:
        g.add_op(op)
    assert err.value.status == ga.Status.unimplemented
    assert g.add_op(op, allow_exception=False) == ga.Status.unimplemented


def test_unsupported_op_is_rejected_at_finalize_when_declared_elsewhere():
    g = ga.Graph()
    g.add_op(ga.Op(0, K.ReLU, [ga.LogicalTensor(0, F32, [4, 8])],
                   [ga.LogicalTensor(1, F32, [4, 8], sparse_encoding="BCSR2x4")]))
    g.add_op(ga.Op(1, K.Exp, [ga.LogicalTensor(1, F32, [4, 8])], [ga.LogicalTensor(2, F32, [4, 8])]))
    with pytest.raises(ga.Unimplemented, match=r"op 1 \(Exp.*i floordiv 2 : dense"):
        g.finalize()


def test_sparse_bias_and_sparse_broadcast_are_refused():
    g = ga.Graph()
    x, w = ga.LogicalTensor(0, F32, [2, 4]), ga.LogicalTensor(1, F32, [4, 4])
    bias = ga.LogicalTensor(2, F32, [2, 4], sparse_encoding="CSR")
    with pytest.raises(ga.Unimplemented, match="sparse bias"):
        g.add_op(ga.Op(0, K.MatMul, [x, w, bias], [ga.LogicalTensor(3, F32, [2, 4])]))
    row = np.ones((1, 8), np.float32)
    with pytest.raises(ga.Unimplemented, match="sparse operands do not broadcast"):
        run_op(K.Add, [(row, se.csr()), (np.ones((4, 8), np.float32), None)], ((4, 8), None))


def test_execute_checks_sparse_against_dense_ports():
    g = ga.Graph()
    x = ga.LogicalTensor(0, F32, [4, 8], sparse_encoding="CSR")
    g.add_op(ga.Op(0, K.Abs, [x], [ga.LogicalTensor(1, F32, [4, 8])]))
    g.finalize()
    part = g.get_partitions()[0]
    cp = part.compile([ga.LogicalTensor(0, F32, [4, 8])], [ga.LogicalTensor(1, F32, [4, 8])])
    assert cp.query_logical_tensor(0).encoding == se.csr()  # the graph's encoding, given or not
    dense_in = ga.Tensor(ga.LogicalTensor(0, F32, [4, 8]), None, np.ones((4, 8), np.float32))
    with pytest.raises(ga.InvalidArguments, match="input tensor 0 is dense, compiled for sparse"):
        cp.execute(None, [dense_in], [ga.Tensor(ga.LogicalTensor(1, F32, [4, 8]))])
    with pytest.raises(ga.InvalidArguments, match="has sparse encoding"):
        part.compile([ga.LogicalTensor(0, F32, [4, 8], sparse_encoding="CSC")], [ga.LogicalTensor(1, F32, [4, 8])])


def test_matching_patterns_keep_the_structure_and_duplicates_are_summed_first():
    a = sparse_matrix("CSR", seed=16)
    out, tensor, _ = run_op(K.Multiply, [(a, se.csr()), (a, se.csr())], (a.shape, se.csr()))
    np.testing.assert_allclose(out, f64(a) * f64(a), **ONE_ROUNDING)
    assert tensor.storage.nse == np.count_nonzero(a)
    # a COO with duplicate entries: Abs of the element (their sum), not the sum of the Abs
    from graph_api.sparse_storage import SparseStorage

    multi = "(i, j) -> (i : compressed(nonunique), j : singleton(nonunique))"
    st = SparseStorage(multi, (2, 2), "f32", [(np.array([0, 2]), np.array([0, 0])), (None, np.array([1, 1]))],
                       np.array([-3.0, 1.0], np.float32))
    out, _, _ = run_op(K.Abs, [(st, multi)], ((2, 2), None))
    assert out[0, 1] == 2.0

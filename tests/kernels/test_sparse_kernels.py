"""Sparse kernels: the fused SpMM partition (MatMul + bias + post-ops) per encoding and
orientation against the float64 reference, the conversion and 2:4 packing kernels."""
import numpy as np
import pytest

import graph_api as ga
from graph_api import sparse_encoding as se
from graph_api.enums import OpKind as K
from graph_api.runner import compile_graph
from tests.graph_api.sparse_cases import ENCODINGS, sparse_matrix

F32 = ga.DataType.f32
#: (encoding name, expected kernel family)
FAST = [("CSR", "csr"), ("CSC", "csc"), ("BCSR4x4", "bcsr"), ("2:4", "nm"), ("COO", "other")]
#: (family, the sparse operand's row form is transposed) -> the kernel the plan names
KERNEL = {("csr", False): "spmm_csr", ("csr", True): "spmm_csr(transposed csr)",
          ("csc", True): "spmm_csr", ("csc", False): "spmm_csr(transposed csc)",
          ("bcsr", False): "spmm_bcsr", ("bcsr", True): "spmm_bcsr(transposed)",
          ("nm", False): "spmm_2of4", ("nm", True): "spmm_csr(from #2:4)",
          ("other", False): "spmm_csr(from #COO)", ("other", True): "spmm_csr(from #COO)"}


def layer(w_enc, w_shape, x_shape, sparse_weight_first: bool, transpose_w: bool, extra=None):
    """y = act(x @ op(W) + bias) (or op(W) @ x), W sparse and constant; one partition expected."""
    g = ga.Graph()
    w = ga.LogicalTensor(1, F32, w_shape, property=ga.PropertyType.constant, sparse_encoding=w_enc)
    x = ga.LogicalTensor(0, F32, x_shape)
    ins = [w, x] if sparse_weight_first else [x, w]
    attrs = {"transpose_a": transpose_w} if sparse_weight_first else {"transpose_b": transpose_w}
    lhs = w_shape[::-1] if (sparse_weight_first and transpose_w) else (w_shape if sparse_weight_first else x_shape)
    rhs = x_shape if sparse_weight_first else (w_shape[::-1] if transpose_w else w_shape)
    out_shape = [lhs[0], rhs[1]]
    bias = ga.LogicalTensor(2, F32, [out_shape[1]])
    y = ga.LogicalTensor(3, F32, out_shape)
    g.add_op(ga.Op(0, K.MatMul, ins + [bias], [y], attrs=attrs))
    last = y
    if extra is not None:
        other = ga.LogicalTensor(4, F32, out_shape)
        z = ga.LogicalTensor(5, F32, out_shape)
        g.add_op(ga.Op(1, K.Add, [last, other], [z]))
        last = z
    act = ga.LogicalTensor(6, F32, out_shape)
    g.add_op(ga.Op(2, K.ReLU, [last], [act]))
    g.finalize()
    return g, out_shape


@pytest.mark.parametrize("name,family", FAST)
@pytest.mark.parametrize("orientation", ["x @ W^T", "x @ W", "W @ x", "W^T @ x"])
@pytest.mark.parametrize("n", [1, 70])
def test_fused_sparse_matmul_bias_relu(name, family, orientation, n):
    rng = np.random.default_rng(hash((name, orientation, n)) % 2**32)
    transpose = "^T" in orientation
    first = orientation.startswith("W")
    w = sparse_matrix(name, shape=(20, 16), density=0.5, seed=3)
    if first:  # W @ x: x is [K, n]; W^T @ x: K = 20
        x = rng.standard_normal((w.shape[0] if transpose else w.shape[1], n)).astype(np.float32)
    else:      # x @ W: x [n, 20]; x @ W^T: x [n, 16]
        x = rng.standard_normal((n, w.shape[1] if transpose else w.shape[0])).astype(np.float32)
    g, out_shape = layer(ENCODINGS[name], list(w.shape), list(x.shape), first, transpose, extra=True)
    bias = rng.standard_normal(out_shape[1]).astype(np.float32)
    other = rng.standard_normal(out_shape).astype(np.float32)
    parts = g.get_partitions()
    assert [p.get_kind() for p in parts] == ["sparse_matmul_post_ops"]
    feeds = {0: x, 1: w, 2: bias, 4: other}
    compiled = compile_graph(g, feeds)
    compiled.run(feeds)
    compiled.run(feeds)  # the second run reuses the converted constant weights
    plan = compiled.steps[0][1].plan
    out = compiled.produced[6].numpy()
    wop = w.T if transpose else w
    l, r = (wop, x) if first else (x, wop)
    ref = np.maximum(l.astype(np.float64) @ r.astype(np.float64) + bias + other, 0)
    # f32 sums of K products (each rounded), then bias and the Add rounded once each:
    # |error| <= (K + 3) * 2^-24 * (|l| @ |r| + |bias| + |other|); ReLU does not increase it
    bound = (l.shape[1] + 3) * 2.0 ** -24 * (np.abs(l) @ np.abs(r) + np.abs(bias) + np.abs(other))
    assert np.all(np.abs(out - ref) <= bound + 1e-30)
    # S @ D runs S's rows; D @ S runs the rows of S^T
    transposed_rows = transpose if first else not transpose
    assert plan.name.split("+")[0] == KERNEL[family, transposed_rows]


@pytest.mark.parametrize("first", [True, False])
def test_direct_epilogue_path_writes_the_output_once(first):
    """S @ D into a dense f32 output runs the epilogue inside the kernel (no store pass)."""
    w = sparse_matrix("CSR", shape=(20, 16), seed=4)
    x = np.random.default_rng(5).standard_normal((16, 3) if first else (3, 20)).astype(np.float32)
    g, out_shape = layer(se.csr(), [20, 16], list(x.shape), first, False)
    feeds = {0: x, 1: w, 2: np.ones(out_shape[1], np.float32)}
    compiled = compile_graph(g, feeds)
    compiled.run(feeds)
    assert compiled.steps[0][1].plan.direct == first
    l, r = (w, x) if first else (x, w)
    ref = np.maximum(l.astype(np.float64) @ r + 1.0, 0)
    np.testing.assert_allclose(compiled.produced[6].numpy(), ref, rtol=1e-5, atol=1e-5)


def test_constant_weights_keep_their_row_form_variables_do_not():
    from graph_api.kernels.fused.sparse_plan import row_form

    w = sparse_matrix("CSR", shape=(20, 16), seed=6)
    x = np.ones((2, 16), np.float32)
    for prop, kept in ((ga.PropertyType.constant, True), (ga.PropertyType.variable, False)):
        g = ga.Graph()
        wl = ga.LogicalTensor(1, F32, [20, 16], property=prop, sparse_encoding="CSR")
        g.add_op(ga.Op(0, K.MatMul, [ga.LogicalTensor(0, F32, [2, 16]), wl], [ga.LogicalTensor(2, F32, [2, 20])],
                       attrs={"transpose_b": True}))
        g.finalize()
        t = ga.Tensor(wl.with_shape((20, 16)), None, w)
        compile_graph(g, {0: x, 1: t}).run({0: x, 1: t})
        assert (("row_form", False) in t.storage._cache) == kept
        assert row_form(t.storage, False)[0] == "csr"


def test_csr_transpose_matches_scipy():
    import scipy.sparse as sp

    from graph_api.kernels import sparse as sk

    a = sp.random_array((37, 53), density=0.2, random_state=1, format="csr", dtype=np.float32)
    ptr, idx, perm = sk.csr_transpose(a.indptr.astype(np.int32), a.indices.astype(np.int32), 53)
    t = sp.csr_array((a.data[perm], idx, ptr), shape=(53, 37))
    np.testing.assert_array_equal(t.toarray(), a.toarray().T)
    assert np.all(np.diff(idx[ptr[5]:ptr[6]]) > 0)  # rows come out ordered


def test_2of4_packing_holds_two_bits_per_value():
    from graph_api.kernels import sparse as sk
    from graph_api.sparse_storage import SparseStorage

    a = sparse_matrix("2:4", shape=(6, 24), density=0.9, seed=7)
    st = SparseStorage.from_dense("2:4", a)
    packed = sk.pack_2of4(st.levels[2].coordinates, 6)
    assert packed.shape == (6, 3) and packed.nbytes * 16 == st.values.nbytes  # 2 bits per 32-bit value
    g = np.arange(6)
    decoded = np.stack([(packed[:, g // 2] >> (4 * (g % 2))) & 3, (packed[:, g // 2] >> (4 * (g % 2) + 2)) & 3], -1)
    np.testing.assert_array_equal(decoded.reshape(-1), st.levels[2].coordinates)

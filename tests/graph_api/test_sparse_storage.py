"""Sparse storage: dense <-> sparse <-> scipy conversions, level arrays, malformed storage."""
import numpy as np
import pytest

import graph_api as ga
from graph_api import sparse_encoding as se
from graph_api.sparse_storage import InvalidSparseStorage, SparseStorage, prune

from tests.graph_api.sparse_cases import ENCODINGS, sparse_matrix


@pytest.mark.parametrize("name", ENCODINGS)
def test_dense_round_trip_and_scipy(name):
    a = sparse_matrix(name)
    st = SparseStorage.from_dense(ENCODINGS[name], a)
    np.testing.assert_array_equal(st.to_dense(), a)
    np.testing.assert_array_equal(st.to_scipy().toarray(), a)
    import scipy.sparse as sp

    for fmt in ("csr", "csc", "coo"):
        back = SparseStorage.from_scipy(ENCODINGS[name], sp.csr_array(a).asformat(fmt))
        np.testing.assert_array_equal(back.to_dense(), a)
    coords, values = st.coo()
    assert np.all(a[tuple(coords.T)] == values)


def test_csr_levels_are_the_usual_arrays():
    import scipy.sparse as sp

    a = sparse_matrix("CSR")
    st = SparseStorage.from_dense("CSR", a)
    ref = sp.csr_array(a)
    np.testing.assert_array_equal(st.levels[1].positions, ref.indptr)
    np.testing.assert_array_equal(st.levels[1].coordinates, ref.indices)
    np.testing.assert_array_equal(st.values, ref.data)
    assert st.levels[0].positions is None and st.levels[0].coordinates is None
    csc = SparseStorage.from_dense("CSC", a)  # column-major: the row-major entries sorted again
    np.testing.assert_array_equal(csc.levels[1].positions, sp.csc_array(a).indptr)
    np.testing.assert_array_equal(csc.levels[1].coordinates, sp.csc_array(a).indices)
    np.testing.assert_array_equal(csc.values, sp.csc_array(a).data)
    for encoding in ("CSR", "CSC", se.bcsr(2, 4), "2:4"):  # COO in any order: the same storage
        b = a if encoding != "2:4" else prune(a, "2:4")
        coords = np.argwhere(b != 0)[::-1].copy()
        shuffled = SparseStorage.from_coo(encoding, b.shape, "f32", coords, b[tuple(coords.T)])
        want = SparseStorage.from_dense(encoding, b)
        np.testing.assert_array_equal(shuffled.values, want.values)
        for got_level, want_level in zip(shuffled.levels, want.levels):
            for name in ("positions", "coordinates"):
                g, w = getattr(got_level, name), getattr(want_level, name)
                assert (g is None and w is None) or np.array_equal(g, w)


def test_bcsr_stores_whole_blocks_and_2of4_pads_to_two():
    a = np.zeros((4, 8), np.float32)
    a[0, 5] = 1.0
    bcsr = SparseStorage.from_dense(se.bcsr(2, 4), a)
    assert bcsr.nse == 8 and list(bcsr.levels[1].coordinates) == [1]
    nm = SparseStorage.from_dense("2:4", a)
    assert nm.nse == 4 * 2 * 2  # two slots per 1x4 block, explicit zeros included
    assert list(nm.levels[2].coordinates[2:4]) == [0, 1] and list(nm.values[2:4]) == [0.0, 1.0]
    np.testing.assert_array_equal(nm.to_dense(), a)


def test_2of4_reads_half_the_weight_bytes():
    a = sparse_matrix("2:4", (64, 256), density=1.0)
    st = SparseStorage.from_dense("2:4", a)
    assert st.values.nbytes * 2 == a.nbytes  # the kernel packs the 2-bit indices: 1/16 more


def test_coo_keeps_duplicates_and_sums_them_densely():
    multi = "(i, j) -> (i : compressed(nonunique), j : singleton(nonunique))"
    st = SparseStorage(multi, (3, 3), "f32", [(np.array([0, 3]), np.array([1, 1, 2])),
                                             (None, np.array([0, 0, 2]))],
                       np.array([1.0, 2.0, 5.0], np.float32))
    dense = st.to_dense()
    assert dense[1, 0] == 3.0 and dense[2, 2] == 5.0
    with pytest.raises(InvalidSparseStorage, match="duplicate"):
        SparseStorage("COO", (3, 3), "f32",
                      [(np.array([0, 2]), np.array([1, 1])), (None, np.array([0, 0]))],
                      np.array([1.0, 2.0], np.float32))


def _csr(positions, coordinates, values=None, shape=(3, 4), enc="CSR"):
    n = len(coordinates)
    values = np.arange(1, n + 1, dtype=np.float32) if values is None else values
    return SparseStorage(enc, shape, "f32", [(None, None), (np.array(positions), np.array(coordinates))], values)


MALFORMED = {
    "positions decrease": (lambda: _csr([0, 2, 1, 3], [0, 1, 2]), "never decrease"),
    "positions do not start at 0": (lambda: _csr([1, 2, 2, 3], [0, 1, 2]), "start at 0"),
    "positions end early": (lambda: _csr([0, 1, 1, 2], [0, 1, 2]), "positions end at 2"),
    "too few positions": (lambda: _csr([0, 3], [0, 1, 2]), "2 positions for 3 parents"),
    "coordinate out of range": (lambda: _csr([0, 1, 2, 3], [0, 4, 1]), "coordinate 4 outside"),
    "negative coordinate": (lambda: _csr([0, 1, 2, 3], [0, -1, 1]), "outside"),
    "duplicate in a unique level": (lambda: _csr([0, 2, 2, 3], [1, 1, 0]), "duplicate coordinate 1"),
    "unsorted in an ordered level": (lambda: _csr([0, 2, 2, 3], [3, 1, 0]), "not ordered: 3 then 1"),
    "duplicate in an unordered unique level": (
        lambda: _csr([0, 2, 2, 3], [1, 1, 0], enc="(i, j) -> (i : dense, j : compressed(nonordered))"),
        "duplicate coordinates"),
    "values length": (lambda: _csr([0, 1, 2, 3], [0, 1, 2], np.ones(4, np.float32)), "4 values for 3"),
    "values dtype": (lambda: _csr([0, 1, 2, 3], [0, 1, 2], np.ones(3, np.float64)), "values must be 1-D float32"),
    "arrays on a dense level": (lambda: SparseStorage("CSR", (1, 1), "f32", [(np.array([0, 1]), None),
                                                                        (np.array([0, 1]), np.array([0]))],
                                                       np.ones(1, np.float32)), "dense level has no arrays"),
    "wrong n:m count": (lambda: SparseStorage("2:4", (1, 8), "f32", [(None, None), (None, None),
                                                                    (None, np.array([0, 1, 2]))],
                                              np.ones(3, np.float32)), "stores exactly 2 per block"),
    "n:m coordinates unsorted": (lambda: SparseStorage("2:4", (1, 4), "f32", [(None, None), (None, None),
                                                                             (None, np.array([2, 0]))],
                                                       np.ones(2, np.float32)), "not ordered"),
    "n:m coordinate outside the block": (lambda: SparseStorage("2:4", (1, 4), "f32", [(None, None), (None, None),
                                                                                     (None, np.array([1, 4]))],
                                                               np.ones(2, np.float32)), "outside"),
    "too many non-zeros for 2:4": (lambda: SparseStorage.from_dense("2:4", np.ones((1, 4), np.float32)),
                                   "holds 4 non-zeros; 2:4 allows at most 2"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_storage_is_a_typed_error(case):
    make, message = MALFORMED[case]
    with pytest.raises(InvalidSparseStorage, match=message) as err:
        make()
    assert isinstance(err.value, ga.InvalidArguments) and err.value.status == ga.Status.invalid_arguments


def test_nonordered_level_accepts_unsorted_coordinates():
    st = _csr([0, 2, 2, 3], [3, 1, 0], enc="(i, j) -> (i : dense, j : compressed(nonordered))")
    assert st.to_dense()[0, 3] == 1.0 and st.to_dense()[0, 1] == 2.0


def test_tensor_holds_storage_and_checks_it():
    lt = ga.LogicalTensor(0, ga.DataType.f32, [8, 12], sparse_encoding="CSR")
    a = sparse_matrix("CSR")
    t = ga.Tensor(lt, ga.Engine(), a)
    assert type(t).__name__ == "SparseTensor" and isinstance(t, ga.Tensor)
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_array_equal(t.to_scipy().toarray(), a)
    t2 = ga.Tensor(lt, None, t.storage)
    assert t2.storage is t.storage
    import scipy.sparse as sp

    np.testing.assert_array_equal(ga.Tensor(lt, None, sp.coo_array(a)).numpy(), a)
    with pytest.raises(ga.InvalidArguments, match="storage has encoding"):
        ga.Tensor(lt, None, SparseStorage.from_dense("CSC", a))
    with pytest.raises(ga.InvalidShape):
        ga.Tensor(lt, None, a[:4])
    with pytest.raises(ga.InvalidArguments, match="outside"):
        ga.Tensor(lt, None, SparseStorage("CSR", (8, 12), "f32", [(None, None),
                                                                 (np.array([0, 1] + [1] * 7), np.array([12]))],
                                          np.ones(1, np.float32)))
    empty = ga.Tensor(lt)
    assert empty.storage.nse == 0 and not empty.numpy().any()


def test_dense_nan_counts_as_a_nonzero():
    a = np.zeros((2, 4), np.float32)
    a[1, 3] = np.nan
    st = SparseStorage.from_dense("CSR", a)
    assert st.nse == 1 and np.isnan(st.values[0])


# ------------------------------------------------ malformed scipy input (issue 33)
def _scipy(fmt, **arrays):
    """A 3x4 scipy matrix of ``fmt`` with some of its index arrays replaced
    (in place, as a user holding a malformed matrix would have it)."""
    import scipy.sparse as sp

    m = sp.coo_array(np.arange(1, 13, dtype=np.float32).reshape(3, 4) * (np.arange(12).reshape(3, 4) % 3 == 0))
    m = m.asformat(fmt)
    for name, value in arrays.items():
        setattr(m, name, np.asarray(value, getattr(m, name).dtype))
    return m


MALFORMED_SCIPY = [
    ("csr", {"indptr": [0, 2, 1, 4]}, "indptr = level 1 positions.*never decrease"),
    ("csr", {"indptr": [1, 2, 3, 4]}, "positions must start at 0"),
    ("csr", {"indptr": [0, 1, 2, 3]}, "positions end at 3 but there are 4 coordinates"),
    ("csr", {"indices": [0, 7, 2, 1]}, "coordinate 7 outside \\[0, 4\\)"),
    ("csr", {"indices": [0, -1, 2, 1]}, "indices = level 1 coordinates.*outside \\[0, 2\\^31-1\\]"),
    ("csc", {"indptr": [0, 2, 1, 3, 4]}, "never decrease"),
    ("csc", {"indices": [0, 3, 1, 2]}, "coordinate 3 outside \\[0, 3\\)"),
    ("coo", {"col": [0, 3, 9, 1]}, "coordinate 9 outside \\[0, 4\\)"),
    ("coo", {"row": [0, -2, 1, 2]}, "row = level 0 coordinates.*outside \\[0, 2\\^31-1\\]"),
    ("coo", {"row": [0, 0, 5, 2]}, "coordinate 5 outside \\[0, 3\\)"),
    ("bsr", {"indices": [0, 9, 2, 1]}, "column index values must be < 4"),
]


@pytest.mark.parametrize("fmt, arrays, fragment", MALFORMED_SCIPY,
                         ids=[f"{f}-{'-'.join(a)}-{i}" for i, (f, a, _) in enumerate(MALFORMED_SCIPY)])
def test_malformed_scipy_input_is_invalid_sparse_storage(fmt, arrays, fragment):
    """A decreasing indptr was stored as another matrix than scipy's own
    toarray(); an index outside the shape escaped as scipy's ValueError.  scipy
    arrays now pass SparseStorage's checks (issue 33)."""
    m = _scipy(fmt, **arrays)
    for encoding in ("CSR", "COO"):
        lt = ga.LogicalTensor(0, ga.DataType.f32, [3, 4], sparse_encoding=encoding)
        with pytest.raises(InvalidSparseStorage, match=f"scipy {fmt} matrix.*{fragment}") as err:
            ga.Tensor(lt, ga.Engine(), m)
        assert err.value.status.name == "invalid_arguments"


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "bsr", "dia", "lil", "dok"])
def test_scipy_input_with_duplicates_and_unsorted_indices_is_scipys_matrix(fmt):
    """What scipy itself allows (duplicates, summed; unsorted indices) is still
    taken, as the matrix scipy's toarray() gives."""
    import scipy.sparse as sp

    m = sp.csr_array((np.array([1, 2, 3, 4, 5], np.float32), np.array([3, 1, 1, 0, 2]),
                      np.array([0, 3, 3, 5])), shape=(3, 4))  # row 0: 4 at col 3, 2 + 3 at col 1
    assert not m.has_sorted_indices
    want = m.toarray()
    for encoding in ("CSR", "CSC", "COO"):
        lt = ga.LogicalTensor(0, ga.DataType.f32, [3, 4], sparse_encoding=encoding)
        np.testing.assert_array_equal(ga.Tensor(lt, ga.Engine(), m.asformat(fmt)).numpy(), want)

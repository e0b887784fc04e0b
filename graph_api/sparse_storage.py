"""Sparse storage: the levels of one sparse tensor as numpy arrays.

Per level (``graph_api.sparse_encoding``)::

    dense            no arrays: a parent's children are parent * size + c
    compressed       positions[nparents + 1] (int32), coordinates[positions[-1]] (int32)
    singleton        coordinates[nparents] (int32): one child per parent
    compressed(n:m)  coordinates[nparents * n] (uint8, inside the block of m): n children per parent

``values`` holds one value per node of the last level (blocks of a trailing
dense level hold their zeros).  Conversions go through *COO*: the
dimension coordinates ``[nse, rank]`` (int64) of every stored value plus the
values.  Building storage from COO sums duplicates when every level is unique,
pads n:m blocks with explicit zeros, and rejects blocks with more than n
non-zeros.  ``SparseStorage(...)`` validates what it is given and raises
:class:`InvalidSparseStorage` (a typed ``InvalidArguments``) before any kernel
sees it: positions not starting at 0 or not monotone, coordinates out of
range, duplicates where a level is unique, disorder where it is ordered,
wrong array lengths (n:m counts included).
"""
from __future__ import annotations

import math

import numpy as np

from . import dtypes
from .dtypes import DataType
from .errors import InvalidArguments
from .sparse_encoding import (COMPRESSED, DENSE, FLOORDIV, MOD, SINGLETON, STRUCTURED, SparseEncoding,
                              read)


class InvalidSparseStorage(InvalidArguments):
    """Malformed sparse storage arrays (status invalid_arguments)."""


INDEX = np.int32
_INDEX_MAX = np.iinfo(np.int32).max


def _index_array(a, what) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise InvalidSparseStorage(f"{what} must be a 1-D integer array, got {a.dtype} {a.shape}")
    if a.size and (a.min() < 0 or a.max() > _INDEX_MAX):
        raise InvalidSparseStorage(f"{what} holds a value outside [0, 2^31-1]")
    return np.ascontiguousarray(a, dtype=INDEX)


class LevelStorage:
    """``positions`` (compressed levels) and ``coordinates`` (compressed, singleton, n:m)."""

    __slots__ = ("positions", "coordinates")

    def __init__(self, positions=None, coordinates=None):
        self.positions = positions
        self.coordinates = coordinates

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.positions, self.coordinates) if a is not None)

    def __repr__(self) -> str:
        parts = [f"{n}={a.size}" for n, a in (("positions", self.positions), ("coordinates", self.coordinates))
                 if a is not None]
        return f"LevelStorage({', '.join(parts)})"


class SparseStorage:
    """The arrays of one sparse tensor (validated on construction).

    Args:
        encoding: a :class:`SparseEncoding` (or notation / preset name).
        shape: the logical (dimension) shape.
        dtype: the values' :class:`DataType`.
        levels: one :class:`LevelStorage` (or a ``(positions, coordinates)`` pair) per level.
        values: one value per leaf node, numpy dtype of ``dtype``.
    """

    def __init__(self, encoding, shape, dtype, levels, values, validate: bool = True):
        self.encoding: SparseEncoding = read(encoding)
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtypes.parse(dtype)
        self.encoding.check_shape(self.shape, "sparse storage")
        if len(levels) != len(self.encoding.levels):
            raise InvalidSparseStorage(f"sparse storage: {len(levels)} levels given, encoding "
                                       f"{self.encoding} has {len(self.encoding.levels)}")
        self.levels = [lv if isinstance(lv, LevelStorage) else LevelStorage(*lv) for lv in levels]
        self.values = np.asarray(values)
        self._cache: dict = {}  # kernel forms derived from these arrays (packed n:m indices, CSR, ...)
        if validate:
            self._validate()

    # ------------------------------------------------------------ queries
    @property
    def nse(self) -> int:
        """Number of stored entries (values, explicit zeros of blocks included)."""
        return int(self.values.size)

    def nbytes(self) -> int:
        return int(self.values.nbytes) + sum(lv.nbytes() for lv in self.levels)

    def dense_nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.values.itemsize

    def level_sizes(self) -> tuple[int, ...]:
        return self.encoding.level_sizes(self.shape)

    def __repr__(self) -> str:
        return (f"SparseStorage({self.encoding!r}, shape={list(self.shape)}, {self.dtype.name}, "
                f"nse={self.nse}, {self.nbytes()} bytes)")

    # ------------------------------------------------------------ validation
    def _fail(self, level: int, message: str):
        return InvalidSparseStorage(f"sparse storage {self.encoding!r} {list(self.shape)}: level {level} "
                                    f"({self.encoding.levels[level].format_text()}): {message}")

    def _validate(self) -> None:
        expected = dtypes.numpy_dtype(self.dtype)
        if self.values.dtype != expected or self.values.ndim != 1:
            raise InvalidSparseStorage(f"sparse storage: values must be 1-D {expected}, got "
                                       f"{self.values.dtype} {self.values.shape}")
        self._walk(check=True)

    def _walk(self, check: bool) -> np.ndarray | None:
        """Level coordinates ``[nse, nlevels]`` of every value, checking the arrays on the
        way when ``check``; a check-only walk stops before trailing dense levels (block
        interiors), which need no check, and returns None."""
        sizes = self.level_sizes()
        nparents = 1
        prefix = np.zeros((1, 0), np.int64)  # level coordinates of every node of the level above
        for i, (lv, st, size) in enumerate(zip(self.encoding.levels, self.levels, sizes)):
            fmt = lv.format
            if check and all(x.format == DENSE for x in self.encoding.levels[i:]):
                for j in range(i, len(self.levels)):
                    if self.levels[j].positions is not None or self.levels[j].coordinates is not None:
                        raise self._fail(j, "a dense level has no arrays")
                nparents *= int(np.prod(sizes[i:]))
                prefix = None
                break
            if fmt == DENSE:
                if st.positions is not None or st.coordinates is not None:
                    raise self._fail(i, "a dense level has no arrays")
                parent = np.repeat(np.arange(nparents), size)
                coord = np.tile(np.arange(size, dtype=np.int64), nparents)
            elif fmt == COMPRESSED:
                if st.positions is None or st.coordinates is None:
                    raise self._fail(i, "a compressed level needs positions and coordinates")
                pos = st.positions = _index_array(st.positions, f"level {i} positions")
                crd = st.coordinates = _index_array(st.coordinates, f"level {i} coordinates")
                if pos.size != nparents + 1:
                    raise self._fail(i, f"{pos.size} positions for {nparents} parents (need {nparents + 1})")
                if pos[0] != 0 or np.any(np.diff(pos) < 0):
                    raise self._fail(i, "positions must start at 0 and never decrease")
                if pos[-1] != crd.size:
                    raise self._fail(i, f"positions end at {pos[-1]} but there are {crd.size} coordinates")
                parent = np.repeat(np.arange(nparents), np.diff(pos))
                coord = crd.astype(np.int64)
            elif fmt == SINGLETON:
                if st.positions is not None or st.coordinates is None:
                    raise self._fail(i, "a singleton level has coordinates only")
                crd = st.coordinates = _index_array(st.coordinates, f"level {i} coordinates")
                if crd.size != nparents:
                    raise self._fail(i, f"{crd.size} coordinates for {nparents} parents (one each)")
                parent = np.arange(nparents)
                coord = crd.astype(np.int64)
            else:  # STRUCTURED n:m
                if st.positions is not None or st.coordinates is None:
                    raise self._fail(i, "an n:m level has coordinates only")
                crd = np.asarray(st.coordinates)
                if crd.ndim != 1 or crd.dtype.kind not in "iu":
                    raise self._fail(i, "coordinates must be a 1-D integer array")
                if crd.size != nparents * lv.n:
                    raise self._fail(i, f"{crd.size} coordinates for {nparents} blocks of {lv.m}: "
                                        f"{lv.n}:{lv.m} stores exactly {lv.n} per block")
                st.coordinates = crd = np.ascontiguousarray(crd, dtype=np.uint8)
                parent = np.repeat(np.arange(nparents), lv.n)
                coord = crd.astype(np.int64)
            if coord.size and (coord.min() < 0 or coord.max() >= size):
                bad = int(coord[(coord < 0) | (coord >= size)][0])
                raise self._fail(i, f"coordinate {bad} outside [0, {size})")
            nodes = np.concatenate([prefix[parent], coord[:, None]], axis=1)
            if fmt != DENSE and check:
                self._check_order(i, lv, nodes)
            prefix, nparents = nodes, nodes.shape[0]
        if self.values.size != nparents:
            raise InvalidSparseStorage(f"sparse storage {self.encoding!r}: {self.values.size} values for "
                                       f"{nparents} stored positions")
        return prefix

    def _check_order(self, i: int, lv, nodes: np.ndarray) -> None:
        """Ordered: within runs of nodes with the same parent coordinates, the level's
        coordinate never decreases.  Unique: no two nodes have the same coordinates."""
        if nodes.shape[0] < 2:
            return
        same_parent = np.all(nodes[1:, :-1] == nodes[:-1, :-1], axis=1)
        step = nodes[1:, -1] - nodes[:-1, -1]
        if lv.ordered and np.any(same_parent & (step < 0)):
            k = int(np.nonzero(same_parent & (step < 0))[0][0])
            raise self._fail(i, f"coordinates are not ordered: {int(nodes[k, -1])} then {int(nodes[k + 1, -1])}")
        if lv.unique:
            if lv.ordered and np.any(same_parent & (step == 0)):
                k = int(np.nonzero(same_parent & (step == 0))[0][0])
                raise self._fail(i, f"duplicate coordinate {int(nodes[k, -1])} in a unique level")
            if not lv.ordered:
                uniq = np.unique(nodes, axis=0)
                if uniq.shape[0] != nodes.shape[0]:
                    raise self._fail(i, "duplicate coordinates in a unique level")

    # ------------------------------------------------------------ to COO / dense
    def level_coordinates(self) -> np.ndarray:
        """``[nse, nlevels]`` level coordinates of every value."""
        return self._walk(check=False)

    def coo(self) -> tuple[np.ndarray, np.ndarray]:
        """(dimension coordinates ``[nse, rank]`` int64, values) in storage order."""
        lc = self.level_coordinates()
        coords = np.zeros((lc.shape[0], self.encoding.rank), np.int64)
        for k, lv in enumerate(self.encoding.levels):
            coords[:, lv.dim] += lc[:, k] * (lv.block if lv.op == FLOORDIV else 1)
        return coords, self.values

    def canonical(self) -> tuple[np.ndarray, np.ndarray]:
        """COO sorted row-major with duplicates summed (the cached form element-wise ops use)."""
        hit = self._cache.get("canonical")
        if hit is None:
            coords, values = self.coo()
            hit = self._cache["canonical"] = canonical_coo(self.shape, coords, values)
        return hit

    def to_dense(self) -> np.ndarray:
        coords, values = self.coo()
        out = np.zeros(self.shape, dtypes.numpy_dtype(self.dtype))
        if all(lv.unique for lv in self.encoding.levels):
            out[tuple(coords.T)] = values
        else:
            acc = np.zeros(self.shape, np.float64)
            np.add.at(acc, tuple(coords.T), values.astype(np.float64))
            out[...] = dtypes.convert(acc.astype(np.float32), self.dtype)
        return out

    def to_scipy(self, format: str = "csr"):
        """A ``scipy.sparse`` array (2-D) in ``format``; scipy is imported here only."""
        import scipy.sparse as sp

        if len(self.shape) != 2:
            raise InvalidArguments(f"to_scipy: scipy.sparse holds 2-D arrays, this tensor is {list(self.shape)}")
        coords, values = self.coo()
        return sp.coo_array((values, (coords[:, 0], coords[:, 1])), shape=self.shape).asformat(format)

    # ------------------------------------------------------------ constructors
    @classmethod
    def from_coo(cls, encoding, shape, dtype, coords, values) -> "SparseStorage":
        """Storage holding ``values`` at dimension ``coords`` ([nse, rank]); explicit zeros are kept."""
        return build(read(encoding), tuple(shape), dtypes.parse(dtype), np.asarray(coords, np.int64),
                     np.asarray(values))

    @classmethod
    def from_dense(cls, encoding, array, dtype=None) -> "SparseStorage":
        """The non-zeros of ``array`` (NaN counts as non-zero)."""
        array = np.asarray(array)
        dt = dtypes.parse(dtype) if dtype is not None else _dtype_of(array)
        coords = np.argwhere(array != 0)
        return build(read(encoding), array.shape, dt, coords, array[tuple(coords.T)])

    @classmethod
    def from_scipy(cls, encoding, matrix, dtype=None) -> "SparseStorage":
        """From any ``scipy.sparse`` matrix/array; its explicit entries are kept (duplicates summed).

        Its arrays are checked first (:func:`scipy_coo`): a malformed matrix is
        :class:`InvalidSparseStorage`, never another matrix or scipy's own error."""
        shape, coords, values = scipy_coo(matrix, dtype)
        dt = dtypes.parse(dtype) if dtype is not None else _dtype_of(values)
        return build(read(encoding), shape, dt, coords, values)


#: scipy's index arrays read as the levels of an encoding: csr/csc as (indptr,
#: indices) of a compressed level under a dense one, coo as (row, col) of a
#: compressed level and a singleton; nonunique and nonordered, as scipy allows
#: duplicates (summed) and unsorted indices
SCIPY_LAYOUTS = {
    "csr": "(i, j) -> (i : dense, j : compressed(nonunique, nonordered))",
    "csc": "(i, j) -> (j : dense, i : compressed(nonunique, nonordered))",
    "coo": "(i, j) -> (i : compressed(nonunique, nonordered), j : singleton(nonunique, nonordered))",
}
_SCIPY_ARRAYS = {"csr": "indptr = level 1 positions, indices = level 1 coordinates",
                 "csc": "indptr = level 1 positions, indices = level 1 coordinates",
                 "coo": "row = level 0 coordinates, col = level 1 coordinates"}


def scipy_coo(matrix, dtype=None) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
    """(shape, coordinates ``[nse, 2]``, values) of a ``scipy.sparse`` matrix, its
    arrays checked as :class:`SparseStorage` checks its own.

    csr, csc and coo arrays are read as storage of :data:`SCIPY_LAYOUTS` and
    validated there (an indptr that does not start at 0, decreases or does not
    end at the number of indices; an index outside the shape; arrays of unequal
    length).  Other formats (bsr, dia, lil, dok) pass scipy's own full format
    check where it has one and its conversion to COO; what either raises is
    InvalidSparseStorage, as are COO coordinates outside the shape.  Duplicates
    are summed, as scipy reads them.
    """
    fmt = getattr(matrix, "format", type(matrix).__name__)
    shape = tuple(int(d) for d in matrix.shape)
    if len(shape) != 2:
        raise InvalidSparseStorage(f"scipy {fmt} matrix: shape {list(shape)}; 2-D matrices only")
    if fmt in SCIPY_LAYOUTS:
        if fmt == "coo":
            row, col = np.asarray(matrix.row), np.asarray(matrix.col)
            levels = [(np.array([0, row.size]), row), (None, col)]
        else:
            levels = [(None, None), (np.asarray(matrix.indptr), np.asarray(matrix.indices))]
        data = np.asarray(matrix.data)
        dt = dtypes.parse(dtype) if dtype is not None else _dtype_of(data)
        values = dtypes.convert(data, dt) if data.dtype != dtypes.numpy_dtype(dt) else data
        try:
            layout = SparseStorage(SCIPY_LAYOUTS[fmt], shape, dt, levels, values)
        except InvalidSparseStorage as err:
            raise InvalidSparseStorage(f"scipy {fmt} matrix {list(shape)} ({_SCIPY_ARRAYS[fmt]}): "
                                       f"{err.message}") from None
        coords, values = canonical_coo(shape, *layout.coo())  # scipy's duplicates are summed
        return shape, coords, values
    try:
        if hasattr(matrix, "check_format"):
            matrix.check_format(full_check=True)
        coo = matrix.tocoo()
        coords = np.stack([np.asarray(coo.row), np.asarray(coo.col)], axis=1).astype(np.int64)
    except (ValueError, IndexError, TypeError, OverflowError) as err:
        raise InvalidSparseStorage(f"scipy {fmt} matrix {list(shape)}: {err}") from None
    if coords.size and (coords.min() < 0 or np.any(coords >= np.asarray(shape))):
        raise InvalidSparseStorage(f"scipy {fmt} matrix {list(shape)}: an index lies outside the shape")
    return (shape,) + canonical_coo(shape, coords, np.asarray(coo.data))


def prune(array: np.ndarray, encoding) -> np.ndarray:
    """A copy of dense ``array`` that ``encoding`` can hold: for n:m levels the n
    largest magnitudes of every block of m are kept (magnitude pruning); other
    encodings hold any array, so it is returned unchanged."""
    enc = read(encoding)
    out = np.array(array, copy=True)
    for lv in enc.levels:
        if lv.format != STRUCTURED:
            continue
        moved = np.moveaxis(out, lv.dim, -1)
        blocks = moved.reshape(moved.shape[:-1] + (-1, lv.m))
        place = np.argsort(np.argsort(-np.abs(blocks.astype(np.float32)), axis=-1, kind="stable"), axis=-1)
        blocks[place >= lv.n] = 0
        out = np.moveaxis(blocks.reshape(moved.shape), -1, lv.dim)
    return np.ascontiguousarray(out)


def _dtype_of(array) -> DataType:
    for dt in (DataType.f32, DataType.f16, DataType.bf16, DataType.s32, DataType.s8, DataType.u8):
        if np.dtype(dtypes.numpy_dtype(dt)) == array.dtype:
            return dt
    if array.dtype == np.float64:
        return DataType.f32
    raise InvalidArguments(f"sparse storage: no data type for numpy {array.dtype}; give dtype=")


def canonical_coo(shape, coords, values):
    """Row-major sorted, duplicates summed (in float64, rounded once to the values' dtype)."""
    if coords.shape[0] == 0:
        return coords.reshape(0, len(shape)), values[:0]
    lin = np.ravel_multi_index(tuple(coords.T), shape) if len(shape) else np.zeros(len(values), np.int64)
    order = np.argsort(lin, kind="stable")
    lin, values = lin[order], values[order]
    first = np.ones(lin.size, bool)
    first[1:] = lin[1:] != lin[:-1]
    if not first.all():
        starts = np.nonzero(first)[0]
        summed = np.add.reduceat(values.astype(np.float64), starts)
        values = summed.astype(np.float32).astype(values.dtype) if values.dtype != np.float64 else summed
        lin = lin[starts]
    coords = np.stack(np.unravel_index(lin, shape), axis=1).astype(np.int64) if len(shape) else coords[:1]
    return coords, values


def _level_coords(enc: SparseEncoding, coords: np.ndarray) -> np.ndarray:
    lc = np.empty((coords.shape[0], len(enc.levels)), np.int64)
    for k, lv in enumerate(enc.levels):
        d = coords[:, lv.dim]
        lc[:, k] = d // lv.block if lv.op == FLOORDIV else (d % lv.block if lv.op == MOD else d)
    return lc


def _in_level_order(lc: np.ndarray, values: np.ndarray, sizes) -> tuple[np.ndarray, np.ndarray]:
    """The entries sorted by level coordinates (level 0 first), stable.  One int64 key per
    entry (the level coordinates as digits of the level sizes) when it fits, and no sort at
    all when the keys already ascend: COO from a dense array or canonical_coo is in
    row-major order, which is level order for most encodings (np.lexsort over 8M entries
    of 2:4 took seconds)."""
    if not lc.shape[0]:
        return lc, values
    if sizes and math.prod(int(s) for s in sizes) < 2**62:
        key = np.ravel_multi_index(tuple(lc.T), tuple(int(s) for s in sizes))
        if np.all(key[1:] >= key[:-1]):
            return lc, values
        order = np.argsort(key, kind="stable")
    else:
        order = np.lexsort(lc.T[::-1])
    return lc[order], values[order]


def build(enc: SparseEncoding, shape, dtype: DataType, coords: np.ndarray, values: np.ndarray) -> SparseStorage:
    """Storage of ``enc`` from COO (see the module docstring)."""
    enc.check_shape(shape, "sparse storage")
    np_dtype = dtypes.numpy_dtype(dtype)
    values = dtypes.convert(np.asarray(values), dtype) if values.dtype != np_dtype else values
    coords = coords.reshape(-1, len(shape))
    if coords.size and (coords.min() < 0 or np.any(coords >= np.asarray(shape))):
        raise InvalidSparseStorage(f"sparse storage {enc!r} {list(shape)}: a coordinate lies outside the shape")
    if all(lv.unique for lv in enc.levels):
        coords, values = canonical_coo(shape, coords, values)  # duplicates summed
    lc = _level_coords(enc, coords)
    sizes = enc.level_sizes(shape)
    lc, values = _in_level_order(lc, values, sizes)
    parent = np.zeros(lc.shape[0], np.int64)  # node id of every entry at the level above
    nparents = 1
    levels = []
    for k, (lv, size) in enumerate(zip(enc.levels, sizes)):
        c = lc[:, k]
        if lv.format == DENSE:
            parent = parent * size + c
            nparents *= size
            levels.append(LevelStorage())
        elif lv.format == COMPRESSED:
            if lv.unique:
                new = np.ones(c.size, bool)
                new[1:] = (parent[1:] != parent[:-1]) | (c[1:] != c[:-1])
                node = np.cumsum(new) - 1
                owner, crd = parent[new], c[new]
            else:
                node, owner, crd = np.arange(c.size), parent, c
            pos = np.zeros(nparents + 1, np.int64)
            pos[1:] = np.cumsum(np.bincount(owner, minlength=nparents))
            levels.append(LevelStorage(_index_array(pos, "positions"), _index_array(crd, "coordinates")))
            parent, nparents = node, crd.size
        elif lv.format == SINGLETON:
            crd = np.zeros(nparents, np.int64)
            crd[parent] = c
            levels.append(LevelStorage(None, _index_array(crd, "coordinates")))
        else:  # n:m: exactly n slots per block, padded with explicit zeros
            counts = np.bincount(parent, minlength=nparents)
            if counts.size and counts.max() > lv.n:
                b = int(np.argmax(counts))
                raise InvalidSparseStorage(f"sparse storage {enc!r}: block {b} holds {int(counts[b])} "
                                           f"non-zeros; {lv.n}:{lv.m} allows at most {lv.n}")
            present = np.zeros((nparents, lv.m), bool)
            present[parent, c] = True
            block_values = np.zeros((nparents, lv.m), values.dtype)
            block_values[parent, c] = values
            free = np.cumsum(~present, axis=1) <= (lv.n - present.sum(axis=1))[:, None]
            keep = present | (~present & free)
            rows, cols = np.nonzero(keep)
            levels.append(LevelStorage(None, cols.astype(np.uint8)))
            values = block_values[rows, cols]
            parent = np.arange(values.size)
            nparents = values.size
            continue
    if enc.levels[-1].format != STRUCTURED:
        leaf = np.zeros(nparents, values.dtype)
        leaf[parent] = values
        values = leaf
    return SparseStorage(enc, shape, dtype, levels, values)

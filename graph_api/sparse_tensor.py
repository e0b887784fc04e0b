"""``SparseTensor``: what ``ga.Tensor(lt, ...)`` is when ``lt`` has a sparse encoding.

It holds a :class:`~graph_api.sparse_storage.SparseStorage` instead of a flat
buffer.  ``data`` may be that storage, a dense numpy array (its non-zeros are
stored), or a ``scipy.sparse`` matrix (its explicit entries are stored)::

    lt = ga.LogicalTensor(0, ga.DataType.f32, [64, 64], sparse_encoding="CSR")
    w = ga.Tensor(lt, eng, dense_array)        # or SparseStorage / scipy.sparse matrix
    w.storage.levels[1].positions, w.storage.values, w.to_scipy(), w.numpy()  # dense copy

Plans replace an output's storage (a sparse result's size is known only when
it is computed), so a sparse output tensor is never written in place; its
``memory()`` is a private token for the execute-time overlap checks.
"""
from __future__ import annotations

import numpy as np

from . import dtypes
from .engine import Engine
from .errors import InvalidArguments, InvalidDataType, InvalidShape
from .logical_tensor import LogicalTensor
from .sparse_storage import SparseStorage
from .tensor import Tensor


class SparseTensor(Tensor):
    """A logical tensor with a sparse encoding plus its storage (see the module docstring)."""

    def __init__(self, logical_tensor: LogicalTensor, engine: Engine | None = None, data=None,
                 offset: int | None = None):
        lt = logical_tensor
        if not lt.is_shape_known():
            raise InvalidArguments(f"tensor {lt!r}: shape must be known to hold data")
        if offset is not None:
            raise InvalidArguments(f"tensor {lt!r}: a sparse tensor takes no buffer offset")
        if engine is not None and not isinstance(engine, Engine):
            raise InvalidArguments(f"tensor {lt!r}: engine must be an Engine, got {type(engine).__name__}")
        self.lt, self.engine = lt, engine
        self.packed = False
        self._token = np.zeros(1, np.uint8)
        self.storage = self._storage_for(data)

    def _storage_for(self, data) -> SparseStorage:
        lt = self.lt
        if data is None:
            return SparseStorage.from_coo(lt.encoding, lt.shape, lt.dtype, np.zeros((0, len(lt.shape)), np.int64),
                                          np.zeros(0, dtypes.numpy_dtype(lt.dtype)))
        if isinstance(data, SparseStorage):
            if data.encoding != lt.encoding:
                raise InvalidArguments(f"tensor {lt!r}: storage has encoding {data.encoding}, "
                                       f"the logical tensor {lt.encoding}")
            if data.shape != tuple(lt.shape):
                raise InvalidShape(f"tensor {lt!r}: storage has shape {list(data.shape)}")
            if data.dtype != lt.dtype:
                raise InvalidDataType(f"tensor {lt!r}: storage holds {data.dtype.name} values")
            return data
        if hasattr(data, "tocoo") and hasattr(data, "nnz"):  # scipy.sparse, without importing scipy
            if tuple(data.shape) != tuple(lt.shape):
                raise InvalidShape(f"tensor {lt!r}: the scipy matrix has shape {data.shape}")
            return SparseStorage.from_scipy(lt.encoding, data, lt.dtype)
        array = np.asarray(data)
        if array.dtype.kind not in "biuf" and array.dtype != dtypes.numpy_dtype(lt.dtype):
            raise InvalidArguments(f"tensor {lt!r}: data is not numeric ({array.dtype})")
        if tuple(array.shape) != tuple(lt.shape):
            raise InvalidShape(f"tensor {lt!r}: data has shape {array.shape}, expected {lt.shape}")
        return SparseStorage.from_dense(lt.encoding, array, lt.dtype)

    # ------------------------------------------------------------ data
    def numpy(self) -> np.ndarray:
        """A dense copy of the values (zeros where nothing is stored)."""
        return self.storage.to_dense()

    def to_dense(self) -> np.ndarray:
        return self.storage.to_dense()

    def to_scipy(self, format: str = "csr"):
        return self.storage.to_scipy(format)

    def set_storage(self, storage: SparseStorage) -> None:
        self.storage = self._storage_for(storage)

    def write(self, values) -> None:
        """Replace the storage: a SparseStorage, or dense values (their non-zeros)."""
        if isinstance(values, SparseStorage):
            self.storage = self._storage_for(values)
            return
        values = np.asarray(values)
        if values.dtype != dtypes.numpy_dtype(self.lt.dtype):
            values = dtypes.convert(values, self.lt.dtype)
        self.storage = SparseStorage.from_dense(self.lt.encoding, np.broadcast_to(values, self.lt.shape),
                                                self.lt.dtype)

    # ------------------------------------------------------------ execute support
    def memory(self) -> np.ndarray:
        return self._token

    def is_view_of(self, array) -> bool:
        """Never: a dense array fed again is converted into new storage each time."""
        return False

    def is_direct(self) -> bool:
        return True

    def memory_overlaps_itself(self) -> bool:
        return False

    def staged(self, copy_values: bool) -> "SparseTensor":
        return self

    def get_data_handle(self) -> SparseStorage:
        return self.storage

    def set_data_handle(self, buffer, offset: int | None = None) -> None:
        if offset is not None:
            raise InvalidArguments(f"tensor {self.lt!r}: a sparse tensor takes no buffer offset")
        self.storage = self._storage_for(buffer)

    @property
    def buffer(self):
        raise InvalidArguments(f"tensor {self.lt!r} is sparse: it has storage levels, not a flat buffer")

    def __repr__(self) -> str:
        return f"Tensor({self.lt!r}, nse={self.storage.nse})"

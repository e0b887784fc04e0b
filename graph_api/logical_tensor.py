"""Logical tensors: id, data type, shape, strides, layout, property.

The constructor takes oneDNN's overloads positionally, told apart by the
types of the arguments after the dtype (as C++ overload resolution does)::

    LogicalTensor(id, dtype, layout_type)                        # rank unknown
    LogicalTensor(id, dtype, ndims, layout_type[, property])     # rank known, dims unknown
    LogicalTensor(id, dtype, dims, layout_type[, property])      # dense strides if strided
    LogicalTensor(id, dtype, dims, strides[, property])          # layout strided

and the keyword form ``LogicalTensor(id, dtype, shape=, strides=, layout=,
property=)`` (a ``layout`` given positionally after strides is still read as
the layout).

Immutable, as in oneDNN: to add information (a concrete shape at compile time)
make a new one with the same id (:meth:`LogicalTensor.with_shape`).  Unknown
rank is ``shape=None``; an unknown dim is ``-1``.  ``encoding`` holds a tensor
encoding and takes part in equality: the keyword ``sparse_encoding=`` (a
:class:`~graph_api.sparse_encoding.SparseEncoding`, its notation
``"(i, j) -> (i : dense, j : compressed)"`` or a preset name such as ``"CSR"``)
makes the tensor sparse (seed 003, ``docs/sparse.md``).
"""
from __future__ import annotations

import enum
import math
import numbers
from typing import Sequence

from . import dtypes
from .dtypes import DataType
from .enums import LayoutType, PropertyType, parse_enum
from .errors import InvalidArguments
from .sparse_encoding import read as read_encoding

MAX_NDIMS = 12
UNKNOWN_DIM = -1


#: oneDNN's DNNL_GRAPH_UNKNOWN_DIM; accepted as an unknown dim or stride as well as -1
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def _integer(tid: int, value, what: str) -> int:
    """``value`` as an int: ints, numpy ints and integral finite floats; else InvalidArguments."""
    if isinstance(value, bool):
        raise InvalidArguments(f"logical tensor {tid}: {what} {value!r} is not an integer")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    raise InvalidArguments(f"logical tensor {tid}: {what} {value!r} is not an integer")


def _sequence(tid: int, values, what: str) -> list:
    if isinstance(values, (str, bytes, dict)):
        raise InvalidArguments(f"logical tensor {tid}: {what} must be a sequence of ints, got {values!r}")
    try:
        return list(values)
    except TypeError:
        raise InvalidArguments(f"logical tensor {tid}: {what} must be a sequence of ints, got {values!r}") from None


def _read_shape(tid: int, shape):
    """Dims as ints; -1 (or INT64_MIN) is unknown, other negatives are refused."""
    if shape is None:
        return None
    dims = tuple(_integer(tid, d, "dim") for d in _sequence(tid, shape, "dims"))
    if len(dims) > MAX_NDIMS:
        raise InvalidArguments(f"logical tensor {tid}: {len(dims)} dims, at most {MAX_NDIMS}")
    bad = [d for d in dims if d < UNKNOWN_DIM and d != INT64_MIN]
    if bad:
        raise InvalidArguments(
            f"logical tensor {tid}: dim {bad[0]} in {list(dims)}; dims are >= 0, or -1 for unknown")
    dims = tuple(UNKNOWN_DIM if d < 0 else d for d in dims)
    known = [d for d in dims if d != UNKNOWN_DIM]
    if math.prod(known) > INT64_MAX:
        raise InvalidArguments(
            f"logical tensor {tid}: dims {list(dims)} hold more than 2^63-1 elements")
    return dims


def _read_strides(tid: int, shape, strides):
    """Strides as ints, or None when unknown (oneDNN writes a single
    INT64_MIN, or INT64_MIN/-1 entries); other negatives are refused."""
    if strides is None:
        return None
    strides = tuple(_integer(tid, s, "stride") for s in _sequence(tid, strides, "strides"))
    if all(s in (UNKNOWN_DIM, INT64_MIN) for s in strides):
        return None
    if any(s < 0 for s in strides):
        raise InvalidArguments(
            f"logical tensor {tid}: strides {list(strides)} have a negative entry; strides are >= 0")
    if shape is None:
        return None  # strides of a tensor of unknown rank carry no information
    if len(strides) != len(shape):
        raise InvalidArguments(f"logical tensor {tid}: {len(strides)} strides for shape {shape}")
    return strides


def _check_span(tid: int, dtype, shape, strides) -> None:
    """The bytes the strided layout spans must be addressable (int64)."""
    if shape is None or strides is None or UNKNOWN_DIM in shape or 0 in shape:
        return
    last = sum((d - 1) * s for d, s in zip(shape, strides))
    if (last + 1) * max(1, dtypes.info(dtype).bits // 8) > INT64_MAX:
        raise InvalidArguments(
            f"logical tensor {tid}: dims {list(shape)} with strides {list(strides)} span "
            f"more than 2^63-1 bytes")


_UNSET = object()


def _is_layout(value) -> bool:
    return isinstance(value, LayoutType) or (isinstance(value, str) and value in LayoutType.__members__)


def _is_property_only(value) -> bool:
    """A property type that cannot be read as a layout type (``'undef'`` is both)."""
    return isinstance(value, PropertyType) or (
        isinstance(value, str) and value in PropertyType.__members__ and value not in LayoutType.__members__)


def _ndims_shape(tid: int, ndims) -> tuple | None:
    """oneDNN's ``ndims`` argument: -1 unknown rank, else that many unknown dims."""
    ndims = int(ndims)
    if not -1 <= ndims <= MAX_NDIMS:
        raise InvalidArguments(f"logical tensor {tid}: ndims {ndims}; expected -1 (unknown) to {MAX_NDIMS}")
    return None if ndims == -1 else (UNKNOWN_DIM,) * ndims


def _overload(tid: int, shape, strides, layout, prop):
    """(shape, strides, layout, property) from whichever oneDNN overload was used.

    The third argument is a layout type (rank unknown), an int ``ndims`` or a
    dims sequence; the fourth a layout type or strides; a fifth after a layout
    type is the property; after strides it is the property when it can only be
    one (a PropertyType), else the layout (this package's keyword order).
    """
    if _is_layout(shape):  # (id, dtype, layout_type)
        if strides is not None or layout is not _UNSET:
            raise InvalidArguments(
                f"logical tensor {tid}: after a layout type as third argument only a property may follow, "
                f"got {strides!r}, {layout!r}")
        return None, None, shape, prop
    by_ndims = isinstance(shape, numbers.Integral) and not isinstance(shape, (bool, enum.Enum))
    if isinstance(shape, enum.Enum):
        raise InvalidArguments(
            f"logical tensor {tid}: third argument {shape!r} is neither ndims, dims nor a layout type")
    if by_ndims:
        shape = _ndims_shape(tid, shape)
    if _is_layout(strides):  # (id, dtype, ndims|dims, layout_type[, property])
        if layout is not _UNSET and prop is not _UNSET:
            raise InvalidArguments(
                f"logical tensor {tid}: after dims and a layout type only a property may follow, "
                f"got {layout!r} and {prop!r}")
        return shape, None, strides, prop if layout is _UNSET else layout
    if by_ndims:
        raise InvalidArguments(
            f"logical tensor {tid}: ndims must be followed by a layout type, got {strides!r}")
    if layout is not _UNSET and _is_property_only(layout):  # (id, dtype, dims, strides, property)
        if prop is not _UNSET:
            raise InvalidArguments(f"logical tensor {tid}: two property types given: {layout!r}, {prop!r}")
        return shape, strides, _UNSET, layout
    return shape, strides, layout, prop


def dense_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides; a 0 dim counts as 1, as oneDNN does."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


class LogicalTensor:
    """Metadata of one tensor of the graph (no data)."""

    __slots__ = ("id", "dtype", "shape", "strides", "layout", "property", "encoding")

    def __init__(
        self,
        id: int,
        dtype=DataType.f32,
        shape: Sequence[int] | None = None,
        strides: Sequence[int] | None = None,
        layout=_UNSET,
        property=_UNSET,
        encoding=None,
        *,
        sparse_encoding=None,
    ):
        if not isinstance(id, (int,)) or isinstance(id, bool) or id < 0:
            raise InvalidArguments(f"logical tensor id must be a non-negative int, got {id!r}")
        self.id = int(id)
        self.dtype = dtypes.parse(dtype)
        shape, strides, layout, property = _overload(self.id, shape, strides, layout, property)
        layout = LayoutType.strided if layout is _UNSET else layout
        property = PropertyType.variable if property is _UNSET else property
        self.layout = parse_enum(LayoutType, layout, "layout type")
        self.property = parse_enum(PropertyType, property, "property type")
        if sparse_encoding is not None:
            if encoding is not None and encoding != sparse_encoding:
                raise InvalidArguments(f"logical tensor {id}: both encoding and sparse_encoding given")
            encoding = sparse_encoding
        if encoding is not None:
            encoding = read_encoding(encoding)
        self.encoding = encoding
        shape = _read_shape(self.id, shape)
        self.shape = shape
        if encoding is not None:
            encoding.check_shape(shape, f"logical tensor {self.id}")
        strides = _read_strides(self.id, shape, strides)
        if strides is None and shape is not None and self.layout == LayoutType.strided \
                and UNKNOWN_DIM not in shape:
            strides = dense_strides(shape)
        self.strides = strides
        _check_span(self.id, self.dtype, shape, strides)
        if self.property == PropertyType.host_scalar:
            if shape not in (None, ()) or self.dtype not in (DataType.s32, DataType.f32, DataType.s64):
                raise InvalidArguments(
                    f"logical tensor {id}: a host_scalar must be 0-D s32/f32/s64, "
                    f"got {self.dtype.name} shape {shape}")
            self.shape = ()
            self.strides = ()

    # ------------------------------------------------------------ queries
    @property
    def ndims(self) -> int:
        return -1 if self.shape is None else len(self.shape)

    def get_id(self) -> int:
        return self.id

    def get_data_type(self) -> DataType:
        return self.dtype

    def get_dims(self) -> tuple[int, ...]:
        if self.shape is None:
            raise InvalidArguments(f"logical tensor {self.id}: rank is unknown")
        return self.shape

    def get_strides(self) -> tuple[int, ...]:
        if self.layout != LayoutType.strided or self.strides is None:
            raise InvalidArguments(f"logical tensor {self.id}: has no known strides")
        return self.strides

    def get_layout_type(self) -> LayoutType:
        return self.layout

    def get_property_type(self) -> PropertyType:
        return self.property

    def is_shape_known(self) -> bool:
        return self.shape is not None and UNKNOWN_DIM not in self.shape

    def nelems(self) -> int:
        if not self.is_shape_known():
            return -1
        return math.prod(self.shape)

    def size_in_bytes(self) -> int:
        """Memory size as oneDNN's ``get_mem_size``; 4-bit types count half a byte.

        Unknown shape or a non-strided layout gives -1 (oneDNN: ``(size_t)-1``).
        """
        if not self.is_shape_known() or self.layout in (LayoutType.undef, LayoutType.any):
            return -1
        if len(self.shape) == 0:
            return max(1, int(math.ceil(dtypes.element_bytes(self.dtype))))
        if 0 in self.shape:
            return 0
        strides = self.strides or dense_strides(self.shape)
        span = max(d * (1 if d == 1 else s) for d, s in zip(self.shape, strides))
        if dtypes.info(self.dtype).packed:
            return (span + 1) // 2
        return span * int(dtypes.element_bytes(self.dtype))

    get_mem_size = size_in_bytes

    def is_dense(self) -> bool:
        return self.strides is None or self.strides == dense_strides(self.shape)

    # ------------------------------------------------------------ derivation
    def with_shape(self, shape, strides=None, layout=None, dtype=None) -> "LogicalTensor":
        """A copy with a (more) concrete shape; strides default to dense."""
        return LogicalTensor(
            self.id, self.dtype if dtype is None else dtype, shape, strides,
            self.layout if layout is None else layout, self.property, self.encoding)

    @property
    def sparse_encoding(self):
        """The sparse encoding, or None for a dense tensor."""
        return self.encoding

    def is_sparse(self) -> bool:
        return self.encoding is not None

    def with_encoding(self, encoding) -> "LogicalTensor":
        """A copy with another (or no) sparse encoding."""
        return LogicalTensor(self.id, self.dtype, self.shape, self.strides, self.layout, self.property,
                             encoding)

    def key(self) -> tuple:
        return (self.id, self.dtype, self.shape, self.strides, self.layout, self.property,
                self.encoding)

    def is_equal(self, other: "LogicalTensor") -> bool:
        return self.key() == other.key()

    def __eq__(self, other) -> bool:
        return isinstance(other, LogicalTensor) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def __repr__(self) -> str:
        shape = "?" if self.shape is None else "x".join("?" if d < 0 else str(d) for d in self.shape)
        extra = ""
        if self.strides is not None and not self.is_dense():
            extra += f" strides={list(self.strides)}"
        if self.property not in (PropertyType.variable, PropertyType.undef):
            extra += f" {self.property.name}"
        if self.layout != LayoutType.strided:
            extra += f" layout={self.layout.name}"
        if self.encoding is not None:
            extra += f" sparse=<{self.encoding}>"
        return f"%{self.id}:{self.dtype.name}[{shape}]{extra}"


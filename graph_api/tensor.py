"""``Tensor``: a logical tensor plus memory.

Memory is one flat numpy buffer laid out by the logical tensor's strides:
elements of the logical dtype, or for s4/u4 packed bytes (element at strided
offset ``i`` in byte ``i // 2``, low nibble first).  ``numpy()`` gives the
logical array: a zero-copy strided view for byte-sized types, an unpacked copy
for 4-bit types.
"""
from __future__ import annotations

import numpy as np

from . import dtypes
from .engine import Engine
from .enums import LayoutType, PropertyType
from .errors import InvalidArguments, InvalidDataType, InvalidShape, OutOfMemory
from .logical_tensor import LogicalTensor, dense_strides


def _span(shape, strides) -> int:
    """Number of elements the strided layout spans (0 for empty tensors)."""
    if len(shape) == 0:
        return 1
    if 0 in shape:
        return 0
    return 1 + sum((d - 1) * s for d, s in zip(shape, strides))


def _strided_offsets(shape, strides) -> np.ndarray:
    """Linear element offset of every logical index, shaped like the tensor."""
    offsets = np.zeros(shape, dtype=np.int64)
    for axis, (d, s) in enumerate(zip(shape, strides)):
        index_shape = [1] * len(shape)
        index_shape[axis] = d
        offsets = offsets + (np.arange(d, dtype=np.int64) * s).reshape(index_shape)
    return offsets


class Tensor:
    """``dnnl::graph::tensor`` over a numpy buffer.

    Args:
        logical_tensor: with a concrete shape and strided (or any -> dense) layout.
        engine: the CPU engine.
        data: ``None`` allocates zeros; otherwise a numpy array of the logical
            dtype and shape (wrapped without copying when its layout matches the
            strides, copied otherwise), a flat buffer spanning the strided
            layout, or for s4/u4 an ``ml_dtypes.int4``/``uint4`` array or the
            packed ``uint8`` bytes.
    """

    def __init__(self, logical_tensor: LogicalTensor, engine: Engine | None = None, data=None):
        lt = logical_tensor
        if not isinstance(lt, LogicalTensor):
            raise InvalidArguments(f"Tensor needs a LogicalTensor, got {type(lt).__name__}")
        if not lt.is_shape_known():
            raise InvalidArguments(f"tensor {lt!r}: shape must be known to hold data")
        if lt.layout == LayoutType.opaque:
            raise InvalidArguments(f"tensor {lt!r}: opaque layouts are not used by this runtime")
        if lt.strides is None:
            lt = lt.with_shape(lt.shape, dense_strides(lt.shape), LayoutType.strided)
        self.lt = lt
        self.engine = engine
        self._info = dtypes.info(lt.dtype)
        if self._info.np_dtype is None:
            raise InvalidDataType(f"tensor {lt!r}: data type undef cannot hold data")
        self.packed = self._info.packed
        span = _span(lt.shape, lt.strides)
        self._span = span
        try:
            if self.packed:
                self.buffer = self._packed_buffer(data, span)
            else:
                self.buffer = self._element_buffer(data, span)
        except MemoryError:
            raise OutOfMemory(f"tensor {lt!r}: cannot allocate {lt.size_in_bytes()} bytes") from None

    # ------------------------------------------------------------ construction
    def _element_buffer(self, data, span: int) -> np.ndarray:
        lt, np_dtype = self.lt, self._info.np_dtype
        if data is None:
            return np.zeros(span, dtype=np_dtype)
        if not isinstance(data, np.ndarray):
            data = dtypes.convert(np.asarray(data), lt.dtype)
        if data.dtype != np_dtype:
            raise InvalidDataType(
                f"tensor {lt!r}: data has numpy dtype {data.dtype}, expected {np_dtype} "
                f"(convert with .astype first; graph_api never converts user data silently)")
        if data.ndim == 1 and data.shape[0] == span and (tuple(lt.shape) != data.shape):
            return data if data.flags.c_contiguous else data.copy()
        if tuple(data.shape) != tuple(lt.shape):
            raise InvalidShape(f"tensor {lt!r}: data has shape {data.shape}, expected {lt.shape}")
        itemsize = data.itemsize
        wanted = tuple(s * itemsize for s, d in zip(lt.strides, lt.shape))
        if data.size and data.strides == wanted and data.base is None and data.flags.c_contiguous:
            return data.reshape(-1)
        if lt.is_dense() and data.flags.c_contiguous:
            return data.reshape(-1)  # a view: the user's memory is the tensor's memory
        buffer = np.zeros(span, dtype=np_dtype)
        self._view_of(buffer)[...] = data
        return buffer

    def _packed_buffer(self, data, span: int) -> np.ndarray:
        nbytes = (span + 1) // 2
        if data is None:
            return np.zeros(nbytes, dtype=np.uint8)
        data = np.asarray(data)
        if data.dtype == np.uint8 and data.ndim == 1 and data.shape[0] == nbytes and \
                not (tuple(self.lt.shape) == data.shape and self.lt.dtype == dtypes.DataType.u4):
            return data
        if data.dtype != self._info.np_dtype:
            raise InvalidDataType(
                f"tensor {self.lt!r}: 4-bit data must be {self._info.np_dtype} values of shape "
                f"{self.lt.shape} or {nbytes} packed uint8 bytes; got {data.dtype} {data.shape}")
        if tuple(data.shape) != tuple(self.lt.shape):
            raise InvalidShape(f"tensor {self.lt!r}: data has shape {data.shape}, expected {self.lt.shape}")
        buffer = np.zeros(nbytes, dtype=np.uint8)
        self._pack_into(buffer, data)
        return buffer

    # ------------------------------------------------------------ views
    def _view_of(self, buffer: np.ndarray) -> np.ndarray:
        itemsize = buffer.itemsize
        # as_strided goes through __array_interface__, which cannot spell the
        # ml_dtypes types (bf16, f8): stride a same-size unsigned view instead.
        raw = buffer.view(f"u{itemsize}") if buffer.dtype.kind == "V" or buffer.dtype.char not in \
            np.typecodes["All"] else buffer
        # a dim of size 1 is never stepped along: its stride (any int64) is moot
        view = np.lib.stride_tricks.as_strided(
            raw, shape=self.lt.shape,
            strides=tuple(s * itemsize if d > 1 else 0 for s, d in zip(self.lt.strides, self.lt.shape)))
        return view if raw is buffer else view.view(buffer.dtype)

    def _pack_into(self, buffer: np.ndarray, values) -> None:
        nibbles = np.asarray(values).astype(np.int16) & 0xF
        if self.lt.is_dense():
            buffer[:] = dtypes.pack_int4(nibbles)
            return
        offsets = _strided_offsets(self.lt.shape, self.lt.strides).reshape(-1)
        flat = nibbles.reshape(-1).astype(np.uint8)
        byte, high = offsets // 2, (offsets % 2).astype(bool)
        buffer[byte[~high]] = (buffer[byte[~high]] & 0xF0) | flat[~high]
        buffer[byte[high]] = (buffer[byte[high]] & 0x0F) | (flat[high] << 4)

    def numpy(self) -> np.ndarray:
        """The logical array (a view for byte-sized types, a copy for s4/u4)."""
        if not self.packed:
            view = self.__dict__.get("_view")
            if view is None or view.base is None or self._view_buffer is not self.buffer:
                view = self._view = self._view_of(self.buffer)
                self._view_buffer = self.buffer
            return view
        signed = self.lt.dtype == dtypes.DataType.s4
        if self.lt.is_dense():
            flat = dtypes.unpack_int4(self.buffer, self.lt.nelems(), signed)
            return flat.reshape(self.lt.shape)
        all_values = dtypes.unpack_int4(self.buffer, self._span, signed)
        return all_values[_strided_offsets(self.lt.shape, self.lt.strides)]

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)

    def write(self, values) -> None:
        """Store ``values`` (already of this tensor's dtype, or convertible)."""
        values = np.asarray(values)
        if values.dtype != self._info.np_dtype:
            values = dtypes.convert(values, self.lt.dtype)
        if tuple(values.shape) != tuple(self.lt.shape):
            values = np.broadcast_to(values, self.lt.shape)
        if self.packed:
            self._pack_into(self.buffer, values)
        else:
            self.numpy()[...] = values

    # ------------------------------------------------------------ oneDNN API
    def get_logical_tensor(self) -> LogicalTensor:
        return self.lt

    def get_engine(self) -> Engine | None:
        return self.engine

    def get_data_handle(self) -> np.ndarray:
        """The flat buffer (packed bytes for s4/u4)."""
        return self.buffer

    def set_data_handle(self, buffer: np.ndarray) -> None:
        expected = self.buffer.shape
        if not isinstance(buffer, np.ndarray) or buffer.dtype != self.buffer.dtype or buffer.shape != expected:
            raise InvalidArguments(
                f"tensor {self.lt!r}: new handle must be a {self.buffer.dtype} array of shape {expected}")
        self.buffer = buffer

    def __repr__(self) -> str:
        return f"Tensor({self.lt!r})"


def make_scalar_tensor(logical_tensor: LogicalTensor, value) -> Tensor:
    """A host-scalar tensor (SDPA scale, causal-mask offsets, Dropout seed...)."""
    lt = logical_tensor
    if not isinstance(lt, LogicalTensor) or lt.property != PropertyType.host_scalar:
        raise InvalidArguments("make_scalar_tensor needs a logical tensor with property host_scalar")
    if value is None:
        raise InvalidArguments(f"host scalar {lt!r}: a value is required")
    return Tensor(lt, None, dtypes.convert(np.asarray(value).reshape(()), lt.dtype))

"""``Tensor``: a logical tensor plus memory.

Memory is one flat numpy buffer laid out by the logical tensor's strides:
elements of the logical dtype, or for s4/u4 packed bytes (element at strided
offset ``i`` in byte ``i // 2``, low nibble first).  ``numpy()`` gives the
logical array: a zero-copy strided view for byte-sized types, an unpacked copy
for 4-bit types.

What a handle may be (the constructor's ``data`` or ``set_data_handle``):

* a flat 1-D array of the strided span (packed bytes for s4/u4), or longer
  (oneDNN's handle is a pointer: the span is read from its start).  Any numpy
  stride is honoured: element ``i`` of the span is ``handle[i]``, so a
  ``[::2]`` or ``[::-1]`` handle is read and written exactly where it points;
* an array of the logical shape.  When its memory layout is the logical
  tensor's, the tensor is a view of it; otherwise the array is the tensor's
  *mirror*: reads and writes go to the user's array element by element, and
  the flat buffer is a private copy.

``Tensor(lt, engine, buffer, offset=k)`` is oneDNN's ``tensor(lt, eng, handle +
k)``: any 1-D buffer of the flat dtype whose elements ``k`` onwards cover the
strided span; the tensor is a zero-copy view of ``buffer[k:k + span]``.

Kernels only ever see *direct* tensors (a C-contiguous flat buffer that is the
tensor's memory); ``CompiledPartition.execute`` stages every other tensor
through :meth:`Tensor.staged` (inputs copied in, outputs stored back through
the user's strides) and checks outputs for read-only and overlapping memory
first.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from . import dtypes, memory
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


def self_overlapping(shape, strides, itemsize: int = 1) -> bool:
    """True when two logical indices may share memory (strides and
    ``itemsize`` in one unit: elements, or bytes for numpy strides).

    Exact for the layouts oneDNN describes (each dim's stride at least the
    extent of the dims inside it, in some order); an interleaving of dims that
    does not nest counts as overlapping.  Size-0/1 dims never overlap.
    """
    if 0 in shape:
        return False
    dims = sorted((abs(s), d) for d, s in zip(shape, strides) if d > 1)
    extent = itemsize
    for stride, d in dims:
        if stride < extent:
            return True
        extent = stride * (d - 1) + extent
    return False


def _step(flat: np.ndarray) -> int:
    """Bytes from one element of a 1-D buffer to the next (numpy reports any
    stride, even 0, for buffers of fewer than two elements)."""
    return flat.strides[0] if flat.ndim == 1 and flat.shape[0] > 1 else flat.itemsize


def _raw(array: np.ndarray) -> np.ndarray:
    """A same-size unsigned view for dtypes ``__array_interface__`` cannot
    spell (ml_dtypes' bf16, f8, int4), so that ``as_strided`` can stride it."""
    if array.dtype.kind == "V" or array.dtype.char not in np.typecodes["All"]:
        return array.view(f"u{array.itemsize}")
    return array


def _restride(array: np.ndarray, shape, byte_strides) -> np.ndarray:
    """``as_strided`` that keeps ``array``'s dtype and its read-only flag."""
    raw = _raw(array)
    view = np.lib.stride_tricks.as_strided(raw, shape=tuple(shape), strides=tuple(byte_strides))
    return view if raw is array else view.view(array.dtype)


class Tensor:
    """``dnnl::graph::tensor`` over a numpy buffer.

    Args:
        logical_tensor: with a concrete shape and strided (or any -> dense) layout.
        engine: the CPU engine.
        data: ``None`` allocates zeros; otherwise a numpy array of the logical
            dtype and shape (wrapped without copying when its layout matches the
            strides, mirrored otherwise), a flat buffer spanning the strided
            layout, or for s4/u4 an ``ml_dtypes.int4``/``uint4`` array or the
            packed ``uint8`` bytes.  See the module docstring.
        offset: with a 1-D ``data`` buffer, the element at which the tensor's
            memory starts (oneDNN's ``handle + offset``); for s4/u4 an even
            element offset (whole bytes).
    """

    def __new__(cls, logical_tensor=None, *args, **kwargs):
        # a logical tensor with a sparse encoding holds sparse storage (graph_api.sparse_tensor)
        if cls is Tensor and isinstance(logical_tensor, LogicalTensor) and logical_tensor.encoding is not None:
            from .sparse_tensor import SparseTensor

            return object.__new__(SparseTensor)
        return object.__new__(cls)

    def __init__(self, logical_tensor: LogicalTensor, engine: Engine | None = None, data=None,
                 offset: int | None = None):
        lt = logical_tensor
        if not isinstance(lt, LogicalTensor):
            raise InvalidArguments(f"Tensor needs a LogicalTensor, got {type(lt).__name__}")
        if not lt.is_shape_known():
            raise InvalidArguments(f"tensor {lt!r}: shape must be known to hold data")
        if lt.layout == LayoutType.opaque:
            raise InvalidArguments(f"tensor {lt!r}: opaque layouts are not used by this runtime")
        if engine is not None and not isinstance(engine, Engine):
            raise InvalidArguments(f"tensor {lt!r}: engine must be an Engine, got {type(engine).__name__}")
        if lt.strides is None:
            lt = lt.with_shape(lt.shape, dense_strides(lt.shape), LayoutType.strided)
        self.lt = lt
        self.engine = engine
        self._info = dtypes.info(lt.dtype)
        if self._info.np_dtype is None:
            raise InvalidDataType(f"tensor {lt!r}: data type undef cannot hold data")
        self.packed = self._info.packed
        self._dense = lt.is_dense()
        self._span = _span(lt.shape, lt.strides)
        if offset is not None:
            data = self._window(data, offset)
        self._attach(self._as_array(data) if data is not None else None)

    # ------------------------------------------------------------ construction
    @property
    def _flat_dtype(self) -> np.dtype:
        return np.dtype(np.uint8) if self.packed else self._info.np_dtype

    @property
    def _flat_size(self) -> int:
        return (self._span + 1) // 2 if self.packed else self._span

    def _zeros(self) -> np.ndarray:
        try:
            return np.zeros(self._flat_size, dtype=self._flat_dtype)
        except (MemoryError, ValueError):  # numpy says ValueError for sizes past its limit
            raise OutOfMemory(f"tensor {self.lt!r}: cannot allocate {self.lt.size_in_bytes()} bytes") from None

    def _window(self, buffer, offset) -> np.ndarray:
        """The zero-copy part of a 1-D ``buffer`` from element ``offset`` that holds the span."""
        lt = self.lt
        if isinstance(offset, bool) or not isinstance(offset, numbers.Integral) or offset < 0:
            raise InvalidArguments(f"tensor {lt!r}: offset must be an int >= 0, got {offset!r}")
        if not isinstance(buffer, np.ndarray) or buffer.ndim != 1:
            raise InvalidArguments(
                f"tensor {lt!r}: an offset needs a 1-D numpy buffer, got "
                f"{type(buffer).__name__ if not isinstance(buffer, np.ndarray) else f'{buffer.ndim}-D array'}")
        if buffer.dtype != self._flat_dtype:
            raise InvalidDataType(
                f"tensor {lt!r}: the buffer has numpy dtype {buffer.dtype}, expected {self._flat_dtype}")
        start = int(offset)
        if self.packed:
            if start % 2:
                raise InvalidArguments(
                    f"tensor {lt!r}: offset {start} splits a byte of packed {lt.dtype.name} data; "
                    f"use an even element offset")
            start //= 2
        needed = start + self._flat_size
        if buffer.shape[0] < needed:
            unit = "bytes" if self.packed else "elements"
            raise InvalidArguments(
                f"tensor {lt!r}: the buffer has {buffer.shape[0]} {unit}; from offset {offset} the strides "
                f"{list(lt.strides)} span {self._flat_size} {unit}, so it needs at least {needed}")
        return buffer[start:needed]

    def _as_array(self, data) -> np.ndarray:
        """User data as an array: numpy arrays as they are, anything else converted."""
        if isinstance(data, np.ndarray):
            return data
        try:
            array = np.asarray(data)
            if array.dtype.kind not in "biuf":
                raise TypeError(f"{array.dtype} values")
            return dtypes.convert(array, self.lt.dtype)
        except (TypeError, ValueError, OverflowError) as err:
            raise InvalidArguments(f"tensor {self.lt!r}: data is not numeric ({err})") from None

    def _attach(self, data) -> None:
        """Make ``data`` (None, a flat handle or a logical array) this tensor's
        memory; on an error the tensor keeps its previous memory."""
        buffer, mirror = self._memory_for(data)
        self.buffer, self._mirror = buffer, mirror
        self.__dict__.pop("_view", None)

    def _memory_for(self, data) -> tuple[np.ndarray, np.ndarray | None]:
        """(flat buffer, mirror) for ``data``; see the module docstring."""
        if data is None:
            return self._zeros(), None
        if self._is_flat_handle(data):
            return data, None
        if data.ndim == 1 and data.dtype == self._flat_dtype and data.shape[0] > self._flat_size \
                and tuple(data.shape) != tuple(self.lt.shape):
            # oneDNN's handle is a pointer: a longer 1-D buffer holds the span at its start
            return self._window(data, 0), None
        expected = self._info.np_dtype
        if data.dtype != expected:
            flat = f" or {self._flat_size} packed uint8 bytes" if self.packed else ""
            raise InvalidDataType(
                f"tensor {self.lt!r}: data has numpy dtype {data.dtype}, expected {expected}{flat} "
                f"(convert with .astype first; graph_api never converts user data silently)")
        if tuple(data.shape) != tuple(self.lt.shape):
            raise InvalidShape(
                f"tensor {self.lt!r}: data has shape {data.shape}, expected {self.lt.shape} "
                f"(or a flat buffer of the {self._flat_size} {self._flat_dtype} elements the strides span)")
        alias = None if self.packed else self._alias(data)
        if alias is not None:
            return alias, None
        buffer = self._zeros()
        self._store(buffer, data)
        return buffer, data

    def _is_flat_handle(self, data: np.ndarray) -> bool:
        """A 1-D array holding exactly the strided span (packed bytes for s4/u4)."""
        if data.ndim != 1 or data.shape[0] != self._flat_size or data.dtype != self._flat_dtype:
            return False
        # uint8 bytes are packed s4/u4 data (their values come as ml_dtypes int4/uint4);
        # for other types a 1-D array of the logical shape is read as the logical array
        return self.packed or tuple(self.lt.shape) != data.shape

    def _alias(self, data: np.ndarray):
        """A flat view of ``data``'s memory when its layout is the logical
        tensor's (same element strides on every dim of size > 1), else None."""
        itemsize = data.itemsize
        if self._span == 0:
            return np.zeros(0, data.dtype)
        if any(s % itemsize for s in data.strides):
            return None
        for d, s, want in zip(data.shape, data.strides, self.lt.strides):
            if d > 1 and s // itemsize != want:
                return None
        if self.lt.is_dense() and data.flags.c_contiguous:
            return data.reshape(-1)
        # strides >= 0 (logical tensors have no negative strides): the span
        # from element 0 lies inside data's allocation
        return _restride(data, (self._span,), (itemsize,))

    # ------------------------------------------------------------ views
    def _view_of(self, buffer: np.ndarray) -> np.ndarray:
        """The logical array over a flat buffer, whatever the buffer's own stride."""
        # a dim of size 1 is never stepped along: its stride (any int64) is moot
        return _restride(buffer, self.lt.shape,
                         [s * _step(buffer) if d > 1 else 0 for s, d in zip(self.lt.strides, self.lt.shape)])

    def _store(self, buffer: np.ndarray, values) -> None:
        """Write logical ``values`` into a flat buffer laid out by the strides.

        A self-overlapping layout (a broadcast view) keeps one value per
        address: values that differ where elements share memory would be lost,
        so they are refused."""
        overlapping = self_overlapping(self.lt.shape, self.lt.strides)
        if overlapping and self.packed:
            raise InvalidArguments(f"tensor {self.lt!r}: a self-overlapping layout of packed 4-bit data "
                                   f"is not supported")
        if not self.packed:
            view = self._view_of(buffer)
            view[...] = values
            if overlapping:
                want = np.ascontiguousarray(np.broadcast_to(np.asarray(values, view.dtype), view.shape))
                if np.ascontiguousarray(view).tobytes() != want.tobytes():
                    raise InvalidArguments(
                        f"tensor {self.lt!r}: a self-overlapping layout (shape {list(self.lt.shape)}, strides "
                        f"{list(self.lt.strides)}): the given values differ where its elements share memory")
            return
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
        """The logical array (a view for byte-sized types, a copy for s4/u4;
        the user's own array for a mirrored tensor)."""
        if self._mirror is not None:
            return self._mirror
        if not self.packed:
            view = self.__dict__.get("_view")
            if view is None or self._view_buffer is not self.buffer:
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
        """Store ``values`` (already of this tensor's dtype, or convertible)
        into the user's memory, through its strides."""
        if not self.memory().flags.writeable:
            raise InvalidArguments(f"tensor {self.lt!r}: its memory is read-only")
        values = np.asarray(values)
        if values.dtype != self._info.np_dtype:
            values = dtypes.convert(values, self.lt.dtype)
        if tuple(values.shape) != tuple(self.lt.shape):
            values = np.broadcast_to(values, self.lt.shape)
        if self._mirror is not None:
            self._mirror[...] = values
        elif not self.packed:
            self.numpy()[...] = values  # the cached strided view
        else:
            self._store(self.buffer, values)

    # ------------------------------------------------------------ execute support
    def memory(self) -> np.ndarray:
        """The user memory this tensor reads and writes (mirror or flat buffer)."""
        return self._mirror if self._mirror is not None else self.buffer

    def is_view_of(self, array: np.ndarray) -> bool:
        """True when this tensor reads and writes ``array``'s own memory, element
        for element (no mirror, no conversion, no self-overlapping layout)."""
        return (self._mirror is None and not self.packed and array.dtype == self.buffer.dtype
                and not self_overlapping(self.lt.shape, self.lt.strides)
                and self.numpy().__array_interface__["data"][0] == array.__array_interface__["data"][0]
                and self.numpy().shape == array.shape
                # a size-1 axis has no step: numpy gives it any stride, the view 0
                and all(a == b for n, a, b in zip(array.shape, self.numpy().strides, array.strides) if n > 1))

    def is_direct(self) -> bool:
        """True when the flat buffer is C-contiguous and is the tensor's memory."""
        return self._mirror is None and self.buffer.flags.c_contiguous

    def memory_overlaps_itself(self) -> bool:
        """True when two logical elements share memory (writing would lose data)."""
        if self._mirror is not None:
            m = self._mirror
            return self_overlapping(m.shape, m.strides, m.itemsize)
        if self._dense and self.buffer.flags.c_contiguous:
            return False
        step = _step(self.buffer)
        if self.packed:  # two nibbles per byte: the bytes must not overlap, nor the nibbles
            return self_overlapping((self._flat_size,), (step,)) or \
                self_overlapping(self.lt.shape, self.lt.strides)
        return self_overlapping(self.lt.shape, [s * step for s in self.lt.strides], self.buffer.itemsize)

    def staged(self, copy_values: bool) -> "Tensor":
        """A direct tensor of the same logical tensor over private memory,
        holding this tensor's values when ``copy_values`` (for inputs)."""
        memory.reserve(self._flat_size * self._flat_dtype.itemsize,
                       f"a staged copy of {'input' if copy_values else 'output'} tensor {self.lt.id}")
        stage = Tensor(self.lt, self.engine)
        memory.track(stage.buffer)
        if copy_values:
            stage._store(stage.buffer, self.numpy())
        return stage

    # ------------------------------------------------------------ oneDNN API
    def get_logical_tensor(self) -> LogicalTensor:
        return self.lt

    def get_engine(self) -> Engine | None:
        return self.engine

    def get_data_handle(self) -> np.ndarray:
        """The flat buffer (packed bytes for s4/u4) in the logical tensor's
        layout; for a mirrored tensor, a fresh copy of the user's array."""
        if self._mirror is not None:
            self._store(self.buffer, self._mirror)
        return self.buffer

    @staticmethod
    def make_scalar_tensor(logical_tensor: LogicalTensor, value) -> "Tensor":
        """``tensor::make_scalar_tensor``: see :func:`make_scalar_tensor`."""
        return make_scalar_tensor(logical_tensor, value)

    def set_data_handle(self, buffer: np.ndarray, offset: int | None = None) -> None:
        """Point the tensor at new memory: a flat buffer of the strided span, an
        array of the logical shape, or a 1-D buffer from element ``offset``
        (same rules as the constructor)."""
        if offset is not None:
            self._attach(self._window(buffer, offset))
            return
        if not isinstance(buffer, np.ndarray):
            raise InvalidArguments(
                f"tensor {self.lt!r}: a data handle must be a numpy array, got {type(buffer).__name__}")
        if buffer.ndim == 1 and buffer.dtype == self._flat_dtype and buffer.shape[0] != self._flat_size \
                and tuple(self.lt.shape) != buffer.shape:
            raise InvalidArguments(
                f"tensor {self.lt!r}: the handle has {buffer.shape[0]} elements; the strides "
                f"{list(self.lt.strides)} span {self._flat_size} {self._flat_dtype} elements")
        self._attach(buffer)

    def __repr__(self) -> str:
        return f"Tensor({self.lt!r})"


def _scalar_value(lt: LogicalTensor, value):
    """``value`` as one real number fit for ``lt``'s dtype, or InvalidArguments."""
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(()).item()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArguments(f"host scalar {lt!r}: the value must be one real number, got {value!r}")
    info = dtypes.info(lt.dtype)
    if info.kind == "int":
        if not (math.isfinite(value) and float(value).is_integer() and info.lowest <= value <= info.highest):
            raise InvalidArguments(
                f"host scalar {lt!r}: {value!r} is not a {lt.dtype.name} integer "
                f"(range [{int(info.lowest)}, {int(info.highest)}])")
        return int(value)
    return float(value)


def make_scalar_tensor(logical_tensor: LogicalTensor, value) -> Tensor:
    """A host-scalar tensor (SDPA scale, causal-mask offsets, Dropout seed...)."""
    lt = logical_tensor
    if not isinstance(lt, LogicalTensor) or lt.property != PropertyType.host_scalar:
        raise InvalidArguments("make_scalar_tensor needs a logical tensor with property host_scalar")
    if value is None:
        raise InvalidArguments(f"host scalar {lt!r}: a value is required")
    value = _scalar_value(lt, value)
    return Tensor(lt, None, np.asarray(value, dtype=dtypes.numpy_dtype(lt.dtype)).reshape(()))

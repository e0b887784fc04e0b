"""The one data-type table: oneDNN enum -> numpy/ml_dtypes dtype, bits, kind.

Also the value conversions every kernel shares: rounding to a storage type
with oneDNN's saturation rules, 4-bit packing, and the fpmath input roundings
(bf16, f16, tf32).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .errors import InvalidDataType


class DataType(enum.IntEnum):
    """``logical_tensor::data_type`` with oneDNN's C values."""

    undef = 0
    f16 = 1
    bf16 = 2
    f32 = 3
    s32 = 4
    s8 = 5
    u8 = 6
    f64 = 7
    boolean = 8
    f8_e5m2 = 9
    f8_e4m3 = 10
    s4 = 11
    u4 = 12
    s64 = 16


@dataclass(frozen=True)
class DTypeInfo:
    """numpy dtype of one element (unpacked for 4-bit types) and its traits."""

    np_dtype: np.dtype | None
    bits: int
    kind: str  # "float", "int", "bool" or "none"
    lowest: float = 0.0  # saturation range for integers and f8_e4m3
    highest: float = 0.0

    @property
    def packed(self) -> bool:
        return self.bits == 4


DTYPES: dict[DataType, DTypeInfo] = {
    DataType.undef: DTypeInfo(None, 0, "none"),
    DataType.f32: DTypeInfo(np.dtype(np.float32), 32, "float"),
    DataType.f16: DTypeInfo(np.dtype(np.float16), 16, "float", -65504.0, 65504.0),
    DataType.bf16: DTypeInfo(np.dtype(ml_dtypes.bfloat16), 16, "float"),
    DataType.f64: DTypeInfo(np.dtype(np.float64), 64, "float"),
    DataType.s32: DTypeInfo(np.dtype(np.int32), 32, "int", -(2**31), 2**31 - 1),
    DataType.s64: DTypeInfo(np.dtype(np.int64), 64, "int", -(2**63), 2**63 - 1),
    DataType.s8: DTypeInfo(np.dtype(np.int8), 8, "int", -128, 127),
    DataType.u8: DTypeInfo(np.dtype(np.uint8), 8, "int", 0, 255),
    DataType.s4: DTypeInfo(np.dtype(ml_dtypes.int4), 4, "int", -8, 7),
    DataType.u4: DTypeInfo(np.dtype(ml_dtypes.uint4), 4, "int", 0, 15),
    DataType.boolean: DTypeInfo(np.dtype(np.bool_), 8, "bool"),
    DataType.f8_e5m2: DTypeInfo(np.dtype(ml_dtypes.float8_e5m2), 8, "float"),
    DataType.f8_e4m3: DTypeInfo(np.dtype(ml_dtypes.float8_e4m3fn), 8, "float", -448.0, 448.0),
}

FLOAT_TYPES = frozenset(dt for dt, i in DTYPES.items() if i.kind == "float" and dt != DataType.f64)
INT_TYPES = frozenset(dt for dt, i in DTYPES.items() if i.kind == "int")
LOW_PRECISION_FLOATS = frozenset({DataType.bf16, DataType.f16, DataType.f8_e5m2, DataType.f8_e4m3})


def info(dt: DataType) -> DTypeInfo:
    return DTYPES[DataType(dt)]


def numpy_dtype(dt: DataType) -> np.dtype:
    """The numpy dtype holding one (unpacked) element of ``dt``."""
    np_dtype = DTYPES[DataType(dt)].np_dtype
    if np_dtype is None:
        raise InvalidDataType(f"data type {DataType(dt).name} has no storage")
    return np_dtype


def from_numpy(np_dtype) -> DataType:
    """Inverse of :func:`numpy_dtype` (float64 maps to f64)."""
    np_dtype = np.dtype(np_dtype)
    for dt, i in DTYPES.items():
        if i.np_dtype == np_dtype:
            return dt

    raise InvalidDataType(f"numpy dtype {np_dtype} has no graph_api data type")


def parse(name) -> DataType:
    """'f32' or DataType or int -> DataType; unknown names raise InvalidDataType."""
    if isinstance(name, DataType):
        return name
    try:
        return DataType[name] if isinstance(name, str) else DataType(name)
    except (KeyError, ValueError):
        names = ", ".join(d.name for d in DataType)
        raise InvalidDataType(f"unknown data type {name!r}; known: {names}") from None


def element_bytes(dt: DataType) -> float:
    """Bytes per element; 0.5 for the packed 4-bit types."""
    return DTYPES[DataType(dt)].bits / 8


def convert(values, dt: DataType) -> np.ndarray:
    """Round ``values`` to data type ``dt`` the way oneDNN stores results.

    Floats round to nearest even through f32 (oneDNN computes in f32, so going
    through f32 reproduces its double rounding exactly).  f8_e4m3 saturates to
    +-448 (ml_dtypes would give NaN); f16 and f8_e5m2 overflow to inf as IEEE
    does.  Integers round half to even and saturate.  Booleans are ``!= 0``.
    """
    dt = DataType(dt)
    i = DTYPES[dt]
    arr = np.asarray(values)
    if i.kind == "bool":
        return arr.astype(np.bool_) if arr.dtype != np.bool_ else arr.copy()
    if i.kind == "float":
        if dt in (DataType.f32, DataType.f64):
            return arr.astype(i.np_dtype)
        f32 = arr.astype(np.float32)
        if dt == DataType.f8_e4m3:
            f32 = np.clip(f32, i.lowest, i.highest)  # NaN passes through clip
        return f32.astype(i.np_dtype)
    # integers
    if arr.dtype.kind in "iub" and np.dtype(arr.dtype).itemsize <= 8 and arr.dtype.kind != "b":
        wide = arr.astype(np.int64)
        return np.clip(wide, i.lowest, i.highest).astype(i.np_dtype)
    f64 = np.asarray(arr, dtype=np.float64)
    f64 = np.rint(np.nan_to_num(f64, nan=0.0, posinf=i.highest, neginf=i.lowest))
    return np.clip(f64, i.lowest, i.highest).astype(i.np_dtype)


def to_f32(values) -> np.ndarray:
    """Any storage array (bf16, f8, int4, bool, ...) as float32."""
    arr = np.asarray(values)
    if arr.dtype == np.float32:
        return arr
    return arr.astype(np.float32)


# ---------------------------------------------------------------- 4-bit packing
def pack_int4(values) -> np.ndarray:
    """Pack a flat sequence of 4-bit values into bytes, low nibble first.

    Element ``i`` lives in byte ``i // 2``: the low nibble when ``i`` is even.
    Works for signed (two's complement nibble) and unsigned values.
    """
    flat = np.asarray(values).reshape(-1).astype(np.int16) & 0xF
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.int16)])
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def unpack_int4(packed, count: int, signed: bool) -> np.ndarray:
    """Inverse of :func:`pack_int4`: ``count`` values as int4/uint4 numpy."""
    b = np.asarray(packed, dtype=np.uint8).reshape(-1)
    nib = np.empty(b.size * 2, dtype=np.int8)
    nib[0::2] = b & 0xF
    nib[1::2] = b >> 4
    nib = nib[:count]
    if signed:  # two's complement nibble, in place: (n ^ 8) - 8
        nib ^= 8
        nib -= 8
        return nib.astype(ml_dtypes.int4)
    return nib.astype(ml_dtypes.uint4)


# ------------------------------------------------------------ fpmath roundings
def round_to_tf32(x) -> np.ndarray:
    """Round f32 values to tf32 (10 mantissa bits), nearest even; inf/NaN kept."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    bits = f.view(np.uint32)
    lsb = (bits >> 13) & 1
    rounded = ((bits.astype(np.uint64) + 0xFFF + lsb) & 0xFFFFE000).astype(np.uint32)
    finite = np.isfinite(f)
    out = np.where(finite, rounded, bits).view(np.float32)
    return out.reshape(np.shape(x))


def round_through(x, dt: DataType) -> np.ndarray:
    """f32 -> ``dt`` -> f32: what 'compute as dt' does to an f32 input."""
    dt = DataType(dt)
    if dt == DataType.f32:
        return np.asarray(x, dtype=np.float32)
    if dt == DataType.undef:  # tf32 has no storage type; see fpmath.py
        return round_to_tf32(x)
    return convert(np.asarray(x, dtype=np.float32), dt).astype(np.float32)

"""The process-wide constant tensor cache, as oneDNN's ``set_constant_tensor_cache_capacity``.

Fused plans prepare constant inputs once (repacked weights, f32 copies of
low-precision weights, packed int8 panels, folded convolution weights) and keep
the copy here.  One table for every partition of the process::

    key    = (owner, slot, source keys)
    owner  = the plan object that prepared it (id, dropped with the plan)
    slot   = which preparation ("weights", "packed", ...), as the plan names it
    source = (address, shape, strides, dtype) of each array the copy was built from

So two constant weights fed to one compiled partition (a compiled-partition cache
hit: same shapes, other buffers) never share prepared data, and two plans never
read each other's preparations.  An entry lives while its sources do: it holds
a weak reference to the memory owner of each source array and is dropped when
that owner is freed, before its address can be reused (a source whose owner
cannot be weakly referenced, e.g. ``bytes``, is held instead).

Capacity in bytes of prepared data, set in MB as oneDNN does; 0 disables the
cache (every execute prepares again; a bound ``CompiledGraph`` step keeps the
copy it was bound with).  Like oneDNN, a new entry that does not fit in what
is left is not cached, and setting the capacity flushes the table.  Unlike
oneDNN (default 0) the default is unlimited: the plans always kept their
prepared weights.  ``GRAPH_API_CONSTANT_TENSOR_CACHE_CAPACITY`` (or oneDNN's
``ONEDNN_GRAPH_CONSTANT_TENSOR_CACHE_CAPACITY``) = ``cpu:MB;gpu:MB`` sets it at
import (read in :mod:`graph_api.config`).
"""
from __future__ import annotations

import numbers
import threading
import weakref
from collections import OrderedDict

import numpy as np

from .config import settings
from .enums import EngineKind, parse_enum
from .errors import InvalidArguments

MB = 1 << 20
#: oneDNN's "enabled" capacity (size_t max): set_constant_tensor_cache(1)
UNLIMITED = (1 << 64) - 1


def _root(array: np.ndarray):
    """The object owning ``array``'s memory: the end of its chain of ``base`` objects
    (through numpy's stride-trick holders, which carry ``base`` too)."""
    obj = array
    for _ in range(64):
        base = getattr(obj, "base", None)
        if base is None:
            break
        obj = base
    return obj


def _nbytes(value, seen=None, depth: int = 0) -> int:
    """Bytes of the arrays a prepared value holds (tuples, lists, dicts, object arrays,
    plain objects' attributes), each array counted once."""
    seen = set() if seen is None else seen
    if depth > 8 or id(value) in seen:
        return 0
    seen.add(id(value))
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return sum(_nbytes(v, seen, depth + 1) for v in value.reshape(-1))
        root = _root(value)
        if root is not value and id(root) in seen:
            return 0
        return int(value.nbytes)
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v, seen, depth + 1) for v in value)
    if isinstance(value, dict):
        return sum(_nbytes(v, seen, depth + 1) for v in value.values())
    fields = getattr(value, "__dict__", None)
    if fields is not None:
        return sum(_nbytes(v, seen, depth + 1) for v in fields.values())
    slots = getattr(type(value), "__slots__", ())
    return sum(_nbytes(getattr(value, s, None), seen, depth + 1) for s in slots)


class _Entry:
    __slots__ = ("value", "nbytes", "refs")

    def __init__(self, value, nbytes, refs):
        self.value, self.nbytes, self.refs = value, nbytes, refs


class ConstantTensorCache:
    """A thread-safe table of prepared constant data (see the module docstring)."""

    def __init__(self, capacity_bytes: int = UNLIMITED):
        self._lock = threading.RLock()
        self._entries: OrderedDict = OrderedDict()
        self._capacity = capacity_bytes
        self._size = 0
        self._owners: dict[int, weakref.finalize] = {}
        self.hits = self.misses = 0

    # ------------------------------------------------------------------ use
    def get(self, owner, slot, sources, build):
        """The value prepared by ``build()`` from ``sources`` (numpy arrays or
        Tensors) for ``owner``'s ``slot``: cached, or built now (and cached if
        the cache is on and the value fits)."""
        if not _env_read:
            _read_env()
        arrays = [s.get_data_handle() if hasattr(s, "get_data_handle") else s for s in sources]
        key = (id(owner), slot) + tuple(_source_key(a, s) for a, s in zip(arrays, sources))
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return hit.value
            self.misses += 1
        value = build()
        if self._capacity == 0:
            return value
        # views of the sources (weights used as they are) are no prepared bytes
        nbytes = _nbytes(value, {id(x) for a in arrays for x in (a, _root(a))})
        with self._lock:
            if key in self._entries or self._size + nbytes > self._capacity:
                return value  # another thread cached it meanwhile, or it does not fit
            self._watch_owner(owner)
            refs = []
            for a in arrays:
                root = _root(a)
                try:
                    refs.append(weakref.ref(root, lambda _r, key=key: self._drop(key)))
                except TypeError:  # bytes, some buffer objects: hold the array itself
                    refs.append(a)
            self._entries[key] = _Entry(value, nbytes, refs)
            self._size += nbytes
        return value

    def _watch_owner(self, owner) -> None:
        token = id(owner)
        fin = self._owners.get(token)
        if fin is None or not fin.alive:
            self._owners[token] = weakref.finalize(owner, self._drop_owner, token)

    def _drop(self, key) -> None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._size -= entry.nbytes

    def _drop_owner(self, token: int) -> None:
        with self._lock:
            self._owners.pop(token, None)
            for key in [k for k in self._entries if k[0] == token]:
                self._drop(key)

    # ------------------------------------------------------------------ control
    def capacity(self) -> int:
        return self._capacity

    def set_capacity(self, nbytes: int) -> None:
        """New capacity in bytes; flushes every entry (oneDNN's rule)."""
        with self._lock:
            self._capacity = nbytes
            self.clear()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._size = 0

    def entries_of(self, owner) -> list:
        """(slot, value) of every entry ``owner`` prepared, oldest use first (for tests and tools)."""
        with self._lock:
            return [(k[1], e.value) for k, e in self._entries.items() if k[0] == id(owner)]

    def size(self) -> int:
        """Bytes of prepared data held now."""
        return self._size

    def __len__(self) -> int:
        return len(self._entries)


def _source_key(array, source) -> tuple:
    """What identifies a source's data: address, shape, strides and dtype of its
    buffer (and the logical dtype/shape of a Tensor)."""
    key = (array.__array_interface__["data"][0], array.shape, array.strides, array.dtype.str)
    lt = getattr(source, "lt", None)
    return key if lt is None else key + (lt.dtype, tuple(lt.shape))


_CAPACITY_MB: dict[EngineKind, int] = {}


def _engine_kind(kind, where: str) -> EngineKind:
    member = parse_enum(EngineKind, kind, f"{where}: engine kind")
    if member not in (EngineKind.cpu, EngineKind.gpu):
        raise InvalidArguments(f"{where}: engine kind must be cpu or gpu, got {member.name}")
    return member


def _mb(size, where: str) -> int:
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 0:
        raise InvalidArguments(f"{where}: expected a capacity in MB, an int >= 0 (0 disables), got {size!r}")
    return int(size)


def set_constant_tensor_cache_capacity(kind, size_mb: int) -> None:
    """Hold at most ``size_mb`` MB of prepared constants for engine ``kind`` (0: disabled).
    Flushes the cache.  Only the cpu cache exists; a gpu capacity is kept and reported."""
    where = "set_constant_tensor_cache_capacity"
    _read_env()
    member, mb = _engine_kind(kind, where), _mb(size_mb, where)
    _CAPACITY_MB[member] = mb
    if member == EngineKind.cpu:
        CACHE.set_capacity(min(mb * MB, UNLIMITED))


def get_constant_tensor_cache_capacity(kind) -> int:
    """The capacity for engine ``kind`` in MB (0: disabled)."""
    _read_env()
    member = _engine_kind(kind, "get_constant_tensor_cache_capacity")
    if member == EngineKind.cpu:
        return CACHE.capacity() // MB
    return _CAPACITY_MB.get(member, 0)


def set_constant_tensor_cache(flag: int) -> None:
    """oneDNN's deprecated switch: 0 disables (capacity 0), > 0 enables (unlimited)."""
    if isinstance(flag, bool) or not isinstance(flag, numbers.Integral) or flag < 0:
        raise InvalidArguments(f"set_constant_tensor_cache: expected an int >= 0 (0 disables), got {flag!r}")
    for kind in (EngineKind.cpu, EngineKind.gpu):
        set_constant_tensor_cache_capacity(kind, 0 if flag == 0 else UNLIMITED // MB)


def get_constant_tensor_cache() -> int:
    """1 when the cpu or gpu cache has a capacity, else 0 (oneDNN's deprecated getter)."""
    return int(any(get_constant_tensor_cache_capacity(k) for k in (EngineKind.cpu, EngineKind.gpu)))


CACHE = ConstantTensorCache()
_env_read = False


def parse_capacities(text: str, where: str = "GRAPH_API_CONSTANT_TENSOR_CACHE_CAPACITY") -> dict:
    """``'cpu:1024;gpu:0'`` -> {EngineKind.cpu: 1024, EngineKind.gpu: 0} (MB)."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        kind, _, size = item.partition(":")
        if kind.strip() not in ("cpu", "gpu") or not size.strip().isdigit():
            raise InvalidArguments(
                f"{where}={text!r}: expected engine_kind:MB pairs separated by ';' "
                f"(engine kinds cpu, gpu), e.g. 'cpu:1024'")
        out[EngineKind[kind.strip()]] = int(size)
    return out


def _read_env() -> None:
    """Apply the capacity variable once, at the cache's first use (a bad value raises there)."""
    global _env_read
    if _env_read:
        return
    capacities = parse_capacities(settings.constant_cache_text)
    _env_read = True
    for kind, mb in capacities.items():
        _CAPACITY_MB[kind] = mb
        if kind == EngineKind.cpu:
            CACHE.set_capacity(min(mb * MB, UNLIMITED))

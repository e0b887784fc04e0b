"""The process-wide compiled-partition cache, as oneDNN's
``set_compiled_partition_cache_capacity`` / ``get_compiled_partition_cache_capacity``.

One least-recently-used table for every partition of the process, keyed by
(partition, concrete input/output logical tensors, fpmath).  Capacity 0
disables caching: every ``compile`` builds a new plan.  All access holds one
lock, so partitions may compile from several threads.

The table is bounded by bytes as well: each entry counts what a compiled
partition may keep between executes (``held_bytes``: the prepared copies of its
constants, as the memory budget counts them), and the least recently used
entries go while the total passes the byte capacity; an entry larger than the
whole capacity is not kept.  Default: ``GRAPH_API_PARTITION_CACHE_BYTES`` (bytes,
suffixes ``K M G T``, or ``unlimited``), else half the memory budget (so the
kept partitions leave the other half for the work running); at run time
:func:`set_compiled_partition_cache_bytes` (None restores the default).
"""
from __future__ import annotations

import numbers
import os
import threading
from collections import OrderedDict

from .config import get_memory_budget, parse_budget
from .errors import InvalidArguments

#: the variable that sets the byte capacity (read at import)
BYTES_ENV = "GRAPH_API_PARTITION_CACHE_BYTES"
#: the default byte capacity, as a fraction of the memory budget
DEFAULT_BYTES_FRACTION = 0.5

#: oneDNN's default capacity (ONEDNN_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY)
DEFAULT_CAPACITY = 1024


class CompiledPartitionCache:
    """A thread-safe LRU table of compiled partitions."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, byte_capacity_text: str = ""):
        self._lock = threading.Lock()
        self._entries: OrderedDict = OrderedDict()
        self._capacity = capacity
        #: key -> bytes the entry counts; their sum
        self._sizes: dict = {}
        self._bytes = 0
        self._byte_capacity_text = byte_capacity_text
        #: bytes given to set_byte_capacity; None: the text, else the default
        self._byte_capacity_set = None

    def get(self, key):
        """The entry for ``key`` (now the most recently used), or None."""
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key, value) -> None:
        size = max(int(getattr(value, "held_bytes", 0)), 0)
        limit = self.byte_capacity()
        with self._lock:
            if self._capacity == 0 or (limit is not None and size > limit):
                return
            self._bytes += size - self._sizes.get(key, 0)
            self._sizes[key] = size
            self._entries[key] = value
            self._entries.move_to_end(key)
            self._evict(limit)

    def __len__(self) -> int:
        return len(self._entries)

    def held_bytes(self) -> int:
        """The bytes the kept entries count."""
        return self._bytes

    def byte_capacity(self) -> int | None:
        """The byte bound (None: unbounded)."""
        if self._byte_capacity_set is not None:
            return self._byte_capacity_set
        if self._byte_capacity_text.strip():
            return parse_budget(self._byte_capacity_text, BYTES_ENV)
        budget = get_memory_budget()
        return None if budget is None else int(budget * DEFAULT_BYTES_FRACTION)

    def set_byte_capacity(self, nbytes) -> None:
        if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral)
                                   or nbytes < 0):
            raise InvalidArguments(
                f"compiled partition cache bytes must be an int >= 0 or None (the default), got {nbytes!r}")
        self._byte_capacity_set = None if nbytes is None else int(nbytes)
        limit = self.byte_capacity()
        with self._lock:
            self._evict(limit)

    def entries_of(self, owner_key) -> dict:
        """The entries whose key starts with ``owner_key`` (one partition's)."""
        with self._lock:
            return {k[1:]: v for k, v in self._entries.items() if k[0] == owner_key}

    def capacity(self) -> int:
        return self._capacity

    def set_capacity(self, capacity) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral) or capacity < 0:
            raise InvalidArguments(
                f"compiled partition cache capacity must be an int >= 0 (0 disables caching), got {capacity!r}")
        limit = self.byte_capacity()
        with self._lock:
            self._capacity = int(capacity)
            self._evict(limit)

    def _evict(self, limit) -> None:
        while self._entries and (len(self._entries) > self._capacity or
                                 (limit is not None and self._bytes > limit)):
            key, _ = self._entries.popitem(last=False)
            self._bytes -= self._sizes.pop(key)


CACHE = CompiledPartitionCache(byte_capacity_text=os.environ.get(BYTES_ENV, ""))


def set_compiled_partition_cache_capacity(capacity: int) -> None:
    """Keep at most ``capacity`` compiled partitions (0: no caching); evicts at once."""
    CACHE.set_capacity(capacity)


def get_compiled_partition_cache_capacity() -> int:
    return CACHE.capacity()


def set_compiled_partition_cache_bytes(nbytes: int | None) -> None:
    """Keep compiled partitions holding at most ``nbytes`` in all (None: the default,
    ``GRAPH_API_PARTITION_CACHE_BYTES`` or half the memory budget); evicts at once."""
    CACHE.set_byte_capacity(nbytes)


def get_compiled_partition_cache_bytes() -> int | None:
    """The byte bound of the compiled-partition cache (None: unbounded)."""
    return CACHE.byte_capacity()

"""The process-wide compiled-partition cache, as oneDNN's
``set_compiled_partition_cache_capacity`` / ``get_compiled_partition_cache_capacity``.

One least-recently-used table for every partition of the process, keyed by
(partition, concrete input/output logical tensors, fpmath).  Capacity 0
disables caching: every ``compile`` builds a new plan.  All access holds one
lock, so partitions may compile from several threads.
"""
from __future__ import annotations

import numbers
import threading
from collections import OrderedDict

from .errors import InvalidArguments

#: oneDNN's default capacity (ONEDNN_GRAPH_COMPILED_PARTITION_CACHE_CAPACITY)
DEFAULT_CAPACITY = 1024


class CompiledPartitionCache:
    """A thread-safe LRU table of compiled partitions."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        self._lock = threading.Lock()
        self._entries: OrderedDict = OrderedDict()
        self._capacity = capacity

    def get(self, key):
        """The entry for ``key`` (now the most recently used), or None."""
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key, value) -> None:
        with self._lock:
            if self._capacity == 0:
                return
            self._entries[key] = value
            self._entries.move_to_end(key)
            self._evict()

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
        with self._lock:
            self._capacity = int(capacity)
            self._evict()

    def _evict(self) -> None:
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)


CACHE = CompiledPartitionCache()


def set_compiled_partition_cache_capacity(capacity: int) -> None:
    """Keep at most ``capacity`` compiled partitions (0: no caching); evicts at once."""
    CACHE.set_capacity(capacity)


def get_compiled_partition_cache_capacity() -> int:
    return CACHE.capacity()

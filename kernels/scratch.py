"""Scratch memory: where plans take the intermediate buffers of one execution.

A plan asks :func:`empty` for every intermediate it materialises while it runs
(a chain's f32 value before a reference tail, the tensors between the ops of a
per-op plan, a weight-compressed MatMul's f32 result).  Outside an arena that
is :func:`graph_api.working_memory.empty` (counted against the memory budget of the
partition running).  ``CompiledPartition.execute`` runs the plan inside
:func:`arena` over one byte buffer: the user's scratchpad tensor, or a buffer
the engine's allocator gives (oneDNN's scratchpad and ``allocator``), carved
in :data:`ALIGNMENT`-byte-aligned pieces.  At compile, one run inside a
:func:`counting` arena measures the bytes an execution takes: the size of the
scratchpad logical tensor.

The arena is per thread (``threading.local``), so concurrent executions of one
compiled partition never share intermediates.
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np

from graph_api import working_memory

#: every piece starts at a multiple of this many bytes (a cache line; AVX-512 loads)
ALIGNMENT = 64

_local = threading.local()


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


class Arena:
    """Hands out consecutive aligned pieces of ``memory`` (a 1-D uint8 array),
    or only counts the bytes asked for when ``memory`` is None."""

    def __init__(self, memory: np.ndarray | None):
        self.memory = memory
        # the first aligned address of the user's buffer: pieces are aligned in memory, not in index
        self.used = 0 if memory is None else (-memory.__array_interface__["data"][0]) % ALIGNMENT
        self.requested = 0
        self.overflowed = 0

    def take(self, nbytes: int) -> np.ndarray | None:
        """``nbytes`` of the arena, or None (counting, or the arena is used up)."""
        self.requested += _aligned(nbytes)
        if self.memory is None or self.used + nbytes > self.memory.size:
            self.overflowed += self.memory is not None
            return None
        piece = self.memory[self.used:self.used + nbytes]
        self.used += _aligned(nbytes)
        return piece


def bytes_needed(measured: int) -> int:
    """Scratchpad bytes for ``measured`` aligned bytes of pieces: room to align the start too."""
    return measured + ALIGNMENT if measured else 0


def empty(shape, dtype) -> np.ndarray:
    """An uninitialised array for an intermediate: from the current arena, else numpy."""
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    arena = getattr(_local, "arena", None)
    piece = None if arena is None else arena.take(int(np.prod(shape)) * dtype.itemsize)
    if piece is None:
        return working_memory.empty(shape, dtype, "an intermediate")
    return piece.view(dtype).reshape(shape)


@contextlib.contextmanager
def arena(memory: np.ndarray | None):
    """Run the body with its :func:`empty` calls served from ``memory`` (None: count only)."""
    previous = getattr(_local, "arena", None)
    current = _local.arena = Arena(memory)
    try:
        yield current
    finally:
        _local.arena = previous


def counting():
    """An arena that only measures: ``with counting() as a: ...; a.requested``."""
    return arena(None)

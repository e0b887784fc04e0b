"""Engine, stream and allocator: the CPU only; they exist to mirror oneDNN's calls."""
from __future__ import annotations

from typing import Callable

import numpy as np

from . import memory as budgeted
from .enums import EngineKind, parse_enum
from .errors import InvalidArguments, OutOfMemory


class Allocator:
    """``dnnl::graph::allocator``: the callbacks the runtime takes memory from.

    ``allocate(size, alignment)`` returns a writable buffer of at least
    ``size`` bytes (anything with the buffer protocol: a numpy array, a
    ``bytearray``, an ``mmap``) or None when it has none; ``free(buffer)`` gets
    that same object back once the runtime is done with it.  A compiled
    partition takes its scratchpad (the intermediates of one execution) from
    its engine's allocator at every ``execute`` that is given no scratchpad
    tensor.  ``Allocator()`` has no callbacks: numpy allocates.
    """

    def __init__(self, allocate: Callable | None = None, free: Callable | None = None):
        if (allocate is None) != (free is None) or \
                (allocate is not None and not (callable(allocate) and callable(free))):
            raise InvalidArguments("allocator needs two callables, allocate(size, alignment) and free(buffer), or neither")
        self.allocate, self.free = allocate, free

    def take(self, nbytes: int, alignment: int = 64) -> tuple[np.ndarray, object]:
        """(``nbytes`` of uint8 memory, the handle to give back) from the callbacks or numpy."""
        if self.allocate is None:  # counted against the memory budget of the partition running
            return budgeted.empty(nbytes, np.uint8, "the scratchpad"), None
        handle = self.allocate(nbytes, alignment)
        if handle is None:
            raise OutOfMemory(f"the engine's allocator returned None for {nbytes} bytes")
        try:
            memory = np.frombuffer(memoryview(handle).cast("B"), np.uint8)
        except (TypeError, ValueError) as err:
            self.free(handle)
            raise InvalidArguments(
                f"the engine's allocator returned {type(handle).__name__}, not a contiguous buffer: {err}") from None
        if memory.size < nbytes or not memory.flags.writeable:
            self.free(handle)
            raise InvalidArguments(
                f"the engine's allocator returned {memory.size} bytes"
                f"{'' if memory.flags.writeable else ' of read-only memory'}; {nbytes} writable were asked for")
        return memory[:nbytes], handle

    def give_back(self, handle) -> None:
        if self.free is not None and handle is not None:
            self.free(handle)


class Engine:
    """A CPU engine (``dnnl::engine``), optionally with a user :class:`Allocator`."""

    def __init__(self, kind=EngineKind.cpu, index: int = 0, allocator: Allocator | None = None):
        self.kind = parse_enum(EngineKind, kind, "engine kind")
        if self.kind != EngineKind.cpu:
            raise InvalidArguments(f"engine kind {self.kind.name} is not available; this runtime has cpu only")
        if index != 0:
            raise InvalidArguments(f"cpu engine index {index} does not exist; only 0")
        if allocator is not None and not isinstance(allocator, Allocator):
            raise InvalidArguments(f"engine allocator must be an Allocator, got {type(allocator).__name__}")
        self.index = index
        self.allocator = allocator

    def get_kind(self) -> EngineKind:
        return self.kind

    def get_allocator(self) -> Allocator | None:
        return self.allocator

    def __repr__(self) -> str:
        return f"Engine({self.kind.name}, {self.index})"


class Stream:
    """An in-order stream; execution is synchronous, so ``wait`` returns at once."""

    def __init__(self, engine: Engine):
        if not isinstance(engine, Engine):
            raise InvalidArguments(f"Stream needs an Engine, got {type(engine).__name__}")
        self.engine = engine

    def get_engine(self) -> Engine:
        return self.engine

    def wait(self) -> None:
        return None


def make_engine_with_allocator(kind, index: int, allocator: Allocator) -> Engine:
    """oneDNN's ``make_engine_with_allocator``: an engine whose runtime memory comes from ``allocator``."""
    if not isinstance(allocator, Allocator):
        raise InvalidArguments(f"make_engine_with_allocator needs an Allocator, got {type(allocator).__name__}")
    return Engine(kind, index, allocator)

"""Working memory a plan allocates while it compiles or runs, counted against the memory
budget (:mod:`graph_api.memory` explains the budget; this module is the part kernels
import, so it depends on nothing but the configuration and the errors: the kernels'
on-disk cache is keyed by the sources they import, see ``kernels/numba_setup.py``).

:func:`empty` inside a :class:`working` block checks each allocation against the budget
on top of the bytes already counted and the bytes the block still holds; running out,
by the budget or by the system, is :class:`OutOfMemory` naming the block's label and the
bytes.
"""
from __future__ import annotations

import math
import threading
import weakref

import numpy as np

from .config import MEMORY_BUDGET_ENV, get_memory_budget
from .errors import OutOfMemory


def _human(nbytes: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} B"


#: allocations smaller than this are checked but not tracked until freed (a
#: weakref finaliser costs ~1 us; they change no verdict)
_TRACK_FROM = 1 << 16

_local = threading.local()


class working:
    """The allocations of one compile or execute of ``label`` (a partition, a filled
    tensor): :func:`empty` in the body checks each against the budget on top of
    ``counted`` bytes (what the caller already checked: the partition's tensors)
    and of what the block still holds; a ``MemoryError`` escaping the body
    becomes :class:`OutOfMemory` naming ``label``.  Blocks nest (the inner one
    holds the label); ``peak`` is the most bytes the block held at once."""

    __slots__ = ("label", "counted", "held", "peak", "_previous")

    def __init__(self, label: str, counted: int = 0):
        self.label, self.counted, self.held, self.peak = label, counted, 0, 0

    def __enter__(self) -> "working":
        self._previous = getattr(_local, "work", None)
        _local.work = self
        return self

    def __exit__(self, kind, err, tb) -> bool:
        _local.work = self._previous
        if kind is not None and issubclass(kind, MemoryError) and not issubclass(kind, OutOfMemory):
            raise OutOfMemory(
                f"{self.label}: the system refused an allocation ({err or 'MemoryError'}) while "
                f"holding {self.counted + self.held:,} bytes ({_human(self.counted + self.held)}) of "
                f"tensors and working memory; lower the sizes or the memory budget "
                f"({MEMORY_BUDGET_ENV}) so that such work is refused before it starts") from err
        return False

    def _release(self, nbytes: int) -> None:
        self.held -= nbytes


def current_label() -> str | None:
    """The label of the innermost :class:`working` block of this thread, or None."""
    work = getattr(_local, "work", None)
    return None if work is None else work.label


def nbytes_of(shape, dtype) -> int:
    shape = shape if isinstance(shape, (tuple, list)) else (shape,)
    return math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize


def reserve(nbytes: int, what: str) -> None:
    """Raise :class:`OutOfMemory` when ``nbytes`` more would pass the budget in the
    current block (what ``empty`` checks, for memory another library allocates)."""
    budget = get_memory_budget()
    if budget is None:
        return
    work = getattr(_local, "work", None)
    held = 0 if work is None else work.counted + work.held
    if held + nbytes > budget:
        label = "an allocation outside any partition" if work is None else work.label
        raise OutOfMemory(
            f"{label}: {what} needs {nbytes:,} bytes ({_human(nbytes)}); with the {held:,} bytes "
            f"({_human(held)}) of tensors and working memory it holds, that passes the memory budget "
            f"of {budget:,} bytes ({_human(budget)}); raise it with {MEMORY_BUDGET_ENV} or "
            f"graph_api.set_memory_budget()")


def empty(shape, dtype, what: str) -> np.ndarray:
    """``np.empty(shape, dtype)`` counted against the budget (see :class:`working`):
    ``what`` says what the memory is for, in the error."""
    nbytes = nbytes_of(shape, dtype)
    reserve(nbytes, what)
    try:
        array = np.empty(shape, dtype)
    except (MemoryError, ValueError) as err:  # numpy says ValueError for sizes past its limit
        if isinstance(err, ValueError) and "array is too big" not in str(err) and "negative" not in str(err):
            raise
        label = current_label() or "an allocation outside any partition"
        raise OutOfMemory(f"{label}: {what}: the system refused {nbytes:,} bytes ({_human(nbytes)})") from None
    return track(array)


def track(array: np.ndarray) -> np.ndarray:
    """Count ``array``'s bytes as held by the current block until it is freed
    (for memory allocated elsewhere after a :func:`reserve`)."""
    work = getattr(_local, "work", None)
    if work is not None and array.nbytes >= _TRACK_FROM:
        work.held += array.nbytes
        work.peak = max(work.peak, work.held)
        weakref.finalize(array, work._release, array.nbytes)
    return array


def zeros(shape, dtype, what: str) -> np.ndarray:
    """:func:`empty`, zeroed."""
    array = empty(shape, dtype, what)
    array.fill(0)
    return array

"""Environment switches, read in one place.

``GRAPH_API_VERBOSE=1`` prints one line per partition compile/execute (pattern,
ops, kernel, fpmath, times), like ONEDNN_VERBOSE.  ``GRAPH_API_CHECK=1`` runs
every fused partition also through the unfused reference plan and raises on a
mismatch.  ``GRAPH_API_REFERENCE=1`` runs every partition on the reference
plan (ground truth; never the default).  All can be changed at run time through
:data:`settings`.

``GRAPH_API_MEMORY_BUDGET`` caps the bytes a partition (at compile) or a whole
graph (``run_graph``, the command line) may need for its tensors; see
:mod:`graph_api.memory`.  The value is a byte count with an optional binary
suffix (``K M G T``: powers of 1024), e.g. ``8G`` or ``1500000000``, or
``unlimited``.  Unset, the budget is :data:`DEFAULT_BUDGET_FRACTION` of the
memory this process may use (physical memory, or the cgroup limit when lower).
At run time: :func:`set_memory_budget` / :func:`get_memory_budget`.

``GRAPH_API_PROGRESS=0`` silences the one line printed (on stderr) the first
time a kernel family is compiled by Numba in a process, e.g. "compiling the
SDPA kernel (first run only, cached on disk)"; a cache hit prints nothing.

``GRAPH_API_COMPOSITE_REFERENCE=1`` makes every Composite op run its reference
decomposition (inlined at ``get_partitions``), never a fast kernel; it can be
changed at run time through :data:`settings`.

``GRAPH_API_CONSTANT_TENSOR_CACHE_CAPACITY`` (or oneDNN's
``ONEDNN_GRAPH_CONSTANT_TENSOR_CACHE_CAPACITY``) = ``cpu:MB;gpu:MB`` sets the
constant tensor cache's capacity (:mod:`graph_api.constant_cache`; unset:
unlimited).  ``GRAPH_API_DUMP`` (or oneDNN's ``ONEDNN_GRAPH_DUMP``) =
``graph,subgraph`` writes graphs and compiled partitions as oneDNN JSON files
into ``GRAPH_API_DUMP_DIR`` (default: the working directory); see
:mod:`graph_api.dump`.  ``GRAPH_API_DETERMINISTIC=1`` turns on deterministic
mode (docs/determinism.md).
"""
from __future__ import annotations

import functools
import os
import re
import sys
from dataclasses import dataclass

from .errors import InvalidArguments

MEMORY_BUDGET_ENV = "GRAPH_API_MEMORY_BUDGET"
#: three quarters of the memory we may use: the rest is for the interpreter,
#: numpy/Numba temporaries and whatever else the host process holds
DEFAULT_BUDGET_FRACTION = 0.75
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def _flag(name: str, default: str = "0") -> bool:
    return os.environ.get(name, default).strip().lower() not in ("", "0", "false", "no", "off")


def _either(name: str, onednn_name: str) -> str:
    """The project's variable, else oneDNN's spelling of it ("" when neither is set)."""
    return os.environ.get(name, os.environ.get(onednn_name, ""))


@dataclass
class Settings:
    verbose: bool = _flag("GRAPH_API_VERBOSE")
    check: bool = _flag("GRAPH_API_CHECK")
    #: GRAPH_API_MEMORY_BUDGET as read at import ("" = the default fraction)
    memory_budget_text: str = os.environ.get(MEMORY_BUDGET_ENV, "")
    #: bytes given to set_memory_budget; None = use memory_budget_text
    memory_budget_bytes: int | None = None
    #: inline every Composite op's decomposition, never its fast kernel (graph_api.composite)
    composite_reference: bool = _flag("GRAPH_API_COMPOSITE_REFERENCE")
    #: run every partition on the reference plan (GRAPH_API_REFERENCE)
    reference: bool = _flag("GRAPH_API_REFERENCE")
    #: say when a kernel compiles for the first time in this process (GRAPH_API_PROGRESS)
    progress: bool = _flag("GRAPH_API_PROGRESS", "1")
    #: GRAPH_API_CONSTANT_TENSOR_CACHE_CAPACITY as read at import ("" = unlimited; parsed
    #: by graph_api.constant_cache at first use, where a bad value raises)
    constant_cache_text: str = _either("GRAPH_API_CONSTANT_TENSOR_CACHE_CAPACITY",
                                       "ONEDNN_GRAPH_CONSTANT_TENSOR_CACHE_CAPACITY")
    #: GRAPH_API_DUMP as read at import ("graph", "subgraph", "graph,subgraph"; parsed by graph_api.dump)
    dump_text: str = _either("GRAPH_API_DUMP", "ONEDNN_GRAPH_DUMP")
    #: where dumps are written (GRAPH_API_DUMP_DIR; "" = the working directory)
    dump_dir: str = os.environ.get("GRAPH_API_DUMP_DIR", "")
    #: bit-reproducible results across runs and thread counts (GRAPH_API_DETERMINISTIC)
    deterministic: bool = _flag("GRAPH_API_DETERMINISTIC")


settings = Settings()


def log(message: str) -> None:
    """Write one verbose line (only when verbose is on)."""
    if settings.verbose:
        print(f"graph_api_verbose,{message}", file=sys.stderr, flush=True)


def progress(message: str) -> None:
    """Write one progress line for a wait the user would otherwise not understand."""
    if settings.progress or settings.verbose:
        print(f"graph_api: {message}", file=sys.stderr, flush=True)


# ====================================================================== memory budget
@functools.lru_cache(maxsize=1)
def usable_memory() -> int | None:
    """Bytes this process may use: physical memory, or a lower cgroup limit; None if unknown.
    Read once per process (every graph run's cache key holds the budget: reading the
    cgroup files each time cost ~1 ms a run)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = None
    for path in _CGROUP_LIMITS:
        try:
            text = open(path, encoding="ascii").read().strip()
        except OSError:
            continue
        if text.isdigit() and (total is None or int(text) < total):
            total = int(text)
    return total if total and total > 0 else None


def parse_budget(text: str, where: str = MEMORY_BUDGET_ENV) -> int | None:
    """``'8G'`` -> 8 * 2**30; ``'unlimited'`` -> None.  Anything else is InvalidArguments."""
    cleaned = text.strip().upper().removesuffix("B").removesuffix("I")
    if cleaned == "UNLIMITED":
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)", cleaned)
    if match is None or float(match.group(1)) * _SUFFIX[match.group(2)] < 1:
        raise InvalidArguments(
            f"{where}={text!r}: expected a positive byte count such as 1500000000, 512M or 8G "
            f"(K, M, G, T are powers of 1024), or 'unlimited'")
    return int(float(match.group(1)) * _SUFFIX[match.group(2)])


def get_memory_budget() -> int | None:
    """The memory budget in bytes (None: unlimited).

    Raises:
        InvalidArguments: ``GRAPH_API_MEMORY_BUDGET`` is set to something that
            is not a byte count.
    """
    if settings.memory_budget_bytes is not None:
        return settings.memory_budget_bytes
    if settings.memory_budget_text.strip():
        return parse_budget(settings.memory_budget_text)
    usable = usable_memory()
    return None if usable is None else int(usable * DEFAULT_BUDGET_FRACTION)


def set_memory_budget(nbytes: int | None) -> None:
    """Cap the bytes a partition or graph may need; ``None`` restores the default
    (``GRAPH_API_MEMORY_BUDGET`` or the fraction of memory)."""
    if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1):
        raise InvalidArguments(f"set_memory_budget: expected a positive int of bytes or None, got {nbytes!r}")
    settings.memory_budget_bytes = nbytes


# ====================================================================== deterministic mode
def set_deterministic(flag: bool) -> None:
    """Deterministic mode on or off (extension, after oneDNN's ``deterministic`` RFC:
    bit-identical results across runs and thread counts; docs/determinism.md).
    Plans compiled before the switch keep the work split they were bound with."""
    if not isinstance(flag, (bool, int)) or isinstance(flag, int) and not isinstance(flag, bool) and flag not in (0, 1):
        raise InvalidArguments(f"set_deterministic: expected True or False, got {flag!r}")
    settings.deterministic = bool(flag)


def get_deterministic() -> bool:
    """Whether deterministic mode is on (``GRAPH_API_DETERMINISTIC`` or :func:`set_deterministic`)."""
    return settings.deterministic

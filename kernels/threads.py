"""The one pool of Python threads the kernels run their own work on.

Numba's ``prange`` runs one parallel region at a time per calling thread and
joins every worker at its end; the kernels that need more (the weight-compressed
prefill's pipelined panels, the SDPA work items, whose counts and costs vary per
call) run a ``nogil`` Numba function on several Python threads instead.  Those
threads come from one ``ThreadPoolExecutor``, made on first use with
``NUMBA_NUM_THREADS - 1`` workers (the calling thread is the other one; the
executor starts a worker only when a task finds none idle).

* :func:`submit`: one task on a pool thread.
* :func:`run_items`: work items dealt round-robin to ``numba.get_num_threads()``
  threads (the SDPA prefill and backward).
* :func:`run_claimed`: threads that claim items one at a time through a shared
  counter (the compressed SDPA decode).
"""

from __future__ import annotations

import threading
import time

from graph_api.kernels.numba_setup import numba  # numba: configured first

import numpy as np

_pool = None
_pool_lock = threading.Lock()


def submit(fn, *args):
    """``fn(*args)`` on a pool thread; its future."""
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                from concurrent.futures import ThreadPoolExecutor
                _pool = ThreadPoolExecutor(max_workers=max(1, numba.config.NUMBA_NUM_THREADS - 1),
                                           thread_name_prefix="graph_api")
    return _pool.submit(fn, *args)


#: below this many multiply-adds a call runs on the calling thread only:
#: handing a share to a pool thread costs ~20-50 us, the work ~1 ns per 16 MACs
SMALL_WORK = 1 << 20
#: deterministic mode (docs/determinism.md): work that is split into parts whose
#: results are summed or whose GEMM shapes differ is split as for this many threads,
#: whatever the thread count, so the parts and their order depend on the shapes only
DETERMINISTIC_SPLIT = 8


def split_threads() -> int:
    """The thread count a kernel sizes its work split for: ``numba.get_num_threads()``,
    or :data:`DETERMINISTIC_SPLIT` in deterministic mode (``config.settings.deterministic``)."""
    from graph_api.config import settings

    return DETERMINISTIC_SPLIT if settings.deterministic else numba.get_num_threads()


def run_items(fn, nitems, *args, work=SMALL_WORK):
    """fn(ids, *args) for the work items [0, nitems), dealt round-robin to
    numba.get_num_threads() Python threads (``fn`` is ``nogil``; round-robin keeps
    the causal prefill's growing item costs balanced); the calling thread takes
    share 0.  ``work``: the call's multiply-adds (small calls stay on one thread)."""
    nth = min(numba.get_num_threads(), nitems) if work >= SMALL_WORK else 1
    if nth <= 1:
        fn(np.arange(nitems, dtype=np.int64), *args)
        return
    shares = [np.arange(i, nitems, nth, dtype=np.int64) for i in range(nth)]
    futs = [submit(fn, shares[i], *args) for i in range(1, nth)]
    fn(shares[0], *args)
    for f in futs:
        f.result()


def run_claimed(fn, nitems, *args, work=SMALL_WORK):
    """fn(ctr, *args) on numba.get_num_threads() Python threads that claim the work items
    [0, nitems) one at a time: ``ctr`` is int64 ``[next item, finished items, nitems]``,
    which ``fn`` advances atomically (``sdpa.decode._fetch_add(ctr, 0)`` to claim an item,
    ``_fetch_add(ctr, 1)`` after its stores).  The calling thread runs too and returns
    when every item is finished, without waiting for a pool thread that has not
    started: on a loaded machine a late thread no longer holds the call for a fixed
    share (2 cores shared with other jobs: the round-robin split of :func:`run_items`
    waited ~0.3-1 ms per call for a descheduled pool thread).  An exception in a pool
    thread that claimed an item is raised here."""
    nth = min(numba.get_num_threads(), nitems) if work >= SMALL_WORK else 1
    ctr = np.array([0, 0, nitems], np.int64)
    futs = [submit(fn, ctr, *args) for _ in range(1, nth)]
    fn(ctr, *args)
    while ctr[1] < nitems:  # items still running on pool threads (x86: ordered stores)
        for f in futs:
            if f.done() and f.exception() is not None:
                raise f.exception()
        time.sleep(0)

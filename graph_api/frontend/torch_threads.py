"""Thread policy: graph_api partitions at full speed in a process where PyTorch runs.

Two thread pools spin after every call unless told otherwise before they load,
and on few cores a spinning pool takes the cores from the next kernel:

* **GNU OpenMP (libgomp).**  PyTorch's CPU wheels bring their own libgomp.  When
  torch is imported first (the ``torch.compile`` case), Numba's OpenMP layer
  binds to that same library (one OpenMP runtime for both), which read
  ``OMP_WAIT_POLICY`` when torch loaded: unset, so its threads spin ~300,000
  pause instructions (milliseconds) after every parallel region, PyTorch's and
  graph_api's alike.  graph_api's own default (``OMP_WAIT_POLICY=PASSIVE``, set by
  ``kernels/numba_setup.py``) comes too late.  libgomp has no call to change its
  wait policy, but it already spins less on its own: when it manages more
  threads than there are CPUs it uses its *throttled* spin count (1,000 pauses,
  then a futex sleep).  :func:`apply` makes that true: a parked helper thread
  opens one parallel region of ``CPUs + 2`` threads in torch's libgomp; those
  threads stay docked in the runtime (asleep), so every later wait, in torch's
  regions and Numba's, is the short throttled one.
* **OpenBLAS** (numpy's; some graph_api MatMul plans call numpy's matmul).  Its
  workers spin ~0.1 s after each threaded GEMM unless ``OPENBLAS_THREAD_TIMEOUT``
  was set when numpy loaded (graph_api sets it when imported before numpy;
  torch imports numpy first).  OpenBLAS exports ``openblas_read_env``: :func:`apply`
  sets the variable (when the user has not), re-reads it and shuts the worker
  threads down, so the next threaded GEMM starts them with the short timeout
  (``4``: 2^4 units, OpenBLAS's minimum).

Measured (2 cores, a machine shared with other jobs, torch imported first, the
MiniLM encoder of ``samples/14`` at 8 x 11 tokens, medians of 8 alternating runs):
no policy 2162 ms alone / 2248 ms right after torch calls; this policy 102 / 79 ms
(best 64 / 65 ms); the environment set before torch loads (``OMP_WAIT_POLICY=PASSIVE``
and ``OPENBLAS_THREAD_TIMEOUT=4``, the ideal) 64 / 69 ms.  Later, on the idle machine:
no policy 340 / 330 ms, this policy 30.5 / 29.9 ms (medians of 12).  The cost: torch's
own threads now sleep between its parallel regions, so a loop of small torch ops pays
their wake-up: 20 x GELU(432x384 @ 384x384) took 10.9 ms without and 15 ms with the
policy on the idle machine (on the loaded one 498 -> 18 ms, the spinning hurt torch too).
``benchmarks/torch_frontend.py`` has the rows.  The backend option ``threads=None``
leaves both pools alone.
"""
from __future__ import annotations

import ctypes
import os
import threading

_lock = threading.Lock()
_applied: dict | None = None
_parked: list = []  # keeps the helper thread's callback alive


def _loaded(fragment: str) -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split()[-1] for line in f if fragment in line and "/" in line})
    except OSError:
        return []


def torch_libgomp() -> str | None:
    """The path of the libgomp that torch loaded (None: another OpenMP, or none)."""
    import torch

    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    for path in _loaded("libgomp"):
        if os.path.dirname(os.path.realpath(path)) == os.path.realpath(lib):
            return path
    return None


def throttle_gomp(path: str) -> int:
    """Dock CPUs + 2 idle threads in that libgomp so its waits use the throttled spin
    count; returns the number of threads docked (0 when already done or impossible)."""
    lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
    procs = lib.omp_get_num_procs()
    count = int(procs) + 2
    parallel = lib.GOMP_parallel
    parallel.restype = None
    parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    noop = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: None)
    started = threading.Event()

    def park():
        parallel(ctypes.cast(noop, ctypes.c_void_p), None, count, 0)  # the team's threads stay docked
        started.set()
        threading.Event().wait()  # this thread owns the pool: it must live on

    helper = threading.Thread(target=park, name="graph_api-gomp-park", daemon=True)
    helper.start()
    started.wait(10)
    _parked.append((noop, helper))
    return count


def openblas_timeout(value: str = "4") -> int | None:
    """Give numpy's OpenBLAS a short worker spin (``OPENBLAS_THREAD_TIMEOUT``) now;
    returns the timeout it reads afterwards (None: not found)."""
    import numpy  # noqa: F401  (numpy's OpenBLAS is the one graph_api's plans call)

    for path in _loaded("openblas"):
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
        except OSError:
            continue
        read_env = getattr(lib, "openblas_read_env", None)
        timeout = getattr(lib, "openblas_thread_timeout", None)
        shutdown = getattr(lib, "blas_thread_shutdown_", None)
        if read_env is None or timeout is None or shutdown is None:
            continue
        timeout.restype = ctypes.c_int
        before = timeout()
        os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", value)
        read_env()
        after = timeout()
        if after != before:
            shutdown()  # the next threaded GEMM starts the workers with the new timeout
        return after
    return None


def apply() -> dict:
    """Apply the policy once per process; returns what was done."""
    global _applied
    if _applied is not None:
        return _applied
    with _lock:
        if _applied is not None:
            return _applied
        done: dict = {}
        path = torch_libgomp()
        try:
            done["gomp_docked_threads"] = throttle_gomp(path) if path else 0
        except (OSError, AttributeError) as err:
            done["gomp_error"] = str(err)
        try:
            done["openblas_timeout"] = openblas_timeout()
        except (OSError, AttributeError) as err:
            done["openblas_error"] = str(err)
        _applied = done
        return done

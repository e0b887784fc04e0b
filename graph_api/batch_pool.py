"""Batch cases on many processes: ``graph-api run --batch FILE --workers N | --scheduler ADDRESS``.

One driver, :func:`run_batch_on`, hands every case of a batch file to a
:class:`concurrent.futures.Executor` as ``work(case, root, max_elements)`` and
prints the outcomes in the batch's order as they arrive, so the per-case lines
and the summary equal the serial run's (:func:`graph_api.batch.run_batch`).
Two executors serve it:

* :class:`ProcessPool` (``--workers N``, the command line's default with one
  worker per core): N ``spawn``-ed processes that live for the whole batch, so
  each keeps its kernels warm.  Each worker gets ``cores // N`` (at least 1)
  Numba, OpenMP and OpenBLAS threads unless the environment already says.  A
  worker that dies (segfault, ``os._exit``, killed) fails the future of the case
  it was running with :class:`WorkerCrashed` and is replaced; the other cases go on.
* a Dask ``distributed.Client(ADDRESS).get_executor()`` (``--scheduler``): the
  same per-case function on an existing cluster (the optional extra
  ``pip install 'graph_api[dask]'``).  The workers read the case files from the
  same inputs root path, so it must be on a shared filesystem.  A case that kills
  its Dask worker ends as the scheduler's ``KilledWorker``, reported as failed.

``work`` turns the process's compiled-partition cache off (no later case can
hit a case's partitions, see ``run_batch``), and it is where the test hook
``GRAPH_API_TEST_CRASH_CASE`` is read: a case whose path ends with its value
makes the worker ``os._exit`` (the crash tests; never set it otherwise).
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import multiprocessing
import os
import queue
import signal
import threading
from multiprocessing.connection import wait
from pathlib import Path

from .batch import MAX_ELEMENTS, Outcome, collect, expand, find_root, missing, run_case
from .errors import ExecutionError, Unimplemented
from .partition_cache import set_compiled_partition_cache_capacity

#: the test hook read by :func:`work`
CRASH_TEST_ENV = "GRAPH_API_TEST_CRASH_CASE"
#: the exit code of the hook's deliberate crash
CRASH_TEST_EXIT = 70
#: the thread counts a local worker gets (cores // workers), unless set already
THREAD_ENV = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")
#: seconds a Dask client waits to reach the scheduler
CONNECT_TIMEOUT = 30


class WorkerCrashed(ExecutionError):
    """A worker process died while it ran a case."""


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def work(case, root: str, max_elements: int = MAX_ELEMENTS) -> Outcome:
    """Run one case in a worker (local or Dask): the one per-case function."""
    crash = os.environ.get(CRASH_TEST_ENV)
    if crash and case.path.endswith(crash):
        os._exit(CRASH_TEST_EXIT)  # the test hook: die as a segfault would
    set_compiled_partition_cache_capacity(0)
    return run_case(case, Path(root), max_elements)


# ====================================================================== the driver
def run_batch_parallel(batch_file, root=None, max_elements: int = MAX_ELEMENTS, echo=print,
                       workers: int | None = None, scheduler: str | None = None):
    """Every case of ``batch_file`` on ``workers`` local processes (default one
    per core) or on the Dask cluster at ``scheduler``; same lines and
    :class:`~graph_api.batch.Summary` as the serial ``run_batch``.  A batch
    file that cannot be read raises before any process starts."""
    root = Path(root) if root is not None else find_root(batch_file)
    cases = list(expand(batch_file, root))
    present = sum(missing(case, root) is None for case in cases)
    with _executor(workers, scheduler, present) as executor:
        return run_batch_on(executor, cases, root, max_elements, echo)


def run_batch_on(executor, cases, root, max_elements: int = MAX_ELEMENTS, echo=print):
    """``cases`` through ``executor.submit(work, ...)``; outcomes echoed in order."""
    absolute = str(Path(root).resolve())  # as the workers see it (a Dask worker's own folder differs)
    # a case whose file is absent is reported here, as the serial run words it
    settled = [missing(case, root) for case in cases]
    futures = [None if done else executor.submit(work, case, absolute, max_elements)
               for case, done in zip(cases, settled)]
    try:
        return collect((done or _outcome(case, future)
                        for case, done, future in zip(cases, settled, futures)), echo)
    finally:
        for future in filter(None, futures):  # an interrupted batch runs no more cases
            future.cancel()


def _outcome(case, future) -> Outcome:
    try:
        return future.result()
    except WorkerCrashed as err:
        return Outcome(case, "failed", err.message)
    except Exception as err:  # noqa: BLE001 - the cluster lost the task (Dask's KilledWorker)
        return Outcome(case, "failed", f"the case's worker was lost: {type(err).__name__}: {err}")


@contextlib.contextmanager
def _executor(workers, scheduler, n_cases):
    if scheduler is None:
        pool = ProcessPool(max(1, min(workers or cores(), n_cases)))
        try:
            yield pool
        finally:
            pool.shutdown(cancel_futures=True)
        return
    try:
        from distributed import Client
    except ImportError as err:
        raise Unimplemented(f"--scheduler {scheduler} needs dask.distributed, which is not "
                            f"installed: pip install 'graph_api[dask]'") from err
    with Client(scheduler, timeout=CONNECT_TIMEOUT) as client:
        yield client.get_executor(pure=False)


# ====================================================================== local processes
class ProcessPool(concurrent.futures.Executor):
    """``workers`` spawned processes that each run one task at a time and live
    until :meth:`shutdown`; a worker that dies fails its task's future with
    :class:`WorkerCrashed` and a new worker takes its place."""

    def __init__(self, workers: int, threads: int | None = None):
        threads = threads or max(1, cores() // workers)
        self._env = {name: str(threads) for name in THREAD_ENV if name not in os.environ}
        self._context = multiprocessing.get_context("spawn")
        self._tasks = queue.SimpleQueue()  # (future, fn, args, kwargs), or ("finish",) / ("cancel",)
        self._pending = collections.deque()  # submitted, not yet sent to a worker
        self._wake_read, self._wake_write = self._context.Pipe(duplex=False)
        self._workers = [self._start() for _ in range(workers)]
        self._closed = False
        self._dispatcher = threading.Thread(target=self._dispatch, name="batch-pool", daemon=True)
        self._dispatcher.start()

    def submit(self, fn, /, *args, **kwargs):
        if self._closed:
            raise RuntimeError("cannot submit to a ProcessPool after shutdown")
        future = concurrent.futures.Future()
        self._tasks.put((future, fn, args, kwargs))
        self._wake_write.send_bytes(b"")
        return future

    def shutdown(self, wait=True, *, cancel_futures=False):
        if self._closed:
            return
        self._closed = True
        self._tasks.put(("cancel" if cancel_futures else "finish",))
        self._wake_write.send_bytes(b"")
        if wait:
            self._dispatcher.join()

    # ------------------------------------------------------------------ workers
    def _start(self) -> "_Worker":
        ours, theirs = self._context.Pipe()
        with _environment(self._env):  # a spawned child reads its thread counts at import
            process = self._context.Process(target=_serve, args=(theirs,), daemon=True,
                                            name="graph-api-batch-worker")
            process.start()
        theirs.close()
        return _Worker(process, ours)

    def _dispatch(self):
        try:
            self._loop()
        except BaseException as err:  # noqa: BLE001 - never leave a future unsettled (a hang)
            for future, *_ in [*self._pending, *(t for t in self._drain() if len(t) > 1)]:
                if not future.done():
                    future.set_exception(err)
            for worker in self._workers:
                if worker.task is not None:
                    worker.task.set_exception(err)
                    worker.task = None
            raise
        finally:
            for worker in self._workers:
                worker.stop()

    def _drain(self):
        while not self._tasks.empty():
            yield self._tasks.get()

    def _loop(self):
        pending, stop = self._pending, None
        while True:
            for item in self._drain():
                if len(item) == 1:
                    stop = item[0]
                else:
                    pending.append(item)
            if stop == "cancel":
                for future, *_ in pending:
                    future.cancel()
                for worker in self._workers:
                    if worker.task is not None:  # running: stopped with its worker
                        worker.task.set_exception(concurrent.futures.CancelledError())
                        worker.task = None
                return
            for worker in self._workers:
                while worker.task is None and pending:
                    future, fn, args, kwargs = pending.popleft()
                    if future.set_running_or_notify_cancel():
                        worker.task = future
                        with contextlib.suppress(OSError):  # a dead worker: seen below
                            worker.conn.send((fn, args, kwargs))
            busy = [w for w in self._workers if w.task is not None]
            if stop == "finish" and not busy and not pending:
                return
            ready = wait([self._wake_read] + [w.conn for w in busy] + [w.process.sentinel for w in busy])
            while self._wake_read.poll():
                self._wake_read.recv_bytes()
            for index, worker in enumerate(self._workers):
                if worker.task is not None and (worker.conn in ready or worker.process.sentinel in ready):
                    if not self._finish(worker):
                        self._workers[index] = self._start()

    def _finish(self, worker) -> bool:
        """Settle the worker's task; False when the worker died doing it."""
        future, worker.task = worker.task, None
        try:
            ok, value = worker.conn.recv()
        except (EOFError, OSError):
            worker.process.join()
            future.set_exception(WorkerCrashed(
                f"worker process {worker.process.pid} died while running this case "
                f"({_exit_reason(worker.process.exitcode)})"))
            worker.conn.close()
            return False
        (future.set_result if ok else future.set_exception)(value)
        return True


class _Worker:
    def __init__(self, process, conn):
        self.process, self.conn, self.task = process, conn, None

    def stop(self):
        if self.task is None and self.process.is_alive():
            with contextlib.suppress(OSError):
                self.conn.send(None)
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def _serve(conn):
    """A worker's loop: ``(fn, args, kwargs)`` in, ``(ok, result or exception)`` out."""
    os.dup2(2, 1)  # stdout is the parent's: the batch lines in order; anything else goes to stderr
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the parent, which stops us
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        fn, args, kwargs = task
        try:
            reply = (True, fn(*args, **kwargs))
        except Exception as err:  # noqa: BLE001 - the parent's future carries it
            reply = (False, err)
        try:
            conn.send(reply)
        except Exception as err:  # noqa: BLE001 - an unpicklable result or exception
            conn.send((False, ExecutionError(f"cannot send the result back: {err!r}")))


def _exit_reason(code) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


_ENV_LOCK = threading.Lock()


@contextlib.contextmanager
def _environment(values: dict):
    """``values`` in ``os.environ`` while a child process starts."""
    with _ENV_LOCK:
        saved = {name: os.environ.get(name) for name in values}
        os.environ.update(values)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

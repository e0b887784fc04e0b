"""``graph-api run --batch --workers N | --scheduler``: the cases on worker
processes or a Dask cluster print what the serial run prints, in its order;
a worker that dies fails only the case it ran."""
from __future__ import annotations

import os
import signal
import sys

import pytest

from graph_api import batch_pool
from graph_api.batch_pool import CRASH_TEST_ENV, ProcessPool, WorkerCrashed, run_batch_parallel
from graph_api.cli import main
from graph_api.errors import Unimplemented

from ..conformance_files import ROOT


@pytest.fixture(scope="module")
def small_batch(tmp_path_factory):
    """A few lines of oneDNN's op/harness_f32_ci (19 cases), one case failing
    (oneDNN gives 1 partition, not 2) and one absent file."""
    lines = (ROOT / "op/harness_f32_ci").read_text().splitlines()
    chosen = [line for line in lines if any(name in line for name in (
        "op/f32/matmul.json", "op/f32/abs.json", "op/f32/clamp.json", "op/f32/add.json"))]
    chosen += ["--reset --expected-n-partitions=2 --case=op/f32/matmul.json",
               "--reset --case=op/f32/not_here.json"]
    path = tmp_path_factory.mktemp("batch") / "small"
    path.write_text("\n".join(chosen) + "\n")
    return path


def _cli(capsys, *args) -> tuple[int, list[str]]:
    code = main(["run", "--batch", *map(str, args)])
    return code, capsys.readouterr().out.splitlines()


@pytest.fixture(scope="module")
def serial_lines(small_batch):
    lines = []
    from graph_api.batch import run_batch
    summary = run_batch(small_batch, ROOT, echo=lines.append)
    assert summary.count("failed") == 1 and summary.count("missing") == 1
    assert summary.count("passed") == len(summary.outcomes) - 2 >= 15
    return lines


def test_two_workers_print_the_serial_lines_in_order(small_batch, serial_lines, capsys):
    code, serial = _cli(capsys, small_batch, "--inputs-root", ROOT, "--workers", 1)
    assert serial == serial_lines and code == 1
    code, parallel = _cli(capsys, small_batch, "--inputs-root", ROOT, "--workers", 2)
    assert parallel == serial_lines and code == 1


def test_a_crashing_case_is_reported_and_the_others_complete(small_batch, serial_lines, monkeypatch):
    """The test hook makes the worker running a clamp case ``os._exit``: that case
    fails naming the crash, a new worker runs the rest."""
    monkeypatch.setenv(CRASH_TEST_ENV, "op/f32/clamp.json")
    lines = []
    summary = run_batch_parallel(small_batch, ROOT, echo=lines.append, workers=2)
    crashed = [i for i, o in enumerate(summary.outcomes) if o.case.path == "op/f32/clamp.json"]
    assert len(crashed) == 1 and len(lines) == len(serial_lines)
    for index, (line, expected) in enumerate(zip(lines[:-1], serial_lines)):
        if index in crashed:
            assert line.startswith(f"{index}:FAILED") and line.endswith(
                f"died while running this case (exit code {batch_pool.CRASH_TEST_EXIT})")
        else:
            assert line == expected
    assert summary.count("failed") == 2 and summary.count("missing") == 1
    assert lines[-1] == serial_lines[-1].replace(
        f"passed:{summary.count('passed') + 1}", f"passed:{summary.count('passed')}").replace(
        "failed:1", "failed:2")


def test_a_worker_killed_by_a_signal_fails_its_task_and_is_replaced():
    with ProcessPool(2, threads=1) as pool:
        killed = pool.submit(signal.raise_signal, signal.SIGKILL)
        exited = pool.submit(os._exit, 3)
        raised = pool.submit(int, "not a number")
        after = [pool.submit(pow, 2, n) for n in range(6)]
        with pytest.raises(WorkerCrashed, match="killed by SIGKILL"):
            killed.result(timeout=120)
        with pytest.raises(WorkerCrashed, match="exit code 3"):
            exited.result(timeout=120)
        with pytest.raises(ValueError, match="not a number"):
            raised.result(timeout=120)
        assert [f.result(timeout=120) for f in after] == [2 ** n for n in range(6)]


def test_each_worker_gets_its_share_of_the_cores(monkeypatch):
    for name in batch_pool.THREAD_ENV:
        monkeypatch.delenv(name, raising=False)
    share = str(max(1, batch_pool.cores() // 2))
    with ProcessPool(2) as pool:
        assert [pool.submit(os.getenv, n).result(timeout=120) for n in batch_pool.THREAD_ENV] == \
            [share] * len(batch_pool.THREAD_ENV)
    assert all(name not in os.environ for name in batch_pool.THREAD_ENV)  # the parent's is as it was


def test_the_dask_path_prints_the_serial_lines(small_batch, serial_lines, capsys):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        code, lines = _cli(capsys, small_batch, "--inputs-root", ROOT,
                           "--scheduler", cluster.scheduler_address)
    assert lines == serial_lines and code == 1


def test_without_dask_the_scheduler_is_a_typed_error(small_batch, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    with pytest.raises(Unimplemented, match=r"pip install 'graph_api\[dask\]'"):
        run_batch_parallel(small_batch, ROOT, scheduler="tcp://127.0.0.1:8786")


@pytest.mark.parametrize("args, phrase", [
    (["run", "graph.json", "--workers", "2"], "for --batch"),
    (["run", "--batch", "b", "--workers", "2", "--scheduler", "tcp://h:1"], "not both"),
])
def test_workers_and_scheduler_argument_errors(args, phrase, capsys):
    assert main(args) == 2
    assert phrase in capsys.readouterr().err

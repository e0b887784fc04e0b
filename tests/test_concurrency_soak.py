"""Concurrency and soak (issue 8, standing tests).

* 8 Python threads execute one compiled fused partition (int4 weight-compressed
  MatMul + ReLU, constant weights: the prepared-weight cache is shared) on
  their own tensors; every result must be bit-identical to a serial run, which
  itself matches the unfused reference.
* Two processes share one fresh Numba cache directory (``NUMBA_CACHE_DIR``)
  and both compile and run a fused kernel at the same time; both must give the
  reference's answer, bit-identical to each other.
* A soak: many executions of a small partition with the process's resident
  memory (``/proc/self/statm``) bounded.

Short versions run in the default suite; ``pytest -m long`` runs the long ones.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api import fill
from graph_api.check import compare

ROOT = Path(__file__).resolve().parents[1]
THREADS = 8
RUNS_PER_THREAD_SHORT, RUNS_PER_THREAD_LONG = 10, 500
SOAK_SHORT, SOAK_LONG = 2_000, int(os.environ.get("GRAPH_API_SOAK_EXECUTIONS", "100000"))
#: the soak's output is 64 KiB (128 x 128 f32): keeping one per execution would
#: grow RSS by 125 MiB in the short soak; allocator noise stays within a few MiB
RSS_GROWTH_LIMIT = 16 << 20


def wmatmul_relu_graph(m=4, k=128, n=64, group=32) -> ga.Graph:
    """DynamicDequantize(s4 W, constant) -> MatMul -> ReLU: one fused partition."""
    g = ga.Graph()
    w = ga.LogicalTensor(0, dt.s4, [k, n], property=ga.PropertyType.constant)
    s = ga.LogicalTensor(1, dt.f32, [k // group, n], property=ga.PropertyType.constant)
    wf, x = ga.LogicalTensor(2, dt.f32, [k, n]), ga.LogicalTensor(3, dt.f32, [m, k])
    y, z = ga.LogicalTensor(4, dt.f32, [m, n]), ga.LogicalTensor(5, dt.f32, [m, n])
    g.add_op(ga.Op(0, K.DynamicDequantize, [w, s], [wf], attrs={"qtype": "per_group", "group_shape": [group, 1]}))
    g.add_op(ga.Op(1, K.MatMul, [x, wf], [y]))
    g.add_op(ga.Op(2, K.ReLU, [y], [z]))
    g.finalize()
    return g


def compiled_single(graph):
    (part,) = graph.get_partitions()
    cp = part.compile(part.get_input_ports(), part.get_output_ports(), ga.Engine())
    return part, cp


def tensors_for(part, cp, feeds):
    engine = ga.Engine()
    ins = [ga.Tensor(cp.query_logical_tensor(t), engine, feeds[t]) for t in part.input_ids]
    outs = [ga.Tensor(cp.query_logical_tensor(t), engine) for t in part.output_ids]
    return ins, outs


# ====================================================================== threads
def run_threads(runs_per_thread: int):
    graph = wmatmul_relu_graph()
    part, cp = compiled_single(graph)
    assert cp.plan.name == "numba_wmatmul", "the test is about the fused kernel"
    feeds = fill.fill_inputs(graph, 11)
    ins, outs = tensors_for(part, cp, feeds)
    cp.execute(ga.Stream(ga.Engine()), ins, outs)
    serial = outs[0].numpy().copy()
    expected = fill.reference_arrays(graph, feeds)[5]
    verdict = compare(expected, serial, dt.f32, graph.fpmath, list(graph.ops.values()))
    assert verdict.ok, verdict.message

    weights = ins[:1] + ins[1:2]  # the constant tensors are shared by every thread, as a framework would
    barrier = threading.Barrier(THREADS)
    results, errors = [None] * THREADS, []

    def worker(i):
        try:
            x = ga.Tensor(cp.query_logical_tensor(3), ga.Engine(), feeds[3].copy())
            out = ga.Tensor(cp.query_logical_tensor(5), ga.Engine())
            stream = ga.Stream(ga.Engine())
            barrier.wait()
            digests = set()
            for _ in range(runs_per_thread):
                out.write(np.full(out.lt.shape, np.nan, np.float32))
                cp.execute(stream, weights + [x], [out])
                digests.add(hashlib.sha256(out.numpy().tobytes()).hexdigest())
            results[i] = digests
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(f"thread {i}: {type(err).__name__}: {err}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    want = {hashlib.sha256(serial.tobytes()).hexdigest()}
    assert all(r == want for r in results), "a thread got a result that is not bit-identical"
    print(f"\nthreads: {THREADS} x {runs_per_thread} executions of one compiled partition, bit-identical")


def test_eight_threads_on_one_compiled_partition():
    run_threads(RUNS_PER_THREAD_SHORT)


@pytest.mark.long
def test_eight_threads_long():
    run_threads(RUNS_PER_THREAD_LONG)


# ====================================================================== processes
CHILD = textwrap.dedent("""
    import hashlib, sys
    import numpy as np
    import graph_api as ga
    from graph_api import DataType as dt, OpKind as K, fill
    from graph_api.check import compare

    g = ga.Graph()
    x = ga.LogicalTensor(0, dt.f32, [6, 48])
    w = ga.LogicalTensor(1, dt.f32, [48, 40], property=ga.PropertyType.constant)
    b = ga.LogicalTensor(2, dt.f32, [40])
    y, z = ga.LogicalTensor(3, dt.f32, [6, 40]), ga.LogicalTensor(4, dt.f32, [6, 40])
    g.add_op(ga.Op(0, K.MatMul, [x, w, b], [y]))
    g.add_op(ga.Op(1, K.GELU, [y], [z]))
    g.finalize()
    feeds = fill.fill_inputs(g, 5)
    run = ga.run_graph(g, feeds)
    (part,) = run.partitions
    assert part.compiled.plan.name != "reference", part.compiled.plan.name
    verdict = compare(fill.reference_arrays(g, feeds)[4], run.outputs[4], dt.f32, g.fpmath, list(g.ops.values()))
    assert verdict.ok, verdict.message
    print(part.compiled.plan.name, hashlib.sha256(run.outputs[4].tobytes()).hexdigest())
""")


def run_processes(tmp_path, pairs: int):
    cache = tmp_path / "numba-cache"
    cache.mkdir()
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    lines = []
    for _ in range(pairs):
        procs = [subprocess.Popen([sys.executable, "-c", CHILD], env=env, cwd=ROOT, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
        for p in procs:
            out, err = p.communicate(timeout=900)
            assert p.returncode == 0, err[-2000:]
            lines.append(out.strip())
    assert len(set(lines)) == 1, lines  # same kernel, bit-identical output
    assert any(cache.rglob("*.nbi")), "the kernels were not cached in NUMBA_CACHE_DIR"
    print(f"\nprocesses: {2 * pairs} sharing one Numba cache directory: {lines[0]}")


def test_two_processes_share_one_numba_cache(tmp_path):
    run_processes(tmp_path, pairs=1)


@pytest.mark.long
def test_processes_share_one_numba_cache_long(tmp_path):
    run_processes(tmp_path, pairs=4)


# ====================================================================== soak
def rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def soak(executions: int):
    g = ga.Graph()
    x, b = ga.LogicalTensor(0, dt.f32, [128, 128]), ga.LogicalTensor(1, dt.f32, [1, 128])
    y, z = ga.LogicalTensor(2, dt.f32, [128, 128]), ga.LogicalTensor(3, dt.f32, [128, 128])
    g.add_op(ga.Op(0, K.Add, [x, b], [y]))
    g.add_op(ga.Op(1, K.ReLU, [y], [z]))
    g.finalize()
    part, cp = compiled_single(g)
    feeds = fill.fill_inputs(g, 3)
    ins, outs = tensors_for(part, cp, feeds)
    stream = ga.Stream(ga.Engine())
    expected = np.maximum(feeds[0].astype(np.float64) + feeds[1], 0)
    warm_up = executions // 10
    for i in range(executions):
        if i == warm_up:
            before = rss_bytes()
        cp.execute(stream, ins, outs)
    after = rss_bytes()
    # f32 add of two values in [-2, 2] and a ReLU: one rounding, so 1 ulp
    np.testing.assert_allclose(outs[0].numpy(), expected, rtol=2**-23, atol=0)
    print(f"\nsoak: {executions} executions, RSS {before / 2**20:.1f} MiB after {warm_up} "
          f"-> {after / 2**20:.1f} MiB at the end")
    assert after - before < RSS_GROWTH_LIMIT


def test_soak_rss_is_bounded():
    soak(SOAK_SHORT)


@pytest.mark.long
def test_soak_long():
    soak(SOAK_LONG)

"""compile() does the Numba specialisation: the first execute compiles nothing.

Each case compiles every partition of a graph, counts the signatures every
Numba dispatcher of graph_api.kernels holds (a cache load or a compile both
add one), runs the graph once and counts again.  Numbers are checked by check
mode (every fused partition also runs the unfused f64/f32 reference and raises
on a mismatch beyond graph_api.check's rule).
"""
import subprocess
import sys

import pytest

import graph_api as ga
from graph_api import backend
from graph_api.config import settings
from graph_api.fill import fill_inputs
from tests.patterns import graphs


def numba_signatures() -> int:
    """Compiled (or cache-loaded) signatures over every kernel dispatcher loaded so far."""
    from graph_api.kernels.numba_setup import numba

    return sum(len(obj.overloads) for name, module in list(sys.modules.items())
               if name.startswith("graph_api.kernels") and module is not None
               for obj in list(vars(module).values()) if isinstance(obj, numba.core.dispatcher.Dispatcher))


CASES = {
    "matmul_relu": lambda: graphs.matmul_chain(post=("relu",)),
    "softmax_chain": lambda: graphs.small("softmax"),
    "quantized_matmul": lambda: graphs.quantized_matmul(),
    "compressed_matmul": lambda: graphs.compressed_matmul(),
    "gated_mlp": lambda: graphs.gated_mlp(),
    "sdpa": lambda: graphs.sdpa(),
    "compressed_sdpa": lambda: graphs.sdpa(k_dequant=ga.DataType.s4, v_dequant=ga.DataType.s4,
                                           fpmath="f16", apply_to_int=True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_first_execute_after_compile_compiles_nothing(name, monkeypatch):
    graph = CASES[name]()
    monkeypatch.setattr(settings, "check", True)
    feeds = fill_inputs(graph)
    backend._WARMED.clear()  # a fresh process: nothing warmed yet
    compiled = ga.compile_graph(graph, feeds)
    assert any(comp.plan.name != "reference" for _, comp, _, _ in compiled.steps)
    before = numba_signatures()
    compiled.run(feeds)
    assert numba_signatures() == before, "the first execute specialised a Numba kernel"


def test_a_request_warmed_before_is_not_run_again(monkeypatch):
    graph = graphs.matmul_chain(post=("relu",))
    feeds = fill_inputs(graph)
    runs = []
    real = backend._run_on_placeholders
    monkeypatch.setattr(backend, "_run_on_placeholders", lambda *a: runs.append(1) or real(*a))
    backend._WARMED.clear()
    ga.run_graph(graph, feeds)
    assert len(runs) == 1
    ga.set_compiled_partition_cache_capacity(0)  # new compiled partitions, same requests
    try:
        ga.run_graph(graphs.matmul_chain(post=("relu",)), feeds)
    finally:
        ga.set_compiled_partition_cache_capacity(1024)
    assert len(runs) == 1


def test_the_first_compile_of_a_kernel_family_is_announced():
    """A fresh njit function in a child process (no cache): the line comes once, before the wait."""
    code = (
        "from graph_api.kernels.numba_setup import numba\n"
        "f = numba.njit(lambda x: x + 1)\n"
        "g = numba.njit(lambda x: x * 2)\n"
        "f(1); f(1.5); g(2)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "GRAPH_API_PROGRESS": "1"})
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "compiling the" in line]
    # one family (this module, "<string>"), announced once though three signatures compiled
    assert lines == ["graph_api: compiling the __main__ kernel (first run only, cached on disk)"]


def test_verbose_mode_reports_compile_progress(monkeypatch, capsys):
    monkeypatch.setattr(settings, "verbose", True)
    backend._WARMED.clear()
    graph = graphs.quantized_matmul()
    part, = graph.get_partitions()
    compiled = part.compile(part.get_input_ports(), part.get_output_ports(), ga.Engine())
    err = capsys.readouterr().err
    start = f"graph_api_verbose,compile,partition {part.id},warm-up,kernel={compiled.plan.name}"
    done = (f"graph_api_verbose,compile,partition {part.id},warm-up done,kernel={compiled.plan.name},"
            f"scratch {compiled.scratch_bytes - 64} bytes,")  # the measured pieces; 64 more align the start
    lines = err.splitlines()
    assert any(line.startswith(start) for line in lines), err
    assert any(line.startswith(done) for line in lines), err
    assert lines.index(next(l for l in lines if l.startswith(start))) < \
        lines.index(next(l for l in lines if l.startswith(done)))

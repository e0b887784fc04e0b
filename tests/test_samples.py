"""Every sample of the gallery runs (small shapes); samples assert their own errors."""
import re

import pytest

from samples import SAMPLES, gallery, load
from samples.__main__ import main as gallery_main


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_runs(name, capsys):
    record = gallery.start()
    load(name).main(small=True)
    out = capsys.readouterr().out
    if record.skipped:
        pytest.skip(record.skipped)
    assert "error" in out  # every sample reports its error against numpy
    assert record.errors and all(value <= bound for _, value, bound in record.errors)
    assert record.partitions > 0 and record.pictures  # every sample shows its partitions


def test_every_sample_module_has_a_docstring_and_main():
    for name in SAMPLES:
        module = load(name)
        assert module.__doc__ and module.__doc__.strip() and callable(module.main), name


def test_gallery_runs_prints_a_summary_and_writes_the_page(tmp_path, capsys):
    code = gallery_main(["--small", "--out", str(tmp_path), "01_first_graph"])
    out = capsys.readouterr().out
    assert code == 0 and "[1/1] 01_first_graph ok" in out and "samples: 1 ok, 0 skipped, 0 failed" in out
    page = (tmp_path / "index.html").read_text()
    assert page.count("<svg") == 2  # one picture per graph the sample ran
    assert "matmul_compressed" in page and "numba_wmatmul" in page  # partitions labelled with kernels
    # each cluster carries a short tag; the legend spells out kind and kernel once
    # (long labels on neighbouring clusters used to be drawn over each other)
    tags = re.findall(r"<!-- (p\d+) -->", page)
    legend = re.findall(r"<!-- (p\d+): ([^>]+) -->", page)
    assert tags and sorted(tags) == sorted(t for t, _ in legend)
    assert any(words.startswith("matmul_compressed / numba_wmatmul") for _, words in legend)
    assert "First graph" in page and "def main" in page  # its description and its code


def test_gallery_runs_samples_in_worker_processes_and_keeps_gallery_order(tmp_path, capsys):
    """``--jobs 2``: each sample runs in a worker process, its whole output printed when it
    ends; the table and the page keep the gallery's order, with the workers' records."""
    names = ["11_composite_ops", "09_why_not_fused"]
    assert gallery_main(["--small", "--jobs", "2", "--out", str(tmp_path), *names]) == 0
    out = capsys.readouterr().out
    assert "samples: 2 ok, 0 skipped, 0 failed" in out
    assert all(f"{name} ok in" in out and out.count(f"] {name}\n") == 1 for name in names)
    table = out[out.index("sample  "):]
    assert table.index(names[0]) < table.index(names[1])
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:3]}
    assert all(rows[name][1] == "ok" and int(rows[name][2]) > 0 for name in names)  # the workers' records
    page = (tmp_path / "index.html").read_text()
    assert page.index(f"id='{names[0]}'") < page.index(f"id='{names[1]}'") and page.count("<svg") >= 2


def test_a_failing_sample_fails_the_gallery(tmp_path, capsys, monkeypatch):
    module = load("01_first_graph")

    def broken(small=False):
        gallery.error("a wrong number", 1.0, 1e-5)

    monkeypatch.setattr(module, "main", broken)
    assert gallery_main(["--small", "--out", str(tmp_path), "01_first_graph"]) == 1
    assert "samples: 0 ok, 0 skipped, 1 failed (01_first_graph)" in capsys.readouterr().out


def test_readme_example_runs():
    """The README's first-graph example runs as written and fuses."""
    import re
    from pathlib import Path

    import numpy as np

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text.split("## A first graph", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2  # the oneDNN-style graph, then the same with GraphBuilder
    scope: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)
    result, feeds, n, k, group = (scope[name] for name in ("result", "feeds", "n", "k", "group"))
    assert [r.partition.get_kind() for r in result.partitions] == ["matmul_compressed"]
    w = feeds[0].astype(np.float64) * 0.01
    expected = feeds[3].astype(np.float64) @ w.T
    np.testing.assert_allclose(result.outputs[4], expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    exec(compile(blocks[1], "README.md", "exec"), scope)
    assert [p.get_kind() for p in scope["model"].partitions] == ["matmul_compressed"]
    np.testing.assert_allclose(scope["out"], expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def test_the_gallery_shows_a_kernel_compiling_for_the_first_time(tmp_path, capsys, monkeypatch):
    """Numba's compile event (a real compile of a fresh function) prints the line on
    stderr; the gallery keeps it with the sample's output on the page."""
    from graph_api.kernels.numba_setup import numba

    module = load("01_first_graph")

    def compiles_a_kernel(small=False):
        numba.njit(lambda x: x + 1)(1)  # this module's first Numba compile
        gallery.error("nothing", 0.0, 1.0)

    monkeypatch.setattr(module, "main", compiles_a_kernel)
    assert gallery_main(["--small", "--out", str(tmp_path), "01_first_graph"]) == 0
    line = "graph_api: compiling the test_samples kernel (first run only, cached on disk)"
    assert line in capsys.readouterr().err
    assert line in (tmp_path / "index.html").read_text()

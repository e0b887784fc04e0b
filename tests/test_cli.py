"""The graph-api command line: run / partitions / dot through ``main([...])``, and its errors."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graph_api import cli

ROOT = Path(__file__).resolve().parents[1]
CONFORMANCE = ROOT / "tests" / "data" / "onednn-graphs"
SDPA_INT4 = CONFORMANCE / "complex_fusion/mha/sdpa-compressed-kv-int4-gs32.json"
MATMUL_SELECT = CONFORMANCE / "pattern/f32/matmul_select.json"
DMASK = CONFORMANCE / "complex_fusion/mha/sdpa-plain-training-backward-w-dmask-bf16-f32.json"


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def rows(out: str) -> list[str]:
    """The partition rows of a table (lines starting with an id)."""
    return [line for line in out.splitlines() if line[:4].strip().isdigit()]


# ================================================================ run
def test_run_prints_the_partition_table_with_timings(capsys):
    code, out, err = run(capsys, "run", SDPA_INT4, "--repeat", "2")
    assert code == 0 and err == ""
    assert "fpmath f16:apply_to_int" in out and "engine cpu (file: cpu)" in out
    assert "compile ms" in out and "execute ms" in out
    table = rows(out)
    assert f"partitions  {len(table)} ({len(table)} supported)" in out
    assert sum(int(r.split()[1]) for r in table) == 7  # ops per partition add up to the graph's
    for row in table:
        compile_ms, execute_ms = map(float, row.split()[-2:])
        assert compile_ms >= 0 and execute_ms >= 0
    assert any(line.startswith("total") for line in out.splitlines())


def test_run_check_compares_every_output(capsys):
    code, out, _ = run(capsys, "run", SDPA_INT4, "--check")
    assert code == 0
    assert "check       output 50 f16[1x32x32x128]: ok" in out
    assert "1 of 1 outputs match the unfused reference" in out


def test_run_check_exits_1_on_a_mismatch(capsys, monkeypatch):
    from graph_api import fill

    real = fill.reference_arrays

    def wrong(graph, feeds, wanted=None):
        arrays = real(graph, feeds, wanted)
        for tid in graph.output_ids:
            arrays[tid] = arrays[tid] + 1
        return arrays

    monkeypatch.setattr(fill, "reference_arrays", wrong)
    code, out, _ = run(capsys, "run", MATMUL_SELECT, "--check")
    assert code == cli.EXIT_MISMATCH and "MISMATCH" in out and "0 of 1 outputs" in out


def test_run_with_debug_policy_and_fpmath_override(capsys):
    code, out, _ = run(capsys, "run", MATMUL_SELECT, "--policy", "debug", "--fpmath", "bf16",
                       "--apply-to-int", "--check")
    assert code == 0
    assert "policy debug" in out and "fpmath bf16:apply_to_int" in out
    assert "fpmath overridden" in out
    assert len(rows(out)) == 2  # one partition per op


def test_run_checks_the_tensor_an_end_op_marks(capsys):
    # debug policy: End is a lone unsupported partition that is listed, not executed,
    # and the dMask tensor it marks as a graph output is checked like the others
    code, out, _ = run(capsys, "run", DMASK, "--mb", "1", "--policy", "debug", "--check")
    assert code == 0
    assert any("End" in r and " no " in r for r in rows(out))
    assert "output 23 f32[1x16x384x384]: ok" in out and "4 of 4 outputs match" in out


def test_run_mb_rewrites_the_batch(capsys):
    path = CONFORMANCE / "complex_fusion/mha/MHA-stable_diffusion-inf-fp32-bs1.json"
    code, out, _ = run(capsys, "run", path, "--mb", "1", "--check")
    assert code == 0 and "batch changed: mb 2->1" in out


def test_python_dash_m_runs_the_cli():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "graph_api", "partitions", str(MATMUL_SELECT)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0 and "partitions  " in done.stdout


# ================================================================ partitions / dot
def test_partitions_explains_unfused_ops(capsys):
    code, out, _ = run(capsys, "partitions", MATMUL_SELECT)
    assert code == 0
    assert "compile ms" not in out and rows(out)
    single = sum("single op" in r for r in rows(out))
    assert f"not fused   {single} single-op partition(s)" in out
    if single and cli.explanations(cli.load(MATMUL_SELECT)) is None:
        assert cli.NO_EXPLANATION in out


def test_partitions_says_why_an_op_was_not_fused(capsys, tmp_path):
    # MatMul -> ReLU would fuse, but the MatMul result also feeds an Exp outside
    def lt(tid, shape):
        return {"id": tid, "dtype": "f32", "shape": shape, "stride": [shape[1], 1],
                "layout_type": "strided", "property_type": "undef"}

    ops = [("MatMul", 7, [lt(0, [2, 3]), lt(1, [3, 2])], lt(2, [2, 2])),
           ("ReLU", 8, [lt(2, [2, 2])], lt(3, [2, 2])), ("Exp", 9, [lt(2, [2, 2])], lt(4, [2, 2]))]
    doc = {"version": "3.5.0", "engine_kind": "cpu", "fpmath_mode": "strict",
           "graph": [{"id": i, "name": k.lower(), "kind": k, "attrs": {}, "inputs": ins, "outputs": [out]}
                     for k, i, ins, out in ops]}
    path = tmp_path / "escape.json"
    path.write_text(json.dumps(doc))
    code, out, _ = run(capsys, "partitions", path)
    assert code == 0 and "not fused   3 single-op partition(s)" in out
    why = out.split("not fused")[1]
    assert "op 7 (MatMul): " in why and "op 8 (ReLU): " in why and "op 9 (Exp): " in why
    assert "tensor 2" in why  # the escaping intermediate is named


def test_explanations_accept_the_shapes_the_library_may_return(monkeypatch):
    class G:
        pass

    graph = G()
    graph.explain_partitions = lambda: {3: "pattern x: needs a MatMul first"}
    assert cli.explanations(graph) == {3: "pattern x: needs a MatMul first"}
    graph.explain_partitions = lambda: "line one\nline two"
    assert cli.explanations(graph) == ["line one", "line two"]


def test_dot_writes_clusters(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(cli.shutil, "which", lambda name: None)
    out_file = tmp_path / "g.dot"
    code, out, _ = run(capsys, "dot", SDPA_INT4, "-o", out_file)
    assert code == 0 and f"wrote {out_file}" in out
    text = out_file.read_text()
    assert text.startswith("digraph graph_api {") and text.rstrip().endswith("}")
    assert "subgraph cluster_p0" in text and "DynamicDequantize #0" in text
    assert "t0 -> op0" in text and "s4[1x32x128x32]" in text


def test_dot_renders_svg_when_graphviz_is_there(capsys, tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "dot"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n# fake graphviz: last argument is the output file\n"
                    "for a; do out=$a; done\necho '<svg/>' > \"$out\"\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    code, out, _ = run(capsys, "dot", MATMUL_SELECT, "-o", tmp_path / "g.svg")
    assert code == 0 and (tmp_path / "g.dot").exists() and (tmp_path / "g.svg").read_text() == "<svg/>\n"


def test_dot_to_stdout(capsys):
    code, out, _ = run(capsys, "dot", MATMUL_SELECT)
    assert code == 0 and "cluster_p" in out and "Select #1" in out


def test_dot_svg_without_graphviz_is_a_clear_error(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(cli.shutil, "which", lambda name: None)
    code, _, err = run(capsys, "dot", MATMUL_SELECT, "-o", tmp_path / "g.svg")
    assert code == cli.EXIT_ERROR and "Graphviz" in err and (tmp_path / "g.dot").exists()


# ================================================================ help and errors
@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["partitions", "--help"], ["dot", "--help"]])
def test_help(capsys, argv):
    code, out, _ = run(capsys, *argv)
    assert code == 0 and "usage: graph-api" in out


def test_run_help_documents_the_fill_rule(capsys):
    _, out, _ = run(capsys, "run", "--help")
    assert "{2,4,8}" in out and "123456" in out


@pytest.mark.parametrize("argv, words", [
    ([], "required"),
    (["frobnicate", "x.json"], "invalid choice"),
    (["run"], "file"),
    (["run", "x.json", "--repeat", "0"], "positive integer"),
    (["run", "x.json", "--fpmath", "f64"], "invalid choice"),
    (["run", "x.json", "--policy", "greedy"], "fusion or debug"),
])
def test_bad_arguments(capsys, argv, words):
    code, _, err = run(capsys, *argv)
    assert code == 2 and words in err and "usage: graph-api" in err


def test_missing_file_is_one_line(capsys, tmp_path):
    code, out, err = run(capsys, "run", tmp_path / "missing.json")
    assert code == cli.EXIT_ERROR and out == ""
    assert err.startswith("graph-api: error: ") and "missing.json" in err and err.count("\n") == 1


@pytest.mark.parametrize("content, words", [
    ("{ nope", "not valid JSON"),
    (json.dumps({"version": "3.0", "engine_kind": "cpu", "fpmath_mode": "strict"}), "'graph'"),
    (json.dumps({"version": "3.0", "engine_kind": "cpu", "fpmath_mode": "strict", "graph": [
        {"id": 4, "name": "x", "kind": "Frob", "inputs": [], "outputs": []}]}), "op 4"),
])
def test_bad_files_are_one_typed_line(capsys, tmp_path, content, words):
    path = tmp_path / "bad.json"
    path.write_text(content)
    for command in ("run", "partitions", "dot"):
        code, out, err = run(capsys, command, path)
        assert code == cli.EXIT_ERROR and out == ""
        assert err.startswith("graph-api: error: [invalid_graph") and "bad.json" in err and words in err
        assert "Traceback" not in err and err.count("\n") == 1

"""``graph-api run --batch``: benchdnn's graph batch files, knobs and summary."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import graph_api as ga
from graph_api import batch
from graph_api.batch import BatchError, Case, apply_knobs, expand, run_batch, tag_strides
from graph_api.cli import main

from ..conformance_files import ROOT


@pytest.fixture
def inputs(tmp_path):
    """An inputs root holding a few small oneDNN files at their benchdnn paths."""
    for name in ("op/f32/abs_bwd.json", "op/f32/conv_2d.json", "op/f32/add.json",
                 "op/f32/relu_bwd.json", "op/f32/prelu_bwd.json", "op/f32/matmul.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ------------------------------------------------------------------ reading
def test_knobs_persist_until_reset_and_commas_multiply_runs(inputs):
    path = write(inputs, "b", """# a comment
--op-kind=0:Add,0:Divide --in-shapes=0:2x3+1:2x3,0:4x3+1:4x3 --case=op/f32/add.json
--case=op/f32/add.json   # still in effect
--reset --case=op/f32/add.json
""")
    cases = list(expand(path, inputs))
    assert len(cases) == 4 + 4 + 1
    assert cases[0].knobs == (("op-kind", "0:Add"), ("in-shapes", "0:2x3+1:2x3"))
    assert cases[3].knobs == (("op-kind", "0:Divide"), ("in-shapes", "0:4x3+1:4x3"))
    assert cases[-1].knobs == () and cases[-1].origin.endswith("b:4")


def test_continuation_lines_and_nested_batches_relative_to_the_root(inputs):
    write(inputs, "sub/inner", "--case=op/f32/add.json\n")
    path = write(inputs, "sub/outer", "--reset --op-kind=0:Add,\\\n   0:Maximum --batch=sub/inner\n")
    cases = list(expand(path, inputs))
    assert [c.knobs for c in cases] == [(("op-kind", "0:Add"),), (("op-kind", "0:Maximum"),)]


def test_an_empty_value_keeps_the_file_as_it_is(inputs):
    cases = list(expand(write(inputs, "b", "--op-attrs=,0:strides:4x4 --case=op/f32/conv_2d.json"),
                        inputs))
    assert [c.knobs for c in cases] == [(), (("op-attrs", "0:strides:4x4"),)]


@pytest.mark.parametrize("text,phrase", [
    ("--engine=gpu --case=op/f32/add.json", "unknown knob --engine"),
    ("--batch=nowhere", "does not exist"),
    ("--case", "needs a value"),
    ("case=op/f32/add.json", "expected an option"),
])
def test_unreadable_batch_lines_are_errors_before_anything_runs(inputs, text, phrase):
    with pytest.raises(BatchError, match=phrase):
        list(expand(write(inputs, "b", text), inputs))


def test_a_batch_including_itself_is_an_error(inputs):
    with pytest.raises(BatchError, match="includes itself"):
        list(expand(write(inputs, "b", "--batch=b"), inputs))


def test_the_root_is_found_from_the_paths_a_batch_names(inputs):
    path = write(inputs, "op/harness", "--case=op/f32/add.json")
    assert batch.find_root(path) == inputs


# ------------------------------------------------------------------ rewrites
def test_tag_strides():
    assert tag_strides((2, 3, 4, 5), "abcd") == (60, 20, 5, 1)
    assert tag_strides((2, 3, 4, 5), "abdc") == (60, 20, 1, 4)
    with pytest.raises(BatchError):
        tag_strides((2, 3), "abc")


def test_in_shapes_and_op_attrs_reinfer_every_produced_shape(inputs):
    graph = ga.load(inputs / "op/f32/conv_2d.json")
    new = apply_knobs(graph, {"in-shapes": "0:2x28x28x32*abcd", "op-attrs": "0:data_format:NXC"})
    conv = new.ops[0]
    assert conv.attrs["data_format"] == "NXC"
    assert new.tensors[0].shape == (2, 28, 28, 32)
    out = new.tensors[conv.outputs[0].id]
    w = graph.tensors[conv.inputs[1].id].shape
    assert out.shape is not None and out.shape[0] == 2 and out.shape[-1] == w[0]


def test_a_commented_line_inside_a_continuation_is_skipped(tmp_path):
    from graph_api.batch import logical_lines

    path = tmp_path / "b"
    path.write_text("--reset --in-shapes=0:1x2,\\\n# 0:3x4,\\\n0:5x6\n--case=x.json  # tail\n")
    assert list(logical_lines(path)) == [(1, "--reset --in-shapes=0:1x2,0:5x6"), (4, "--case=x.json")]


def test_an_id_is_its_leading_integer_as_benchdnn_reads_it(inputs):
    """harness_f32_all's prelu_bwd_dw_5d line spells an id ``2*abc``; benchdnn's stoll reads 2."""
    graph = ga.load(inputs / "op/f32/conv_2d.json")
    new = apply_knobs(graph, {"in-shapes": "0*abcd:2x28x28x32*abcd", "op-attrs": "0:data_format:NXC"})
    assert new.tensors[0].shape == (2, 28, 28, 32)
    with pytest.raises(BatchError):
        apply_knobs(graph, {"in-shapes": "x0:2x28x28x32"})


def test_op_kind_dt_property_and_fpmath(inputs):
    graph = ga.load(inputs / "op/f32/add.json")
    new = apply_knobs(graph, {"op-kind": "0:Maximum", "dt": "bf16", "attr-fpmath": "bf16:true",
                              "tensor-property": "1:constant"})
    op = new.ops[0]
    assert op.kind == ga.OpKind.Maximum
    assert {lt.dtype for lt in op.inputs + op.outputs} == {ga.DataType.bf16}
    assert new.tensors[1].property == ga.PropertyType.constant
    assert new.fpmath.mode.name == "bf16" and new.fpmath.apply_to_int


def test_norm_backward_keeps_f32_statistics_under_dt(inputs):
    graph = ga.load(ROOT / "pattern/f32/bn_bwd_relu_bwd_fusion.json")
    new = apply_knobs(graph, {"dt": "f16"})
    bn = next(op for op in new.ops.values() if op.kind == ga.OpKind.BatchNormTrainingBackward)
    assert [lt.dtype.name for lt in bn.inputs] == ["f16", "f16", "f32", "f32", "f32"]
    assert [lt.dtype.name for lt in bn.outputs] == ["f16", "f32", "f32"]


def chain_graph():
    """ReLU(0) -> 1; Add(2, 1) -> 3; Tanh(3) -> 4."""
    g = ga.Graph(ga.EngineKind.cpu)
    lt = lambda i: ga.LogicalTensor(i, ga.DataType.f32, (2, 3))  # noqa: E731
    g.add_op(ga.Op(0, "ReLU", [lt(0)], [lt(1)]))
    g.add_op(ga.Op(1, "Add", [lt(2), lt(1)], [lt(3)]))
    g.add_op(ga.Op(2, "Tanh", [lt(3)], [lt(4)]))
    g.finalize()
    return g


def test_undef_removes_a_binary_op_and_passes_its_produced_input_on(inputs):
    new = apply_knobs(chain_graph(), {"op-kind": "1:undef"})
    assert sorted(new.ops) == [0, 2] and new.ops[2].inputs[0].id == 1


def test_in_shapes_of_a_tensor_no_op_reads_is_ignored_as_in_benchdnn():
    """benchdnn rejects only ids an op reads that are not graph inputs; an
    output's shape (harness_*_all give GenIndex's output one) or an unknown id
    is ignored, the output shape inferred again."""
    new = apply_knobs(chain_graph(), {"in-shapes": "0:4x3+2:4x3+4:7x7+99:1"})
    assert new.tensors[4].shape == (4, 3) and 99 not in new.tensors
    with pytest.raises(BatchError, match="tensor 1 is not an input of the graph"):
        apply_knobs(chain_graph(), {"in-shapes": "1:4x3"})


def test_genindex_output_in_shapes_runs_as_in_benchdnn():
    """harness_f32_all:870 gives GenIndex's output tensor 1 a shape and strides."""
    case = Case("op/f32/genindex.json", (("op-attrs", "0:axis:2"),
                                          ("in-shapes", "0:1x16x32x32*acbd+1:1x16x32x32*acbd")), "t")
    outcome = batch.run_case(case, ROOT)
    assert outcome.state == "passed", outcome.message


@pytest.mark.parametrize("text,sizes", [("1.666667x1", [1, 1]), ("0.6x1", [0, 1]), ("5x11", [5, 11])])
def test_integer_list_attributes_are_read_as_benchdnn_reads_them(text, sizes):
    """benchdnn's string_to_shape stores atof of each dim in an int64."""
    graph = ga.load(ROOT / "op/f32/interpolate_bwd.json")
    assert apply_knobs(graph, {"op-attrs": f"0:sizes:{text}"}).ops[0].attrs["sizes"] == sizes


def test_interpolate_backward_with_truncated_sizes_runs_as_in_benchdnn():
    """harness_bf16_all:200: sizes:1.666667x1 -> [1, 1]; InterpolateBackward
    ignores sizes (diff_src = src; the factors come from the src and diff_dst
    shapes), so the case runs on the --in-shapes and is checked."""
    case = Case("op/f32/interpolate_bwd.json", (("dt", "bf16"), ("in-shapes", "0:2x16x3x11+1:2x16x5x11"),
                                                 ("op-attrs", "0:sizes:1.666667x1")), "t")
    outcome = batch.run_case(case, ROOT)
    assert outcome.state == "passed", outcome.message


@pytest.mark.parametrize("knobs,phrase", [
    ({"op-attrs": "0:nosuch:1"}, "no attribute"),
    ({"op-kind": "0:Frobnicate"}, "unknown op kind"),
    ({"op-kind": "0:ReLU"}, "not a binary op"),
    ({"dt": "s8"}, "only f32, bf16 and f16"),
    ({"tensor-property": "0:sticky"}, "unknown value"),
    ({"attr-fpmath": "bf16:maybe"}, "MODE"),
])
def test_bad_knob_values_are_typed_errors(inputs, knobs, phrase):
    with pytest.raises(BatchError, match=phrase):
        apply_knobs(ga.load(inputs / "op/f32/add.json"), knobs)


# ------------------------------------------------------------------ running
def test_summary_counts_passed_failed_unimplemented_and_missing(inputs, capsys):
    path = write(inputs, "b", "\n".join([
        "--reset --case=op/f32/abs_bwd.json",
        "--op-kind=0:SigmoidBackward,0:TanhBackward --case=op/f32/relu_bwd.json",
        "--reset --expected-n-partitions=2 --case=op/f32/add.json",     # oneDNN gives 1: failed
        "--reset --expected-n-partitions=0 --case=op/f32/prelu_bwd.json",
        "--reset --case=op/f32/not_here.json",
    ]))
    summary = run_batch(path, inputs)
    out = capsys.readouterr().out.splitlines()
    assert [o.state for o in summary.outcomes] == ["passed"] * 3 + ["failed", "passed", "missing"]
    assert out[-1] == "tests:5 passed:4 skipped:0 unimplemented:0 failed:1 missing:1"
    assert any("FAILED" in line and "expected 2 partition(s), got 1" in line for line in out)
    assert any("MISSING" in line and "not_here.json" in line for line in out)
    # every case has its benchdnn line, passed ones too
    assert out[0] == "0:PASSED (%s:1) __REPRO: --graph --case=op/f32/abs_bwd.json" % path
    assert len(out) == 6 + 1
    assert not summary.ok


def test_an_attribute_the_new_kind_does_not_take_fails_as_in_onednn(inputs):
    """relu_bwd.json carries use_dst, which AbsBackward does not take."""
    case = Case("op/f32/relu_bwd.json", (("op-kind", "0:AbsBackward"),), "t")
    outcome = batch.run_case(case, inputs)
    assert outcome.state == "failed" and "unknown attribute 'use_dst'" in outcome.message


def test_a_mismatch_is_a_failure_naming_the_output(inputs, monkeypatch):
    import graph_api.cli
    from graph_api.check import Verdict

    monkeypatch.setattr(graph_api.cli, "compare", lambda *a, **k: Verdict(False, "max |diff| 1"))
    outcome = batch.run_case(Case("op/f32/abs_bwd.json", (), "t"), inputs)
    assert outcome.state == "failed" and outcome.message == "output 2: max |diff| 1"


def test_unsupported_partitions_are_unimplemented(inputs, tmp_path):
    doc = json.loads((inputs / "op/f32/add.json").read_text())
    doc["graph"][0]["kind"] = "Wildcard"
    doc["graph"][0]["attrs"] = {}
    write(inputs, "op/f32/wild.json", json.dumps(doc))
    outcome = batch.run_case(Case("op/f32/wild.json", (), "t"), inputs)
    assert outcome.state == "unimplemented" and "Wildcard" in outcome.message


def test_cli_runs_a_batch_and_exits_1_on_a_failure(inputs, capsys):
    good = write(inputs, "good", "--case=op/f32/abs_bwd.json --case=op/f32/matmul.json")
    assert main(["run", "--batch", str(good), "--workers", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == \
        "tests:2 passed:2 skipped:0 unimplemented:0 failed:0"
    bad = write(inputs, "bad", "--expected-n-partitions=3 --case=op/f32/matmul.json")
    assert main(["run", "--batch", str(bad), "--inputs-root", str(inputs)]) == 1
    assert main(["run", "--batch", str(write(inputs, "worse", "--frob=1"))]) == 2
    assert "unknown knob --frob" in capsys.readouterr().err
    assert main(["run"]) == 2


def test_the_real_op_f32_ci_batch_passes_every_present_case():
    """oneDNN's own ``op/harness_f32_ci`` (small cases: conv, pooling, norms,
    backward ops, binary and eltwise op kinds); absent files are reported missing."""
    lines = []
    summary = run_batch(ROOT / "op/harness_f32_ci", echo=lines.append)
    failed = [line for line in lines if "FAILED" in line or "UNIMPLEMENTED" in line]
    assert not failed, "\n".join(failed)
    assert summary.count("passed") >= 50 and summary.count("missing") == 10
    present = {o.case.path for o in summary.outcomes if o.state != "missing"}
    assert all((ROOT / p).is_file() for p in present)


def test_a_crash_in_one_case_fails_that_case_and_the_batch_goes_on(inputs, monkeypatch):
    from graph_api.kernels.reference import REFERENCE

    def crash(op, inputs_, out_lts, ctx):
        raise ZeroDivisionError("boom")

    monkeypatch.setitem(REFERENCE, ga.OpKind.AbsBackward, crash)
    path = write(inputs, "b", "--case=op/f32/abs_bwd.json --case=op/f32/matmul.json")
    lines = []
    summary = run_batch(path, inputs, echo=lines.append)
    assert [o.state for o in summary.outcomes] == ["failed", "passed"]
    assert "__REPRO: --graph --case=op/f32/abs_bwd.json" in lines[0]
    assert "internal error ZeroDivisionError: boom" in lines[0]


def test_a_batch_keeps_no_compiled_partitions_and_restores_the_cache(inputs):
    """No later case can hit a case's compiled partitions (new partitions each
    case); kept, they grew op/harness_f32_all to 9.8 GB.  The cache is off
    while the batch runs and its capacity is restored afterwards."""
    from graph_api import partition_cache

    partition_cache.set_compiled_partition_cache_capacity(7)
    try:
        path = write(inputs, "b", "--case=op/f32/abs_bwd.json --case=op/f32/matmul.json")
        summary = run_batch(path, inputs, echo=lambda line: None)
        assert [o.state for o in summary.outcomes] == ["passed", "passed"]
        assert len(partition_cache.CACHE._entries) == 0
        assert ga.get_compiled_partition_cache_capacity() == 7
    finally:
        partition_cache.set_compiled_partition_cache_capacity(partition_cache.DEFAULT_CAPACITY)

"""The memory budget (issue 8, defect 7): work whose tensors cannot fit is refused
with ``OutOfMemory`` before anything is allocated, at compile (one partition),
in ``run_graph`` (the whole graph) and on the command line (one error line, exit 2)."""
import json
import subprocess
import sys

import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api import cli, config, memory

GIB = 1 << 30


@pytest.fixture(autouse=True)
def default_budget(monkeypatch):
    """Every test starts from the default budget and leaves it so."""
    monkeypatch.setattr(config.settings, "memory_budget_text", "")
    monkeypatch.setattr(config.settings, "memory_budget_bytes", None)


def lt(i, shape, dtype=dt.f32, prop=ga.PropertyType.variable):
    return ga.LogicalTensor(i, dtype, shape, property=prop)


def matmul_relu(m, k, n, weight_prop=ga.PropertyType.variable):
    """MatMul -> ReLU: one fused partition with one intermediate (tensor 2)."""
    g = ga.Graph()
    g.add_op(ga.Op(0, K.MatMul, [lt(0, [m, k]), lt(1, [k, n], prop=weight_prop)], [lt(2, [m, n])]))
    g.add_op(ga.Op(1, K.ReLU, [lt(2, [m, n])], [lt(3, [m, n])]))
    g.finalize()
    return g


def compile_only(graph, policy=ga.PartitionPolicy.fusion):
    (part,) = graph.get_partitions(policy)
    return part.compile(part.get_input_ports(), part.get_output_ports(), ga.Engine())


# ---------------------------------------------------------------- the setting
@pytest.mark.parametrize("text, expected", [
    ("1500000000", 1_500_000_000), ("512M", 512 << 20), ("8G", 8 * GIB), ("8GiB", 8 * GIB),
    ("1.5g", int(1.5 * GIB)), ("2T", 2 << 40), ("unlimited", None)])
def test_the_environment_value_is_bytes_with_a_binary_suffix(monkeypatch, text, expected):
    monkeypatch.setattr(config.settings, "memory_budget_text", text)
    assert ga.get_memory_budget() == expected


@pytest.mark.parametrize("text", ["0", "-5", "lots", "8X", "1e9", "0.1"])
def test_a_bad_environment_value_is_a_typed_error_naming_the_variable(monkeypatch, text):
    monkeypatch.setattr(config.settings, "memory_budget_text", text)
    with pytest.raises(ga.InvalidArguments, match="GRAPH_API_MEMORY_BUDGET"):
        ga.get_memory_budget()


def test_the_default_is_a_fraction_of_usable_memory():
    usable = config.usable_memory()
    assert usable is not None and usable > GIB  # /proc-less systems are not ours
    assert ga.get_memory_budget() == int(usable * config.DEFAULT_BUDGET_FRACTION)


def test_set_memory_budget_overrides_and_none_restores(monkeypatch):
    monkeypatch.setattr(config.settings, "memory_budget_text", "1G")
    ga.set_memory_budget(12345)
    assert ga.get_memory_budget() == 12345
    ga.set_memory_budget(None)
    assert ga.get_memory_budget() == GIB


@pytest.mark.parametrize("bad", [0, -1, 1.5, "8G", True, [1]])
def test_set_memory_budget_rejects_what_is_not_a_positive_int(bad):
    with pytest.raises(ga.InvalidArguments, match="set_memory_budget"):
        ga.set_memory_budget(bad)


def test_the_environment_variable_is_read_at_import():
    code = ("import graph_api as ga; print(ga.get_memory_budget())")
    env = {**__import__("os").environ, "GRAPH_API_MEMORY_BUDGET": "3M"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(3 << 20)


# ---------------------------------------------------------------- compile
def test_partition_need_counts_inputs_outputs_intermediates_and_constants():
    g = matmul_relu(4, 8, 5, weight_prop=ga.PropertyType.constant)
    (part,) = g.get_partitions()
    cp = part.compile(part.get_input_ports(), part.get_output_ports(), ga.Engine())
    need = memory.partition_need(cp.lts, part.input_ids, part.output_ids)
    # f32 everywhere: x 4x8, w 8x5 (constant: plus its f32 prepared copy), y 4x5, out 4x5
    assert (need.inputs, need.intermediates, need.outputs, need.constants) == \
        (4 * (32 + 40), 4 * 20, 4 * 20, 4 * 40)


def test_compile_refuses_a_partition_over_the_budget_naming_it_and_the_bytes():
    g = matmul_relu(4, 8, 5)
    total = 4 * (32 + 40 + 20 + 20)
    ga.set_memory_budget(total)
    compile_only(g)  # exactly the budget: allowed
    g = matmul_relu(4, 8, 5)  # a fresh graph: compile results are cached per partition
    ga.set_memory_budget(total - 1)
    with pytest.raises(ga.OutOfMemory) as err:
        compile_only(g)
    assert err.value.status == ga.Status.out_of_memory and isinstance(err.value, MemoryError)
    text = str(err.value)
    assert "partition 0 (matmul_post_ops)" in text or "partition 0 (" in text
    assert f"needs {total:,} bytes" in text and f"budget of {total - 1:,} bytes" in text
    assert "intermediates 80 B" in text


def test_compile_refuses_a_100_gb_partition_with_the_default_budget():
    # 160k x 160k f32 = 95 GiB per operand; nothing is allocated before the refusal
    g = matmul_relu(160_000, 160_000, 160_000)
    with pytest.raises(ga.OutOfMemory, match=r"partition 0 .* needs 409,600,000,000 bytes"):
        compile_only(g)


def test_compile_counts_packed_int4_as_half_a_byte():
    g = ga.Graph()
    w, s = lt(0, [64, 32], dt.s4, ga.PropertyType.constant), lt(1, [64, 1], dt.f32)
    g.add_op(ga.Op(0, K.DynamicDequantize, [w, s], [lt(2, [64, 32])],
                   attrs={"qtype": "per_group", "group_shape": [1, 32]}))
    g.finalize()
    cp = compile_only(g)
    need = memory.partition_need(cp.lts, [0, 1], [2])
    assert need.inputs == 64 * 32 // 2 + 64 * 4 and need.constants == 64 * 32 * 4


# ---------------------------------------------------------------- run_graph
def test_run_graph_refuses_the_whole_graph_before_compiling():
    # feeds are zero-stride views: 0 bytes each, however big they look
    g = ga.Graph()
    g.add_op(ga.Op(0, K.ReLU, [lt(0, [-1, 1000])], [lt(1, [-1, 1000])]))
    g.add_op(ga.Op(1, K.Exp, [lt(1, [-1, 1000])], [lt(2, [-1, 1000])]))
    g.finalize()
    rows = 40_000_000  # 40M x 1000 f32 = 149 GiB per tensor
    feeds = {0: np.broadcast_to(np.float32(1), (rows, 1000))}
    parts = g.get_partitions(ga.PartitionPolicy.debug)
    with pytest.raises(ga.OutOfMemory, match=r"the graph \(2 ops, 2 partitions\) needs 480,000,000,000 bytes"):
        ga.run_graph(g, feeds, partitions=parts)
    assert all(not p._cache for p in parts)  # nothing compiled


def test_run_graph_need_keeps_boundaries_and_the_largest_intermediates():
    g = matmul_relu(4, 8, 5)
    need = memory.check_graph(g, g.get_partitions())  # fused: tensor 2 is internal
    assert (need.inputs, need.outputs, need.intermediates) == (4 * 72, 4 * 20, 4 * 20)
    need = memory.check_graph(g, g.get_partitions(ga.PartitionPolicy.debug))  # debug: it is kept
    assert (need.inputs, need.outputs, need.intermediates) == (4 * 72, 4 * 40, 0)


def test_run_graph_runs_within_the_budget():
    g = matmul_relu(4, 8, 5)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((4, 8), np.float32), rng.standard_normal((8, 5), np.float32)
    ga.set_memory_budget(4 * (72 + 40))
    out = ga.run_graph(g, {0: x, 1: w}).outputs[3]
    expected = np.maximum(x.astype(np.float64) @ w.astype(np.float64), 0)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)  # f32 sums of 8 terms
    ga.set_memory_budget(4 * (72 + 40) - 1)
    with pytest.raises(ga.OutOfMemory):
        ga.run_graph(g, {0: x, 1: w})


# ---------------------------------------------------------------- command line
def huge_file(tmp_path):
    def tensor(i, shape, prop="variable"):
        strides = [shape[1], 1]
        return {"id": i, "dtype": "f32", "shape": shape, "stride": strides,
                "layout_type": "strided", "property_type": prop}
    doc = {"version": "3.14.0", "engine_kind": "cpu", "fpmath_mode": "strict", "graph": [
        {"id": 0, "name": "mm", "kind": "MatMul", "attrs": {},
         "inputs": [tensor(0, [200000, 100000]), tensor(1, [100000, 200000], "constant")],
         "outputs": [tensor(2, [200000, 200000])]}]}
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(doc))
    return path


def test_cli_refuses_a_huge_graph_with_one_line_and_exit_2(tmp_path, capsys):
    code = cli.main(["run", str(huge_file(tmp_path)), "--check"])
    out, err = capsys.readouterr()
    assert code == cli.EXIT_ERROR and out == ""
    assert err.count("\n") == 1 and err.startswith("graph-api: error: [out_of_memory] the graph")
    assert "400,000,000,000 bytes" in err and "GRAPH_API_MEMORY_BUDGET" in err


def test_cli_in_a_subprocess_sees_the_environment_budget(tmp_path):
    small = tmp_path / "small.json"
    small.write_text(matmul_relu(4, 8, 5).to_json())
    env = {**__import__("os").environ, "GRAPH_API_MEMORY_BUDGET": "100"}
    proc = subprocess.run([sys.executable, "-m", "graph_api", "run", str(small)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("graph-api: error: [out_of_memory]") and "budget of 100 bytes" in proc.stderr
    env["GRAPH_API_MEMORY_BUDGET"] = "nonsense"
    proc = subprocess.run([sys.executable, "-m", "graph_api", "run", str(small)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "GRAPH_API_MEMORY_BUDGET" in proc.stderr


def test_cli_turns_an_unforeseen_memory_error_into_one_line(tmp_path, capsys, monkeypatch):
    small = tmp_path / "small.json"
    small.write_text(matmul_relu(4, 8, 5).to_json())

    def refuse(*args, **kwargs):
        raise MemoryError("Unable to allocate 93.1 GiB")

    monkeypatch.setattr(cli.fill, "fill_inputs", refuse)
    code = cli.main(["run", str(small)])
    out, err = capsys.readouterr()
    assert code == cli.EXIT_ERROR and err.count("\n") == 1 and "[out_of_memory]" in err


# ---------------------------------------------------------------- what plans allocate (issue 33)
def test_an_allocation_past_the_budget_in_a_working_block_names_it_and_the_bytes():
    ga.set_memory_budget(1000)
    with memory.working("partition 7 (demo)", counted=600) as work:
        kept = memory.empty(300, np.uint8, "a buffer")
        assert work.held == 0  # below the tracking size: checked, not tracked
        with pytest.raises(ga.OutOfMemory) as err:
            memory.empty(401, np.uint8, "the scratchpad")
    assert "partition 7 (demo): the scratchpad needs 401 bytes (401 B); with the 600 bytes" in str(err.value)
    assert "budget of 1,000 bytes" in str(err.value) and kept.size == 300


def test_a_working_block_counts_what_it_holds_until_it_is_freed():
    ga.set_memory_budget(3 << 20)
    with memory.working("partition 1 (demo)") as work:
        a = memory.empty(2 << 20, np.uint8, "a")
        assert work.held == 2 << 20
        with pytest.raises(ga.OutOfMemory, match="partition 1"):
            memory.empty(2 << 20, np.uint8, "b")
        del a
        assert work.held == 0
        memory.empty(2 << 20, np.uint8, "b")  # fits again
    assert work.peak == 2 << 20


def test_a_system_memory_error_in_a_working_block_is_out_of_memory_naming_it():
    with pytest.raises(ga.OutOfMemory, match=r"partition 3 \(x\): the system refused an allocation"):
        with memory.working("partition 3 (x)"):
            raise MemoryError("Unable to allocate 4.5 GiB")


def test_compile_turns_a_plans_memory_error_into_out_of_memory(monkeypatch):
    """The epilogue's offset table (4.5 GiB for a 1.1 GiB tensor) failed as a bare
    MemoryError at compile; any plan allocation that fails now names the partition."""
    from graph_api.kernels import store

    def refuse(*args, **kwargs):
        raise MemoryError("Unable to allocate 4.50 GiB for an array with shape (1048576, 1152)")

    monkeypatch.setattr(store, "row_col_offsets", refuse)
    monkeypatch.setattr(store, "element_offsets", refuse)
    with pytest.raises(ga.OutOfMemory, match=r"partition 0 \(.*\): the system refused an allocation"):
        compile_only(matmul_relu(4, 8, 5))


def test_compile_does_not_skip_a_warm_up_that_ran_out_of_memory(monkeypatch):
    """The warm-up swallowed every exception (a MemoryError too) and compile
    succeeded; execute would then fail the same way."""
    from graph_api import backend

    def refuse(plan, request):
        raise MemoryError("Unable to allocate")

    monkeypatch.setattr(backend, "_run_on_placeholders", refuse)
    monkeypatch.setattr(backend, "_WARMED", type(backend._WARMED)())
    with pytest.raises(ga.OutOfMemory, match=r"partition 0 "):
        compile_only(matmul_relu(4, 8, 6))


def tensors_for(cp, part, rng):
    ins = [ga.Tensor(cp.query_logical_tensor(t), None,
                     rng.standard_normal(cp.query_logical_tensor(t).shape).astype(np.float32))
           for t in part.input_ids]
    return ins, [ga.Tensor(cp.query_logical_tensor(t)) for t in part.output_ids]


def test_execute_turns_a_plans_memory_error_into_out_of_memory(monkeypatch):
    g = matmul_relu(4, 8, 7)
    (part,) = g.get_partitions()
    cp = compile_only(g)
    ins, outs = tensors_for(cp, part, np.random.default_rng(0))

    def refuse(inputs, outputs):
        raise MemoryError("Unable to allocate 93.1 GiB")

    monkeypatch.setattr(cp.plan, "execute", refuse)
    with pytest.raises(ga.OutOfMemory, match=r"partition 0 \(.*\): the system refused an allocation"):
        cp.execute(ga.Stream(ga.Engine()), ins, outs)


def test_execute_counts_intermediates_against_the_budget():
    """The fused plan's f32 intermediate (1 MiB) is taken at execute: past the
    budget it is refused, naming the partition and the bytes; the scratchpad an
    engine's allocator gives is counted the same way."""
    g = matmul_relu(512, 8, 512)
    (part,) = g.get_partitions(ga.PartitionPolicy.fusion)
    cp = compile_only(g)
    ins, outs = tensors_for(cp, part, np.random.default_rng(1))
    stream = ga.Stream(ga.Engine())
    cp.execute(stream, ins, outs)
    assert cp.scratch_bytes, f"plan {cp.plan.name} took no scratchpad: the test checks nothing of it"
    ga.set_memory_budget(cp.need.total - cp.need.intermediates + cp.scratch_bytes // 2)
    with pytest.raises(ga.OutOfMemory, match=r"partition 0 \(.*\): an intermediate needs 1,048,576 bytes"):
        cp.execute(stream, ins, outs)
    stream = ga.Stream(ga.Engine(allocator=ga.Allocator()))
    with pytest.raises(ga.OutOfMemory, match=rf"partition 0 \(.*\): the scratchpad needs {cp.scratch_bytes:,} bytes"):
        cp.execute(stream, ins, outs)


def input_graph(shape, dtype=dt.f32):
    g = ga.Graph()
    g.add_op(ga.Op(0, K.ReLU, [lt(0, list(shape), dtype)], [lt(1, list(shape), dtype)]))
    g.finalize()
    return g


def test_fill_checks_its_temporaries_against_the_budget_naming_the_tensor():
    from graph_api import fill

    g = input_graph((1024, 1024))  # 4 MiB of f32; its fill holds 12 MiB at most
    ga.set_memory_budget(8 << 20)
    with pytest.raises(ga.OutOfMemory, match=r"filling input tensor 0 \(f32 \[1024, 1024\]\): its values"):
        fill.fill_inputs(g)
    ga.set_memory_budget(16 << 20)
    assert fill.fill_inputs(g)[0].shape == (1024, 1024)


def test_fill_turns_the_systems_refusal_into_out_of_memory(monkeypatch):
    from graph_api import fill

    def refuse(*args):
        raise MemoryError("Unable to allocate 4.00 GiB")

    monkeypatch.setattr(fill, "_uniform", refuse)
    with pytest.raises(ga.OutOfMemory, match=r"filling input tensor 0 .*the system refused an allocation"):
        fill.fill_inputs(input_graph((4, 4)))


def test_sdpa_working_memory_counts_against_the_budget_at_execute():
    """The SDPA's split partials and merge buffers (a bare MemoryError at run in
    kernels/sdpa with a batch of 2^20) are taken through the budget."""
    from ..patterns import graphs

    g = graphs.sdpa(mask=None, s=64)
    (part,) = g.get_partitions()
    cp = compile_only(g)
    ins, outs = tensors_for(cp, part, np.random.default_rng(2))
    stream = ga.Stream(ga.Engine())
    cp.execute(stream, ins, outs)
    ga.set_memory_budget(cp.need.total - cp.need.intermediates + 64)
    with pytest.raises(ga.OutOfMemory, match=r"partition 0 \(sdpa\): the SDPA .* needs \d+ bytes"):
        cp.execute(stream, ins, outs)

"""Scratchpad (``get_scratchpad_logical_tensor``, ``execute(..., scratchpad)``) and
a user allocator on the engine (``make_engine_with_allocator``).

The partitions here materialise intermediates: a quantized MatMul keeps its f32
chain value before the reference Quantize tail, gated MLP its up/gate
products, the JAX MQA per-op plan every tensor between its ops (SDPA backward, the
earlier per-op case, has a fused kernel now).  Results
are compared with the unfused reference plan (GRAPH_API_REFERENCE) by
graph_api.check's rule (the rule every fused kernel is held to: inputs are
filled with small integers, so MatMul sums are exact in f32 and most outputs
match bit for bit).
"""
import numpy as np
import pytest

import graph_api as ga
from graph_api.check import compare
from graph_api.config import settings
from graph_api.fill import fill_inputs
from tests.patterns import graphs

CASES = {
    "quantized_matmul": graphs.quantized_matmul,
    "gated_mlp": graphs.gated_mlp,
    "mqa_jax_per_op": graphs.jax_mqa,
}


class CountingAllocator:
    """Hands out numpy byte buffers filled with a sentinel and records every call."""

    def __init__(self):
        self.allocated, self.freed = [], []

    def allocate(self, size, alignment):
        buffer = np.full(size + alignment, 0xAB, np.uint8)
        self.allocated.append((size, alignment, buffer))
        return buffer

    def free(self, buffer):
        self.freed.append(buffer)


def _compile(graph, engine):
    part, = graph.get_partitions()
    compiled = part.compile(part.get_input_ports(), part.get_output_ports(), engine)
    return part, compiled


def _tensors(part, compiled, feeds, engine):
    ins = [ga.Tensor(compiled.query_logical_tensor(t), engine, feeds[t]) for t in part.input_ids]
    outs = [ga.Tensor(compiled.query_logical_tensor(t), engine) for t in part.output_ids]
    return ins, outs


def _reference(graph, feeds, monkeypatch):
    monkeypatch.setattr(settings, "reference", True)
    try:
        return ga.run_graph(graph, feeds).outputs
    finally:
        monkeypatch.setattr(settings, "reference", False)


def _assert_matches(graph, outs, want):
    for t in outs:
        verdict = compare(want[t.lt.id], t.numpy(), t.lt.dtype, graph.fpmath)
        assert verdict.ok, f"output {t.lt.id}: {verdict.message}"


@pytest.mark.parametrize("name", list(CASES))
def test_intermediates_come_from_the_engine_allocator(name, monkeypatch):
    graph = CASES[name]()
    feeds = fill_inputs(graph)
    alloc = CountingAllocator()
    engine = ga.make_engine_with_allocator(ga.EngineKind.cpu, 0, ga.Allocator(alloc.allocate, alloc.free))
    part, compiled = _compile(graph, engine)
    scratch_lt = compiled.get_scratchpad_logical_tensor()
    assert scratch_lt.dtype == ga.DataType.u8 and scratch_lt.ndims == 1
    assert scratch_lt.get_mem_size() == compiled.scratch_bytes > 0
    assert alloc.allocated == []  # compiling takes nothing from the allocator
    ins, outs = _tensors(part, compiled, feeds, engine)
    for run in range(1, 4):
        compiled.execute(ga.Stream(engine), ins, outs)
        # one scratchpad per execution, of the advertised size, given back after it
        assert len(alloc.allocated) == len(alloc.freed) == run
        size, alignment, buffer = alloc.allocated[-1]
        assert (size, alignment) == (scratch_lt.get_mem_size(), 64) and alloc.freed[-1] is buffer
        assert np.any(buffer[:size] != 0xAB), "the plan wrote nothing into the allocator's memory"
        assert np.all(buffer[size:] == 0xAB), "the plan wrote past the scratchpad"
    _assert_matches(graph, outs, _reference(graph, feeds, monkeypatch))


@pytest.mark.parametrize("name", list(CASES))
def test_a_user_scratchpad_replaces_the_allocator(name, monkeypatch):
    graph = CASES[name]()
    feeds = fill_inputs(graph)
    alloc = CountingAllocator()
    engine = ga.make_engine_with_allocator(ga.EngineKind.cpu, 0, ga.Allocator(alloc.allocate, alloc.free))
    part, compiled = _compile(graph, engine)
    scratch_lt = compiled.get_scratchpad_logical_tensor()
    # oneDNN's tensor(lt, engine, handle + offset): an odd offset, so the start is unaligned
    memory = np.full(scratch_lt.get_mem_size() + 3, 0xCD, np.uint8)
    scratchpad = ga.Tensor(scratch_lt, engine, memory, offset=3)
    ins, outs = _tensors(part, compiled, feeds, engine)
    compiled.execute(ga.Stream(engine), ins, outs, scratchpad)
    assert alloc.allocated == [] and np.any(memory[3:] != 0xCD) and np.all(memory[:3] == 0xCD)
    _assert_matches(graph, outs, _reference(graph, feeds, monkeypatch))


def test_a_scratchpad_too_small_is_refused_before_running():
    graph = graphs.quantized_matmul()
    part, compiled = _compile(graph, ga.Engine())
    need = compiled.scratch_bytes
    small = ga.Tensor(ga.LogicalTensor(0, ga.DataType.u8, [need - 1], ga.LayoutType.strided))
    ins, outs = _tensors(part, compiled, fill_inputs(graph), None)
    before = [t.numpy().copy() for t in outs]
    with pytest.raises(ga.InvalidArguments, match=f"needs {need}"):
        compiled.execute(ga.Stream(ga.Engine()), ins, outs, small)
    assert all(np.array_equal(b, t.numpy()) for b, t in zip(before, outs))


def test_an_allocator_without_memory_is_out_of_memory():
    engine = ga.make_engine_with_allocator(ga.EngineKind.cpu, 0, ga.Allocator(lambda size, align: None, lambda b: None))
    graph = graphs.quantized_matmul()
    part, compiled = _compile(graph, engine)
    ins, outs = _tensors(part, compiled, fill_inputs(graph), engine)
    with pytest.raises(ga.OutOfMemory, match="allocator returned None"):
        compiled.execute(ga.Stream(engine), ins, outs)


def test_a_partition_without_intermediates_needs_no_scratchpad():
    part, compiled = _compile(graphs.matmul_chain(post=("relu",)), ga.Engine())
    assert compiled.get_scratchpad_logical_tensor().get_mem_size() == 0

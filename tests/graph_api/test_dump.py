"""Graph dumps (oneDNN's set_dump_mode / ONEDNN_GRAPH_DUMP=graph,subgraph): the files are
oneDNN graph JSON with oneDNN's names, and each replays (ga.load, graph-api run) to the
numbers the dumped graph or partition computed."""
import json

import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api import cli, dump
from graph_api.config import settings

RNG = np.random.default_rng(3)


@pytest.fixture
def dumping(tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "dump_dir", str(tmp_path))
    saved = ga.get_dump_mode()
    ga.set_dump_mode(ga.GraphDumpMode.graph | ga.GraphDumpMode.subgraph)
    yield tmp_path
    ga.set_dump_mode(saved)


def _graph():
    """MatMul -> ReLU (one partition), then SoftMax over its output (another)."""
    g = ga.Graph(ga.EngineKind.cpu)
    x, w = ga.LogicalTensor(0, dt.f32, [4, 8]), ga.LogicalTensor(1, dt.f32, [8, 6])
    y, r = ga.LogicalTensor(2, dt.f32, [4, 6]), ga.LogicalTensor(3, dt.f32, [4, 6])
    s = ga.LogicalTensor(4, dt.f32, [4, 6])
    g.add_op(ga.Op(10, K.MatMul, [x, w], [y], name="mm"))
    g.add_op(ga.Op(11, K.ReLU, [y], [r]))
    g.add_op(ga.Op(12, K.SoftMax, [r], [s], attrs={"axis": -1}))
    g.finalize()
    return g


def _want(x, w):
    r = np.maximum(x.astype(np.float64) @ w.astype(np.float64), 0)
    e = np.exp(r - r.max(-1, keepdims=True))
    return r, e / e.sum(-1, keepdims=True)


def test_graph_partitioning_and_subgraph_files_replay(dumping, capsys):
    g = _graph()
    parts = g.get_partitions()
    gid = dump.graph_id(g)
    whole = ga.load(dumping / f"graph-{gid}.json")
    assert sorted(whole.ops) == [10, 11, 12]
    doc = json.loads((dumping / f"graph-{gid}-partitioning.json").read_text())
    tags = {op["id"]: op["attrs"]["partition_id"]["value"] for op in doc["graph"]}
    assert tags == {op.id: str(p.get_id()) for p in parts for op in p.ops}
    assert all(op["attrs"]["backend"]["value"] == "graph_api" for op in doc["graph"])
    ga.load(dumping / f"graph-{gid}-partitioning.json")  # the tags are kept aside, not op attributes

    x = RNG.standard_normal((4, 8)).astype(np.float32)
    w = RNG.standard_normal((8, 6)).astype(np.float32)
    run = ga.run_graph(g, {0: x, 1: w})
    want_r, want_s = _want(x, w)
    np.testing.assert_allclose(run.outputs[4], want_s, rtol=1e-5, atol=1e-6)
    subs = sorted(dumping.glob(f"graph-{gid}-[0-9]*.json"))
    assert len(subs) == len(parts)
    for path in subs:
        sub = ga.load(path)
        feeds = {tid: {0: x, 1: w, 3: run.outputs.get(3)}[tid] for tid in sub.input_ids}
        if any(v is None for v in feeds.values()):  # the partition's input is internal to the graph run
            feeds = {tid: want_r.astype(np.float32) for tid in sub.input_ids}
        out = ga.run_graph(sub, feeds).outputs[sub.output_ids[0]]
        ref = want_s if sub.output_ids[0] == 4 else want_r
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
        assert all(sub.tensors[t].is_shape_known() for t in sub.input_ids + sub.output_ids)
        assert cli.main(["run", str(path), "--check"]) == 0
    capsys.readouterr()


def test_mode_none_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "dump_dir", str(tmp_path))
    saved = ga.get_dump_mode()
    ga.set_dump_mode(ga.GraphDumpMode.none)
    try:
        g = _graph()
        ga.run_graph(g, {0: np.ones((4, 8), np.float32), 1: np.ones((8, 6), np.float32)})
    finally:
        ga.set_dump_mode(saved)
    assert list(tmp_path.iterdir()) == []


def test_modes_parse_and_bad_ones_raise():
    assert dump.parse_mode("graph,subgraph") == ga.GraphDumpMode.graph | ga.GraphDumpMode.subgraph
    assert dump.parse_mode(" Subgraph ") == ga.GraphDumpMode.subgraph
    assert dump.parse_mode("") == dump.parse_mode("none") == ga.GraphDumpMode.none
    with pytest.raises(ga.InvalidArguments, match="GRAPH_API_DUMP.*'graphs'"):
        dump.parse_mode("graphs")
    saved = ga.get_dump_mode()
    try:
        for bad in (4, -1, True, 2.0):
            with pytest.raises(ga.InvalidArguments, match="set_dump_mode"):
                ga.set_dump_mode(bad)
        ga.set_dump_mode("graph")
        assert ga.get_dump_mode() == ga.GraphDumpMode.graph
        ga.set_dump_mode(3)
        assert ga.get_dump_mode() == ga.GraphDumpMode.graph | ga.GraphDumpMode.subgraph
    finally:
        ga.set_dump_mode(saved)

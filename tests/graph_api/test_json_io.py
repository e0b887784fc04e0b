"""oneDNN graph JSON: round trip of every conformance file, the format's quirks, typed errors."""
import copy
import json
from pathlib import Path

import pytest

import graph_api as ga
from graph_api import json_io
from graph_api.json_io import INT64_MIN, KIND_ALIASES

from ..conformance_files import FILES, ROOT as CONFORMANCE, params


def signature(graph) -> dict:
    """Everything a file records, in comparable form."""
    meta = graph.json_meta
    return {
        "version": meta.version, "engine": graph.recorded_engine_kind, "fpmath": graph.fpmath,
        "has_apply_to_int": meta.has_apply_to_int, "input_ports": meta.input_ports,
        "output_ports": meta.output_ports, "dump_attrs": meta.dump_attrs,
        "ops": [(op.id, op.name, op.kind, op.attrs, [lt.key() for lt in op.inputs],
                 [lt.key() for lt in op.outputs]) for op in graph.ops.values()],
    }


def tensor(tid, dtype="f32", shape=(2, 3), stride=None, layout="strided", prop="undef"):
    if stride is None:
        stride = [3, 1] if list(shape) == [2, 3] else [INT64_MIN]
    return {"id": tid, "dtype": dtype, "shape": list(shape), "stride": list(stride),
            "layout_type": layout, "property_type": prop}


def relu_doc(**top) -> dict:
    """A two-op graph: MatMul(0, 1) -> 2 -> ReLU -> 3."""
    doc = {"version": "3.5.0", "engine_kind": "cpu", "fpmath_mode": "strict",
           "fpmath_mode_apply_to_int": "false", "input_ports": [0, 1], "output_ports": [3],
           "graph": [
               {"id": 7, "name": "mm", "kind": "MatMul",
                "attrs": {"transpose_b": {"type": "bool", "value": 1}},
                "inputs": [tensor(0), tensor(1)], "outputs": [tensor(2, shape=(2, 2), stride=[2, 1])]},
               {"id": 8, "name": "relu", "kind": "ReLU", "attrs": {},
                "inputs": [tensor(2, shape=(2, 2), stride=[2, 1])],
                "outputs": [tensor(3, shape=(2, 2), stride=[2, 1])]},
           ]}
    doc.update(top)
    return doc


def write(tmp_path, doc, name="g.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


# ================================================================ every conformance file
def test_the_conformance_folder_is_there():
    assert len(FILES) >= 100, f"expected the oneDNN graphs under {CONFORMANCE}"


@pytest.mark.parametrize("path", params())
def test_round_trip_is_identical(path, tmp_path):
    first = ga.load(path)
    out = tmp_path / "again.json"
    ga.save(first, out)
    second = ga.load(out)
    assert signature(second) == signature(first)
    assert second.to_json() == first.to_json()  # writing is a fixed point
    assert second.input_ids == first.input_ids and second.output_ids == first.output_ids


@pytest.mark.parametrize("path", params())
def test_loaded_graph_matches_the_file(path):
    doc = json.loads(path.read_text())
    graph = ga.load(path)
    assert [op.id for op in graph.ops.values()] == [o["id"] for o in doc["graph"]]  # insertion order
    assert graph.engine_kind == ga.EngineKind.cpu and graph.recorded_engine_kind == doc["engine_kind"]
    assert graph.fpmath.mode.name == doc["fpmath_mode"]
    assert graph.fpmath.apply_to_int == (doc.get("fpmath_mode_apply_to_int") == "true")
    assert graph.json_meta.input_ports == doc.get("input_ports")
    for op_doc in doc["graph"]:
        op = graph.ops[op_doc["id"]]
        assert op.kind.name == KIND_ALIASES.get(op_doc["kind"], op_doc["kind"])
        assert op.name == op_doc["name"]
        for key, entry in op_doc.get("attrs", {}).items():
            expected = bool(entry["value"]) if entry["type"] == "bool" else entry["value"]
            assert op.attrs[key] == expected, key
        for lt, t in zip(op.inputs + op.outputs, op_doc["inputs"] + op_doc["outputs"]):
            assert lt.id == t["id"] and lt.dtype.name == t["dtype"]
            if t["shape"] == [INT64_MIN]:
                assert lt.shape is None
            else:
                assert list(lt.shape) == [-1 if d == INT64_MIN else d for d in t["shape"]]
            if t["layout_type"] == "strided" and INT64_MIN not in t["stride"]:
                assert list(lt.strides) == t["stride"]
            assert lt.layout.name == t["layout_type"] and lt.property.name == t["property_type"]


# ================================================================ quirks
def test_apply_to_int_is_a_string_and_absent_in_old_files(tmp_path):
    graph = ga.load(write(tmp_path, relu_doc(fpmath_mode="f16", fpmath_mode_apply_to_int="true")))
    assert graph.fpmath == ga.FPMath.make("f16", True)
    assert json.loads(graph.to_json())["fpmath_mode_apply_to_int"] == "true"
    old = relu_doc()
    del old["fpmath_mode_apply_to_int"]
    graph = ga.load(write(tmp_path, old))
    assert graph.fpmath.apply_to_int is False
    assert "fpmath_mode_apply_to_int" not in json.loads(graph.to_json())  # written as it was read


def test_bools_are_0_1_and_f32_values_are_floats(tmp_path):
    doc = relu_doc()
    doc["graph"][1] = {"id": 8, "name": "clamp", "kind": "Clamp",
                       "attrs": {"min": {"type": "f32", "value": 0}, "max": {"type": "f32", "value": 6}},
                       "inputs": doc["graph"][1]["inputs"], "outputs": doc["graph"][1]["outputs"]}
    graph = ga.load(write(tmp_path, doc))
    assert graph.ops[7].attrs["transpose_b"] is True
    assert graph.ops[8].attrs["max"] == 6.0 and isinstance(graph.ops[8].attrs["max"], float)
    written = json.loads(graph.to_json())["graph"]
    assert written[0]["attrs"]["transpose_b"] == {"type": "bool", "value": 1}
    assert written[0]["attrs"]["transpose_a"] == {"type": "bool", "value": 0}  # default written in
    assert written[1]["attrs"]["max"] == {"type": "f32", "value": 6.0}
    assert isinstance(written[1]["attrs"]["max"]["value"], float)


def test_missing_ports_and_attrs(tmp_path):
    doc = relu_doc()
    del doc["input_ports"], doc["output_ports"], doc["graph"][1]["attrs"]
    graph = ga.load(write(tmp_path, doc))
    assert graph.input_ids == [0, 1] and graph.output_ids == [3]
    written = json.loads(graph.to_json())
    assert "input_ports" not in written and "output_ports" not in written
    assert written["graph"][1]["attrs"] == {}


def test_ports_of_a_python_built_graph_are_derived():
    g = ga.Graph()
    g.add_op(ga.Op(0, ga.OpKind.ReLU, [ga.LogicalTensor(0, "f32", (4,))], [ga.LogicalTensor(1, "f32", (4,))]))
    doc = json.loads(g.to_json())
    assert doc["input_ports"] == [0] and doc["output_ports"] == [1]
    assert doc["version"] == json_io.WRITER_VERSION and doc["fpmath_mode_apply_to_int"] == "false"
    assert signature(ga.Graph.from_json(g.to_json()))["ops"][0][2] == ga.OpKind.ReLU


def test_duplicate_port_ids_are_kept(tmp_path):
    graph = ga.load(write(tmp_path, relu_doc(input_ports=[0, 1, 0, 1, 0])))
    assert graph.json_meta.input_ports == [0, 1, 0, 1, 0]
    assert json.loads(graph.to_json())["input_ports"] == [0, 1, 0, 1, 0]
    assert graph.input_ids == [0, 1]  # the graph's own inputs are unique


def test_stale_port_ids_are_recorded_not_trusted(tmp_path):
    graph = ga.load(write(tmp_path, relu_doc(input_ports=[0, 1, 42], output_ports=[99])))
    assert graph.output_ids == [3] and graph.json_meta.output_ports == [99]


def test_unknown_shapes_and_strides_round_trip(tmp_path):
    doc = relu_doc()
    unknown = tensor(2, shape=[INT64_MIN], stride=[INT64_MIN], layout="undef")
    partial = tensor(2, shape=[2, INT64_MIN], stride=[INT64_MIN], layout="undef")
    doc["graph"][0]["outputs"] = [unknown]
    doc["graph"][1]["inputs"] = [partial]
    doc["graph"][1]["outputs"] = [tensor(3, shape=[2, 2], stride=[INT64_MIN], layout="undef")]
    graph = ga.load(write(tmp_path, doc))
    assert graph.ops[7].outputs[0].shape is None and graph.ops[7].outputs[0].strides is None
    assert graph.ops[8].inputs[0].shape == (2, -1)
    assert graph.tensors[2].shape == (2, 2)  # inferred at finalize
    written = json.loads(graph.to_json())["graph"]
    assert written[0]["outputs"][0]["shape"] == [INT64_MIN] and written[0]["outputs"][0]["stride"] == [INT64_MIN]
    assert written[1]["inputs"][0]["shape"] == [2, INT64_MIN]
    assert written[1]["outputs"][0] == tensor(3, shape=[2, 2], stride=[INT64_MIN], layout="undef")


def test_transposed_strides_of_compressed_k_are_kept():
    path = CONFORMANCE / "complex_fusion/mha/sdpa-compressed-kv-int4-gs32.json"
    graph = ga.load(path)
    k = graph.tensors[0]
    assert k.dtype == ga.DataType.s4 and k.strides == (131072, 4096, 1, 128)
    written = json.loads(graph.to_json())["graph"][0]["inputs"][0]
    assert written["stride"] == [131072, 4096, 1, 128]


def test_gpu_file_loads_as_cpu_and_keeps_its_engine_kind(tmp_path):
    graph = ga.load(write(tmp_path, relu_doc(engine_kind="gpu")))
    assert graph.engine_kind == ga.EngineKind.cpu and graph.recorded_engine_kind == "gpu"
    assert json.loads(graph.to_json())["engine_kind"] == "gpu"
    assert all(p.get_engine_kind() == ga.EngineKind.cpu for p in graph.get_partitions())


def test_dump_only_attrs_are_kept_aside(tmp_path):
    doc = relu_doc()
    doc["graph"][0]["attrs"]["partition_id"] = {"type": "string", "value": "0"}
    doc["graph"][0]["attrs"]["backend"] = {"type": "string", "value": "dnnl_backend"}
    graph = ga.load(write(tmp_path, doc))
    assert "backend" not in graph.ops[7].attrs
    assert json.loads(graph.to_json())["graph"][0]["attrs"]["backend"]["value"] == "dnnl_backend"


def test_from_json_takes_text_dicts_and_paths(tmp_path):
    doc = relu_doc()
    for source in (json.dumps(doc), doc, write(tmp_path, doc), str(write(tmp_path, doc))):
        assert signature(ga.Graph.from_json(source))["ops"] == signature(ga.load(write(tmp_path, doc)))["ops"]
    assert not ga.Graph.from_json(doc, finalize=False).is_finalized()


# ================================================================ typed errors
def mutate(fn):
    doc = copy.deepcopy(relu_doc())
    fn(doc)
    return doc


BAD = {
    "not json": ("{ not json", ga.InvalidGraph, ["not valid JSON"]),
    "not an object": ("[1, 2]", ga.InvalidGraph, ["top level"]),
    "missing graph": (mutate(lambda d: d.pop("graph")), ga.InvalidGraph, ["'graph'", "missing"]),
    "bad fpmath": (mutate(lambda d: d.update(fpmath_mode="f64")), ga.InvalidGraph, ["fpmath_mode", "f64"]),
    "bad apply_to_int": (mutate(lambda d: d.update(fpmath_mode_apply_to_int="yes")), ga.InvalidGraph,
                         ["fpmath_mode_apply_to_int"]),
    "missing op key": (mutate(lambda d: d["graph"][1].pop("kind")), ga.InvalidGraphOp, ["op 8", "'kind'"]),
    "unknown op kind": (mutate(lambda d: d["graph"][1].update(kind="Frobnicate")), ga.InvalidGraphOp,
                        ["op 8", "kind", "Frobnicate"]),
    "unknown attribute": (mutate(lambda d: d["graph"][0]["attrs"].update(alpha={"type": "f32", "value": 1})),
                          ga.InvalidGraphOp, ["op 7", "attrs.alpha", "unknown attribute"]),
    "wrong attribute type": (mutate(lambda d: d["graph"][0]["attrs"].update(
        transpose_b={"type": "s64", "value": 1})), ga.InvalidGraphOp, ["op 7", "attrs.transpose_b", "s64", "bool"]),
    "value not of its type": (mutate(lambda d: d["graph"][0]["attrs"].update(
        transpose_b={"type": "bool", "value": "yes"})), ga.InvalidGraphOp, ["op 7", "attrs.transpose_b.value"]),
    "unknown attribute type": (mutate(lambda d: d["graph"][0]["attrs"].update(
        transpose_b={"type": "int", "value": 1})), ga.InvalidGraphOp, ["op 7", "attrs.transpose_b.type"]),
    "missing tensor key": (mutate(lambda d: d["graph"][0]["inputs"][1].pop("dtype")), ga.InvalidGraphOp,
                           ["op 7", "inputs[1]", "'dtype'"]),
    "bad shape": (mutate(lambda d: d["graph"][0]["inputs"][1].update(shape="2x3")), ga.InvalidGraphOp,
                  ["op 7", "inputs[1].shape"]),
    "unknown dtype": (mutate(lambda d: d["graph"][0]["inputs"][1].update(dtype="f31")), ga.InvalidDataType,
                      ["op 7", "inputs[1]", "f31"]),
    "inconsistent tensor ids": (mutate(lambda d: d["graph"][1]["inputs"][0].update(shape=[2, 5], stride=[5, 1])),
                                ga.InvalidGraph, ["tensor 2", "different metadata"]),
    "two producers": (mutate(lambda d: d["graph"][1]["outputs"][0].update(id=2)), ga.InvalidGraph,
                      ["tensor 2", "produced by both"]),
    "cycle": (mutate(lambda d: d["graph"][0]["inputs"].__setitem__(0, tensor(3, shape=(2, 2), stride=[2, 1]))),
              ga.InvalidGraph, ["cycle"]),
    "duplicate op id": (mutate(lambda d: d["graph"][1].update(id=7)), ga.InvalidGraph, ["op id 7", "twice"]),
    "schema violation": (mutate(lambda d: d["graph"][0]["inputs"].pop()), ga.InvalidGraphOp, ["op 7", "inputs"]),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_files_raise_typed_errors_naming_file_op_and_key(case, tmp_path):
    doc, error, words = BAD[case]
    path = write(tmp_path, doc, "bad-case.json")
    with pytest.raises(error) as info:
        ga.load(path)
    message = str(info.value)
    assert "bad-case.json" in message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        ga.load(tmp_path / "nowhere.json")


def test_binary_file_is_not_json(tmp_path):
    path = tmp_path / "blob.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ga.InvalidGraph, match="blob.json: not valid JSON"):
        ga.load(path)

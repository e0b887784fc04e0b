"""Sparse encodings (seed 003): notation, presets, rules, the logical tensor keyword, JSON."""
import json

import pytest

import graph_api as ga
from graph_api import sparse_encoding as se
from graph_api.enums import OpKind as K

PRESETS = {
    "CSR": (se.csr(), "(i, j) -> (i : dense, j : compressed)"),
    "CSC": (se.csc(), "(i, j) -> (j : dense, i : compressed)"),
    "COO": (se.coo(), "(i, j) -> (i : compressed(nonunique), j : singleton)"),
    "DCSR": (se.dcsr(), "(i, j) -> (i : compressed, j : compressed)"),
    "BCSR2x3": (se.bcsr(2, 3), "(i, j) -> (i floordiv 2 : dense, j floordiv 3 : compressed, "
                               "i mod 2 : dense, j mod 3 : dense)"),
    "2:4": (se.nm(2, 4), "(i, j) -> (i : dense, j floordiv 4 : dense, j mod 4 : compressed(2:4))"),
    "batched CSR": (se.csr(batch=1), "(b0, i, j) -> (b0 : dense, i : dense, j : compressed)"),
}


@pytest.mark.parametrize("name", PRESETS)
def test_preset_prints_the_seed_notation_and_parses_back(name):
    enc, text = PRESETS[name]
    assert str(enc) == text
    assert se.parse(text) == enc
    assert se.parse(f"#sparse_tensor.encoding<{text}>") == enc


@pytest.mark.parametrize("name", ["CSR", "CSC", "COO", "DCSR", "2:4", "BCSR2x3", "bcsr4x4"])
def test_preset_names_parse(name):
    assert se.parse(name) == {"bcsr4x4": se.bcsr(4, 4)}.get(name, PRESETS.get(name, (None,))[0])


def test_seed_bcsr_example_with_compressed_block_rows():
    enc = se.parse("(i, j) -> ( i floordiv 2 : compressed, j floordiv 3 : compressed, "
                   "i mod 2 : dense, j mod 3 : dense)")
    assert [lv.format for lv in enc.levels] == ["compressed", "compressed", "dense", "dense"]
    assert enc.level_sizes((4, 9)) == (2, 3, 2, 3)
    assert se.parse(str(enc)) == enc


def test_properties_print_and_parse():
    text = "(i, j) -> (i : compressed(nonunique, nonordered), j : singleton(nonordered))"
    enc = se.parse(text)
    assert not enc.levels[0].unique and not enc.levels[0].ordered and not enc.levels[1].ordered
    assert str(enc) == text


INVALID = {
    "unordered dense": "(i, j) -> (i : dense(nonordered), j : compressed)",
    "nonunique dense": "(i, j) -> (i : dense(nonunique), j : compressed)",
    "singleton first": "(i, j) -> (i : singleton, j : compressed)",
    "singleton after a unique level": "(i, j) -> (i : compressed, j : singleton)",
    "compressed after nonunique": "(i, j) -> (i : compressed(nonunique), j : compressed)",
    "dimension missing": "(i, j) -> (i : dense)",
    "dimension twice": "(i, j) -> (i : dense, i : compressed, j : dense)",
    "floordiv without mod": "(i, j) -> (i floordiv 2 : dense, j : compressed)",
    "blocks differ": "(i, j) -> (i floordiv 2 : dense, j : compressed, i mod 3 : dense)",
    "n:m not last": "(i, j) -> (j floordiv 4 : dense, j mod 4 : compressed(2:4), i : dense)",
    "n:m without its block": "(i, j) -> (i : dense, j : compressed(2:4))",
    "n > m": "(i, j) -> (i : dense, j floordiv 4 : dense, j mod 4 : compressed(5:4))",
    "unknown format": "(i, j) -> (i : dense, j : hashed)",
    "unknown property": "(i, j) -> (i : dense, j : compressed(sorted))",
    "unknown variable": "(i, j) -> (i : dense, k : compressed)",
    "no arrow": "i, j : dense",
}


@pytest.mark.parametrize("case", INVALID)
def test_invalid_encodings_are_typed_errors(case):
    with pytest.raises(ga.InvalidArguments) as err:
        se.parse(INVALID[case])
    assert err.value.status == ga.Status.invalid_arguments


def test_logical_tensor_keyword_keeps_positional_forms():
    lt = ga.LogicalTensor(3, ga.DataType.f32, [4, 8], sparse_encoding="CSR")
    assert lt.sparse_encoding == se.csr() and lt.is_sparse() and lt.strides == (8, 1)
    assert lt != ga.LogicalTensor(3, ga.DataType.f32, [4, 8])
    assert lt == ga.LogicalTensor(3, ga.DataType.f32, [4, 8], sparse_encoding=se.parse(str(se.csr())))
    assert "sparse=<(i, j) -> (i : dense, j : compressed)>" in repr(lt)
    # oneDNN's positional overloads are unchanged
    assert ga.LogicalTensor(0, ga.DataType.f32, ga.LayoutType.strided).shape is None
    assert ga.LogicalTensor(0, ga.DataType.f32, 2, ga.LayoutType.strided).shape == (-1, -1)
    assert ga.LogicalTensor(0, ga.DataType.f32, [2, 3], [3, 1], ga.PropertyType.constant).property == \
        ga.PropertyType.constant
    assert lt.with_shape((4, 8)).encoding == se.csr()


def test_logical_tensor_shape_must_fit_the_encoding():
    with pytest.raises(ga.InvalidArguments, match="2 dimensions"):
        ga.LogicalTensor(0, ga.DataType.f32, [2, 3, 4], sparse_encoding="CSR")
    with pytest.raises(ga.InvalidArguments, match="not a multiple of the block 4"):
        ga.LogicalTensor(0, ga.DataType.f32, [4, 6], sparse_encoding="2:4")
    ga.LogicalTensor(0, ga.DataType.f32, [-1, 8], sparse_encoding="2:4")  # unknown dims are fine


def _relu_graph(enc_in, enc_out):
    g = ga.Graph()
    x = ga.LogicalTensor(0, ga.DataType.f32, [4, 12], sparse_encoding=enc_in)
    y = ga.LogicalTensor(1, ga.DataType.f32, [4, 12], sparse_encoding=enc_out)
    g.add_op(ga.Op(0, K.ReLU, [x], [y]))
    g.finalize()
    return g


@pytest.mark.parametrize("name", [n for n in PRESETS if n != "batched CSR"])
def test_json_round_trip_keeps_the_encoding(name):
    enc = PRESETS[name][0] if name != "BCSR2x3" else se.bcsr(2, 4)
    g = _relu_graph(enc, "CSR")
    text = g.to_json()
    doc = json.loads(text)
    assert doc["graph"][0]["inputs"][0]["sparse_encoding"] == str(enc)
    back = ga.Graph.from_json(text)
    assert back.tensors[0].encoding == enc and back.tensors[1].encoding == se.csr()
    assert back.to_json() == text


def test_json_of_dense_graphs_has_no_extension_key():
    assert "sparse_encoding" not in _relu_graph(None, None).to_json()


def test_json_bad_encoding_is_reported_with_its_place():
    doc = json.loads(_relu_graph("CSR", None).to_json())
    doc["graph"][0]["inputs"][0]["sparse_encoding"] = "(i, j) -> (i : dense(nonordered), j : compressed)"
    with pytest.raises(ga.InvalidArguments, match="always unique and ordered"):
        ga.Graph.from_json(json.dumps(doc))


def test_encoding_declared_on_one_use_holds_for_the_tensor():
    g = ga.Graph()
    x = ga.LogicalTensor(0, ga.DataType.f32, [4, 8], sparse_encoding="CSR")
    g.add_op(ga.Op(0, K.Abs, [x], [ga.LogicalTensor(1, ga.DataType.f32, [4, 8], sparse_encoding="CSR")]))
    g.add_op(ga.Op(1, K.ReLU, [ga.LogicalTensor(1, ga.DataType.f32, [4, 8])],
                   [ga.LogicalTensor(2, ga.DataType.f32, [4, 8])]))
    g.finalize()
    assert g.tensors[1].encoding == se.csr()


def test_two_encodings_for_one_tensor_are_refused():
    g = ga.Graph()
    g.add_op(ga.Op(0, K.Abs, [ga.LogicalTensor(0, ga.DataType.f32, [4, 8])],
                   [ga.LogicalTensor(1, ga.DataType.f32, [4, 8], sparse_encoding="CSR")]))
    g.add_op(ga.Op(1, K.ReLU, [ga.LogicalTensor(1, ga.DataType.f32, [4, 8], sparse_encoding="CSC")],
                   [ga.LogicalTensor(2, ga.DataType.f32, [4, 8])]))
    with pytest.raises(ga.InvalidGraph, match="tensor 1 is used with different metadata"):
        g.finalize()

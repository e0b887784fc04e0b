"""oneDNN graph JSON: the format of oneDNN's graph dumps and benchdnn ``--case`` files.

Reading builds a :class:`~graph_api.graph.Graph` (finalized, so inconsistent
tensor ids and cycles are reported at load time); writing emits the same keys in
oneDNN's order.  ``load -> save -> load`` gives an identical graph.

Top level (``dnnl_graph_graph::serialize``)::

    {"version": "3.14.0", "engine_kind": "cpu", "fpmath_mode": "strict",
     "fpmath_mode_apply_to_int": "false",          # a string; absent in old files
     "input_ports": [0, 1, 0], "output_ports": [7], # absent in old files; duplicates kept
     "graph": [op, ...]}                            # insertion order

    op     = {"id": 10, "name": "qk", "kind": "MatMul",
              "attrs": {"transpose_b": {"type": "bool", "value": 1}},   # may be absent
              "inputs": [tensor, ...], "outputs": [tensor, ...]}
    tensor = {"id": 0, "dtype": "f16", "shape": [1, 4, 8, 16], "stride": [512, 128, 16, 1],
              "layout_type": "strided", "property_type": "variable"}

Quirks handled:

* ``shape``/``stride`` of ``[INT64_MIN]`` mean unknown rank / unknown strides
  (our ``shape=None`` / ``strides=None``); an unknown dim inside a shape is
  INT64_MIN in the file and -1 here.  Intermediate tensors of benchdnn files
  often carry a known shape with unknown strides and layout ``undef``.
* Attribute ``type`` is one of ``bool s64 f32 s64[] f32[] string``; bools are
  written 0/1, f32 values as floats.  Extension types (this runtime only):
  ``string[]`` (MatMul ``indexing_maps``) and ``dict`` (a MatMul ``algorithm``
  given by its fields, e.g. ``{"type": "dict", "value": {"lhs_type": "bf16", ...}}``).  The declared type must be the kind the
  op schema expects (an ``s64`` ``transpose_a`` is rejected).
* ``partition_id`` and ``backend`` (added by post-partitioning dumps) are not
  op attributes; they are kept aside and written back.
* ``engine_kind`` ``gpu`` loads as a cpu graph (this runtime has the cpu only);
  the recorded kind is kept in ``graph.recorded_engine_kind`` and written back.
* ``input_ports``/``output_ports`` are kept as recorded, duplicates and all,
  but not trusted: some benchdnn files list stale ids (``sdpa-compressed-k-int8``
  lists a tensor no op uses).  Graph inputs and outputs are derived from the ops,
  as oneDNN's ``finalize`` does.
* Extension (this runtime only, seed 003): a sparse tensor carries
  ``"sparse_encoding": "(i, j) -> (i : dense, j : compressed)"`` (the notation of
  ``graph_api.sparse_encoding``); dense tensors have no such key, so files stay
  oneDNN's.
* A 1-D tensor with an unknown dim and a tensor of unknown rank are written
  identically by oneDNN (``[INT64_MIN]``); both read back as unknown rank.
* Extension: ``"graph_api.decompositions"`` (after ``graph``) lists the
  decompositions the file's ``Composite`` ops call, callees first; they are
  defined in the composite library before the ops are read (docs/composite.md).

Errors are typed (:mod:`graph_api.errors`) and name the file, the op id and the
key: ``gqa.json: op 3 (MatMul "qk"): attrs.transpose_b: ...``.
"""
from __future__ import annotations

import json
import os
import reprlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .enums import EngineKind, FPMathMode, OpKind
from .errors import GraphError, InvalidGraph, InvalidGraphOp, op_label
from .logical_tensor import UNKNOWN_DIM, LogicalTensor
from .op import Op
from .schema import ATTR_KINDS
from .composite import Decomposition, LIBRARY, NAME, VERSION, _ensure_shipped, resolve
from .opset import OP_SCHEMAS

#: oneDNN's DNNL_GRAPH_UNKNOWN_DIM as written in JSON
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: the oneDNN library version this runtime mirrors, written into new files
WRITER_VERSION = "3.14.0"
#: string attrs that post-partitioning dumps add to every op; not op attributes
DUMP_ONLY_ATTRS = ("partition_id", "backend")
#: Deviation: other spellings of an op kind found in oneDNN's own inputs
#: (``op/f32/biasadd_bwd.json`` says BiasAddBackprop, a name benchdnn's
#: ``opstr2kind`` rejects); read as the kind, written back under its name.
KIND_ALIASES = {"BiasAddBackprop": "BiasAddBackward"}

TOP_KEYS = ("version", "engine_kind", "fpmath_mode", "graph")
#: extension key: the decompositions of the graph's Composite ops (docs/composite.md)
DECOMPOSITIONS_KEY = "graph_api.decompositions"
OP_KEYS = ("id", "name", "kind", "inputs", "outputs")
TENSOR_KEYS = ("id", "dtype", "shape", "stride", "layout_type", "property_type")


@dataclass
class JsonMeta:
    """What a file records beyond the graph itself, kept so it can be written back."""

    source: str = "<graph>"
    version: str = WRITER_VERSION
    has_apply_to_int: bool = True
    input_ports: list[int] | None = None
    output_ports: list[int] | None = None
    dump_attrs: dict[int, dict] = field(default_factory=dict)


# ====================================================================== reading
class _Reader:
    """Turns a parsed document into a Graph; every error names ``self.source``."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, cls, where: str, message: str) -> GraphError:
        return cls(f"{self.source}: {where}: {message}" if where else f"{self.source}: {message}")

    # ------------------------------------------------------------ scalars
    def need(self, obj: dict, key: str, kinds, where: str, cls=InvalidGraph):
        if key not in obj:
            raise self.fail(cls, where, f"key {_show(key)} is missing")
        value = obj[key]
        if isinstance(value, int) and not isinstance(value, bool) and not _is_int(value):
            raise self.fail(cls, f"{where}.{key}" if where else key, f"{_show(value)} does not fit a 64-bit integer")
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in _tuple(kinds)):
            raise self.fail(cls, f"{where}.{key}" if where else key,
                            f"expected {_kind_names(kinds)}, got {_show(value)}")
        return value

    def int_list(self, value, where: str, cls) -> list[int]:
        if not isinstance(value, list) or not all(_is_int(v) for v in value):
            raise self.fail(cls, where, f"expected a list of 64-bit integers, got {_show(value)}")
        return value

    # ------------------------------------------------------------ document
    def graph(self, doc, finalize: bool):
        from .graph import Graph

        if not isinstance(doc, dict):
            raise self.fail(InvalidGraph, "", f"the top level must be a JSON object, got {type(doc).__name__}")
        version = self.need(doc, "version", str, "")
        engine = self.need(doc, "engine_kind", str, "")
        if engine not in EngineKind.__members__:
            raise self.fail(InvalidGraph, "engine_kind", f"unknown engine kind {_show(engine)}; expected cpu, gpu or any")
        mode = self.need(doc, "fpmath_mode", str, "")
        if mode not in FPMathMode.__members__:
            choices = ", ".join(FPMathMode.__members__)
            raise self.fail(InvalidGraph, "fpmath_mode", f"unknown fpmath mode {_show(mode)}; expected one of: {choices}")
        apply_to_int = self.apply_to_int(doc)
        ops_doc = self.need(doc, "graph", list, "")
        ports = {key: (self.int_list(doc[key], key, InvalidGraph) if key in doc else None)
                 for key in ("input_ports", "output_ports")}
        graph = Graph(EngineKind.cpu, FPMathMode[mode], bool(apply_to_int))
        graph.recorded_engine_kind = engine
        meta = JsonMeta(self.source, version, "fpmath_mode_apply_to_int" in doc,
                        ports["input_ports"], ports["output_ports"])
        graph.json_meta = meta
        if DECOMPOSITIONS_KEY in doc:
            self.decompositions(doc[DECOMPOSITIONS_KEY], meta)
        for index, op_doc in enumerate(ops_doc):
            op = self.op(op_doc, index, meta)
            if op.id in graph.ops:
                raise self.fail(InvalidGraph, f"graph[{index}]",
                                f"op id {op.id} is used twice ({op_label(graph.ops[op.id])} and {op_label(op)})")
            try:
                graph.add_op(op)
            except GraphError as err:
                raise type(err)(f"{self.source}: {err.message}") from None
        if finalize:
            try:
                graph.finalize()
            except GraphError as err:
                raise type(err)(f"{self.source}: {err.message}") from None
        return graph

    def apply_to_int(self, doc) -> bool:
        if "fpmath_mode_apply_to_int" not in doc:
            return False
        value = doc["fpmath_mode_apply_to_int"]
        # oneDNN writes a string; accept a JSON bool from hand-made files too
        if isinstance(value, bool):
            return value
        if value in ("true", "false"):
            return value == "true"
        raise self.fail(InvalidGraph, "fpmath_mode_apply_to_int", f"expected \"true\" or \"false\", got {_show(value)}")

    # ------------------------------------------------------------ ops
    def op(self, doc, index: int, meta: JsonMeta) -> Op:
        where = f"graph[{index}]"
        if not isinstance(doc, dict):
            raise self.fail(InvalidGraphOp, where, f"an op must be a JSON object, got {_show(doc)}")
        op_id = self.need(doc, "id", int, where, InvalidGraphOp)
        if op_id < 0:
            raise self.fail(InvalidGraphOp, f"{where}.id", f"op id must be non-negative, got {op_id}")
        where = f"op {op_id}"
        name = self.need(doc, "name", str, where, InvalidGraphOp)
        kind_name = self.need(doc, "kind", str, where, InvalidGraphOp)
        kind_name = KIND_ALIASES.get(kind_name, kind_name)
        if kind_name not in OpKind.__members__:
            raise self.fail(InvalidGraphOp, f"{where} ({_show(name)}).kind", f"unknown op kind {_show(kind_name)}")
        kind = OpKind[kind_name]
        where = f'op {op_id} ({kind_name}{" " + json.dumps(name) if name else ""})'
        inputs = [self.tensor(t, f"{where}.inputs[{i}]")
                  for i, t in enumerate(self.need(doc, "inputs", list, where, InvalidGraphOp))]
        outputs = [self.tensor(t, f"{where}.outputs[{i}]")
                   for i, t in enumerate(self.need(doc, "outputs", list, where, InvalidGraphOp))]
        attrs_doc = doc.get("attrs", {})  # some hand-made files have no "attrs"
        if not isinstance(attrs_doc, dict):
            raise self.fail(InvalidGraphOp, f"{where}.attrs", f"expected an object, got {_show(attrs_doc)}")
        attrs, dump = {}, {}
        for key, entry in attrs_doc.items():
            value = self.attr(kind, key, entry, f"{where}.attrs.{key}")
            (dump if key in DUMP_ONLY_ATTRS else attrs)[key] = value
        if dump:
            meta.dump_attrs[op_id] = dump
        return Op(op_id, kind, inputs, outputs, name, attrs)

    def attr(self, kind: OpKind, key: str, entry, where: str):
        if not isinstance(entry, dict) or "type" not in entry or "value" not in entry:
            raise self.fail(InvalidGraphOp, where, f'expected {{"type": ..., "value": ...}}, got {_show(entry)}')
        declared, value = entry["type"], entry["value"]
        if declared not in ATTR_KINDS:
            raise self.fail(InvalidGraphOp, f"{where}.type",
                            f"unknown attribute type {_show(declared)}; expected one of: {', '.join(ATTR_KINDS)}")
        if key in DUMP_ONLY_ATTRS:
            return _decode_value(declared, value) if _fits(declared, value) else value
        expected = _schema_kind(kind, key)
        if expected is None:
            known = ", ".join(_schema_attr_names(kind)) or "none"
            raise self.fail(InvalidGraphOp, where, f"unknown attribute {_show(key)}; {kind.name} takes: {known}")
        if declared not in expected.split("|"):
            raise self.fail(InvalidGraphOp, f"{where}.type",
                            f"wrong attribute type {_show(declared)}; {kind.name}.{key} is {expected}")
        if not _fits(declared, value):
            raise self.fail(InvalidGraphOp, f"{where}.value", f"{_show(value)} is not a {declared} value")
        return _decode_value(declared, value)

    # ------------------------------------------------------------ extension: composites
    def decompositions(self, docs, meta: JsonMeta) -> None:
        """The ``graph_api.decompositions`` list, defined in the composite library
        (an identical definition is a no-op; a conflicting one an error)."""

        where = DECOMPOSITIONS_KEY
        if not isinstance(docs, list):
            raise self.fail(InvalidGraph, where, f"expected a list, got {docs!r}")
        decs = []
        for i, d in enumerate(docs):
            at = f"{where}[{i}]"
            if not isinstance(d, dict):
                raise self.fail(InvalidGraph, at, f"expected an object, got {d!r}")
            name = self.need(d, "name", str, at)
            version = self.need(d, "version", int, at)
            at = f"{where}[{i}] ({name!r} v{version})"
            ports = [[self.tensor(t, f"{at}.{key}[{j}]") for j, t in enumerate(self.need(d, key, list, at))]
                     for key in ("inputs", "outputs")]
            ops = [self.op(o, j, meta) for j, o in enumerate(self.need(d, "graph", list, at))]
            attrs = {key: None if entry is None else self.attr(OpKind.Composite, key, entry, f"{at}.attrs.{key}")
                     for key, entry in self.need(d, "attrs", dict, at).items()}
            constants = {}
            for j, c in enumerate(self.need(d, "constants", list, at)):
                if not isinstance(c, dict):
                    raise self.fail(InvalidGraph, f"{at}.constants[{j}]", f"expected an object, got {c!r}")
                cid = self.need(c, "id", int, f"{at}.constants[{j}]")
                constants[cid] = c["attr"] if "attr" in c else self.need(c, "value", list, f"{at}.constants[{j}]")
            try:
                decs.append(Decomposition(name, ports[0], ports[1], ops, version, constants, attrs))
            except GraphError as err:
                raise type(err)(f"{self.source}: {at}: {err.message}") from None
        try:
            _ensure_shipped()
            LIBRARY.define_all(decs)
        except GraphError as err:
            raise type(err)(f"{self.source}: {where}: {err.message}") from None

    # ------------------------------------------------------------ tensors
    def tensor(self, doc, where: str) -> LogicalTensor:
        if not isinstance(doc, dict):
            raise self.fail(InvalidGraphOp, where, f"a tensor must be a JSON object, got {_show(doc)}")
        for key in TENSOR_KEYS:
            if key not in doc:
                raise self.fail(InvalidGraphOp, where, f"key {_show(key)} is missing")
        tid = self.need(doc, "id", int, where, InvalidGraphOp)
        shape = self.int_list(doc["shape"], f"{where}.shape", InvalidGraphOp)
        stride = self.int_list(doc["stride"], f"{where}.stride", InvalidGraphOp)
        encoding = doc.get("sparse_encoding")
        if encoding is not None and not isinstance(encoding, str):
            raise self.fail(InvalidGraphOp, where, f"sparse_encoding must be a string, got {_show(encoding)}")
        try:
            return LogicalTensor(tid, doc["dtype"], _read_dims(shape), _read_strides(stride),
                                 doc["layout_type"], doc["property_type"], sparse_encoding=encoding)
        except GraphError as err:
            raise self.fail(type(err), f"{where} (tensor {tid})", err.message) from None


#: how messages show a value from the file: bounded in depth and length, so a
#: hostile document (nested thousands deep, megabytes long) gives a short message
_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxlist, _SHOW.maxdict, _SHOW.maxstring, _SHOW.maxother = 3, 8, 4, 60, 60


def _show(value) -> str:
    return _SHOW.repr(value)


def _tuple(kinds) -> tuple:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _kind_names(kinds) -> str:
    names = {str: "a string", int: "an integer", list: "a list", dict: "an object"}
    return " or ".join(names.get(k, k.__name__) for k in _tuple(kinds))


def _read_dims(shape: list[int]):
    if shape == [INT64_MIN]:
        return None
    return [UNKNOWN_DIM if d == INT64_MIN else d for d in shape]


def _read_strides(stride: list[int]):
    if stride == [INT64_MIN] or INT64_MIN in stride:
        return None
    return stride


def _schema_kind(kind: OpKind, key: str) -> str | None:
    schema = OP_SCHEMAS.get(kind)
    if schema is None:
        # not in the opset (backward ops): add_op reports Unimplemented; accept the
        # declared type here so that error, which names the missing kind, wins
        return "|".join(ATTR_KINDS)
    spec = schema.attr_by_name.get(key)
    return None if spec is None else spec.kind


def _schema_attr_names(kind: OpKind) -> list[str]:
    schema = OP_SCHEMAS.get(kind)
    return [] if schema is None else list(schema.attr_by_name)


def _is_int(v) -> bool:
    """A JSON integer that fits oneDNN's int64."""
    return isinstance(v, int) and not isinstance(v, bool) and INT64_MIN <= v <= INT64_MAX


def _is_number(v) -> bool:
    """A JSON number that converts to a float (an integer of 400 digits does not)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return isinstance(v, float) or abs(v) < 2**1024


def _fits(declared: str, value) -> bool:
    if declared == "bool":
        return isinstance(value, bool) or value in (0, 1)
    if declared == "s64":
        return _is_int(value)
    if declared == "f32":
        return _is_number(value)
    if declared == "string":
        return isinstance(value, str) and value != ""
    if declared == "s64[]":
        return isinstance(value, list) and all(_is_int(v) for v in value)
    if declared == "string[]":  # extension: MatMul indexing_maps
        return isinstance(value, list) and all(isinstance(v, str) and v for v in value)
    if declared == "dict":  # extension: a MatMul algorithm given by its fields
        return isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, (bool, int, str)) for k, v in value.items())
    return isinstance(value, list) and all(_is_number(v) for v in value)  # f32[]


def _decode_value(declared: str, value):
    if declared == "bool":
        return bool(value)
    if declared == "f32":
        return float(value)
    if declared == "f32[]":
        return [float(v) for v in value]
    if declared == "s64[]":
        return [int(v) for v in value]
    if declared in ("string[]", "dict"):
        return list(value) if declared == "string[]" else dict(value)
    return value


# ====================================================================== writing
def _attr_type(kind: OpKind, key: str, value) -> str:
    """The JSON ``type`` of an attribute: the schema's kind (the value picks among alternatives)."""

    schema = OP_SCHEMAS.get(kind)
    spec = None if schema is None else schema.attr_by_name.get(key)
    candidates = spec.kind.split("|") if spec is not None else list(ATTR_KINDS)
    for declared in candidates:
        if declared == "f32[]" and isinstance(value, list) and all(_is_number(v) for v in value) \
                and "s64[]" in candidates and all(_is_int(v) for v in value):
            continue  # an all-int list fits s64[] better when both are allowed
        if declared == "bool" and not isinstance(value, bool):
            continue
        if _fits(declared, value):
            return declared
    return candidates[0]


def _encode_value(declared: str, value):
    """The JSON form: bools as 0/1, everything else as decoded."""
    return int(bool(value)) if declared == "bool" else _decode_value(declared, value)


def _write_tensor(lt: LogicalTensor) -> dict:
    shape = [INT64_MIN] if lt.shape is None else [INT64_MIN if d == UNKNOWN_DIM else d for d in lt.shape]
    if lt.strides is not None:
        stride = list(lt.strides)
    elif lt.shape == ():
        stride = []
    else:
        stride = [INT64_MIN]
    doc = {"id": lt.id, "dtype": lt.dtype.name, "shape": shape, "stride": stride,
           "layout_type": lt.layout.name, "property_type": lt.property.name}
    if lt.encoding is not None:  # extension: sparse tensors (seed 003)
        doc["sparse_encoding"] = lt.encoding.to_json()
    return doc


def _write_op(op: Op, dump_attrs: dict) -> dict:
    attrs = {}
    for key, value in op.attrs.items():
        declared = _attr_type(op.kind, key, value)
        attrs[key] = {"type": declared, "value": _encode_value(declared, value)}
    for key, value in dump_attrs.get(op.id, {}).items():
        attrs[key] = {"type": "string", "value": value}
    return {"id": op.id, "name": op.name, "kind": op.kind.name, "attrs": attrs,
            "inputs": [_write_tensor(lt) for lt in op.inputs],
            "outputs": [_write_tensor(lt) for lt in op.outputs]}


def _derived_ports(graph) -> tuple[list[int], list[int]]:
    """Graph inputs (consumed, never produced) and outputs (produced, never consumed)."""
    if graph.is_finalized():
        return list(graph.input_ids), list(graph.output_ids)
    produced = [lt.id for op in graph.ops.values() for lt in op.outputs]
    consumed = {lt.id for op in graph.ops.values() for lt in op.inputs}
    inputs = list(dict.fromkeys(lt.id for op in graph.ops.values() for lt in op.inputs
                                if lt.id not in set(produced)))
    return inputs, [t for t in produced if t not in consumed]


def to_document(graph) -> dict:
    """The JSON object (as Python data) describing ``graph``."""
    meta: JsonMeta = getattr(graph, "json_meta", None) or JsonMeta()
    engine = getattr(graph, "recorded_engine_kind", None) or graph.engine_kind.name
    mode, apply_to_int = graph.fpmath.mode, graph.fpmath.apply_to_int
    doc = {"version": meta.version, "engine_kind": engine, "fpmath_mode": mode.name}
    if meta.has_apply_to_int or apply_to_int:
        doc["fpmath_mode_apply_to_int"] = "true" if apply_to_int else "false"
    derived = None
    if meta.input_ports is None or meta.output_ports is None:
        derived = _derived_ports(graph)
    # old files had no port lists; writing them back keeps the file as it was
    if meta.input_ports is not None or getattr(graph, "json_meta", None) is None:
        doc["input_ports"] = list(meta.input_ports) if meta.input_ports is not None else derived[0]
    if meta.output_ports is not None or getattr(graph, "json_meta", None) is None:
        doc["output_ports"] = list(meta.output_ports) if meta.output_ports is not None else derived[1]
    doc["graph"] = [_write_op(op, meta.dump_attrs) for op in graph.ops.values()]
    decompositions = _write_decompositions(graph)
    if decompositions:
        doc[DECOMPOSITIONS_KEY] = decompositions
    return doc


def _write_decompositions(graph) -> list[dict]:
    """Extension: every decomposition the graph's Composite ops need, callees first."""

    calls = [op for op in graph.ops.values() if op.kind == OpKind.Composite]
    for op in calls:
        resolve(op)  # an unknown composite fails here, naming the op
    keys = list(dict.fromkeys((op.attrs[NAME], op.attrs.get(VERSION, 1)) for op in calls))
    docs = []
    for dec in LIBRARY.closure(keys):
        attrs = {}
        for key, value in dec.attrs.items():
            declared = None if value is None else _attr_type(OpKind.Composite, key, value)
            attrs[key] = None if value is None else {"type": declared, "value": _encode_value(declared, value)}
        constants = [{"id": tid, "attr": c.attr} if c.attr is not None else {"id": tid, "value": c.value.tolist()}
                     for tid, c in dec.constants.items()]
        docs.append({"name": dec.name, "version": dec.version, "attrs": attrs,
                     "inputs": [_write_tensor(lt) for lt in dec.inputs],
                     "outputs": [_write_tensor(lt) for lt in dec.outputs],
                     "constants": constants, "graph": [_write_op(op, {}) for op in dec.ops]})
    return docs


# ====================================================================== public API
def _parse_text(text: str, source: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidGraph(f"{source}: not valid JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    except RecursionError:  # the parser recurses once per nesting level
        raise InvalidGraph(f"{source}: not a oneDNN graph: JSON nested deeper than the parser's limit "
                           f"(about {sys.getrecursionlimit()} levels; a graph file needs 5)") from None


def from_json(path_or_text, finalize: bool = True, source: str | None = None):
    """A Graph from a JSON file path, JSON text, or an already parsed document.

    Args:
        path_or_text: a path (``str``/``Path``), the JSON text itself (a string
            starting with ``{``), or a ``dict``.
        finalize: finalize the graph (checks tensor-id consistency and cycles).
        source: the name errors use; defaults to the path or ``<json>``.

    Raises:
        InvalidGraph: not JSON, a missing or malformed top-level key, bad port
            ids, duplicate op ids, inconsistent tensor metadata, a cycle.
        InvalidGraphOp: a malformed op, unknown kind or attribute, wrong
            attribute type, a schema violation.
        Unimplemented: an op kind this runtime's opset does not have yet.
        OSError: the file cannot be read.
    """
    if isinstance(path_or_text, dict):
        doc, source = path_or_text, source or "<json>"
    elif isinstance(path_or_text, str) and path_or_text.lstrip().startswith("{"):
        source = source or "<json>"
        doc = _parse_text(path_or_text, source)
    elif isinstance(path_or_text, (str, os.PathLike)):
        path = Path(path_or_text)
        source = source or str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise InvalidGraph(f"{source}: not valid JSON: not UTF-8 text ({err.reason} at byte {err.start})") from None
        doc = _parse_text(text, source)
    else:
        raise InvalidGraph(f"from_json needs a path, JSON text or a dict, got {type(path_or_text).__name__}")
    return _Reader(source).graph(doc, finalize)


def to_json(graph, indent: int = 4) -> str:
    """The graph as oneDNN graph JSON text (keys and order as oneDNN writes them)."""
    return json.dumps(to_document(graph), indent=indent) + "\n"


def load(path, finalize: bool = True):
    """Read a oneDNN graph JSON file; see :func:`from_json`."""
    return from_json(Path(path), finalize=finalize)


def save(graph, path) -> None:
    """Write ``graph`` as oneDNN graph JSON to ``path``."""
    Path(path).write_text(to_json(graph), encoding="utf-8")

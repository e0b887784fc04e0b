"""Graph dumps, as oneDNN's ``set_dump_mode`` / ``ONEDNN_GRAPH_DUMP=graph,subgraph``.

Files, written into ``GRAPH_API_DUMP_DIR`` (default: the working directory) with
oneDNN's names, in oneDNN's graph JSON (:mod:`graph_api.json_io`)::

    graph-<id>.json               graph  the finalized graph, before partitioning
    graph-<id>-partitioning.json  graph  the same, each op with string attrs
                                         partition_id and backend ("graph_api")
    graph-<id>-<hash>.json        subgraph  a partition at compile: its ops on the
                                         concrete logical tensors it was compiled for,
                                         fpmath as the partition's; <hash> is of those
                                         input/output tensors

Every file loads with ``ga.load`` and replays with ``graph-api run FILE`` (a
subgraph's inputs are filled as benchdnn fills them; constants a partition
carries itself, from an inlined Composite, become plain inputs).  ``<id>`` is a
process-wide graph number given at the graph's first dump.  The mode is
``GRAPH_API_DUMP`` (or oneDNN's ``ONEDNN_GRAPH_DUMP``), read at first use;
:func:`set_dump_mode` overrides it, as in oneDNN.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading
from pathlib import Path

from .config import settings
from .enums import GraphDumpMode
from .errors import InvalidArguments
from .json_io import to_document
from .op import Op

BACKEND_NAME = "graph_api"
_ids = itertools.count()
_lock = threading.Lock()
_mode: GraphDumpMode | None = None  # None: not read from the environment yet


def parse_mode(text: str, where: str = "GRAPH_API_DUMP") -> GraphDumpMode:
    """``'graph,subgraph'`` -> graph | subgraph; ``''`` / ``'none'`` -> none."""
    mode = GraphDumpMode.none
    for word in filter(None, (w.strip().lower() for w in text.split(","))):
        if word not in GraphDumpMode.__members__:
            raise InvalidArguments(f"{where}={text!r}: expected a comma-separated list of "
                                   f"graph, subgraph (or none), got {word!r}")
        mode |= GraphDumpMode[word]
    return mode


def get_dump_mode() -> GraphDumpMode:
    """The dump mode in force (the environment's until :func:`set_dump_mode` is called)."""
    global _mode
    if _mode is None:
        _mode = parse_mode(settings.dump_text)
    return _mode


def set_dump_mode(mode) -> None:
    """Dump ``mode`` (a :class:`GraphDumpMode`, its int, or ``'graph,subgraph'``) from now on.

    Raises:
        InvalidArguments: bits or names that are not dump modes.
    """
    global _mode
    if isinstance(mode, str):
        _mode = parse_mode(mode, "set_dump_mode")
        return
    if isinstance(mode, bool) or not isinstance(mode, int) or mode < 0 or mode & ~int(GraphDumpMode(3)):
        raise InvalidArguments(f"set_dump_mode: expected a GraphDumpMode (none=0, subgraph=1, graph=2, "
                               f"or their union), got {mode!r}")
    _mode = GraphDumpMode(int(mode))


def enabled(mode: GraphDumpMode) -> bool:
    return bool(get_dump_mode() & mode)


def _folder() -> Path:
    return Path(settings.dump_dir or os.getcwd())


def graph_id(graph) -> int:
    """The graph's dump number, given at its first dump."""
    with _lock:
        if "_dump_id" not in graph.__dict__:
            graph._dump_id = next(_ids)
        return graph._dump_id


def _write(name: str, doc: dict) -> Path:
    folder = _folder()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(doc, indent=4) + "\n", encoding="utf-8")
    return path


def dump_graph(graph) -> Path:
    """``graph-<id>.json``: the graph before partitioning."""
    return _write(f"graph-{graph_id(graph)}.json", to_document(graph))


def dump_partitioning(graph, partitions) -> Path:
    """``graph-<id>-partitioning.json``: every op tagged with its partition id and backend."""
    owner = {op.id: str(p.get_id()) for p in partitions for op in p.ops}
    doc = to_document(graph)
    for op_doc in doc["graph"]:
        pid = owner.get(op_doc["id"])
        if pid is not None:
            op_doc["attrs"]["partition_id"] = {"type": "string", "value": pid}
            op_doc["attrs"]["backend"] = {"type": "string", "value": BACKEND_NAME}
    return _write(f"graph-{graph_id(graph)}-partitioning.json", doc)


def dump_subgraph(partition, lts: dict) -> Path:
    """``graph-<id>-<hash>.json``: the partition's ops on the concrete tensors ``lts``
    (tensor id -> LogicalTensor) it is being compiled for, as a graph of its own."""
    graph = partition.graph
    sub = type(graph)(graph.engine_kind, graph.fpmath.mode, graph.fpmath.apply_to_int)
    sub.set_fpmath_mode(partition.fpmath.mode, partition.fpmath.apply_to_int)
    for op in partition.ops:
        sub.add_op(Op(op.id, op.kind, [lts[lt.id] for lt in op.inputs], [lts[lt.id] for lt in op.outputs],
                      attrs=dict(op.attrs), name=op.name))
    sub.finalize()
    ports = [lts[t].key() for t in list(partition.input_ids) + list(partition.output_ids)]
    digest = int.from_bytes(hashlib.blake2b(repr(ports).encode(), digest_size=8).digest(), "little")
    return _write(f"graph-{graph_id(graph)}-{digest}.json", to_document(sub))

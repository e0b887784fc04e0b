"""Conformance: every oneDNN graph JSON file of tests/data runs like ``graph-api run --check``.

One test per file (id = its path under ``onednn-graphs/``): it must load,
partition (every op in exactly one partition), compile and execute with the
fusion policy, and every graph output must match the unfused numpy reference
within the per-data-type tolerance of :func:`graph_api.check.compare`.

Inputs are filled as benchdnn does (:mod:`graph_api.fill`).  Files whose
tensors hold more than ``MAX_ELEMENTS`` elements run with their leading batch
(then heads) dims reduced, like benchdnn's ``--mb``; their test id ends in
``[mb-reduced]`` and the reduction is printed.  Files that cannot pass yet are
listed in :mod:`tests.conformance_files` with a reason naming what is missing.
"""
from pathlib import Path

import pytest

from graph_api.cli import execute, graph_outputs, prepare, runnable
from graph_api.enums import OpKind
from graph_api.errors import GraphError

from .conformance_files import FILES, NOT_LOADABLE, ROOT, params, rel

#: a reference run of this many f32 elements takes well under a second
MAX_ELEMENTS = 16_000_000


def _case(param):
    """The file's test id says when its batch is reduced (a file that does not
    load yet keeps its plain id: it is an expected failure)."""
    path = param.values[0]
    if rel(path) in NOT_LOADABLE:
        return param
    try:
        prepared = prepare(path, max_elements=MAX_ELEMENTS)
    except GraphError:  # reported by the test itself, not at collection
        return param
    reduced = any(note.startswith("batch reduced") for note in prepared.notes)
    return pytest.param(path, id=param.id + ("[mb-reduced]" if reduced else ""), marks=param.marks)


CASES = [_case(param) for param in params()]


def test_the_conformance_folder_is_there():
    assert len(FILES) == 213, f"expected the 213 oneDNN graphs under {ROOT}"


@pytest.mark.parametrize("path", CASES)
def test_file_runs_and_matches_the_reference(path):
    prepared = prepare(path, max_elements=MAX_ELEMENTS)
    for note in prepared.notes:
        print(note)
    graph = prepared.graph
    partitions = graph.get_partitions()
    covered = sorted(op.id for p in partitions for op in p.ops)
    assert covered == sorted(graph.ops), "every op must be in exactly one partition"
    unsupported = [p for p in runnable(partitions) if not p.is_supported()]
    assert not unsupported, f"unsupported: {[p.unsupported_reason() for p in unsupported]}"
    assert all(op.kind == OpKind.End for p in partitions if p not in runnable(partitions) for op in p.ops)

    report = execute(prepared, check=True)
    assert [c.tid for c in report.checks] == graph_outputs(graph) and report.checks
    failures = [f"output {c.tid} ({c.lt.dtype.name}): {c.verdict.message}" for c in report.checks
                if not c.verdict.ok]
    assert not failures, "\n".join(failures)


def test_the_expected_failure_tables_name_files_that_exist():
    from .conformance_files import NOT_ONE_PARTITION
    names = {rel(path) for path in FILES}
    assert set(NOT_LOADABLE) <= names and set(NOT_ONE_PARTITION) <= names
    assert not set(NOT_LOADABLE) & set(NOT_ONE_PARTITION)

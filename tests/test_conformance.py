"""Conformance: every oneDNN graph JSON file of ../shared/conformance runs like ``graph-api run --check``.

One test per file (id = its path under ``onednn-graphs/``): it must load,
partition (every op in exactly one partition), compile and execute with the
fusion policy, and every graph output must match the unfused numpy reference
within the per-data-type tolerance of :func:`graph_api.check.compare`.

Inputs are filled as benchdnn does (:mod:`graph_api.fill`).  Files whose
tensors hold more than ``MAX_ELEMENTS`` elements run with their leading batch
(then heads) dims reduced, like benchdnn's ``--mb``; their test id ends in
``[mb-reduced]`` and the reduction is printed.  Files that cannot pass yet are
listed in ``XFAIL`` with a reason naming the missing op, attribute or data type.
"""
from pathlib import Path

import pytest

from graph_api.cli import execute, graph_outputs, prepare, runnable
from graph_api.enums import OpKind

CONFORMANCE = Path(__file__).resolve().parents[1].parent / "shared" / "conformance" / "onednn-graphs"
FILES = sorted(CONFORMANCE.rglob("*.json"))

#: a reference run of this many f32 elements takes well under a second
MAX_ELEMENTS = 16_000_000

#: file (relative path) -> reason naming what is missing; strict, so a fix shows up
XFAIL: dict[str, str] = {}


def _case(path: Path):
    rel = str(path.relative_to(CONFORMANCE))
    prepared = prepare(path, max_elements=MAX_ELEMENTS)
    reduced = any(note.startswith("batch reduced") for note in prepared.notes)
    marks = [pytest.mark.xfail(reason=XFAIL[rel], strict=True)] if rel in XFAIL else []
    return pytest.param(path, id=rel + ("[mb-reduced]" if reduced else ""), marks=marks)


CASES = [_case(path) for path in FILES]


def test_the_conformance_folder_is_there():
    assert len(FILES) >= 100, f"expected the oneDNN graphs under {CONFORMANCE}"


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

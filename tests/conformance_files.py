"""The oneDNN benchdnn graph files the tests run, and which of them cannot pass yet.

The files live in ``tests/data/onednn-graphs/`` (a copy of
``../shared/conformance/onednn-graphs/``; source, commit and licence in
``tests/data/README.md``), so the suite runs on a fresh clone with nothing
beside it.  Every test module that walks the folder takes its file list and its
expected failures from here: one table, so a capability that lands removes its
rows once and every module sees it.

Two kinds of expected failure, each strict (a fix makes the test pass and
pytest then reports XPASS as a failure, so the row must go):

* ``NOT_LOADABLE``: the file does not load (an op kind or attribute value the
  opset does not have yet).  Every test that loads the file fails.
* ``NOT_ONE_PARTITION``: the file loads, runs and matches the reference, but
  oneDNN forms one partition where the pattern library forms several (the CNN
  fusions of issue 15).  Only the partition-count test fails.
"""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent / "data" / "onednn-graphs"
FILES = sorted(ROOT.rglob("*.json"))

#: file (path under ``onednn-graphs/``) -> what is missing
NOT_LOADABLE: dict[str, str] = {
}

#: file -> why it does not give the one partition oneDNN gives
NOT_ONE_PARTITION: dict[str, str] = {
}


def rel(path: Path) -> str:
    """A file's name in the tables: its path under ``onednn-graphs/``."""
    return str(Path(path).relative_to(ROOT))


def params(paths=None, *, partitions: bool = False) -> list:
    """``pytest.param`` per file with a strict xfail mark where it cannot pass yet.

    Args:
        partitions: the test checks oneDNN's partition count, so the
            ``NOT_ONE_PARTITION`` files are expected to fail too.
    """
    out = []
    for path in FILES if paths is None else paths:
        name = rel(path)
        reason = NOT_LOADABLE.get(name) or (NOT_ONE_PARTITION.get(name) if partitions else None)
        marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
        out.append(pytest.param(path, id=name, marks=marks))
    return out

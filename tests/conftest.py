"""The ``long`` marker: the long versions of the standing tests (fuzzing, random
graphs, soak) are skipped unless ``pytest -m long`` selects them or
``GRAPH_API_LONG_TESTS=1`` is set."""
import os

import pytest


def long_tests_enabled(config) -> bool:
    markexpr = config.getoption("markexpr", "") or ""
    return os.environ.get("GRAPH_API_LONG_TESTS", "0") not in ("", "0") or \
        ("long" in markexpr and "not long" not in markexpr)


def pytest_collection_modifyitems(config, items):
    if long_tests_enabled(config):
        return
    skip = pytest.mark.skip(reason="long standing test: run with `pytest -m long` or GRAPH_API_LONG_TESTS=1")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)

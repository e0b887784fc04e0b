"""Fixtures shared by the kernel tests."""
import pytest

from graph_api.config import settings


@pytest.fixture
def check_mode():
    """Every fused partition re-run through the unfused reference (GRAPH_API_CHECK): a
    fast plan that differs from it raises."""
    old = settings.check
    settings.check = True
    yield
    settings.check = old

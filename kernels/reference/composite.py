"""Composite (extension): the decomposition, run op by op on these reference kernels."""
from __future__ import annotations

from graph_api.composite import run_reference
from graph_api.enums import OpKind

COMPOSITE = {OpKind.Composite: run_reference}

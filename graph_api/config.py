"""Environment switches, read in one place.

``GRAPH_API_VERBOSE=1`` prints one line per partition compile/execute (pattern,
ops, kernel, fpmath, times), like ONEDNN_VERBOSE.  ``GRAPH_API_CHECK=1`` runs
every fused partition also through the unfused reference plan and raises on a
mismatch.  ``GRAPH_API_REFERENCE=1`` runs every partition on the reference
plan (ground truth; never the default).  All can be changed at run time through :data:`settings`.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() not in ("", "0", "false", "no", "off")


@dataclass
class Settings:
    verbose: bool = _flag("GRAPH_API_VERBOSE")
    check: bool = _flag("GRAPH_API_CHECK")
    reference: bool = _flag("GRAPH_API_REFERENCE")


settings = Settings()


def log(message: str) -> None:
    """Write one verbose line (only when verbose is on)."""
    if settings.verbose:
        print(f"graph_api_verbose,{message}", file=sys.stderr, flush=True)

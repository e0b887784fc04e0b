"""Cuts a finalized graph into partitions.

Until the pattern library lands, every op is its own partition (this is
exactly ``PartitionPolicy.debug``).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Fusion:
    """One partition-to-be: op ids in topological order, the pattern that took
    them (None for a single op) and the pattern's role bindings."""

    op_ids: list[int]
    pattern: object = None
    bindings: dict = field(default_factory=dict)


def partition_graph(graph, policy) -> list[Fusion]:
    return [Fusion([op_id]) for op_id in graph.topological_op_ids()]

"""Extension: a Composite op kept as one partition (it has a fast kernel)."""
from __future__ import annotations

from graph_api.enums import OpKind as K

from ..pattern import Node, Pattern

#: every Composite op that reaches the partitioner was kept for its fast kernel: the runtime
#: decides before partitioning (graph_api.composite_inline) and inlines the others
COMPOSITE = Pattern("composite", 30.0, [
    Node("composite", K.Composite),
], min_ops=1, doc="""One Composite op whose name/version has a fast kernel (kernels.composite).

    inputs ─ composite (Composite name=..., version=...) ─ outputs     one op, KERNELS['composite']

Composites without a suitable fast kernel never reach the partitioner: get_partitions
inlines their decompositions first (graph_api.composite_inline).  Roles: composite.""")

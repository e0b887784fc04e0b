"""Extension: a Composite op kept as one partition (it has a fast kernel)."""
from __future__ import annotations

from graph_api.enums import OpKind as K

from ..pattern import Cond, Node, Pattern


def _has_fast_kernel(op, graph) -> bool:
    from graph_api.composite_inline import decide
    from graph_api.enums import PartitionPolicy

    return decide(op, graph.tensors, PartitionPolicy.fusion)[0]


COMPOSITE = Pattern("composite", 30.0, [
    Node("composite", K.Composite,
         when=[Cond("a fast kernel is registered for the composite and suits its shapes",
                    _has_fast_kernel)]),
], min_ops=1, doc="""One Composite op whose name/version has a fast kernel (kernels.composite).

    inputs ─ composite (Composite name=..., version=...) ─ outputs     one op, KERNELS['composite']

Composites without a suitable fast kernel never reach the partitioner: get_partitions
inlines their decompositions first (graph_api.composite_inline).  Roles: composite.""")

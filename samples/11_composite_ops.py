"""Composite ops: a user-defined composite, and the backend's fused-vs-inlined choice.

A Composite op is a named abstraction carried with its reference decomposition
(the StableHLO composite proposal).  This sample

1. defines ``my.softcap`` (``cap * tanh(x / cap)``, the Gemma-2 logit soft-cap) as a
   decomposition that calls the shipped ``tanh`` composite, with ``cap`` an attribute;
2. builds ``x @ W -> my.softcap -> gated_mlp`` (the last a shipped composite);
3. partitions and runs it twice: as the backend chooses (``tanh`` and ``gated_mlp``
   have fast kernels and stay one partition each; ``my.softcap`` has none and is
   inlined, its Divide fusing into the MatMul), then with the reference path forced
   (every decomposition inlined, for results that do not depend on the machine's
   kernels), printing the partitions, the backend's reasons and the max error
   against float64 numpy.

    python -m samples 11_composite_ops
"""
from __future__ import annotations

import numpy as np

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api import composite
from graph_api.composite_library import Builder
from samples import gallery


def softcap_decomposition() -> composite.Decomposition:
    """my.softcap v1: (x: f32[any]) -> cap * tanh(x / cap); attribute cap (default 30)."""
    b = Builder()
    x = b.port()
    cap = b.const("cap")
    y = b.op(K.Multiply, b.composite("tanh", b.op(K.Divide, x, cap)), cap)
    return b.decomposition("my.softcap", [x], [y], {"cap": 30.0}, doc="logit soft-capping")


def build_graph(m: int, k: int, n: int, hidden: int, cap: float) -> ga.Graph:
    lt = lambda i, shape: ga.LogicalTensor(i, dt.f32, shape)  # noqa: E731
    g = ga.Graph()
    g.add_op(ga.Op(0, K.MatMul, [lt(0, [m, k]), lt(1, [k, n])], [lt(2, [m, n])], "proj"))
    g.add_op(composite.composite_op(1, [lt(2, [m, n])], [lt(3, [m, n])], "my.softcap",
                                    decomposition=softcap_decomposition(), op_name="softcap", cap=cap))
    weights = [lt(4, [n, hidden]), lt(5, [n, hidden]), lt(6, [hidden, n])]
    g.add_op(composite.composite_op(2, [lt(3, [m, n])] + weights, [lt(7, [m, n])], "gated_mlp",
                                    op_name="mlp"))
    g.finalize()
    return g


def expected(feeds, cap: float) -> np.ndarray:
    f = {k: v.astype(np.float64) for k, v in feeds.items()}
    s = cap * np.tanh(f[0] @ f[1] / cap)
    gate = s @ f[4]
    return (gate / (1 + np.exp(-gate)) * (s @ f[5])) @ f[6]


def run(graph, feeds, want, reference: bool) -> float:
    with composite.reference_mode(reference):
        parts = graph.get_partitions()
        result = ga.run_graph(graph, feeds, partitions=parts)
        reasons = graph.explain_partitions()
    title = "reference path forced (decompositions inlined)" if reference else "backend choice"
    # the partitions were cut from the graph with composites inlined (part.graph)
    gallery.graph(title, result.partitions[0].partition.graph, result.partitions)
    for op_id, why in sorted(reasons.items()):
        if why.op_kind == "Composite":
            print(f"  op {op_id}: {why}")
    error = float(np.abs(result.outputs[7] - want).max() / np.abs(want).max())
    # f32 everywhere: tanh's approximation (3.7e-7) and K-term f32 dot products
    return gallery.error(f"{title}, max rel vs float64 numpy", error, 1e-4)


def main(small: bool = False) -> None:
    m, k, n, hidden = (4, 32, 32, 64) if small else (32, 512, 512, 1536)
    cap = 5.0
    rng = np.random.default_rng(11)
    with composite.LIBRARY.scope():  # the user definition lives for this sample only
        graph = build_graph(m, k, n, hidden, cap)
        print(graph)
        feeds = {0: rng.standard_normal((m, k)).astype(np.float32),
                 1: (rng.standard_normal((k, n)) * 3 / np.sqrt(k)).astype(np.float32)}
        for i, shape in ((4, (n, hidden)), (5, (n, hidden)), (6, (hidden, n))):
            feeds[i] = (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
        want = expected(feeds, cap)
        for reference in (False, True):
            run(graph, feeds, want, reference)

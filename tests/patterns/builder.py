"""A tiny graph builder for pattern tests, and the fused-vs-debug comparison."""
from __future__ import annotations

import numpy as np

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api.check import compare
from graph_api.fill import fill_inputs


class G:
    """Builds a graph op by op: ``x = g.input((4, 8)); y = g.op(K.ReLU, x)``.

    Op and tensor ids are assigned in order; ``name=`` names the op and records
    its id in ``g.ids``.  Output shapes are left to shape inference unless given.
    """

    def __init__(self, fpmath="strict", apply_to_int=False):
        self.graph = ga.Graph(ga.EngineKind.cpu, fpmath, apply_to_int)
        self.ids: dict[str, int] = {}
        self._op = 0
        self._tensor = 0

    def tensor(self, shape=None, dtype=dt.f32, prop=ga.PropertyType.variable):
        lt = ga.LogicalTensor(self._tensor, dtype, shape, property=prop)
        self._tensor += 1
        return lt

    input = tensor

    def scalar(self, dtype=dt.f32):
        return self.tensor((), dtype, ga.PropertyType.host_scalar)

    def op(self, kind, *inputs, dtype=None, attrs=None, outputs=1, shape=None, name=None,
           dtypes=None):
        """Add an op; ``dtypes`` gives one data type per output (default: ``dtype``,
        itself defaulting to the first input's)."""
        dtype = dtype or inputs[0].dtype
        dtypes = dtypes or [dtype] * outputs
        outs = [self.tensor(shape, d) for d in dtypes]
        op = ga.Op(self._op, kind, list(inputs), outs, name=name or "", attrs=attrs or {})
        self.graph.add_op(op)
        if name:
            self.ids[name] = self._op
        self._op += 1
        if outputs == 0:
            return None
        return outs[0] if outputs == 1 else outs

    def done(self):
        self.graph.finalize()
        return self.graph


def fused(graph):
    """[(pattern name or 'single op', sorted op ids)] of the fusion policy."""
    return [(p.get_kind(), sorted(p.get_ops())) for p in graph.get_partitions()]


def kinds(graph):
    return [p.get_kind() for p in graph.get_partitions()]


def the_fusion(graph):
    """The one fused (multi-op) partition; fails unless there is exactly one."""
    parts = [p for p in graph.get_partitions() if p.pattern_name is not None]
    assert len(parts) == 1, [repr(p) for p in graph.get_partitions()]
    return parts[0]


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def outputs_of(graph, policy, feeds):
    """Graph outputs after running every partition (End-only partitions have no kernel)."""
    parts = [p for p in graph.get_partitions(policy) if any(op.kind != K.End for op in p.ops)]
    run = ga.run_graph(graph, feeds, partitions=parts)
    return {tid: run.outputs[tid] for tid in graph.output_ids if tid in run.outputs}


def assert_same_as_debug(graph, seed=0, exact=True, debug_on_reference=False):
    """Fusion-policy results equal the single-op (debug) results: bit for bit
    (``exact``, for the composed reference plan) or within the check rule of
    :mod:`graph_api.check` (fast kernels sum in another order).

    ``debug_on_reference``: the single ops run the reference plan (for fused
    plans built from the reference kernels, which single-op fast plans do not use)."""
    from graph_api.config import settings

    feeds = fill_inputs(graph, seed)
    got = outputs_of(graph, ga.PartitionPolicy.fusion, feeds)
    saved = settings.reference
    settings.reference = saved or debug_on_reference
    try:
        want = outputs_of(graph, ga.PartitionPolicy.debug, feeds)
    finally:
        settings.reference = saved
    assert got and set(got) == set(want)
    for tid in want:
        if exact:
            assert same_bits(got[tid], want[tid]), f"output {tid} differs from the debug policy"
        else:
            verdict = compare(want[tid], got[tid], graph.tensors[tid].dtype, graph.fpmath)
            assert verdict.ok, f"output {tid}: {verdict.message}"
    return got


__all__ = ["G", "K", "dt", "fused", "kinds", "the_fusion", "assert_same_as_debug", "same_bits"]

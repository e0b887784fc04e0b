"""``HybridPlan``: a fast kernel for the core of a partition, reference steps for the rest."""
from __future__ import annotations

from typing import Callable

import numpy as np

from graph_api.kernels.plan import ComposedPlan, CompileRequest


class HybridPlan:
    """Runs ``core(inputs, arrays)`` then the ops it does not cover through REFERENCE.

    ``core`` gets the partition's input tensors by id (raw buffers available:
    packed int4 stays packed) and a dict to put the logical arrays it produces
    in, keyed by tensor id.  ``covered`` are the op ids the core computes.  A core
    with ``writes_outputs`` set also gets the output tensors and may compute
    straight into their memory; an array it puts in ``arrays`` that already is an
    output's memory is not copied again.
    """

    def __init__(self, request: CompileRequest, name: str, core: Callable, covered: set[int]):
        self.request = request
        self.name = name
        self.core = core
        self.covered = set(covered)
        self.tail = ComposedPlan(request)
        self.tail.steps = [s for s in self.tail.steps if s[1].id not in self.covered]
        self._needs_inputs = any(lt.id in request.input_ids for _, op, _, _ in self.tail.steps
                                 for lt in op.inputs)

    def bind(self, inputs: dict, outputs: dict):
        """The core's bound form for these tensors (see ``CompiledPartition.bind``) when
        no reference step follows it, else None."""
        bind = getattr(self.core, "bind", None)
        if bind is None or self.tail.steps or not getattr(self.core, "writes_outputs", False):
            return None
        return bind(inputs, outputs)

    def execute(self, inputs: dict, outputs: dict) -> None:
        arrays: dict = {}
        if getattr(self.core, "writes_outputs", False):
            self.core(inputs, arrays, outputs)
        else:
            self.core(inputs, arrays)
        if self.tail.steps:
            if self._needs_inputs:
                for tid, t in inputs.items():
                    arrays.setdefault(tid, t.numpy())
            arrays = self.tail.run_arrays(arrays)
        for tid, tensor in outputs.items():
            value = arrays[tid]
            if not (isinstance(value, np.ndarray) and tensor.is_view_of(value)):
                tensor.write(value)

"""Composite (extension): the decomposition, run op by op on these reference kernels."""
from __future__ import annotations

import numpy as np

from graph_api.composite import resolve
from graph_api.enums import OpKind
from graph_api.logical_tensor import dense_strides
from graph_api.kernels.plan import CompileRequest, ComposedPlan


def run_reference(op, inputs, out_lts, ctx) -> list[np.ndarray]:
    """``REFERENCE[Composite]``: the decomposition run op by op on the reference kernels."""
    dec = resolve(op)
    known = dec.infer(op, [np.shape(x) for x in inputs])
    lts = {tid: lt.with_shape(lt.shape, dense_strides(lt.shape)) for tid, lt in known.items()}
    arrays = {port.id: x for port, x in zip(dec.inputs, inputs)}
    arrays.update({tid: c.array(op.attrs) for tid, c in dec.constants.items()})
    request = CompileRequest(None, dec.verified_ops, lts, list(arrays), [p.id for p in dec.outputs],
                             ctx.fpmath)
    arrays = ComposedPlan(request).run_arrays(arrays)
    return [np.asarray(arrays[p.id]).reshape(lt.shape) for p, lt in zip(dec.outputs, out_lts)]


COMPOSITE = {OpKind.Composite: run_reference}

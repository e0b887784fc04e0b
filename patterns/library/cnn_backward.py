"""CNN training (backward) fusions.

oneDNN fuses one backward pair on the CPU: the ReLU gradient feeding the
BatchNorm gradient (``fp_bnorm_bwd_relu_bwd``, priority 8.8, training builds).
The partition runs both gradients in f32 on in-memory arrays, in order
(``kernels/fused/backward_plan.py``, ``ChainBackwardPlan``), which is what the
unfused ops compute.
"""
from __future__ import annotations

from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K

from ..pattern import Cond, In, Node, Pattern


def _stats_are_f32() -> Cond:
    """oneDNN's ``check_input_dtype_from_offset<f32, 2>``: mean, variance (and gamma) f32."""
    return Cond("inputs 2.. (mean, variance, gamma) are f32",
                lambda op, g: all(g.tensors.get(lt.id, lt).dtype == DataType.f32
                                  for lt in op.inputs[2:]))


def _one_or_three_outputs() -> Cond:
    return Cond("has 1 or 3 outputs", lambda op, g: len(op.outputs) in (1, 3))


BATCHNORM_BWD_RELU_BWD = Pattern("batchnorm_bwd_relu_bwd", 8.8, [
    Node("relu_bwd", K.ReLUBackward),
    Node("bn_bwd", K.BatchNormTrainingBackward, [In("relu_bwd", 0)],
         when=[_stats_are_f32(), _one_or_three_outputs()]),
], doc="""ReLU gradient into the BatchNorm gradient (fp_bnorm_bwd_relu_bwd).

    relu_bwd ─ bn_bwd (input 0, as oneDNN's in_edge(0, relu_bwd, 0))

Roles: relu_bwd, bn_bwd.""")

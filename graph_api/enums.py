"""oneDNN Graph enums with their C values (``dnnl_graph_types.h``)."""
from __future__ import annotations

import enum

_OP_KINDS = """
Abs AbsBackward Add AvgPool AvgPoolBackward BatchNormTrainingBackward
BatchNormForwardTraining BatchNormInference BiasAdd BiasAddBackward Clamp
ClampBackward Concat Convolution ConvolutionBackwardData
ConvolutionBackwardWeights ConvTranspose ConvTransposeBackwardData
ConvTransposeBackwardWeights Dequantize Divide DynamicDequantize
DynamicQuantize Elu EluBackward End Exp GELU GELUBackward HardSwish
HardSwishBackward Interpolate InterpolateBackward LayerNorm LayerNormBackward
LeakyReLU Log LogSoftmax LogSoftmaxBackward MatMul Maximum MaxPool
MaxPoolBackward Minimum Mish MishBackward Multiply PReLU PReLUBackward
Quantize Reciprocal ReduceL1 ReduceL2 ReduceMax ReduceMean ReduceMin
ReduceProd ReduceSum ReLU ReLUBackward Reorder Round Sigmoid SigmoidBackward
SoftMax SoftMaxBackward SoftPlus SoftPlusBackward Sqrt SqrtBackward Square
SquaredDifference StaticReshape StaticTranspose Subtract Tanh TanhBackward
TypeCast Wildcard HardSigmoid HardSigmoidBackward Select Pow GroupNorm
GenIndex GreaterEqual RMSNorm Dropout
""".split()
# Extension kinds (not in oneDNN), numbered after oneDNN's: linalg's batch_reduce_matmul.
_OP_KINDS += ["BatchReduceMatMul"]

#: Extension kinds (not oneDNN's), numbered from 1000 so they never take a oneDNN value.
#: Composite: a named op carried with its reference decomposition (graph_api/composite.py).
_EXTENSION_KINDS = [("Composite", 1000)]

#: ``dnnl_graph_op_kind_t``: value = position in oneDNN's enum.
OpKind = enum.IntEnum("OpKind", [(name, i) for i, name in enumerate(_OP_KINDS)] + _EXTENSION_KINDS)
OpKind.__doc__ = "Op kinds spelled and numbered as in oneDNN Graph."
OpKind.__module__ = __name__


class LayoutType(enum.IntEnum):
    undef = 0
    any = 1
    strided = 2
    opaque = 3


class PropertyType(enum.IntEnum):
    """A logical tensor's property.  ``constant`` promises, as in oneDNN, that the
    data does not change after the first execute of a compiled partition: fused
    kernels may cache a prepared copy, keyed on the buffers' identity (address,
    shape, strides, dtype), so a different buffer is always seen, new values
    written into the same buffer are not (README, "Constant tensors")."""

    undef = 0
    variable = 1
    constant = 2
    host_scalar = 3


class FPMathMode(enum.IntEnum):
    """Which implicit down-conversions of f32 data a computation may make."""

    strict = 0
    bf16 = 1
    f16 = 2
    any = 3
    tf32 = 4


class PartitionPolicy(enum.IntEnum):
    fusion = 1
    debug = 2


class EngineKind(enum.IntEnum):
    any = 0
    cpu = 1
    gpu = 2


def parse_enum(enum_cls, value, what: str):
    """Name, member or int -> member; otherwise InvalidArguments naming choices."""
    if isinstance(value, enum_cls):
        return value
    try:
        return enum_cls[value] if isinstance(value, str) else enum_cls(value)
    except (KeyError, ValueError):
        from .errors import InvalidArguments

        choices = ", ".join(m.name for m in enum_cls)
        raise InvalidArguments(f"unknown {what} {value!r}; expected one of: {choices}") from None

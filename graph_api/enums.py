"""oneDNN Graph enums with their C values (``dnnl_graph_types.h``)."""
from __future__ import annotations

import enum

from .errors import InvalidArguments

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


class OpAttr(enum.IntEnum):
    """``op::attr`` with oneDNN's C values (``dnnl_graph_op_attr_t``): ``op.set_attr(OpAttr.axis, -1)``
    is ``op.set_attr<int64_t>(op::attr::axis, -1)``; the attribute's name works too."""

    alpha = 0x1
    beta = 0x2
    epsilon = 0x3
    max = 0x4
    min = 0x5
    momentum = 0x6
    scales = 0x20
    axis = 0x30
    begin_norm_axis = 0x31
    groups = 0x32
    mask = 0x33  # quantization scale mask (oneDNN branch lvtao/main/quant-mask, 2026-08)
    axes = 0x40
    dilations = 0x41
    dst_shape = 0x42
    kernel = 0x43
    order = 0x44
    output_padding = 0x45
    pads_begin = 0x46
    pads_end = 0x47
    shape = 0x48
    sizes = 0x49
    src_shape = 0x4A
    strides = 0x4B
    weights_shape = 0x4C
    zps = 0x4D
    group_shape = 0x4E
    exclude_pad = 0x60
    keep_dims = 0x61
    keep_stats = 0x62
    per_channel_broadcast = 0x63
    special_zero = 0x64
    transpose_a = 0x65
    transpose_b = 0x66
    use_affine = 0x67
    use_dst = 0x68
    auto_broadcast = 0x80
    auto_pad = 0x81
    coordinate_transformation_mode = 0x82
    data_format = 0x83
    mode = 0x84
    qtype = 0x85
    rounding_type = 0x86
    weights_format = 0x87
    accumulation_mode = 0x88


class GraphDumpMode(enum.IntFlag):
    """oneDNN's ``graph_dump_mode`` bitmask (``set_dump_mode``; graph_api.dump)."""
    none = 0
    subgraph = 1  # each partition, as compiled
    graph = 2  # the whole graph before and after partitioning


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
        choices = ", ".join(m.name for m in enum_cls)
        raise InvalidArguments(f"unknown {what} {value!r}; expected one of: {choices}") from None

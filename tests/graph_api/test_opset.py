"""The op table (``opset.OP_SCHEMAS``) and shape inference (``shapes``).

Tensors are written as compact specs: ``"f32:2x3"`` (shape (2, 3)), ``"f32:"``
(a scalar), ``"f32:?"`` (unknown rank), ``"f32:-1x3"`` (unknown first dim).
Every test op has id ``OP_ID`` so error messages can be checked for it.
"""
from __future__ import annotations

import pytest

from graph_api import shapes
from graph_api.enums import OpKind
from graph_api.errors import InvalidGraphOp, InvalidShape
from graph_api.logical_tensor import LogicalTensor
from graph_api.op import Op
from graph_api.opset import FORWARD_KINDS, OP_SCHEMAS
from graph_api.schema import verify_op

OP_ID = 4242


def lt(tensor_id: int, spec: str) -> LogicalTensor:
    dtype, _, dims = spec.partition(":")
    if dims == "?":
        shape = None
    else:
        shape = tuple(int(d) for d in dims.split("x")) if dims else ()
    return LogicalTensor(tensor_id, dtype, shape)


def make(kind: str, ins, outs, **attrs) -> Op:
    inputs = [lt(i, spec) for i, spec in enumerate(ins)]
    outputs = [lt(100 + i, spec) for i, spec in enumerate(outs)]
    return Op(OP_ID, kind, inputs, outputs, attrs=attrs)


def verify(kind: str, ins, outs, **attrs) -> Op:
    op = make(kind, ins, outs, **attrs)
    verify_op(op, OP_SCHEMAS)
    return op


def infer(kind: str, ins, outs=("f32:?",), **attrs):
    """Verify the op, then run its shape function on the inputs' shapes."""
    op = verify(kind, ins, outs, **attrs)
    return OP_SCHEMAS[op.kind].infer_shapes(op, [x.shape for x in op.inputs])


def compatible(declared, inferred) -> bool:
    if declared is None or inferred is None:
        return True
    return len(declared) == len(inferred) and all(
        -1 in (d, i) or d == i for d, i in zip(declared, inferred))


# ----------------------------------------------------------------- coverage
def test_every_forward_kind_has_a_row():
    missing = sorted(k.name for k in FORWARD_KINDS - set(OP_SCHEMAS))
    assert not missing
    assert all(schema.kind == kind for kind, schema in OP_SCHEMAS.items())
    assert set(OP_SCHEMAS) == set(OpKind)  # the backward kinds too


# --------------------------------------------------------- valid ops table
_CONV2D = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1])
_POOL2D = dict(kernel=[3, 3], strides=[2, 2], pads_begin=[0, 0], pads_end=[0, 0])

# kind: (inputs, outputs, attrs given, attrs expected after add_op)
VALID = {
    "Abs": (["f32:2x3"], ["f32:2x3"], {}, {}),
    "Exp": (["bf16:2x3"], ["bf16:2x3"], {}, {}),
    "HardSwish": (["f16:4"], ["f16:4"], {}, {}),
    "Log": (["f32:2x3"], ["f32:2x3"], {}, {}),
    "Mish": (["f32:2x3"], ["f32:2x3"], {}, {}),
    "Reciprocal": (["f32:2x3"], ["f32:2x3"], {}, {}),
    "ReLU": (["f32:"], ["f32:"], {}, {}),
    "Round": (["f32:2x3"], ["f32:2x3"], {}, {}),
    "Sigmoid": (["f32:2x3"], ["f32:2x3"], {}, {}),
    "Sqrt": (["f32:2x3"], ["f32:2x3"], {}, {}),
    "Square": (["f32:2x3"], ["f32:2x3"], {}, {}),
    "Tanh": (["f32:2x3"], ["f32:2x3"], {}, {}),
    "Reorder": (["bf16:2x3"], ["bf16:2x3"], {}, {}),
    "Clamp": (["f32:2x3"], ["f32:2x3"], {"min": -1, "max": 1.0}, {"min": -1.0, "max": 1.0}),
    "Elu": (["f32:2x3"], ["f32:2x3"], {"alpha": 1.0}, {"alpha": 1.0}),
    "LeakyReLU": (["f32:2x3"], ["f32:2x3"], {"alpha": 0.1}, {"alpha": 0.1}),
    "HardSigmoid": (["f32:2x3"], ["f32:2x3"], {"alpha": 0.2, "beta": 0.5},
                    {"alpha": 0.2, "beta": 0.5}),
    "Pow": (["f32:2x3"], ["f32:2x3"], {"beta": 2}, {"beta": 2.0}),
    "GELU": (["f32:2x3"], ["f32:2x3"], {}, {"mode": "gelu_erf"}),
    "SoftPlus": (["f32:2x3"], ["f32:2x3"], {}, {"beta": 1.0}),
    "Add": (["f32:2x3", "bf16:3"], ["f32:2x3"], {}, {"auto_broadcast": "numpy"}),
    "Subtract": (["s32:4x1", "s32:"], ["s32:4x1"], {}, {"auto_broadcast": "numpy"}),
    "Multiply": (["f16:2x3", "f32:2x1"], ["f32:2x3"], {}, {"auto_broadcast": "numpy"}),
    "Divide": (["f32:2x3", "f32:2x3"], ["f32:2x3"], {"auto_broadcast": "none"},
               {"auto_broadcast": "none"}),
    "Maximum": (["f32:2x3", "f32:1"], ["f32:2x3"], {}, {"auto_broadcast": "numpy"}),
    "Minimum": (["bf16:2x3", "bf16:2x3"], ["bf16:2x3"], {}, {"auto_broadcast": "numpy"}),
    "SquaredDifference": (["f32:2x3", "f32:3"], ["f32:2x3"], {}, {"auto_broadcast": "numpy"}),
    "GreaterEqual": (["s32:4x1", "s32:1x5"], ["boolean:4x5"], {}, {"auto_broadcast": "numpy"}),
    "Select": (["boolean:1x5", "f32:4x1", "f32:1x5"], ["f32:4x5"], {},
               {"auto_broadcast": "numpy"}),
    "BiasAdd": (["f32:2x4x4x8", "f32:8"], ["f32:2x4x4x8"], {}, {"data_format": "NXC"}),
    "PReLU": (["f32:2x8x4x4", "f32:8"], ["f32:2x8x4x4"], {"data_format": "NCX"},
              {"per_channel_broadcast": True}),
    "TypeCast": (["bf16:2x3"], ["f32:2x3"], {}, {}),
    "GenIndex": (["f32:2x3"], ["s32:2x3"], {"axis": -1}, {"axis": -1}),
    "Dropout": (["f32:2x3", "s64:", "s64:", "f32:"], ["f32:2x3", "u8:2x3"], {}, {}),
    "StaticReshape": (["f32:2x3"], ["f32:3x2"], {"shape": [3, -1], "special_zero": False},
                      {"shape": [3, -1], "special_zero": False}),
    "StaticTranspose": (["f32:2x3x4"], ["f32:4x2x3"], {"order": [-1, 0, 1]},
                        {"order": [-1, 0, 1]}),
    "Concat": (["f32:2x3", "f32:4x3", "f32:1x3"], ["f32:7x3"], {"axis": 0}, {"axis": 0}),
    "ReduceL1": (["f32:2x3"], ["f32:2"], {"axes": [1]}, {"axes": [1], "keep_dims": False}),
    "ReduceL2": (["f32:2x3"], ["f32:2x1"], {"axes": [1], "keep_dims": True}, {}),
    "ReduceMax": (["f32:2x3"], ["f32:3"], {"axes": [0]}, {"keep_dims": False}),
    "ReduceMean": (["f32:2x3x4"], ["f32:3"], {"axes": [0, -1]}, {"keep_dims": False}),
    "ReduceMin": (["f32:2x3"], ["f32:2"], {"axes": [-1]}, {}),
    "ReduceProd": (["f32:2x3"], ["f32:2"], {"axes": [1]}, {}),
    # the 2-input form: axes from a tensor, the attribute keeps its default []
    "ReduceSum": (["f32:2x3", "s32:1"], ["f32:?"], {}, {"axes": [], "keep_dims": False}),
    "MatMul": (["bf16:2x3x4", "bf16:4x5", "bf16:5"], ["f32:2x3x5"], {},
               {"transpose_a": False, "transpose_b": False, "accumulation_mode": "strict"}),
    "BatchReduceMatMul": (["f32:3x4x5", "f32:3x5x2"], ["f32:4x2"], {},
                          {"accumulation_mode": "strict"}),
    "SoftMax": (["f32:2x3"], ["bf16:2x3", "f32:2x1"], {}, {"axis": 1, "mode": "none"}),
    "LogSoftmax": (["f32:2x3"], ["f32:2x3"], {}, {"axis": -1}),
    "LayerNorm": (["f32:2x3", "f32:3", "f32:3"], ["f32:2x3", "f32:2", "f32:2"], {},
                  {"keep_stats": True, "begin_norm_axis": -1, "use_affine": True,
                   "epsilon": 1e-5}),
    "GroupNorm": (["f32:2x3x3x4", "f32:4", "f32:4"], ["f32:2x3x3x4", "f32:2x2", "f32:2x2"],
                  {"groups": 2}, {"keep_stats": True, "use_affine": True, "epsilon": 1e-5,
                                  "data_format": "NXC"}),
    "RMSNorm": (["f16:2x3", "f16:3"], ["f16:2x3"], {}, {"begin_norm_axis": -1, "epsilon": 1e-5}),
    "BatchNormInference": (["f32:2x4x4x8"] + ["f32:8"] * 4, ["f32:2x4x4x8"], {"epsilon": 1e-3},
                           {"data_format": "NXC"}),
    "BatchNormForwardTraining": (["f32:2x8x4x4", "f32:8", "f32:8"], ["f32:2x8x4x4"] + ["f32:8"] * 4,
                                 {"epsilon": 1e-3, "data_format": "NCX"}, {}),
    "Convolution": (["f32:1x5x5x3", "f32:3x3x3x8"], ["f32:1x5x5x8"], _CONV2D,
                    {"groups": 1, "auto_pad": "None", "data_format": "NXC",
                     "weights_format": "XIO"}),
    "ConvTranspose": (["f32:1x3x3x4", "f32:3x3x2x4"], ["f32:1x3x3x2"], _CONV2D,
                      {"weights_format": "XOI", "data_format": "NXC", "output_padding": [0] * 12}),
    "AvgPool": (["f32:1x3x5x5"], ["f32:1x3x2x2"],
                dict(_POOL2D, exclude_pad=False, data_format="NCX"),
                {"rounding_type": "floor", "auto_pad": "None"}),
    "MaxPool": (["f32:1x5x5x3"], ["f32:1x2x2x3"], _POOL2D,
                {"dilations": [1] * 12, "data_format": "NXC", "rounding_type": "floor"}),
    "Interpolate": (["f32:1x3x5x5"], ["f32:1x3x10x10"],
                    {"mode": "nearest", "sizes": [10, 10], "data_format": "NCX"},
                    {"coordinate_transformation_mode": "half_pixel"}),
    "Quantize": (["f32:2x3"], ["u8:2x3"], {"scales": [0.5], "zps": [3]},
                 {"qtype": "per_tensor", "axis": 1}),
    "Dequantize": (["f8_e4m3:2x3"], ["f32:2x3"], {"scales": [0.5]}, {"qtype": "per_tensor"}),
    "DynamicDequantize": (["s4:4x8", "f16:4x2", "u8:4x2"], ["f16:4x8"],
                          {"qtype": "per_group", "group_shape": [1, 4]}, {"axis": 1}),
    "DynamicQuantize": (["f32:2x64", "f32:1"], ["s8:2x64"], {},
                        {"qtype": "per_tensor", "axis": 1}),
    "End": (["f32:2x3"], [], {}, {}),
    "Wildcard": (["f32:2", "s8:3"], ["u4:7", "boolean:?"], {}, {}),
    "Composite": (["f32:2x3"], ["f32:2x3"], {"name": "tanh"}, {"version": 1}),  # extension
}

# ---- backward (training) kinds: ports and defaults of oneDNN's op_def.hpp
_T = ["f32:2x3", "f32:2x3"]
VALID.update({
    "AbsBackward": (_T, ["f32:2x3"], {}, {}),
    "ClampBackward": (_T, ["f32:2x3"], {"min": -1.0, "max": 1.0}, {"use_dst": True}),
    "EluBackward": (_T, ["f32:2x3"], {"alpha": 1.0}, {"use_dst": True}),
    "GELUBackward": (["bf16:2x3", "bf16:2x3"], ["bf16:2x3"], {}, {"mode": "gelu_erf"}),
    "HardSigmoidBackward": (_T, ["f32:2x3"], {"alpha": 0.2, "beta": 0.5}, {}),
    "HardSwishBackward": (["f16:4", "f16:4"], ["f16:4"], {}, {}),
    "MishBackward": (_T, ["f32:2x3"], {}, {}),
    "ReLUBackward": (_T, ["f32:2x3"], {}, {"use_dst": True}),
    "SigmoidBackward": (_T, ["f32:2x3"], {}, {"use_dst": True}),
    "SoftPlusBackward": (_T, ["f32:2x3"], {}, {"beta": 1.0}),
    "SqrtBackward": (_T, ["f32:2x3"], {}, {"use_dst": True}),
    "TanhBackward": (_T, ["f32:2x3"], {}, {"use_dst": True}),
    "SoftMaxBackward": (["bf16:2x3", "bf16:2x3"], ["f32:2x3"], {}, {"axis": 1}),
    "LogSoftmaxBackward": (_T, ["f32:2x3"], {}, {"axis": -1}),
    "BiasAddBackward": (["f32:2x5x4"], ["f32:4"], {}, {"data_format": "NXC"}),
    "PReLUBackward": (["f32:2x3x4", "f32:3", "f32:2x3x4"], ["f32:2x3x4", "f32:3"],
                      {"data_format": "NCX"}, {}),
    "BatchNormTrainingBackward": (["f32:2x4x3", "f32:2x4x3", "f32:3", "f32:3", "f32:3"],
                                  ["f32:2x4x3", "f32:3", "f32:3"], {"epsilon": 1e-5},
                                  {"data_format": "NXC"}),
    "LayerNormBackward": (["f32:2x3x4", "f32:2x3x4", "f32:2x3", "f32:2x3", "f32:4", "f32:4"],
                          ["f32:2x3x4", "f32:4", "f32:4"], {},
                          {"begin_norm_axis": -1, "use_affine": True, "epsilon": 1e-5}),
    "ConvolutionBackwardData": (["f32:1x3x3x4", "f32:3x3x2x4"], ["f32:1x5x5x2"],
                                dict(_CONV2D, pads_begin=[0, 0], pads_end=[0, 0],
                                     dst_shape=[1, 5, 5, 2]),
                                {"weights_format": "XIO", "groups": 1,
                                 "output_padding": [0] * 12}),
    "ConvolutionBackwardWeights": (["f32:1x2x5x5", "f32:1x4x5x5"], ["f32:4x2x3x3"],
                                   dict(_CONV2D, data_format="NCX", weights_format="OIX",
                                        weights_shape=[4, 2, 3, 3]), {"auto_pad": "None"}),
    "ConvTransposeBackwardData": (["f32:1x4x7x7", "f32:2x4x3x3"], ["f32:1x2x5x5"],
                                  dict(_CONV2D, pads_begin=[0, 0], pads_end=[0, 0],
                                       data_format="NCX", weights_format="IOX"), {"groups": 1}),
    "ConvTransposeBackwardWeights": (["f32:1x5x5x2", "f32:1x7x7x4"], ["f32:3x3x4x2"],
                                     dict(_CONV2D, pads_begin=[0, 0], pads_end=[0, 0],
                                          weights_shape=[3, 3, 4, 2]), {"weights_format": "XOI"}),
    "AvgPoolBackward": (["f32:1x3x2x2"], ["f32:1x3x5x5"],
                        dict(_POOL2D, exclude_pad=True, data_format="NCX", src_shape=[1, 3, 5, 5]),
                        {"auto_pad": "None"}),
    "MaxPoolBackward": (["f32:1x5x5x3", "f32:1x2x2x3"], ["f32:1x5x5x3"], _POOL2D,
                        {"dilations": [1] * 12, "data_format": "NXC"}),
    "InterpolateBackward": (["f32:1x3x5x5", "f32:1x3x10x10"], ["f32:1x3x5x5"],
                            {"mode": "linear", "scales": [2.0, 2.0], "data_format": "NCX"},
                            {"coordinate_transformation_mode": "half_pixel"}),
})


def test_valid_table_covers_every_row():
    assert set(VALID) == {k.name for k in OP_SCHEMAS}


@pytest.mark.parametrize("kind", sorted(VALID))
def test_valid_op_verifies_writes_defaults_and_infers_its_shapes(kind):
    ins, outs, attrs, expected = VALID[kind]
    op = verify(kind, ins, outs, **attrs)
    for name, value in expected.items():
        assert op.attrs[name] == value, name
    assert set(op.attrs) <= set(OP_SCHEMAS[op.kind].attr_by_name)
    inferred = OP_SCHEMAS[op.kind].infer_shapes(op, [x.shape for x in op.inputs])
    assert len(inferred) == len(op.outputs)
    for out, shape in zip(op.outputs, inferred):
        assert compatible(out.shape, shape), (out, shape)


def test_every_declared_default_is_written():
    op = verify("LayerNorm", ["f32:2x3"], ["f32:2x3"], keep_stats=False)
    assert op.attrs == {"keep_stats": False, "begin_norm_axis": -1, "use_affine": True,
                        "epsilon": 1e-5}
    op = verify("ReduceSum", ["f32:2x3"], ["f32:?"])
    assert op.attrs == {"axes": [], "keep_dims": False}


# ---------------------------------------------------------- generic rules
GENERIC_ERRORS = [
    ("too many inputs", "Abs", ["f32:2", "f32:2"], ["f32:2"], {}, "got 2 inputs, expected 1"),
    ("too few inputs", "MatMul", ["f32:2x2"], ["f32:2x2"], {}, "got 1 inputs, expected 2..3"),
    ("too many outputs", "SoftMax", ["f32:2"], ["f32:2"] * 3, {}, "got 3 outputs"),
    ("End has no outputs", "End", ["f32:2"], ["f32:2"], {}, "got 1 outputs, expected 0"),
    ("Dropout needs 4 inputs", "Dropout", ["f32:2", "s64:", "s64:"], ["f32:2"], {},
     "got 3 inputs"),
    ("Concat needs an input", "Concat", [], ["f32:2"], {"axis": 0}, "got 0 inputs"),
    ("wrong dtype", "ReLU", ["s32:2"], ["s32:2"], {}, "allowed: bf16, f16, f32"),
    ("Multiply has no s32", "Multiply", ["s32:2", "s32:2"], ["s32:2"], {}, "s32"),
    ("Select cond is boolean", "Select", ["f32:2", "f32:2", "f32:2"], ["f32:2"], {}, "boolean"),
    ("Dropout seed is s64", "Dropout", ["f32:2", "s32:", "s64:", "f32:"], ["f32:2"], {}, "s32"),
    ("Dropout mask is u8", "Dropout", ["f32:2", "s64:", "s64:", "f32:"], ["f32:2", "f32:2"],
     {}, "mask"),
    ("type variable", "Maximum", ["f32:2", "bf16:2"], ["f32:2"], {}, "were bound to f32"),
    ("GreaterEqual same T", "GreaterEqual", ["f32:2", "s32:2"], ["boolean:2"], {}, "bound"),
    ("DynamicDequantize dst = scales dtype", "DynamicDequantize", ["s8:2", "f16:1"], ["f32:2"],
     {}, "bound to f16"),
    ("DynamicQuantize src = scales dtype", "DynamicQuantize", ["f16:2", "f32:1"], ["s8:2"], {},
     "bound to f16"),
    ("Reorder keeps the dtype", "Reorder", ["f32:2"], ["bf16:2"], {}, "bound"),
    ("unknown attribute", "ReLU", ["f32:2"], ["f32:2"], {"alpha": 1.0}, "unknown attribute 'alpha'"),
    ("End takes no attrs", "End", ["f32:2"], [], {"axis": 1}, "unknown attribute"),
    ("wrong attribute kind", "SoftMax", ["f32:2"], ["f32:2"], {"axis": 1.5}, "must be s64"),
    ("bool is not s64", "Concat", ["f32:2"], ["f32:2"], {"axis": True}, "must be s64"),
    ("list attr", "StaticTranspose", ["f32:2"], ["f32:2"], {"order": "0"}, "must be s64[]"),
    ("alternative kinds", "DynamicDequantize", ["s8:2", "f32:1"], ["f32:2"], {"axis": "x"},
     "must be s64|s64[]"),
    ("bad choice", "GELU", ["f32:2"], ["f32:2"], {"mode": "gelu_fast"}, "is not one of"),
    ("bad accumulation mode", "MatMul", ["f32:2x2", "f32:2x2"], ["f32:2x2"],
     {"accumulation_mode": "f64"}, "accumulation_mode='f64'"),
    ("bad SoftMax mode", "SoftMax", ["f32:2"], ["f32:2"], {"mode": "inf_as_nan"}, "not one of"),
    ("bad broadcast", "Add", ["f32:2", "f32:2"], ["f32:2"], {"auto_broadcast": "bidirectional"},
     "not one of"),
    ("bad qtype", "Quantize", ["f32:2"], ["u8:2"], {"scales": [1.0], "qtype": "per_group"},
     "not one of"),
    ("bad data_format", "BiasAdd", ["f32:2x2", "f32:2"], ["f32:2x2"], {"data_format": "NHWC"},
     "not one of"),
]
for _kind, _attr in [("Elu", "alpha"), ("LeakyReLU", "alpha"), ("Clamp", "max"),
                     ("HardSigmoid", "beta"), ("Pow", "beta"), ("GenIndex", "axis"),
                     ("Concat", "axis"), ("StaticReshape", "special_zero"),
                     ("StaticTranspose", "order"), ("Quantize", "scales")]:
    _all = {"Clamp": {"min": 0.0}, "HardSigmoid": {"alpha": 0.2},
            "StaticReshape": {"shape": [2]}}.get(_kind, {})
    _out = {"GenIndex": "s32:2", "Quantize": "s8:2"}.get(_kind, "f32:2")
    GENERIC_ERRORS.append((f"{_kind} needs {_attr}", _kind, ["f32:2"], [_out], _all,
                           f"required attribute {_attr!r}"))


@pytest.mark.parametrize("case", GENERIC_ERRORS, ids=[c[0] for c in GENERIC_ERRORS])
def test_generic_schema_errors(case):
    _, kind, ins, outs, attrs, fragment = case
    with pytest.raises(InvalidGraphOp) as info:
        verify(kind, ins, outs, **attrs)
    assert f"op {OP_ID}" in str(info.value)
    assert fragment in str(info.value)


def test_scalar_for_a_list_attribute_is_a_one_element_list():
    """As oneDNN's C API stores set_attr<float>(scales, 0.25f) / set_attr<int64_t>(zps, 128)."""
    op = verify("Dequantize", ["u8:2"], ["f32:2"], qtype="per_tensor", scales=0.25, zps=128)
    assert op.attrs["scales"] == [0.25] and op.attrs["zps"] == [128]
    with pytest.raises(InvalidGraphOp, match="must be f32"):
        verify("Dequantize", ["u8:2"], ["f32:2"], qtype="per_tensor", scales=True)


# --------------------------------------------------- per-op constraints
CONSTRAINT_ERRORS = [
    ("TypeCast bf16->f16", "TypeCast", ["bf16:2"], ["f16:2"], {}, "bf16 -> f16"),
    ("TypeCast f16->bf16", "TypeCast", ["f16:2"], ["bf16:2"], {}, "f16 -> bf16"),
    ("TypeCast same type", "TypeCast", ["f32:2"], ["f32:2"], {}, "both f32"),
    ("SoftMax bf16->f16", "SoftMax", ["bf16:2"], ["f16:2"], {}, "src bf16 with dst f16"),
    ("MatMul dst rule", "MatMul", ["bf16:2x2", "bf16:2x2"], ["f16:2x2"], {},
     "dst must be bf16 or f32"),
    ("MatMul f32 to xf16", "MatMul", ["f32:2x2", "f32:2x2"], ["bf16:2x2"], {},
     "dst must be f32 or f32"),
    ("MatMul bias type", "MatMul", ["f16:2x2", "f16:2x2", "f32:2"], ["f16:2x2"], {}, "bound"),
    ("LayerNorm keep_stats outputs", "LayerNorm", ["f32:2x3"], ["f32:2x3"], {},
     "keep_stats=true needs 3 outputs"),
    ("GroupNorm keep_stats outputs", "GroupNorm", ["f32:2x4"], ["f32:2x4"], {"groups": 2},
     "keep_stats=true needs 3 outputs"),
    ("LayerNorm 2 inputs", "LayerNorm", ["f32:2x3", "f32:3"], ["f32:2x3"], {"keep_stats": False},
     "got 2 inputs, expected one of [1, 3]"),
    ("LayerNorm 2 outputs", "LayerNorm", ["f32:2x3"], ["f32:2x3", "f32:2"], {"keep_stats": False},
     "got 2 outputs, expected one of [1, 3]"),
    ("LayerNorm bf16 gamma", "LayerNorm", ["f32:2x3", "bf16:3", "bf16:3"],
     ["f32:2x3"], {"keep_stats": False}, "bf16 gamma needs a bf16 src"),
    ("LayerNorm bf16 stats", "LayerNorm", ["f16:2x3"], ["f16:2x3", "bf16:2", "bf16:2"], {},
     "bf16 mean needs a bf16 src"),
    ("RMSNorm bf16 gamma", "RMSNorm", ["f16:2x3", "bf16:3"], ["f16:2x3"], {}, "bf16 gamma"),
    ("BatchNorm bf16 aux", "BatchNormInference", ["f32:2x3"] + ["bf16:3"] * 4, ["f32:2x3"],
     {"epsilon": 1e-5}, "bf16 input 2 needs a bf16 src"),
    ("Reduce axes twice", "ReduceSum", ["f32:2x3", "s32:1"], ["f32:2"], {"axes": [1]},
     "give exactly one"),
    ("Interpolate sizes and scales", "Interpolate", ["f32:1x2x3"], ["f32:1x2x3"],
     {"mode": "linear", "sizes": [3], "scales": [1.0]}, "given both"),
    ("Interpolate neither", "Interpolate", ["f32:1x2x3"], ["f32:1x2x3"], {"mode": "linear"},
     "given neither"),
    ("Interpolate mode required", "Interpolate", ["f32:1x2x3"], ["f32:1x2x3"], {"sizes": [3]},
     "required attribute 'mode'"),
    ("negative pads", "Convolution", ["f32:1x3x3x1", "f32:1x1x1x1"], ["f32:1x3x3x1"],
     dict(_CONV2D, pads_begin=[-1, 0]), "pads_begin=[-1, 0] must be non-negative"),
    ("MaxPool dilations", "MaxPool", ["f32:1x5x5x3"], ["f32:?"], dict(_POOL2D, dilations=[1]),
     "dilations=[1] has 1 entries, expected 2"),
    ("Quantize per_tensor scales", "Quantize", ["f32:2"], ["u8:2"], {"scales": [1.0, 2.0]},
     "per_tensor takes exactly 1 scale, given 2"),
    ("Dequantize zps length", "Dequantize", ["u8:2x2"], ["f32:2x2"],
     {"qtype": "per_channel", "scales": [1.0, 2.0], "zps": [1]}, "zps has 1 entries, expected 2"),
    ("Dequantize zps with f8", "Dequantize", ["f8_e5m2:2"], ["f32:2"], {"scales": [1.0], "zps": [0]},
     "zps are not supported for f8"),
    ("Quantize zps with f8 dst", "Quantize", ["f32:2"], ["f8_e4m3:2"],
     {"scales": [1.0], "zps": [0]}, "zps are not supported for f8"),
    ("Quantize empty scales", "Quantize", ["f32:2"], ["u8:2"], {"scales": []}, "must not be empty"),
]

# DynamicDequantize / DynamicQuantize: (case, kind, inputs, outputs, attrs, fragment)
DYN_QUANT_ERRORS = [
    ("per_tensor scale count", "DynamicDequantize", ["s8:2x4", "f32:2"], ["f32:2x4"], {},
     "per_tensor scales [2] must hold exactly 1 value"),
    ("per_tensor zp count", "DynamicDequantize", ["u8:2x4", "f32:1", "u8:3"], ["f32:2x4"], {},
     "per_tensor zps [3]"),
    ("per_channel scale count", "DynamicDequantize", ["s8:2x4", "f32:2"], ["f32:2x4"],
     {"qtype": "per_channel", "axis": 1}, "must hold src dim 1 = 4 values"),
    ("per_channel zps", "DynamicQuantize", ["f32:2x4", "f32:4", "s8:2"], ["u8:2x4"],
     {"qtype": "per_channel", "axis": -1}, "zps [2] must hold 1 value or match scales [4]"),
    ("per_channel axis", "DynamicDequantize", ["s8:2x4", "f32:4"], ["f32:2x4"],
     {"qtype": "per_channel", "axis": 2}, "axis=2 is out of range"),
    ("int4 without groups", "DynamicDequantize", ["s4:2x4", "f32:1"], ["f32:2x4"], {},
     "s4 tensor 0 needs qtype=per_group"),
    ("int4 per_channel", "DynamicDequantize", ["u4:2x4", "f32:4"], ["f32:2x4"],
     {"qtype": "per_channel"}, "int4 without groups"),
    ("int4 dst without groups", "DynamicQuantize", ["f32:2x4", "f32:1"], ["u4:2x4"], {},
     "u4 tensor 100 needs qtype=per_group"),
    ("group does not divide", "DynamicDequantize", ["s8:4x8", "f32:4x3"], ["f32:4x8"],
     {"qtype": "per_group", "group_shape": [1, 3]}, "group_shape[1]=3 does not divide src dim 1 = 8"),
    ("per_group scales shape", "DynamicDequantize", ["s8:4x8", "f32:4x4"], ["f32:4x8"],
     {"qtype": "per_group", "group_shape": [1, 4]}, "scales [4, 4] must be [4, 2]"),
    ("per_group scales rank", "DynamicDequantize", ["s8:4x8", "f32:8"], ["f32:4x8"],
     {"qtype": "per_group", "group_shape": [1, 4]}, "must be [4, 2]"),
    ("per_group zps shape", "DynamicDequantize", ["s8:4x8", "f32:4x2", "s8:1"], ["f32:4x8"],
     {"qtype": "per_group", "group_shape": [1, 4]}, "zps [1] must have the scales shape [4, 2]"),
    ("group_shape length", "DynamicDequantize", ["s8:4x8", "f32:4x2"], ["f32:4x8"],
     {"qtype": "per_group", "group_shape": [4]}, "must hold 2 positive entries"),
    ("group_shape positive", "DynamicDequantize", ["s8:4x8", "f32:4x2"], ["f32:4x8"],
     {"qtype": "per_group", "group_shape": [0, 4]}, "positive entries"),
    ("per_group rank 1", "DynamicDequantize", ["s8:8", "f32:2"], ["f32:8"],
     {"qtype": "per_group", "group_shape": [4]}, "rank >= 2"),
    ("per_group needs group_shape", "DynamicDequantize", ["s8:4x8", "f32:4x2"], ["f32:4x8"],
     {"qtype": "per_group"}, "needs a non-empty group_shape"),
    ("RFC groups do not divide", "DynamicDequantize", ["s4:4x8", "f32:1x3"], ["f32:4x8"],
     {"qtype": "per_group", "axis": [1], "groups": [3]}, "groups entry 3 for dim 1 does not divide"),
    ("RFC groups length", "DynamicDequantize", ["s4:4x8", "f32:4x2"], ["f32:4x8"],
     {"qtype": "per_group", "axis": [0, 1], "groups": [4]}, "groups=[4] has 1 entries, expected 2"),
    ("RFC axis twice", "DynamicDequantize", ["s4:4x8", "f32:4x2"], ["f32:4x8"],
     {"qtype": "per_group", "axis": [1, -1], "groups": [2, 2]}, "names a dim twice"),
    ("RFC axis range", "DynamicDequantize", ["s4:4x8", "f32:4x2"], ["f32:4x8"],
     {"qtype": "per_group", "axis": [2], "groups": [2]}, "axis entry 2 is out of range"),
    ("RFC several axes without groups", "DynamicDequantize", ["s8:4x8", "f32:4"], ["f32:4x8"],
     {"qtype": "per_channel", "axis": [0, 1]}, "lists 2 dims but qtype=per_channel"),
    ("RFC and group_shape", "DynamicDequantize", ["s4:4x8", "f32:4x2"], ["f32:4x8"],
     {"qtype": "per_group", "axis": [1], "groups": [2], "group_shape": [1, 4]}, "not both"),
    ("RFC needs the src shape", "DynamicDequantize", ["s4:?", "f32:?"], ["f32:?"],
     {"qtype": "per_group", "axis": [1], "groups": [2]}, "needs the src shape at add_op"),
    ("RFC empty axis", "DynamicDequantize", ["s8:4x8", "f32:1"], ["f32:4x8"], {"axis": []},
     "axis=[] is empty"),
]


@pytest.mark.parametrize("case", CONSTRAINT_ERRORS + DYN_QUANT_ERRORS,
                         ids=[c[0] for c in CONSTRAINT_ERRORS + DYN_QUANT_ERRORS])
def test_per_op_constraint_errors(case):
    _, kind, ins, outs, attrs, fragment = case
    with pytest.raises(InvalidGraphOp) as info:
        verify(kind, ins, outs, **attrs)
    assert f"op {OP_ID} ({kind}" in str(info.value)
    assert fragment in str(info.value)


# --------------------------------------------- accepted quantization forms
@pytest.mark.parametrize("ins, outs, attrs", [
    (["s8:2x64x3x3", "f32:64"], ["f32:2x64x3x3"], {"qtype": "per_channel", "axis": 1}),
    (["u8:2x4", "f32:1x4", "u8:1"], ["f32:2x4"],
     {"qtype": "per_channel", "axis": 1}),
    (["u4:1x32x128x32", "bf16:1x32x16x32", "u4:1x32x16x32"], ["bf16:1x32x128x32"],
     {"qtype": "per_group", "group_shape": [1, 1, 8, 1], "axis": 2}),
    (["u4:4096x14336", "f16:4096x112", "u8:4096x112"], ["f16:4096x14336"],
     {"qtype": "per_group", "group_shape": [1, 128], "axis": -1}),
    # unknown dims: the size checks are skipped
    (["s4:-1x8", "f32:-1x2"], ["f32:-1x8"], {"qtype": "per_group", "group_shape": [1, 4]}),
    (["s8:?", "f32:?"], ["f32:?"], {"qtype": "per_channel", "axis": 3}),
])
def test_dynamic_dequantize_accepts(ins, outs, attrs):
    verify("DynamicDequantize", ins, outs, **attrs)


@pytest.mark.parametrize("ins, outs, attrs", [
    (["f32:2x64x3x3", "f32:64"], ["s8:2x64x3x3"], {"qtype": "per_channel", "axis": 1}),
    (["f32:4x8", "f32:4x2", "s32:4x2"], ["s8:4x8"], {"qtype": "per_group", "group_shape": [1, 4]}),
    (["bf16:4x8", "bf16:4x2", "s4:4x2"], ["s4:4x8"], {"qtype": "per_group", "group_shape": [1, 4]}),
    (["f16:4x8", "f16:2x1"], ["u4:4x8"], {"qtype": "per_group", "axis": [0], "groups": [2]}),
])
def test_dynamic_quantize_extensions_accepted(ins, outs, attrs):
    """Extension (int4 RFC): per_group, int4 dst/zps and xf16 src/scales."""
    verify("DynamicQuantize", ins, outs, **attrs)


def test_rfc_groups_become_group_shape():
    # groups[i] = number of groups along axis[i]; unlisted dims form one group
    op = verify("DynamicDequantize", ["s4:4x8", "f16:1x2"], ["f16:4x8"],
                qtype="per_group", axis=[1], groups=[2])
    assert op.attrs == {"qtype": "per_group", "axis": 1, "group_shape": [4, 4]}
    op = verify("DynamicDequantize", ["u4:4x8", "f32:4x2", "u8:4x2"], ["f32:4x8"],
                qtype="per_group", axis=[0, -1], groups=[4, 2])
    assert op.attrs["group_shape"] == [1, 4] and op.attrs["axis"] == 0
    assert "groups" not in op.attrs


def test_group_shape_without_per_group_is_dropped_as_onednn_ignores_it():
    """oneDNN reads group_shape only for per_group; harness_mha_all makes a
    per_group op per_tensor / per_channel with --op-attrs and keeps it."""
    op = verify("DynamicDequantize", ["s8:4x8", "f32:4"], ["f32:4x8"],
                qtype="per_channel", axis=0, group_shape=[1, 4])
    assert op.attrs == {"qtype": "per_channel", "axis": 0}
    op = verify("DynamicDequantize", ["s8:4x8", "f32:1"], ["f32:4x8"],
                qtype="per_tensor", group_shape=[1, 4])
    assert "group_shape" not in op.attrs


def test_rfc_axis_list_for_one_dim_becomes_s64():
    op = verify("DynamicQuantize", ["f32:2x4", "f32:4"], ["s8:2x4"], qtype="per_channel",
                axis=[-1], groups=[7])  # groups is ignored unless per_group (RFC)
    assert op.attrs == {"qtype": "per_channel", "axis": -1}


def test_static_quant_accepts_per_channel_lists():
    op = verify("Dequantize", ["s8:13x512"], ["f32:13x512"], qtype="per_channel", axis=1,
                scales=[0.5] * 512, zps=[0] * 512)
    assert op.attrs["zps"] == [0] * 512


# ================================================================= shapes
def test_identity_shapes():
    assert infer("Tanh", ["f32:2x3"]) == [(2, 3)]
    assert infer("Sigmoid", ["f16:?"], ["f16:?"]) == [None]
    assert infer("Dropout", ["f32:2x-1", "s64:", "s64:", "f32:"], ["f32:?", "u8:?"]) \
        == [(2, -1), (2, -1)]
    assert infer("Quantize", ["f32:4x5"], ["s8:?"], scales=[1.0]) == [(4, 5)]
    assert infer("DynamicDequantize", ["u8:4x5", "f32:1"], ["f32:?"]) == [(4, 5)]


def test_gen_index_axis_range():
    assert infer("GenIndex", ["f32:2x3"], ["s32:?"], axis=-2) == [(2, 3)]
    with pytest.raises(InvalidShape, match=f"op {OP_ID}.*axis=2 is out of range"):
        infer("GenIndex", ["f32:2x3"], ["s32:?"], axis=2)


@pytest.mark.parametrize("a, b, expected", [
    ("2x1x3", "4x1", (2, 4, 3)),
    ("3", "", (3,)),
    ("-1x3", "1x3", (-1, 3)),
    ("-1x3", "5x1", (5, 3)),
    ("1x-1", "4x1", (4, -1)),
    ("?", "2", None),
])
def test_numpy_broadcast(a, b, expected):
    assert infer("Add", [f"f32:{a}", f"f32:{b}"]) == [expected]


def test_broadcast_errors_name_the_op():
    with pytest.raises(InvalidShape, match=rf"op {OP_ID} \(Multiply.*\[2, 3\] and \[4, 3\]"):
        infer("Multiply", ["f32:2x3", "f32:4x3"])
    with pytest.raises(InvalidShape, match="auto_broadcast=none"):
        infer("Add", ["f32:2x3", "f32:3"], auto_broadcast="none")
    assert infer("Add", ["f32:2x-1", "f32:-1x3"], auto_broadcast="none") == [(2, 3)]


def test_select_two_step_broadcast():
    cond_ab = ["boolean:4x1", "f32:2x1x5", "f32:4x5"]
    assert infer("Select", cond_ab) == [(2, 4, 5)]
    # cond may not grow the output: it broadcasts one-way into broadcast(src_0, src_1)
    with pytest.raises(InvalidShape, match=f"op {OP_ID}.*cond shape \\[4, 5\\]"):
        infer("Select", ["boolean:4x5", "f32:1x5", "f32:1x5"])
    with pytest.raises(InvalidShape, match="cond"):
        infer("Select", ["boolean:3x4x5", "f32:4x5", "f32:4x5"])
    with pytest.raises(InvalidShape, match="src_0 and src_1"):
        infer("Select", ["boolean:1", "f32:3", "f32:4"])
    assert infer("Select", ["boolean:4x5", "f32:4x5", "f32:4x5"], auto_broadcast="none") \
        == [(4, 5)]


@pytest.mark.parametrize("src, wei, attrs, expected", [
    ("3x4", "4x5", {}, (3, 5)),
    ("4", "4", {}, ()),
    ("4", "2x4x5", {}, (2, 5)),
    ("2x3x4", "4", {}, (2, 3)),
    ("2x4x3", "4x5", {"transpose_a": True}, (2, 3, 5)),
    ("3x4", "5x4", {"transpose_b": True}, (3, 5)),
    ("4", "4x5", {"transpose_a": True}, (5,)),  # transpose ignored for rank 1
    ("4", "5x4", {"transpose_b": True}, (5,)),
    ("2x1x3x4", "5x4x6", {}, (2, 5, 3, 6)),
    ("-1x3x4", "4x-1", {}, (-1, 3, -1)),
    ("3x-1", "4x5", {}, (3, 5)),  # unknown K agrees with anything
    ("?", "4x5", {}, None),
])
def test_matmul_shapes(src, wei, attrs, expected):
    assert infer("MatMul", [f"f32:{src}", f"f32:{wei}"], **attrs) == [expected]


def test_matmul_shape_errors():
    with pytest.raises(InvalidShape, match=rf"op {OP_ID} \(MatMul.*K mismatch.*K=4.*K=5"):
        infer("MatMul", ["f32:3x4", "f32:5x6"])
    with pytest.raises(InvalidShape, match="K mismatch"):
        infer("MatMul", ["f32:3x4", "f32:4x5"], transpose_a=True)  # src acts as 4x3
    with pytest.raises(InvalidShape, match="K mismatch"):
        infer("MatMul", ["f32:4", "f32:5"])
    with pytest.raises(InvalidShape, match="batch dims"):
        infer("MatMul", ["f32:2x3x4", "f32:3x4x5"])
    with pytest.raises(InvalidShape, match="bias shape \\[3\\]"):
        infer("MatMul", ["f32:2x4", "f32:4x5", "f32:3"])
    assert infer("MatMul", ["f32:2x4", "f32:4x5", "f32:1x5"]) == [(2, 5)]


@pytest.mark.parametrize("ins, attrs, expected", [
    (["f32:2x3x4"], {"axes": [1]}, (2, 4)),
    (["f32:2x3x4"], {"axes": [1], "keep_dims": True}, (2, 1, 4)),
    (["f32:2x3x4"], {"axes": [-1, 0]}, (3,)),
    (["f32:2x-1x4"], {"axes": [2]}, (2, -1)),
    (["f32:2x3x4", "s32:2"], {}, (-1,)),  # axes from a tensor: only the rank is known
    (["f32:2x3x4", "s32:2"], {"keep_dims": True}, (-1, -1, -1)),
])
def test_reduce_shapes(ins, attrs, expected):
    assert infer("ReduceMean", ins, **attrs) == [expected]


def test_reduce_shape_errors():
    with pytest.raises(InvalidShape, match=f"op {OP_ID}.*name a dim twice"):
        infer("ReduceSum", ["f32:2x3"], axes=[1, -1])
    with pytest.raises(InvalidShape, match="axes entry=2 is out of range"):
        infer("ReduceMax", ["f32:2x3"], axes=[2])
    with pytest.raises(InvalidShape, match="names 3 dims, src \\[2, 3\\] has only 2"):
        infer("ReduceMax", ["f32:2x3", "s32:3"])


@pytest.mark.parametrize("src, shape, special_zero, expected", [
    ("2x3x4", [0, -1], True, (2, 12)),
    ("2x3x4", [6, 4], False, (6, 4)),
    ("2x3x4", [-1], False, (24,)),
    ("2x3x4", [0, 0, 4], True, (2, 3, 4)),
    ("0x3", [0, 3], False, (0, 3)),  # special_zero false: 0 is a zero-size dim
    ("-1x3", [0, 3], True, (-1, 3)),
    ("-1x3", [-1], False, (-1,)),
    ("?", [2, -1], False, (2, -1)),
])
def test_static_reshape_shapes(src, shape, special_zero, expected):
    assert infer("StaticReshape", [f"f32:{src}"], shape=shape, special_zero=special_zero) \
        == [expected]


@pytest.mark.parametrize("src, shape, special_zero, fragment", [
    ("2x3x4", [0, -1], False, "cannot reshape"),  # 0 is literal: -1 cannot be inferred
    ("2x3x4", [5, -1], False, "cannot reshape"),
    ("2x3x4", [5, 5], False, "(25 elements)"),
    ("2x3x4", [-1, -1], False, "more than one -1"),
    ("2x3x4", [-2, 12], False, "below -1"),
    ("2x3", [0, 0, 0], True, "special_zero copies src dim 2"),
])
def test_static_reshape_errors(src, shape, special_zero, fragment):
    with pytest.raises(InvalidShape) as info:
        infer("StaticReshape", [f"f32:{src}"], shape=shape, special_zero=special_zero)
    assert f"op {OP_ID}" in str(info.value) and fragment in str(info.value)


@pytest.mark.parametrize("order, expected", [
    ([-1, 0, 1], (4, 2, 3)),
    ([2, 1, 0], (4, 3, 2)),
    ([0, -1, -2], (2, 4, 3)),
    ([], (4, 3, 2)),  # an empty order reverses the dims
])
def test_static_transpose_shapes(order, expected):
    assert infer("StaticTranspose", ["f32:2x3x4"], order=order) == [expected]


def test_static_transpose_errors():
    with pytest.raises(InvalidShape, match=f"op {OP_ID}.*has 2 entries"):
        infer("StaticTranspose", ["f32:2x3x4"], order=[1, 0])
    with pytest.raises(InvalidShape, match="not a permutation"):
        infer("StaticTranspose", ["f32:2x3x4"], order=[0, -3, 1])
    with pytest.raises(InvalidShape, match="out of range"):
        infer("StaticTranspose", ["f32:2x3"], order=[0, 2])


def test_concat_shapes():
    assert infer("Concat", ["f32:2x3", "f32:2x5"], axis=-1) == [(2, 8)]
    assert infer("Concat", ["f32:2x3", "f32:-1x3"], axis=0) == [(-1, 3)]
    assert infer("Concat", ["f32:-1x3", "f32:2x-1"], axis=0) == [(-1, 3)]
    assert infer("Concat", ["f32:?", "f32:2x3"], axis=1) == [(2, -1)]
    with pytest.raises(InvalidShape, match=f"op {OP_ID}.*match except along axis 0"):
        infer("Concat", ["f32:2x3", "f32:2x4"], axis=0)
    with pytest.raises(InvalidShape, match="same rank"):
        infer("Concat", ["f32:2x3", "f32:2"], axis=0)


def test_softmax_and_stats_shapes():
    assert infer("SoftMax", ["f32:2x3x4"], ["f32:?", "f32:?"]) == [(2, 3, 4), (2, 1, 4)]
    assert infer("SoftMax", ["f32:2x3x4"], ["f32:?", "f32:?"], axis=-1) == [(2, 3, 4), (2, 3, 1)]
    assert infer("LogSoftmax", ["f32:2x3"], ["f32:?"]) == [(2, 3)]
    with pytest.raises(InvalidShape, match=f"op {OP_ID}.*axis=1 is out of range"):
        infer("SoftMax", ["f32:5"])


def test_layer_norm_and_rms_norm_shapes():
    outs = ["f32:?"] * 3
    assert infer("LayerNorm", ["f32:2x3x4", "f32:4", "f32:4"], outs) == [(2, 3, 4), (2, 3), (2, 3)]
    assert infer("LayerNorm", ["f32:2x3x4"], outs, begin_norm_axis=1) == [(2, 3, 4), (2,), (2,)]
    assert infer("LayerNorm", ["f32:2x3"], ["f32:?"], keep_stats=False) == [(2, 3)]
    with pytest.raises(InvalidShape, match=f"op {OP_ID}.*gamma shape \\[3\\]"):
        infer("LayerNorm", ["f32:2x3x4", "f32:3", "f32:3"], outs)
    assert infer("RMSNorm", ["f32:2x3x4", "f32:4"]) == [(2, 3, 4)]
    assert infer("RMSNorm", ["f32:2x3x4", "f32:3x4"], begin_norm_axis=-2) == [(2, 3, 4)]
    with pytest.raises(InvalidShape, match="begin_norm_axis=3 is out of range"):
        infer("RMSNorm", ["f32:2x3x4"], begin_norm_axis=3)


def test_batch_group_norm_bias_add_prelu_shapes():
    assert infer("BatchNormInference", ["f32:2x3x4x5"] + ["f32:5"] * 4, epsilon=1e-5) \
        == [(2, 3, 4, 5)]
    with pytest.raises(InvalidShape, match=f"op {OP_ID}.*gamma and \\[src channels\\]"):
        infer("BatchNormInference", ["f32:2x3x4x5"] + ["f32:5"] * 4, epsilon=1e-5,
              data_format="NCX")
    assert infer("BatchNormForwardTraining", ["f32:2x3x4x5", "f32:3", "f32:3"], ["f32:?"] * 5,
                 epsilon=1e-5, data_format="NCX") == [(2, 3, 4, 5)] + [(3,)] * 4
    assert infer("GroupNorm", ["f32:2x6x4x4"], ["f32:?"] * 3, groups=3, data_format="NCX") \
        == [(2, 6, 4, 4), (2, 3), (2, 3)]
    with pytest.raises(InvalidShape, match="groups=4 must be positive and divide the 6"):
        infer("GroupNorm", ["f32:2x6x4x4"], ["f32:?"] * 3, groups=4, data_format="NCX")
    assert infer("BiasAdd", ["f32:2x8x4", "f32:8"], data_format="NCX") == [(2, 8, 4)]
    with pytest.raises(InvalidShape, match="bias and \\[src channels\\]"):
        infer("BiasAdd", ["f32:2x8x4", "f32:8"])
    assert infer("PReLU", ["f32:2x8x4", "f32:8"], data_format="NCX") == [(2, 8, 4)]
    assert infer("PReLU", ["f32:2x8x4", "f32:1x4"], data_format="NCX") == [(2, 8, 4)]
    with pytest.raises(InvalidShape, match="slope shape \\[3\\]"):
        infer("PReLU", ["f32:2x8x4", "f32:3"], data_format="NCX")


# conv/pool cases: (data_format, weights_format, src, weights, attrs, expected dst)
CONV_CASES = [
    # (5 + 1 + 1 - 3) // 1 + 1 = 5
    ("NCX", "OIX", "1x3x5x5", "8x3x3x3", {}, (1, 8, 5, 5)),
    # default NXC/XIO; (7 - 3) // 2 + 1 = 3
    (None, None, "2x7x7x3", "3x3x3x16",
     {"strides": [2, 2], "pads_begin": [0, 0], "pads_end": [0, 0]}, (2, 3, 3, 16)),
    # dilation 2: effective kernel 5, (10 - 5) // 1 + 1 = 6
    ("NCX", "OIX", "1x1x10", "1x1x3",
     {"strides": [1], "pads_begin": [0], "pads_end": [0], "dilations": [2]}, (1, 1, 6)),
    # groups: 4 channels = 2 (weights I) x 2 groups; (5 - 3) // 1 + 1 = 3
    ("NCX", "OIX", "1x4x5x5", "6x2x3x3",
     {"groups": 2, "pads_begin": [0, 0], "pads_end": [0, 0]}, (1, 6, 3, 3)),
    # SAME_UPPER, 5 % 2 = 1: total pad 3 - 1 = 2 -> (5 + 2 - 3) // 2 + 1 = 3 = ceil(5 / 2)
    ("NCX", "OIX", "1x1x5", "1x1x3",
     {"strides": [2], "pads_begin": [0], "pads_end": [0], "dilations": [1],
      "auto_pad": "SAME_UPPER"}, (1, 1, 3)),
    # VALID ignores the pads attributes: (5 - 3) // 1 + 1 = 3
    ("NCX", "OIX", "1x1x5", "1x1x3",
     {"strides": [1], "pads_begin": [4], "pads_end": [4], "dilations": [1], "auto_pad": "VALID"},
     (1, 1, 3)),
    # unknown spatial dim stays unknown, batch flows through
    ("NCX", "OIX", "-1x3x-1x5", "8x3x3x3", {}, (-1, 8, -1, 5)),
]


@pytest.mark.parametrize("data_format, weights_format, src, wei, attrs, expected", CONV_CASES)
def test_convolution_shapes(data_format, weights_format, src, wei, attrs, expected):
    attrs = dict(_CONV2D, **attrs)
    formats = {k: v for k, v in (("data_format", data_format),
                                 ("weights_format", weights_format)) if v}
    assert infer("Convolution", [f"f32:{src}", f"f32:{wei}"], **attrs, **formats) == [expected]


def test_convolution_shape_errors():
    formats = {"data_format": "NCX", "weights_format": "OIX"}
    with pytest.raises(InvalidShape, match=rf"op {OP_ID} \(Convolution.*src has 4 channels, "
                                           r"expected weights input channels 3"):
        infer("Convolution", ["f32:1x4x5x5", "f32:8x3x3x3"], **_CONV2D, **formats)
    with pytest.raises(InvalidShape, match="strides=\\[1\\] has 1 entries, expected 2"):
        infer("Convolution", ["f32:1x3x5x5", "f32:8x3x3x3"], **dict(_CONV2D, strides=[1]),
              **formats)
    with pytest.raises(InvalidShape, match="bias and \\[weights O\\]"):
        infer("Convolution", ["f32:1x3x5x5", "f32:8x3x3x3", "f32:4"], **_CONV2D, **formats)
    with pytest.raises(InvalidShape, match="same rank"):
        infer("Convolution", ["f32:1x3x5x5", "f32:8x3x3"], **_CONV2D, **formats)


def test_conv_pads_auto_pad():
    op = verify("Convolution", ["f32:1x1x6", "f32:1x1x3"], ["f32:?"], strides=[2], dilations=[1],
                pads_begin=[0], pads_end=[0], data_format="NCX", weights_format="OIX",
                auto_pad="SAME_LOWER")
    # 6 % 2 == 0: total pad 3 - 2 = 1, LOWER puts the odd one first
    assert shapes.conv_pads(op, [6], [3], [2], [1]) == ([1], [0])
    op.attrs["auto_pad"] = "SAME_UPPER"
    assert shapes.conv_pads(op, [6], [3], [2], [1]) == ([0], [1])
    assert OP_SCHEMAS[OpKind.Convolution].infer_shapes(op, [(1, 1, 6), (1, 1, 3)]) == [(1, 1, 3)]


@pytest.mark.parametrize("src, wei, attrs, expected", [
    # NCX/IOX: 2 * (3 - 1) + 3 - 1 - 1 = 5
    ("1x4x3x3", "4x2x3x3", {"strides": [2, 2]}, (1, 2, 5, 5)),
    # output_padding adds at the end: 6
    ("1x4x3x3", "4x2x3x3", {"strides": [2, 2], "output_padding": [1, 1]}, (1, 2, 6, 6)),
    # groups: output channels = weights O x groups
    ("1x4x3x3", "4x3x3x3", {"groups": 2, "strides": [1, 1]}, (1, 6, 3, 3)),
])
def test_conv_transpose_shapes(src, wei, attrs, expected):
    attrs = dict(_CONV2D, **attrs)
    assert infer("ConvTranspose", [f"f32:{src}", f"f32:{wei}"], data_format="NCX",
                 weights_format="IOX", **attrs) == [expected]


def test_conv_transpose_default_formats():
    # NXC src (N, X, C), XOI weights (X, O, I); 1 * (3 - 1) + 3 = 5
    attrs = dict(_CONV2D, pads_begin=[0, 0], pads_end=[0, 0])
    assert infer("ConvTranspose", ["f32:1x3x3x4", "f32:3x3x2x4"], **attrs) == [(1, 5, 5, 2)]
    with pytest.raises(InvalidShape, match=f"op {OP_ID}.*src has 5 channels"):
        infer("ConvTranspose", ["f32:1x3x3x5", "f32:3x3x2x4"], **attrs)


@pytest.mark.parametrize("src, attrs, expected", [
    # (5 - 3) // 2 + 1 = 2
    ("1x3x5x5", {}, (1, 3, 2, 2)),
    # kernel 2, stride 2 on 5: floor gives 2, ceil gives ceil(3 / 2) + 1 = 3
    ("1x3x5x5", {"kernel": [2, 2]}, (1, 3, 2, 2)),
    ("1x3x5x5", {"kernel": [2, 2], "rounding_type": "ceil"}, (1, 3, 3, 3)),
    # pads 1+1: (5 + 2 - 3) // 2 + 1 = 3
    ("1x3x5x5", {"pads_begin": [1, 1], "pads_end": [1, 1]}, (1, 3, 3, 3)),
    # SAME_UPPER keeps ceil(x / s)
    ("1x3x5x5", {"auto_pad": "SAME_UPPER"}, (1, 3, 3, 3)),
])
def test_pool_shapes(src, attrs, expected):
    attrs = dict(_POOL2D, data_format="NCX", **attrs)
    assert infer("AvgPool", [f"f32:{src}"], exclude_pad=True, **attrs) == [expected]
    assert infer("MaxPool", [f"f32:{src}"], **attrs) == [expected]


def test_maxpool_dilations_and_nxc():
    # dilation 2: effective kernel 5, (5 - 5) // 1 + 1 = 1
    assert infer("MaxPool", ["f32:1x5x5x3"], kernel=[3, 3], strides=[1, 1], pads_begin=[0, 0],
                 pads_end=[0, 0], dilations=[2, 2]) == [(1, 1, 1, 3)]
    with pytest.raises(InvalidShape, match=f"op {OP_ID}.*kernel=\\[3\\] has 1 entries"):
        infer("MaxPool", ["f32:1x5x5x3"], **dict(_POOL2D, kernel=[3]), dilations=[1])


def test_interpolate_shapes():
    assert infer("Interpolate", ["f32:1x3x5x4"], mode="nearest", sizes=[10, 8],
                 data_format="NCX") == [(1, 3, 10, 8)]
    # floor(x * scale), computed in f32: 5 * 2 = 10, 4 * 1.5 = 6, NXC layout
    assert infer("Interpolate", ["f32:1x5x4x3"], mode="bilinear", scales=[2.0, 1.5]) \
        == [(1, 10, 6, 3)]
    assert infer("Interpolate", ["f32:1x5x-1x3"], mode="linear", scales=[0.5, 2.0]) \
        == [(1, 2, -1, 3)]
    with pytest.raises(InvalidShape, match=f"op {OP_ID}.*sizes=\\[10\\] has 1 entries, expected 2"):
        infer("Interpolate", ["f32:1x3x5x4"], mode="nearest", sizes=[10], data_format="NCX")


def test_end_and_wildcard_shapes():
    assert infer("End", ["f32:2x3"], []) == []
    assert infer("Wildcard", ["f32:2"], ["s8:3x3", "f32:?"]) == [(3, 3), None]
    assert infer("Wildcard", [], []) == []


# ------------------------------------------------ ranks nothing checked (issue 33)
def _with_rank(spec: str, rank: int) -> str:
    """``spec`` with its dims cut or padded with 2s to ``rank``."""
    dtype, _, dims = spec.partition(":")
    base = [int(d) for d in dims.split("x")] if dims and dims != "?" else []
    return dtype + ":" + "x".join(str(d) for d in (base + [2] * 7)[:rank])


def _rank_variants():
    """(kind, inputs, outputs, attrs): one VALID row with one input or declared
    output at rank 0..6, or one shape-naming attribute of length 1..6."""
    for kind, (ins, outs, attrs, _) in sorted(VALID.items()):
        for port in range(len(ins)):
            for rank in range(7):
                yield kind, ins[:port] + [_with_rank(ins[port], rank)] + ins[port + 1:], outs, attrs
        for port in range(len(outs)):
            for rank in range(7):
                yield kind, ins, outs[:port] + [_with_rank(outs[port], rank)] + outs[port + 1:], attrs
        for name in ("dst_shape", "weights_shape", "src_shape"):
            for rank in range(1, 7) if name in attrs else ():
                yield kind, ins, outs, dict(attrs, **{name: (list(attrs[name]) + [2] * 7)[:rank]})


def test_every_shape_function_takes_any_rank_or_names_the_op():
    """A rank the op does not take is InvalidShape/InvalidGraphOp naming the op,
    never an IndexError from indexing dims nothing checked (issue 33: the weights
    of Convolution/ConvTransposeBackwardData, a 1-entry ConvolutionBackwardWeights
    weights_shape, in split_weights)."""
    untyped, count = [], 0
    for kind, ins, outs, attrs in _rank_variants():
        count += 1
        try:
            infer(kind, ins, outs, **attrs)
        except (InvalidShape, InvalidGraphOp) as err:
            assert f"op {OP_ID}" in str(err)
        except Exception as err:  # noqa: BLE001 - the contract under test
            untyped.append(f"{kind} {ins} -> {outs}: {type(err).__name__}: {err}")
    assert count > 1800
    assert not untyped, "\n".join(untyped)


@pytest.mark.parametrize("kind, ins, outs, attrs, fragment", [
    ("ConvTransposeBackwardData", ["f32:1x8x6x6", "f32:4"], ["f32:?"], {},
     r"diff_dst \[1, 8, 6, 6\] and weights \[4\] must have the same rank >= 3"),
    ("ConvTransposeBackwardData", ["f32:1x8x6x6", "f32:8x4x3"], ["f32:?"], {},
     r"diff_dst \[1, 8, 6, 6\] and weights \[8, 4, 3\] must have the same rank >= 3"),
    ("ConvolutionBackwardData", ["f32:1x8x6x6", "f32:3"], ["f32:1x4x8x8"], {"dst_shape": [1, 4, 8, 8]},
     r"weights \[3\] must have rank >= 3"),
    ("ConvolutionBackwardWeights", ["f32:1x4x8x8", "f32:1x8x6x6"], ["f32:?"],
     {"weights_shape": [8]}, r"weights \[8\] must have rank >= 3"),
])
def test_conv_backward_ranks_are_invalid_shape(kind, ins, outs, attrs, fragment):
    """ConvTransposeBackwardData with rank-1 weights raised IndexError in
    split_weights; rank-3 weights under a rank-4 diff_dst gave a rank-3 diff_src
    (zip stopped at the shorter spatial list) and a numpy error at execute."""
    attrs = dict(_CONV2D, weights_format="OIX" if "Transpose" not in kind else "IOX",
                 data_format="NCX", **attrs)
    with pytest.raises(InvalidShape, match=f"op {OP_ID} \\({kind}.*{fragment}"):
        infer(kind, ins, outs, **attrs)


# ------------------------------------------ non-finite float attributes (issue 33)
def _float_attrs():
    """(kind, attribute, is a list, +-inf allowed) of every f32/f32[] attribute."""
    return [(kind.name, a.name, a.kind == "f32[]", a.infinite) for kind, schema in OP_SCHEMAS.items()
            for a in schema.attrs if "f32" in a.kind]


def test_the_float_attributes_are_the_known_ones():
    """A new float attribute gets its own decision (finite, or +-inf meaningful)."""
    infinite = sorted(f"{k}.{a}" for k, a, _, inf in _float_attrs() if inf)
    assert infinite == ["Clamp.max", "Clamp.min", "ClampBackward.max", "ClampBackward.min"]
    assert len(_float_attrs()) == 26


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1e39, -1e39],
                         ids=["nan", "inf", "-inf", "1e39", "-1e39"])
@pytest.mark.parametrize("kind, name, is_list, infinite", _float_attrs(),
                         ids=[f"{k}.{a}" for k, a, _, _ in _float_attrs()])
def test_non_finite_float_attributes_are_refused_at_add_op(kind, name, is_list, infinite, value):
    """NaN (or +-inf, or a value that is +-inf in f32) in a float attribute ran
    and gave fused kernels and the reference different answers (int8 MatMul
    fusions: 127 vs 0; Interpolate: ValueError).  oneDNN defines no meaning for
    them (only Clamp's bounds take +-inf: a one-sided clip), so add_op refuses
    them as invalid_graph_op naming the op and the attribute."""
    ins, outs, attrs, _ = VALID[kind]
    attrs = dict(attrs)
    if is_list:
        attrs[name] = [value] + [2.0] * (len(attrs.get(name) or [0.5]) - 1)
    else:
        attrs[name] = value
    op = make(kind, ins, outs, **attrs)
    if infinite and value == value and (value < 0) == (name == "min"):
        verify_op(op, OP_SCHEMAS)  # min = -inf, max = +inf: nothing clipped on that side
        return
    fragment = f"attribute {name}=" if value != value or not infinite else "above max"
    with pytest.raises(InvalidGraphOp, match=f"op {OP_ID} \\({kind}.*{fragment}") as err:
        verify_op(op, OP_SCHEMAS)
    assert err.value.status.name == "invalid_graph_op"


@pytest.mark.parametrize("lo, hi, ok", [(0.5, 0.5, True), (-1.0, 1e39, True), (float("-inf"), float("inf"), True),
                                        (float("inf"), float("inf"), True), (1.0, 0.5, False),
                                        (1e39, float("inf"), True), (float("inf"), 1e38, False)])
def test_clamp_bounds_follow_onednns_clip_rule(lo, hi, ok):
    """oneDNN's clip takes any ``min <= max`` in f32 (math::is_eltwise_ok); min > max is refused."""
    for kind in ("Clamp", "ClampBackward"):
        ins, outs, _, _ = VALID[kind]
        op = make(kind, ins, outs, min=lo, max=hi)
        if ok:
            verify_op(op, OP_SCHEMAS)
        else:
            with pytest.raises(InvalidGraphOp, match=f"op {OP_ID} \\({kind}.*is above max"):
                verify_op(op, OP_SCHEMAS)


@pytest.mark.parametrize("scales, fragment", [([1e38, 1.0], "give inf"), ([-2.0, 1.0], "give -10.0"),
                                              ([3e18, 1.0], "give 1.49")])
def test_interpolate_scales_that_give_no_size_are_invalid_shape(scales, fragment):
    """Finite scales whose f32 product with a dim overflows, is negative or
    passes int64 are refused before the conversion to int (was OverflowError)."""
    with pytest.raises(InvalidShape, match=f"op {OP_ID} \\(Interpolate.*scales=.*{fragment}"):
        infer("Interpolate", ["f32:1x3x5x5"], mode="nearest", scales=scales, data_format="NCX")


@pytest.mark.parametrize("src, wei, groups, fragment", [
    ("f32:2x16x5x5", "f32:8x2x4x3", 4, "src has 16 channels, expected the weights input channels 8"),
    ("f32:2x6x5x5", "f32:6x2x3x3", 4, "src channels 6 do not split into groups=4"),
])
def test_grouped_conv_transpose_channels_are_checked(src, wei, groups, fragment):
    """Grouped ConvTranspose weights hold all input channels (I) and the
    per-group outputs (O); the channel rule was checked for groups=1 only, and
    a mismatch reached the kernels as a numpy matmul error (found by the
    fuzzer's rank_change kind)."""
    with pytest.raises(InvalidShape, match=f"op {OP_ID} \\(ConvTranspose.*{fragment}"):
        infer("ConvTranspose", [src, wei], weights_format="IOX", data_format="NCX", groups=groups,
              **_CONV2D)
    assert infer("ConvTranspose", ["f32:2x16x5x5", "f32:16x2x3x3"], weights_format="IOX", data_format="NCX",
                 groups=4, **_CONV2D) == [(2, 8, 5, 5)]

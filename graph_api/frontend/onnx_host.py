"""Host steps of the ONNX front door: ONNX nodes run with numpy, at load (constant
folding) or between graph_api segments (run-time values).

A few frequent shape-and-index ops have a direct numpy form here (Shape, Gather,
Unsqueeze, Squeeze, Cast, Reshape, Concat, Identity); every other standard-domain op
runs on ONNX's reference evaluator (``onnx.reference``), one evaluator per node made
at load.  An op the evaluator does not know is ``Unimplemented`` at load.
"""
from __future__ import annotations

import numpy as np

from ..errors import InvalidGraph, Unimplemented


def constant_value(node) -> np.ndarray:
    """The value of a ``Constant`` node."""
    from onnx import helper, numpy_helper

    from .onnx_import import node_label

    if len(node.attribute) != 1:
        raise InvalidGraph(f"{node_label(node)}: a Constant node has exactly one value attribute, "
                           f"given {[a.name for a in node.attribute]}")
    attr = node.attribute[0]
    if attr.name == "value":
        return numpy_helper.to_array(attr.t)
    value = helper.get_attribute_value(attr)
    if attr.name in ("value_float", "value_int"):
        return np.array(value, np.float32 if attr.name == "value_float" else np.int64)
    if attr.name in ("value_floats", "value_ints"):
        return np.array(list(value), np.float32 if attr.name == "value_floats" else np.int64)
    raise Unimplemented(f"{node_label(node)}: Constant with attribute {attr.name!r} is not supported")


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _axes(node, ins, opset, index=1):
    attrs = _attrs(node)
    if "axes" in attrs:
        return [int(a) for a in attrs["axes"]]
    if len(ins) > index and ins[index] is not None:
        return [int(a) for a in np.asarray(ins[index]).reshape(-1)]
    return None


def _fast(node, opset):
    """A direct numpy form of frequent data-movement ops, or None."""
    op, attrs = node.op_type, _attrs(node)
    if op == "Identity":
        return lambda ins: [ins[0]]
    if op == "Shape":
        start, end = attrs.get("start", 0), attrs.get("end", None)
        return lambda ins: [np.array(np.shape(ins[0])[start:end], np.int64)]
    if op == "Gather":
        axis = attrs.get("axis", 0)

        def gather(ins):
            data, idx = np.asarray(ins[0]), np.asarray(ins[1]).astype(np.int64)
            n = data.shape[axis]
            if idx.size and (idx.min() < -n or idx.max() >= n):
                raise InvalidGraph(f"Gather: an index is outside [-{n}, {n - 1}]")
            return [np.take(data, np.where(idx < 0, idx + n, idx), axis=axis)]
        return gather
    if op == "Unsqueeze":
        def unsqueeze(ins):
            axes = _axes(node, ins, opset)
            x = np.asarray(ins[0])
            rank = x.ndim + len(axes)
            for a in sorted(a % rank for a in axes):
                x = np.expand_dims(x, a)
            return [x]
        return unsqueeze
    if op == "Squeeze":
        def squeeze(ins):
            axes = _axes(node, ins, opset)
            x = np.asarray(ins[0])
            return [np.squeeze(x, axis=None if axes is None else tuple(a % x.ndim for a in axes))]
        return squeeze
    if op == "Reshape" and not attrs.get("allowzero", 0):
        def reshape(ins):
            x, shape = np.asarray(ins[0]), [int(d) for d in np.asarray(ins[1]).reshape(-1)]
            shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
            return [x.reshape(shape)]
        return reshape
    if op == "Concat":
        axis = attrs.get("axis", 0)
        return lambda ins: [np.concatenate([np.asarray(x) for x in ins], axis=axis)]
    if op == "GatherElements":
        axis = attrs.get("axis", 0)

        def gather_elements(ins):
            data, idx = np.asarray(ins[0]), np.asarray(ins[1]).astype(np.int64)
            n = data.shape[axis]
            if idx.size and (idx.min() < -n or idx.max() >= n):
                raise InvalidGraph(f"GatherElements: an index is outside [-{n}, {n - 1}]")
            return [np.take_along_axis(data, np.where(idx < 0, idx + n, idx), axis=axis)]
        return gather_elements
    if op == "Expand":
        def expand(ins):
            x = np.asarray(ins[0])
            shape = np.broadcast_shapes(x.shape, tuple(int(d) for d in np.asarray(ins[1]).reshape(-1)))
            return [np.broadcast_to(x, shape).copy()]
        return expand
    if op == "Where":
        return lambda ins: [np.where(np.asarray(ins[0]), ins[1], ins[2])]
    if op in _ELEMENTWISE:
        fn = _ELEMENTWISE[op]
        return lambda ins: [np.asarray(fn(*[np.asarray(x) for x in ins]))]
    if op in ("DequantizeLinear", "QuantizeLinear") and not attrs.get("block_size", 0):
        return _dequantize_linear(attrs) if op == "DequantizeLinear" else _quantize_linear(node, attrs)
    if op == "Cast":
        from onnx import helper
        to = np.dtype(helper.tensor_dtype_to_np_dtype(attrs["to"]))
        if to.kind in "biuf" and to.name not in ("int4", "uint4"):
            return lambda ins: [np.asarray(ins[0]).astype(to)]
    return None


def _per_axis(param, x, axis: int) -> np.ndarray:
    """A per-tensor (size 1) or per-axis (1-D along ``axis``) Q/DQ parameter, broadcastable to x."""
    param = np.asarray(param)
    if param.size == 1 or x.ndim == 0:
        return param.reshape(())
    shape = [1] * x.ndim
    shape[axis % x.ndim] = param.size
    return param.reshape(shape)


def _dequantize_linear(attrs):
    """ONNX DequantizeLinear (per tensor / per axis): ``y = (x - zp) * scale`` with the
    difference taken in int32 (exact for int8/uint8/int32 storage, as ONNX Runtime computes
    it), then one f32 product; the output has the scale's type.  The reference evaluator
    has no form for opsets below 19, where ONNX Runtime's static quantizer writes them."""
    axis = int(attrs.get("axis", 1))

    def dequantize(ins):
        x, scale = np.asarray(ins[0]), np.asarray(ins[1])
        zp = np.asarray(ins[2]) if len(ins) > 2 and ins[2] is not None else np.zeros((), np.int32)
        diff = x.astype(np.int64) - _per_axis(zp, x, axis).astype(np.int64)
        return [(diff.astype(scale.dtype) * _per_axis(scale, x, axis)).astype(scale.dtype)]
    return dequantize


def _quantize_linear(node, attrs):
    """ONNX QuantizeLinear (per tensor / per axis) to int8/uint8: ``y = saturate(round(x /
    scale) + zp)``, rounding half to even; the type is the zero point's (uint8 without one)."""
    axis = int(attrs.get("axis", 1))
    out_dtype = {3: np.int8, 2: np.uint8}.get(int(attrs.get("output_dtype", 0)), np.uint8)

    def quantize(ins):
        x, scale = np.asarray(ins[0]), np.asarray(ins[1])
        has_zp = len(ins) > 2 and ins[2] is not None
        dtype = np.asarray(ins[2]).dtype if has_zp else np.dtype(out_dtype)
        if dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
            from .onnx_import import node_label
            raise Unimplemented(f"{node_label(node)}: QuantizeLinear to {dtype} on the host: only int8 and uint8")
        zp = _per_axis(ins[2], x, axis).astype(np.float32) if has_zp else np.float32(0)
        q = np.rint(x.astype(np.float32) / _per_axis(scale, x, axis).astype(np.float32)) + zp
        info = np.iinfo(dtype)
        return [np.clip(q, info.min, info.max).astype(dtype)]
    return quantize


#: element-wise ops whose numpy form is exact ONNX semantics for every type they take
_ELEMENTWISE = {
    "Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
    "Not": np.logical_not, "IsNaN": np.isnan, "Neg": np.negative, "Abs": np.abs,
}


def host_function(node, model, opset: int):
    """A callable ``list of input arrays -> list of output arrays`` for ``node``.

    Raises:
        Unimplemented: neither a numpy form nor ONNX's reference evaluator runs the node.
    """
    from .onnx_import import node_label

    if node.domain not in ("", "ai.onnx"):
        raise Unimplemented(f"{node_label(node)}: no graph_api mapping and no host implementation "
                            f"for domain {node.domain!r}")
    fast = _fast(node, opset)
    if fast is not None:
        return fast
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.ops import load_op

    try:
        load_op("", node.op_type, opset)
    except Exception:  # noqa: BLE001 - the evaluator's own error types vary by version
        raise Unimplemented(f"{node_label(node)}: no graph_api mapping and no host implementation "
                            f"of ai.onnx::{node.op_type} (opset {opset})") from None
    inputs = [helper.make_tensor_value_info(n or f"__absent{i}", 0, None) for i, n in enumerate(node.input)]
    outputs = [helper.make_tensor_value_info(n, 0, None) for n in node.output if n]
    graph = helper.make_graph([node], "host_step", inputs, outputs)
    one = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    one.ir_version = model.ir_version or 8
    try:
        evaluator = ReferenceEvaluator(one)
    except Exception as err:  # noqa: BLE001
        raise Unimplemented(f"{node_label(node)}: the reference evaluator cannot run it: "
                            f"{type(err).__name__}: {err}") from None
    names = list(node.input)
    wanted = [n for n in node.output if n]

    def run(ins):
        feeds = {n: x for n, x in zip(names, ins) if n}
        results = evaluator.run(wanted, feeds)
        by_name = dict(zip(wanted, results))
        return [by_name.get(n) for n in node.output]
    return run

"""Op schemas as data, and the one function that checks an op against them.

A schema row says, for one op kind: the input and output ports (with a type
variable each), the data types each type variable allows, the attributes with
their value kinds and defaults, extra constraint functions, and the shape
inference function.  ``verify_op`` is what ``Graph.add_op`` runs; it writes the
defaults into the op, as oneDNN does.  The table itself is ``opset.OP_SCHEMAS``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

import numpy as np

from .dtypes import DataType
from .enums import OpKind
from .errors import InvalidGraphOp, Unimplemented, op_label

REQUIRED = object()  # attribute must be given
NO_DEFAULT = object()  # attribute is optional and has no default

ATTR_KINDS = ("bool", "s64", "f32", "s64[]", "f32[]", "string", "string[]", "dict")
# Extension kinds (not in oneDNN): "string[]" (MatMul indexing_maps) and "dict" (a
# MatMul algorithm given by its fields, a flat dict of str -> bool/int/str).
# An Attr.kind may also list alternatives, "s64|s64[]": the first kind the value fits wins.

#: a type variable accepting every data type (Wildcard, End)
ANY_TYPE = frozenset(DataType) - {DataType.f64}


@dataclass(frozen=True)
class Port:
    name: str
    type_var: str
    optional: bool = False
    variadic: bool = False  # the last port may repeat (Concat, Wildcard)


@dataclass(frozen=True)
class Attr:
    """One attribute of a schema row.

    Float values (kinds ``f32``, ``f32[]``) are finite after rounding to f32, as
    oneDNN stores them: NaN is never taken, and ``infinite`` lets one attribute
    take +-inf where oneDNN gives it a meaning (Clamp's bounds: a one-sided clip).
    """

    name: str
    kind: str
    default: object = NO_DEFAULT
    choices: tuple | None = None
    infinite: bool = False

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


ShapeFn = Callable[["object", list], list]
Constraint = Callable[["object"], None]


@dataclass(frozen=True)
class OpSchema:
    """One row of the op table.

    ``infer_shapes(op, in_shapes)`` gets the op (for attrs and dtypes) and the
    input shapes (tuples, ``None`` = unknown rank, -1 = unknown dim) and returns
    one shape per output; it raises ``InvalidShape`` when the inputs disagree.
    ``constraints`` run after the generic checks and raise ``InvalidGraphOp``.
    ``compile_checks(op, in_shapes)`` run at compile with the concrete input
    shapes, for rules that need dims the graph may not know yet (scale counts
    against a quantization axis); they raise ``InvalidGraphOp`` too.
    ``max_inputs``/``max_outputs`` bound variadic ports.
    """

    kind: OpKind
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    type_vars: Mapping[str, frozenset]
    infer_shapes: ShapeFn
    attrs: tuple[Attr, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    compile_checks: tuple[Callable[["object", list], None], ...] = ()
    max_inputs: int | None = None
    max_outputs: int | None = None
    doc: str = ""
    attr_by_name: Mapping[str, Attr] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "attr_by_name", {a.name: a for a in self.attrs})

    def port_counts(self, ports, maximum) -> tuple[int, int]:
        lo = sum(1 for p in ports if not p.optional and not p.variadic)
        hi = len(ports) if not any(p.variadic for p in ports) else (maximum or 64)
        if any(p.variadic for p in ports) and not ports[-1].optional:
            lo = max(lo, len(ports))
        return lo, hi

    def input_port(self, index: int) -> Port:
        return self.inputs[min(index, len(self.inputs) - 1)]

    def output_port(self, index: int) -> Port:
        return self.outputs[min(index, len(self.outputs) - 1)]


def _normalize_attr(op, spec: Attr, value):
    kind = spec.kind

    def bad():
        return InvalidGraphOp(
            f"{op_label(op)}: attribute {spec.name!r} must be {kind}, got {value!r}")

    if "|" in kind:
        for alternative in kind.split("|"):
            try:
                return _normalize_attr(op, replace(spec, kind=alternative), value)
            except InvalidGraphOp:
                continue
        raise bad()
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise bad()
    if kind == "s64":
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad()
        return int(value)
    if kind == "f32":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad()
        return float(value)
    if kind == "string":
        if not isinstance(value, str):
            raise bad()
        return value
    if kind == "string[]":
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
            raise bad()
        return [str(v) for v in value]
    if kind == "dict":
        if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, (bool, int, str)) for k, v in value.items()):
            raise bad()
        return dict(value)
    if kind in ("s64[]", "f32[]"):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            # oneDNN's dnnl_graph_op_set_attr_f32/_s64 store a list-valued attribute
            # set with one scalar (C++ set_attr<float>(scales, 0.25f)) as a one-element list
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise bad()
        if kind == "s64[]":
            if any(isinstance(v, bool) or not isinstance(v, int) for v in value):
                raise bad()
            return [int(v) for v in value]
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
            raise bad()
        return [float(v) for v in value]
    raise AssertionError(kind)


def _check_float_values(op, spec: Attr, value) -> None:
    """NaN anywhere, or +-inf unless ``spec.infinite``: InvalidGraphOp naming the attribute.

    Checked on the f32 value oneDNN stores (1e39 is +inf there), before any
    shape function or kernel converts it."""
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, float) for v in values):
        return
    with np.errstate(over="ignore"):
        f32 = np.array(values, np.float64).astype(np.float32)
    bad = np.isnan(f32) if spec.infinite else ~np.isfinite(f32)
    if bad.any():
        i = int(np.argmax(bad))
        if isinstance(value, list):
            got = f"has entry {i} = {float(f32[i])!r} (as f32)"
        elif math.isfinite(value):
            got = f"is {float(f32[i])!r} as f32"
        else:
            got = "is NaN" if math.isnan(value) else "is not finite"
        allowed = "finite or +-inf, never NaN" if spec.infinite else "finite"
        raise InvalidGraphOp(f"{op_label(op)}: attribute {spec.name}={value!r} {got}; "
                             f"{op.kind.name} {spec.name} must be {allowed}")


def check_attrs(op, schema: OpSchema) -> None:
    """Reject unknown attrs, wrong kinds and values; write defaults into ``op``."""
    for name in list(op.attrs):
        spec = schema.attr_by_name.get(name)
        if spec is None:
            known = ", ".join(schema.attr_by_name) or "none"
            raise InvalidGraphOp(f"{op_label(op)}: unknown attribute {name!r}; {op.kind.name} takes: {known}")
        value = _normalize_attr(op, spec, op.attrs[name])
        if spec.choices is not None and value not in spec.choices:
            raise InvalidGraphOp(
                f"{op_label(op)}: attribute {name}={value!r} is not one of {list(spec.choices)}")
        if "f32" in spec.kind:
            _check_float_values(op, spec, value)
        op.attrs[name] = value
    for spec in schema.attrs:
        if spec.name in op.attrs:
            continue
        if spec.required:
            raise InvalidGraphOp(f"{op_label(op)}: required attribute {spec.name!r} ({spec.kind}) is missing")
        if spec.default is not NO_DEFAULT:
            default = spec.default
            op.attrs[spec.name] = list(default) if isinstance(default, (list, tuple)) else default


def check_ports(op, schema: OpSchema) -> None:
    """Port counts and type variables (ports sharing a variable share a dtype)."""
    for what, lts, ports, maximum in (("inputs", op.inputs, schema.inputs, schema.max_inputs),
                                      ("outputs", op.outputs, schema.outputs, schema.max_outputs)):
        lo, hi = schema.port_counts(ports, maximum)
        if not lo <= len(lts) <= hi:
            expected = str(lo) if lo == hi else f"{lo}..{hi}"
            raise InvalidGraphOp(f"{op_label(op)}: got {len(lts)} {what}, expected {expected}")
    bound: dict[str, DataType] = {}
    for what, lts, port_of in (("input", op.inputs, schema.input_port),
                               ("output", op.outputs, schema.output_port)):
        for i, lt in enumerate(lts):
            port = port_of(i)
            allowed = schema.type_vars[port.type_var]
            if lt.dtype not in allowed:
                names = ", ".join(sorted(d.name for d in allowed))
                raise InvalidGraphOp(
                    f"{op_label(op)}: {what} {i} ({port.name}, tensor {lt.id}) has data type "
                    f"{lt.dtype.name}; allowed: {names}")
            if port.type_var in bound and bound[port.type_var] != lt.dtype and allowed is not ANY_TYPE:
                raise InvalidGraphOp(
                    f"{op_label(op)}: {what} {i} ({port.name}, tensor {lt.id}) is {lt.dtype.name} but "
                    f"ports of type {port.type_var} were bound to {bound[port.type_var].name}")
            bound.setdefault(port.type_var, lt.dtype)


def verify_op(op, schemas) -> OpSchema:
    """Everything ``add_op`` checks; returns the schema row."""
    schema = schemas.get(op.kind)
    if schema is None:
        raise Unimplemented(f"{op_label(op)}: op kind {op.kind.name} is not in this runtime's opset yet")
    check_ports(op, schema)
    check_attrs(op, schema)
    for constraint in schema.constraints:
        constraint(op)
    return schema

"""Composite ops: a high-level name carried with its reference decomposition.

Extension of the oneDNN opset after the StableHLO composite proposal (seed 002)::

    %y = Composite(%x; name="gelu_tanh", version=1)        the abstraction (R1)
         decomposition "gelu_tanh" v1:                      its reference implementation,
             (x: f32[?]) -> (y: f32[?])                     a sub-graph of ordinary ops
             { Multiply, Add, Composite "tanh", ... }       and composites (R3), with ports

* A :class:`Decomposition` is built with the ordinary API (``Op``, ``LogicalTensor``):
  input and output ports, ops, constants (fixed values, or the value of one of the
  composite's own attributes) and the attributes the composite takes with defaults.
* Decompositions live in one :class:`Library` (:data:`LIBRARY`), keyed by
  name + version and shared by every call site (one definition, many uses, stored
  once).  A name + version is a stable contract (R2): defining it again with other
  ports, types or body is an error; an identical definition is a no-op.  References
  between decompositions are checked for cycles.  Users define any composite (R4);
  :mod:`graph_api.composite_library` holds the shipped ones.
* At ``add_op`` a Composite op is type-checked against its decomposition's ports
  (counts, dtypes, known dims; :class:`InvalidGraphOp` naming the composite and the
  port); its shapes are inferred through the decomposition.
* ``get_partitions`` keeps a composite as one partition running its fast kernel when
  one is registered for its name/version and the shapes suit it, and otherwise
  inlines the decomposition (:mod:`graph_api.composite_inline`).
  :func:`use_reference` (or ``GRAPH_API_COMPOSITE_REFERENCE=1``) forces inlining.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import networkx as nx
import numpy as np

from . import dtypes
from .config import settings
from .enums import OpKind, PropertyType
from .errors import GraphError, InvalidArguments, InvalidGraph, InvalidGraphOp, op_label
from .infer import propagate
from .logical_tensor import UNKNOWN_DIM, LogicalTensor
from .op import Op
from .schema import Attr, OpSchema, check_attrs

#: the attribute kinds a composite's own attributes may have (first fitting kind wins)
ANY_ATTR_KIND = "string|s64|f32|bool|s64[]|f32[]"
#: op attributes every composite has; the rest are the composite's own
NAME, VERSION = "name", "version"
DEFAULT_VERSION = 1


def use_reference(on: bool = True) -> None:
    """Force (or stop forcing) every composite onto its inlined reference decomposition."""
    settings.composite_reference = bool(on)


@contextlib.contextmanager
def reference_mode(on: bool = True):
    """``with reference_mode(): ...`` forces the reference path inside the block."""
    before = settings.composite_reference
    use_reference(on)
    try:
        yield
    finally:
        settings.composite_reference = before


# ====================================================================== the schema row
class OpenAttrs(dict):
    """``attr_by_name`` of the Composite row: declared attrs, and any other name as a
    composite's own attribute of any kind (checked against the decomposition)."""

    def get(self, name, default=None):
        spec = super().get(name)
        return spec if spec is not None else Attr(name, ANY_ATTR_KIND)


@dataclass(frozen=True)
class CompositeSchema(OpSchema):
    """The Composite row: an :class:`OpSchema` whose attributes are open."""

    def __post_init__(self):
        object.__setattr__(self, "attr_by_name", OpenAttrs({a.name: a for a in self.attrs}))


# ====================================================================== decompositions
@dataclass(frozen=True)
class Constant:
    """An inner tensor with a fixed value, or the value of the composite's attribute ``attr``."""

    lt: LogicalTensor
    value: np.ndarray | None = None
    attr: str | None = None

    def array(self, attrs: dict) -> np.ndarray:
        dt = dtypes.numpy_dtype(self.lt.dtype)
        if self.attr is None:
            return self.value
        return np.broadcast_to(np.asarray(attrs[self.attr], dt), self.lt.shape).copy()


def _port_text(lt: LogicalTensor) -> str:
    shape = "?" if lt.shape is None else ",".join("?" if d < 0 else str(d) for d in lt.shape)
    return f"{lt.dtype.name}[{shape}]"


class Decomposition:
    """The reference implementation of composite ``name`` v``version``.

    Args:
        name: the composite's name (``"tanh"``, ``"my.rms_norm"``).
        inputs, outputs: the port logical tensors (dtype fixed; ``shape=None`` or -1
            dims accept any rank or size; dims are checked where both sides know them).
        ops: ordinary ops and Composite ops over the ports' and inner tensors' ids.
        version: the contract's version (name + version never changes meaning).
        constants: ``{tensor id: value}`` for fixed inner values, or
            ``{tensor id: "attr name"}`` for the value of one of the composite's own
            attributes (broadcast to the tensor's shape); each id must have a logical
            tensor in ``constant_lts`` or be used by an op.
        attrs: the composite's own attributes: ``{name: default}`` (``None`` = required).
    """

    def __init__(self, name: str, inputs, outputs, ops, version: int = DEFAULT_VERSION,
                 constants: dict | None = None, attrs: dict | None = None, doc: str = ""):
        if not isinstance(name, str) or not name:
            raise InvalidArguments(f"a composite name must be a non-empty string, got {name!r}")
        if isinstance(version, bool) or not isinstance(version, int):
            raise InvalidArguments(f"composite {name!r}: version must be an int, got {version!r}")
        self.name, self.version, self.doc = name, version, doc
        self.inputs, self.outputs = list(inputs), list(outputs)
        self.attrs = dict(attrs or {})
        self.ops = [self._normalized(op) for op in ops]
        self.constants = self._constants(constants or {})
        self._check_structure()
        self.verified_ops: list[Op] | None = None  # set by the library (verify)

    # ------------------------------------------------------------ identity
    @property
    def key(self) -> tuple[str, int]:
        return (self.name, self.version)

    @property
    def label(self) -> str:
        return f"composite '{self.name}' v{self.version}"

    def signature(self) -> tuple:
        return (tuple(_port_text(lt) for lt in self.inputs), tuple(_port_text(lt) for lt in self.outputs))

    def references(self) -> list[tuple[str, int]]:
        """(name, version) of the composites its ops call."""
        return [(op.attrs[NAME], op.attrs[VERSION]) for op in self.ops if op.kind == OpKind.Composite]

    def fingerprint(self) -> tuple:
        """Everything that defines the body, for "same definition?" checks."""
        ops = tuple((op.id, op.kind, tuple(sorted((k, repr(v)) for k, v in op.attrs.items())),
                     tuple(lt.key() for lt in op.inputs), tuple(lt.key() for lt in op.outputs))
                    for op in self.ops)
        consts = tuple((tid, c.attr, None if c.value is None else (c.value.dtype.str, c.value.shape,
                                                                  c.value.tobytes()))
                       for tid, c in sorted(self.constants.items()))
        return (self.signature(), tuple(lt.key() for lt in self.inputs + self.outputs), ops, consts,
                tuple(sorted((k, repr(v)) for k, v in self.attrs.items())))

    def __repr__(self) -> str:
        ins, outs = self.signature()
        return f"Decomposition({self.name!r} v{self.version}: ({', '.join(ins)}) -> ({', '.join(outs)}), {len(self.ops)} ops)"

    # ------------------------------------------------------------ construction checks
    def _fail(self, message: str) -> InvalidGraph:
        return InvalidGraph(f"{self.label}: {message}")

    def _normalized(self, op: Op) -> Op:
        """A copy with the schema's attribute defaults written in (no cross-op checks yet)."""
        from .opset import OP_SCHEMAS

        if not isinstance(op, Op):
            raise InvalidArguments(f"{self.label}: ops must be Op objects, got {type(op).__name__}")
        copy = op.copy()
        schema = OP_SCHEMAS.get(copy.kind)
        if schema is None:
            raise InvalidGraphOp(f"{self.label}: {op_label(op)}: op kind {op.kind.name} is not in the opset")
        check_attrs(copy, schema)
        return copy

    def _constants(self, given: dict) -> dict[int, Constant]:
        lts = {lt.id: lt for op in self.ops for lt in op.inputs}
        result = {}
        for tid, value in given.items():
            lt = lts.get(tid)
            if lt is None:
                raise self._fail(f"constant tensor {tid} is not an input of any op")
            if lt.shape is None or UNKNOWN_DIM in lt.shape:
                raise self._fail(f"constant tensor {tid} needs a concrete shape, got {lt!r}")
            lt = LogicalTensor(tid, lt.dtype, lt.shape, property=PropertyType.constant)
            if isinstance(value, str):
                if value not in self.attrs:
                    raise self._fail(f"constant tensor {tid} takes attribute {value!r}, which the "
                                     f"composite does not declare (attrs: {sorted(self.attrs)})")
                result[tid] = Constant(lt, attr=value)
                continue
            try:
                array = np.broadcast_to(np.asarray(value, dtypes.numpy_dtype(lt.dtype)), lt.shape).copy()
            except (ValueError, TypeError, OverflowError):
                raise self._fail(f"constant tensor {tid}: value {value!r} is not an array that "
                                 f"broadcasts to {lt!r}") from None
            result[tid] = Constant(lt, value=array)
        return result

    def _check_structure(self) -> None:
        ids = [op.id for op in self.ops]
        if not self.ops:
            raise self._fail("a decomposition needs at least one op")
        if len(set(ids)) != len(ids):
            raise self._fail(f"op ids are not unique: {ids}")
        produced = {lt.id: op for op in self.ops for lt in op.outputs}
        consumed = {lt.id for op in self.ops for lt in op.inputs}
        in_ids = [lt.id for lt in self.inputs]
        out_ids = [lt.id for lt in self.outputs]
        if len(set(in_ids + out_ids)) != len(in_ids + out_ids):
            raise self._fail(f"port tensor ids repeat: inputs {in_ids}, outputs {out_ids}")
        for i, lt in enumerate(self.inputs):
            if lt.id in produced:
                raise self._fail(f"input port {i} (tensor {lt.id}) is produced by {op_label(produced[lt.id])}")
            if lt.id in self.constants:
                raise self._fail(f"input port {i} (tensor {lt.id}) is also a constant")
        for i, lt in enumerate(self.outputs):
            if lt.id not in produced:
                raise self._fail(f"output port {i} (tensor {lt.id}) is produced by no op")
        free = consumed - produced.keys() - set(in_ids) - set(self.constants)
        if free:
            raise self._fail(f"tensors {sorted(free)} are used but are neither input ports, "
                             f"constants nor produced by an op")
        dead = produced.keys() - consumed - set(out_ids)
        if dead:
            raise self._fail(f"tensors {sorted(dead)} are produced but neither used nor output ports")

    # ------------------------------------------------------------ verification
    def verify(self) -> None:
        """Full check of every op (schemas, nested composites' boundaries), tensor
        consistency, acyclicity and shape inference from the ports; keeps the
        verified ops in topological order.  The library calls this on define."""
        from .graph import Graph

        graph = Graph()
        try:
            for op in self.ops:
                graph.add_op(op)
            graph.finalize()
        except GraphError as err:
            raise type(err)(f"{self.label}: {err.message}") from None
        for i, lt in enumerate(self.inputs):
            inner = graph.tensors.get(lt.id)
            if inner is not None and inner.dtype != lt.dtype:
                raise InvalidGraphOp(f"{self.label}: input port {i} (tensor {lt.id}) is {lt.dtype.name} "
                                     f"but its ops use it as {inner.dtype.name}")
        for i, lt in enumerate(self.outputs):
            inner = graph.tensors[lt.id]
            if inner.dtype != lt.dtype:
                raise InvalidGraphOp(f"{self.label}: output port {i} (tensor {lt.id}) is {lt.dtype.name} "
                                     f"but op {graph.producer[lt.id][0]} makes {inner.dtype.name}")
        self.verified_ops = [graph.ops[i] for i in graph.topological_op_ids()]
        self.infer(None, [lt.shape for lt in self.inputs])

    # ------------------------------------------------------------ shapes
    def seed_lts(self, in_shapes, where: str) -> dict[int, LogicalTensor]:
        """Port and constant logical tensors with the given input shapes merged in."""
        known = {c.lt.id: c.lt for c in self.constants.values()}
        for i, (port, shape) in enumerate(zip(self.inputs, in_shapes)):
            known[port.id] = port.with_shape(_merge_port(port.shape, shape, f"{where}input {i}", port, self))
        return known

    def infer(self, op, in_shapes) -> dict[int, LogicalTensor]:
        """Every inner tensor's logical tensor for these input shapes (``op`` names errors)."""
        from .opset import OP_SCHEMAS

        where = f"{op_label(op)}: " if op is not None else ""
        known = self.seed_lts(in_shapes, where)
        try:
            propagate(self.verified_ops, known, OP_SCHEMAS)
        except GraphError as err:
            raise type(err)(f"{where}in the decomposition of {self.label}: {err.message}") from None
        for i, port in enumerate(self.outputs):
            _merge_port(port.shape, known[port.id].shape, f"{where}output {i}", port, self, inferred=True)
        return known


def _merge_port(declared, given, what: str, port: LogicalTensor, dec: Decomposition, inferred=False):
    """The port shape refined by ``given``; InvalidGraphOp naming the port on a clash."""
    if declared is None or given is None:
        return given if declared is None else declared
    clash = len(declared) != len(given) or any(
        d != UNKNOWN_DIM and g != UNKNOWN_DIM and d != g for d, g in zip(declared, given))
    if clash:
        source = "infers" if inferred else "is given"
        raise InvalidGraphOp(f"{what} (port tensor {port.id}) of {dec.label} {source} shape "
                             f"{list(given)}; the port is {_port_text(port)}")
    return tuple(g if d == UNKNOWN_DIM else d for d, g in zip(declared, given))


# ====================================================================== the library
class Library:
    """Decompositions by (name, version), shared by every call site."""

    def __init__(self):
        self._entries: dict[tuple[str, int], Decomposition] = {}

    def __contains__(self, key) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[tuple[str, int]]:
        return list(self._entries)

    def get(self, name: str, version: int = DEFAULT_VERSION) -> Decomposition | None:
        return self._entries.get((name, version))

    def define(self, decomposition: Decomposition) -> Decomposition:
        """Add one decomposition (or find the identical one); returns the stored one."""
        return self.define_all([decomposition])[0]

    def define_all(self, decompositions) -> list[Decomposition]:
        """Add several at once (they may reference each other in any order).

        Raises:
            InvalidGraphOp: a redefinition of a name + version with other ports,
                types or body (R2); a reference to an unknown composite.
            InvalidGraph: the references form a cycle (R3 allows nesting, not recursion).
        """
        stored, added = [], []
        for dec in decompositions:
            if not isinstance(dec, Decomposition):
                raise InvalidArguments(f"define needs a Decomposition, got {type(dec).__name__}")
            existing = self._entries.get(dec.key) or next((d for d in added if d.key == dec.key), None)
            if existing is not None:
                _check_redefinition(existing, dec)
                stored.append(existing)
                continue
            added.append(dec)
            stored.append(dec)
        for dec in added:
            self._entries[dec.key] = dec
        try:
            self._check_references(added)
            for dec in self._dependency_order(added):
                dec.verify()
        except GraphError:
            for dec in added:
                del self._entries[dec.key]
            raise
        return stored

    def _check_references(self, decs) -> None:
        for dec in decs:
            for key in dec.references():
                if key not in self._entries:
                    raise InvalidGraphOp(f"{dec.label} calls composite '{key[0]}' v{key[1]}, which has no "
                                         f"decomposition (known: {self.known_text()})")
        cycle = self.find_cycle()
        if cycle:
            path = " -> ".join(f"'{n}' v{v}" for n, v in cycle + [cycle[0]])
            raise InvalidGraph(f"the composite library has a cycle: {path}; a decomposition may "
                               f"nest composites but not call itself")

    def find_cycle(self) -> list[tuple[str, int]] | None:
        calls = nx.DiGraph()
        for key, dec in self._entries.items():
            calls.add_node(key)
            calls.add_edges_from((key, ref) for ref in dec.references())
        try:
            return [u for u, _ in nx.find_cycle(calls)]
        except nx.NetworkXNoCycle:
            return None

    def _dependency_order(self, decs) -> list[Decomposition]:
        """Callees first, so that verifying a caller finds its callees verified."""
        new = {d.key for d in decs}
        calls = nx.DiGraph()
        calls.add_nodes_from(new)
        calls.add_edges_from((ref, d.key) for d in decs for ref in d.references() if ref in new)
        return [self._entries[k] for k in nx.topological_sort(calls)]

    def closure(self, keys) -> list[Decomposition]:
        """The decompositions ``keys`` need, transitively, callees first."""
        order, seen = [], set()

        def visit(key):
            if key in seen:
                return
            seen.add(key)
            dec = self._entries[key]
            for ref in dec.references():
                visit(ref)
            order.append(dec)

        for key in keys:
            visit(key)
        return order

    def known_text(self) -> str:
        return ", ".join(f"'{n}' v{v}" for n, v in sorted(self._entries)) or "none"

    @contextlib.contextmanager
    def scope(self):
        """Definitions made inside the block are dropped at its end (tests, samples)."""
        if self is LIBRARY:  # load the shipped ones first, or the block's end would drop them for good
            _ensure_shipped()
        saved = dict(self._entries)
        try:
            yield self
        finally:
            self._entries = saved


def _check_redefinition(existing: Decomposition, new: Decomposition) -> None:
    if existing.fingerprint() == new.fingerprint():
        return
    (old_in, old_out), (new_in, new_out) = existing.signature(), new.signature()
    for what, old, given in (("input", old_in, new_in), ("output", old_out, new_out)):
        if len(old) != len(given):
            raise InvalidGraphOp(f"redefinition of {existing.label} changes the {what} count from "
                                 f"{len(old)} to {len(given)}; a name + version is a stable contract, "
                                 f"give the new one another version")
        for i, (a, b) in enumerate(zip(old, given)):
            if a != b:
                raise InvalidGraphOp(f"redefinition of {existing.label} changes {what} port {i} from "
                                     f"{a} to {b}; a name + version is a stable contract, give the "
                                     f"new one another version")
    raise InvalidGraphOp(f"redefinition of {existing.label} with the same ports but another body; "
                         f"a name + version has one decomposition, give the new one another version")


#: the process-wide library: the shipped decompositions plus user and file definitions
LIBRARY = Library()


def define(decomposition: Decomposition) -> Decomposition:
    """Add a decomposition to :data:`LIBRARY` (see :meth:`Library.define`)."""
    _ensure_shipped()
    return LIBRARY.define(decomposition)


_SHIPPED = []


def _ensure_shipped() -> None:
    """Load the shipped decompositions on first use (they are built with the op API)."""
    if not _SHIPPED:
        _SHIPPED.append(True)  # first: verifying gelu_tanh resolves tanh through here
        from .composite_library import shipped

        try:
            LIBRARY.define_all(shipped())
        except GraphError:
            _SHIPPED.clear()
            raise


def resolve(op) -> Decomposition:
    """The decomposition a Composite op calls; InvalidGraphOp when there is none."""
    _ensure_shipped()
    name, version = op.attrs.get(NAME), op.attrs.get(VERSION, DEFAULT_VERSION)
    dec = LIBRARY.get(name, version)
    if dec is None:
        raise InvalidGraphOp(f"{op_label(op)}: unknown composite '{name}' v{version}: no decomposition "
                             f"is defined for it (known: {LIBRARY.known_text()}); define one with "
                             f"graph_api.composite.define or give it in the file's "
                             f"'graph_api.decompositions'")
    return dec


def composite_op(id: int, inputs, outputs, name: str, version: int = DEFAULT_VERSION,
                 decomposition: Decomposition | None = None, op_name: str = "", **attrs) -> Op:
    """A Composite op; ``decomposition`` (inline) is defined in the library on the way."""
    if decomposition is not None:
        if decomposition.key != (name, version):
            raise InvalidArguments(f"op {id}: the inline decomposition is {decomposition.label}, "
                                   f"the op calls '{name}' v{version}")
        define(decomposition)
    return Op(id, OpKind.Composite, inputs, outputs, op_name,
              {NAME: name, VERSION: version, **attrs})


# ====================================================================== the op's checks
def check_composite(op) -> None:
    """Composite row constraint: the boundary types and the composite's own attributes."""
    dec = resolve(op)
    for what, lts, ports in (("input", op.inputs, dec.inputs), ("output", op.outputs, dec.outputs)):
        if len(lts) != len(ports):
            names = ", ".join(_port_text(p) for p in ports)
            raise InvalidGraphOp(f"{op_label(op)}: {dec.label} takes {len(ports)} {what}s ({names}), "
                                 f"given {len(lts)}")
        for i, (lt, port) in enumerate(zip(lts, ports)):
            if lt.dtype != port.dtype:
                raise InvalidGraphOp(f"{op_label(op)}: {what} {i} (tensor {lt.id}) is {lt.dtype.name}; "
                                     f"{what} port {i} of {dec.label} is {_port_text(port)}")
            _merge_port(port.shape, lt.shape, f"{op_label(op)}: {what} {i} (tensor {lt.id})", port, dec)
    own = {k for k in op.attrs if k not in (NAME, VERSION)}
    unknown = sorted(own - dec.attrs.keys())
    if unknown:
        raise InvalidGraphOp(f"{op_label(op)}: {dec.label} has no attribute {unknown[0]!r}; it takes: "
                             f"{', '.join(sorted(dec.attrs)) or 'none'}")
    for name, default in dec.attrs.items():
        if name not in op.attrs:
            if default is None:
                raise InvalidGraphOp(f"{op_label(op)}: {dec.label} needs attribute {name!r}")
            op.attrs[name] = list(default) if isinstance(default, (list, tuple)) else default
    for c in dec.constants.values():
        if c.attr is None:
            continue
        value = op.attrs[c.attr]
        if not _numeric(value) or not _broadcasts(value, c.lt.shape):
            raise InvalidGraphOp(f"{op_label(op)}: attribute {c.attr}={value!r} of {dec.label} must be "
                                 f"a number (or list of numbers) broadcasting to {list(c.lt.shape)}")


def _broadcasts(value, shape) -> bool:
    try:
        return np.broadcast_shapes(np.shape(value), shape) == tuple(shape)
    except ValueError:
        return False


def _numeric(value) -> bool:
    values = value if isinstance(value, list) else [value]
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def infer_shapes(op, in_shapes) -> list:
    """Composite shape inference: through the decomposition."""
    dec = resolve(op)
    known = dec.infer(op, in_shapes)
    shapes = [known[p.id].shape for p in dec.outputs]
    for i, (lt, shape) in enumerate(zip(op.outputs, shapes)):
        if lt.shape is not None and shape is not None and (
                len(lt.shape) != len(shape)
                or any(d >= 0 and s >= 0 and d != s for d, s in zip(lt.shape, shape))):
            raise InvalidGraphOp(f"{op_label(op)}: output {i} (tensor {lt.id}) is declared "
                                 f"{_port_text(lt)} but {dec.label} gives {list(shape)} for output port {i}")
    return shapes

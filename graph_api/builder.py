"""``GraphBuilder``: build a graph by calling one method per op kind.

The oneDNN-style API is explicit (hand-numbered ids, every shape spelled out).
The builder assigns ids, infers output data types and shapes from the schema
table, and keeps constant arrays beside the graph::

    b = ga.GraphBuilder()
    x = b.input(dt.f32, [1, 4096])
    w = b.constant(weights)                       # data type from the array
    y = b.matmul(x, w, transpose_b=True)          # attrs as keywords, defaults from the schema
    model = b.compile()                           # partitions once, compiles once per shape
    out = model(x_array)                          # the graph outputs, in order

The op methods are generated from ``OP_SCHEMAS`` (not written by hand): the
method for ``OpKind.DynamicDequantize`` is ``dynamic_dequantize``, its
positional parameters are the input ports, its keyword-only parameters the
attributes with the schema's defaults, so ``help(b.matmul)`` shows them
(a port name that is not an identifier, ``src/dst``, becomes ``src_dst``).  An
input port that shares its name with an attribute (``axes`` of the Reduce ops,
``sizes`` of Interpolate) takes the parameter name ``<port>_input``.

Output data types: an output port whose type variable an input already binds
gets that input's type; else a type variable with one allowed type gets it;
else the first input whose type the port allows; ``out_dtype=`` (one output)
or ``out_dtypes=`` (several) say it explicitly, as TypeCast and Quantize need.
Optional outputs (LayerNorm's mean/variance, SoftMax's stats) are made when
``num_outputs=`` asks for them.
"""
from __future__ import annotations

import inspect
import itertools
import re
from dataclasses import dataclass

import numpy as np

from . import dtypes
from .config import get_memory_budget, settings
from .dtypes import DataType
from .engine import Engine, Stream
from .enums import EngineKind, FPMathMode, OpKind, PartitionPolicy, PropertyType
from .errors import InvalidArguments, InvalidGraphOp, Unimplemented
from .graph import Graph
from .logical_tensor import LogicalTensor
from .op import Op
from .opset import OP_SCHEMAS
from .runner import compile_graph
from .schema import NO_DEFAULT, REQUIRED, check_attrs
from .tensor import Tensor

#: CamelCase pieces that read as one word in a method name
_WORDS = {"PReLU": "Prelu", "ReLU": "Relu", "SoftMax": "Softmax", "MatMul": "Matmul"}


def method_name(kind: OpKind) -> str:
    """``OpKind.DynamicDequantize`` -> ``dynamic_dequantize``; ``LeakyReLU`` -> ``leaky_relu``."""
    name = kind.name
    for word, plain in _WORDS.items():
        name = name.replace(word, plain)
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name)
    return name.lower()


@dataclass(frozen=True)
class Value:
    """A tensor of the graph being built: what op methods take and return."""

    lt: LogicalTensor

    @property
    def id(self) -> int:
        return self.lt.id

    @property
    def dtype(self) -> DataType:
        return self.lt.dtype

    @property
    def shape(self) -> tuple[int, ...] | None:
        return self.lt.shape

    def __repr__(self) -> str:
        shape = "?" if self.shape is None else "x".join(map(str, self.shape)) or "scalar"
        return f"Value({self.id}: {self.dtype.name} {shape})"


class GraphBuilder:
    """Ids assigned, data types and shapes inferred, constants kept.

    Args:
        fpmath_mode, apply_to_int: the graph's fpmath (``Graph(...)``'s).
        engine_kind: only ``cpu``.
    """

    def __init__(self, fpmath_mode=FPMathMode.strict, apply_to_int: bool = False,
                 engine_kind=EngineKind.cpu):
        self.graph = Graph(engine_kind, fpmath_mode, apply_to_int)
        self.constants: dict[int, np.ndarray] = {}
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self._tensor_ids = itertools.count()
        self._op_ids = itertools.count()

    # ------------------------------------------------------------ graph inputs
    def input(self, dtype, shape, property=PropertyType.variable) -> Value:
        """A graph input fed at run time (``property=host_scalar`` for a 0-D host scalar)."""
        lt = LogicalTensor(next(self._tensor_ids), dtype, shape, property=property)
        value = Value(lt)
        self.inputs.append(value)
        return value

    def constant(self, array, dtype=None) -> Value:
        """A constant tensor holding ``array`` (the data type follows the array's
        numpy dtype unless ``dtype`` is given; the array is converted to it)."""
        array = np.asarray(array)
        dt = dtypes.parse(dtype) if dtype is not None else dtypes.from_numpy(array.dtype)
        if array.dtype != dtypes.numpy_dtype(dt):
            array = dtypes.convert(array, dt)
        lt = LogicalTensor(next(self._tensor_ids), dt, array.shape, property=PropertyType.constant)
        if dtypes.info(dt).packed:
            # s4/u4 are held as their packed bytes (oneDNN's handle form): a direct tensor the kernels
            # read in place, so a prepared weight is cached across runs; an unpacked array would be a
            # mirror that every execute re-packs into fresh memory, preparing the weight again
            array = dtypes.pack_int4(array)
        self.constants[lt.id] = array
        return Value(lt)

    def output(self, *values: Value) -> None:
        """Mark the values the compiled model returns, in order (default: every
        tensor no op consumes, in creation order)."""
        self.outputs.extend(values)

    # ------------------------------------------------------------ ops
    def make_op(self, kind: OpKind, inputs, attrs: dict, out_dtypes=None, num_outputs=None,
                op_name: str | None = None):
        """Add one op of any kind: what every generated method calls.  Returns a ``Value``
        (one output) or a tuple of them."""
        schema = OP_SCHEMAS[kind]
        in_lts = [v.lt if isinstance(v, Value) else _not_a_value(kind, v) for v in inputs]
        op_id = next(self._op_ids)
        op = Op(op_id, kind, in_lts, [], op_name or f"{method_name(kind)}_{op_id}",
                attrs={k: v for k, v in attrs.items() if v is not None})
        check_attrs(op, schema)  # writes the defaults shape inference reads
        count = _output_count(schema, num_outputs, op)
        types = _output_dtypes(schema, op, in_lts, count, out_dtypes)
        outs = [LogicalTensor(next(self._tensor_ids), dt) for dt in types]
        op.add_outputs(outs)  # shape functions read the output count (and dtypes)
        shapes = schema.infer_shapes(op, [lt.shape for lt in in_lts])
        outs = [lt.with_shape(shape) if shape is not None else lt for lt, shape in zip(outs, shapes)]
        op.outputs[:] = outs
        self.graph.add_op(op)
        values = tuple(Value(lt) for lt in outs)
        return values[0] if len(values) == 1 else values

    # ------------------------------------------------------------ results
    def build(self) -> Graph:
        """The finalized graph (the builder's constants are in ``self.constants``)."""
        if not self.graph.is_finalized():
            self.graph.finalize()
        return self.graph

    def compile(self, policy=PartitionPolicy.fusion) -> "CompiledModel":
        """A model that runs the whole graph many times: partitions once,
        compiles each partition once per input shape."""
        graph = self.build()
        outputs = self.outputs or [Value(graph.tensors[t]) for t in graph.output_ids]
        feeds = [v for v in self.inputs if v.id in graph.input_ids]
        return CompiledModel(graph, feeds, outputs, self.constants, policy)


def _not_a_value(kind, value):
    raise InvalidArguments(f"{kind.name}: inputs must be builder Values (from input(), constant() "
                           f"or an op method), got {type(value).__name__}")


def _output_count(schema, num_outputs, op) -> int:
    required = sum(1 for p in schema.outputs if not p.optional)
    if num_outputs is None:
        return required
    if not required <= num_outputs <= len(schema.outputs):
        raise InvalidGraphOp(f"{op.kind.name}: num_outputs={num_outputs}; it has {required} required "
                             f"and {len(schema.outputs)} possible outputs")
    return num_outputs


def _output_dtypes(schema, op, in_lts, count, out_dtypes) -> list[DataType]:
    if out_dtypes is not None:
        if len(out_dtypes) != count:
            raise InvalidArguments(f"{op.kind.name}: {len(out_dtypes)} out_dtypes for {count} outputs")
        return [dtypes.parse(d) for d in out_dtypes]
    bound = {}
    for i, lt in enumerate(in_lts):
        bound.setdefault(schema.input_port(i).type_var, lt.dtype)
    types = []
    for i in range(count):
        port = schema.output_port(i)
        allowed = schema.type_vars[port.type_var]
        if port.type_var in bound:
            types.append(bound[port.type_var])
        elif len(allowed) == 1:
            types.append(next(iter(allowed)))
        else:
            first = next((lt.dtype for lt in in_lts if lt.dtype in allowed), None)
            if first is None:
                names = ", ".join(sorted(d.name for d in allowed))
                raise InvalidArguments(f"{op.kind.name}: say the data type of output {i} ({port.name}) "
                                       f"with out_dtype=; allowed: {names}")
            types.append(first)
    return types


# ---------------------------------------------------------------- generated op methods
def _input_params(schema) -> list[inspect.Parameter]:
    attr_names = set(schema.attr_by_name)
    params = []
    for port in schema.inputs:
        name = re.sub(r"\W", "_", port.name)  # 'src/dst' of the backward ops -> src_dst
        name = name + "_input" if name in attr_names else name
        if port.variadic:
            params.append(inspect.Parameter(name, inspect.Parameter.VAR_POSITIONAL))
        else:
            default = None if port.optional else inspect.Parameter.empty
            params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default))
    return params


def _attr_params(schema) -> list[inspect.Parameter]:
    params = []
    for attr in schema.attrs:
        if attr.default is REQUIRED:
            default = inspect.Parameter.empty
        elif attr.default is NO_DEFAULT:
            default = None
        else:
            default = attr.default
        params.append(inspect.Parameter(attr.name, inspect.Parameter.KEYWORD_ONLY, default=default))
    return params


_COMMON = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None)
           for name in ("out_dtype", "out_dtypes", "num_outputs", "op_name")]


def _doc(schema) -> str:
    def port_line(port):
        types = ", ".join(sorted(d.name for d in schema.type_vars[port.type_var]))
        flags = " (optional)" if port.optional else ""
        flags += " (repeats)" if port.variadic else ""
        return f"        {port.name}{flags}: {types}"

    def attr_line(attr):
        if attr.default is REQUIRED:
            default = "required"
        elif attr.default is NO_DEFAULT:
            default = "optional, no default"
        else:
            default = f"default {attr.default!r}"
        choices = f", one of {list(attr.choices)}" if attr.choices else ""
        return f"        {attr.name} ({attr.kind}): {default}{choices}"

    lines = [f"Add a {schema.kind.name} op; returns its output Value(s).", ""]
    if schema.doc:
        lines += [schema.doc, ""]
    lines += ["    Inputs:"] + [port_line(p) for p in schema.inputs]
    lines += ["    Outputs:"] + [port_line(p) for p in schema.outputs]
    if schema.attrs:
        lines += ["    Attributes:"] + [attr_line(a) for a in schema.attrs]
    lines += ["", "    out_dtype / out_dtypes: output data type(s) when they cannot be inferred;",
              "    num_outputs: to get optional outputs; op_name: the op's name."]
    return "\n".join(lines)


def _make_method(kind: OpKind):
    schema = OP_SCHEMAS[kind]
    inputs = _input_params(schema)
    attrs = _attr_params(schema)
    signature = inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
                                  + inputs + attrs + _COMMON)
    input_names = [p.name for p in inputs]
    variadic = any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in inputs)

    def method(self, *args, **kwargs):
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError as err:
            raise InvalidArguments(f"{method_name(kind)}{signature}: {err}") from None
        bound.apply_defaults()
        given = bound.arguments
        values = []
        for name in input_names:
            value = given[name]
            if variadic and name == input_names[-1]:
                values.extend(value)
            elif value is not None:
                values.append(value)
        attr_values = {a.name: given[a.name] for a in attrs}
        out_dtypes = given["out_dtypes"]
        if given["out_dtype"] is not None:
            out_dtypes = [given["out_dtype"]]
        return self.make_op(kind, values, attr_values, out_dtypes, given["num_outputs"], given["op_name"])

    method.__name__ = method.__qualname__ = method_name(kind)
    method.__signature__ = signature
    method.__doc__ = _doc(schema)
    return method


def _install_op_methods() -> None:
    for kind in OP_SCHEMAS:
        setattr(GraphBuilder, method_name(kind), _make_method(kind))


_install_op_methods()


# ---------------------------------------------------------------- the compiled model
class CompiledModel:
    """The whole graph, ready to run many times: a thin front of
    :func:`graph_api.runner.compile_graph` (one :class:`~graph_api.runner.CompiledGraph`
    per input-shape signature: partitions compiled once, intermediates
    allocated once, layout-only partitions as views).

    ``model(*arrays)`` feeds the builder's inputs in creation order and returns
    the outputs (one array, or a tuple); ``model.run({value_or_id: array})``
    returns ``{id: array}`` for every output (new arrays, yours to keep).
    Partitions come from one ``get_partitions()``; the constants are wrapped in
    tensors once, so kernels that prepare constant weights do it on the first
    call only.
    """

    def __init__(self, graph: Graph, inputs, outputs, constants, policy):
        self.graph = graph
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.policy = policy
        self.partitions = graph.get_partitions(policy)
        unsupported = [p for p in self.partitions if not p.is_supported()]
        if unsupported:
            reasons = "; ".join(f"partition {p.id}: {p.unsupported_reason()}" for p in unsupported)
            raise Unimplemented(f"the graph has unsupported partitions: {reasons}")
        self.engine = Engine()
        self.stream = Stream(self.engine)
        self._constants = {tid: Tensor(graph.tensors[tid], self.engine, array)
                           for tid, array in constants.items() if tid in graph.input_ids}
        #: partition id -> the kernel (plan) it runs, for the shapes compiled last
        self.kernels: dict[int, str] = {}
        #: feed signature -> CompiledGraph (:meth:`_compiled_for`), and the one run last
        self._graphs: dict = {}
        self._last = None

    def __call__(self, *arrays):
        if len(arrays) != len(self.inputs):
            raise InvalidArguments(f"the model takes {len(self.inputs)} inputs "
                                   f"({', '.join(map(repr, self.inputs))}), got {len(arrays)}")
        results = self.run(dict(zip((v.id for v in self.inputs), arrays)))
        out = tuple(results[v.id] for v in self.outputs)
        return out[0] if len(out) == 1 else out

    def run(self, feeds: dict) -> dict[int, np.ndarray]:
        """Run on ``feeds`` (keys: ``Value`` or tensor id) -> ``{output id: array}``."""
        values = {}
        for key, array in feeds.items():
            tid = key.id if isinstance(key, Value) else int(key)
            lt = self.graph.tensors.get(tid)
            if lt is None or tid not in self.graph.input_ids:
                raise InvalidArguments(f"tensor {tid} is not an input of the graph")
            values[tid] = _input_array(lt, array)
        values.update(self._constants)
        missing = [t for t in self.graph.input_ids if t not in values]
        if missing:
            raise InvalidArguments(f"no value for graph inputs {missing}")
        compiled = self._compiled_for(values)
        compiled(values)  # the steps bound once per set of input arrays (CompiledGraph.__call__)
        return {v.id: compiled.produced[v.id].numpy().copy() if v.id in compiled.produced
                else np.array(_array_of(values[v.id])) for v in self.outputs}

    def _compiled_for(self, values: dict):
        """The CompiledGraph for these feeds' shapes and types, looked up by a key made of
        what the arrays already say (shape, dtype), the reference switch and the memory
        budget: :func:`compile_graph`'s own key (new logical tensors, the partitions'
        descriptions) cost more than running a decode step's small partitions."""
        key = (tuple((tid, _signature(v)) for tid, v in values.items()), settings.reference, get_memory_budget())
        compiled = self._graphs.get(key)
        if compiled is None:
            if len(self._graphs) > 8:
                self._graphs.clear()
            compiled = self._graphs[key] = compile_graph(self.graph, values, self.policy, self.partitions)
        if compiled is not self._last:
            self._last = compiled
            self.kernels = {part.id: comp.plan.name for part, comp, _, _ in compiled.steps}
        return compiled


def _signature(value) -> tuple:
    """What of a feed decides the compiled graph: its logical tensor (a Tensor), or the
    shape and dtype of an array (fed dense: :func:`_input_array`)."""
    if isinstance(value, Tensor):
        return value.get_logical_tensor().key()
    return tuple(np.shape(value)), str(getattr(value, "dtype", type(value).__name__))


def _array_of(value):
    return value.numpy() if isinstance(value, Tensor) else value


def _input_array(lt: LogicalTensor, array):
    """A feed as the array the graph's input takes: its data type (converted), dense."""
    if lt.property == PropertyType.host_scalar:
        return array
    array = np.asarray(array)
    if array.dtype != dtypes.numpy_dtype(lt.dtype):
        array = dtypes.convert(array, lt.dtype)
    if lt.shape is not None and len(lt.shape) != array.ndim:
        raise InvalidArguments(f"input {lt.id} has rank {len(lt.shape)}, got an array of shape {array.shape}")
    return np.ascontiguousarray(array)

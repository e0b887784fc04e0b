"""The ONNX front door: ``.onnx`` models as graph_api graphs.

::

    graph = ga.from_onnx("model.onnx")           # a Graph when every node maps
    out = ga.run_graph(graph, {**graph.constants, graph.onnx_inputs["x"]: x})

    model = ga.import_onnx("model.onnx")         # always an OnnxModel
    outs = model.run({"x": x})                   # {output name: array}

How a model is cut (one pass over the nodes, which ONNX keeps in topological order):

* a node whose inputs are all known at load (initializers, ``Constant`` nodes, folded
  values) is **constant-folded** with numpy (ONNX's reference evaluator), whatever its op;
* a node with a oneDNN Graph counterpart (:mod:`.onnx_ops`, :mod:`.onnx_contrib`) becomes
  graph_api ops in the open **segment** (one ``Graph`` with its constants);
* any other standard-domain node runs as a **host step** (numpy, ``onnx.reference``) on
  run-time arrays: Gather of an embedding table by token ids, Shape of a dynamic input,
  Where/Expand/Range/ConstantOfShape of run-time values, int64 arithmetic.  A host step
  that needs nothing of the open segment runs before it; else the segment closes and a
  new one opens after the step;
* a node neither path can run (an unknown domain or op type, a control-flow body) is
  :class:`~graph_api.errors.Unimplemented` at load, naming the node, its domain and type.

QDQ int8 models (ONNX Runtime's ``quantize_static``, QDQ format): a ``DequantizeLinear`` of
constant s8/u8/int4 weights read only by MatMul/Gemm/Conv stays a Dequantize op, made in the
segment of the node that reads it; int32 bias DequantizeLinears fold to f32; a
DequantizeLinear several nodes read is copied per reader (:func:`.onnx_rewrite.unique_dequantize`).
Q -> DQ -> MatMul/Conv -> Q then match the ``matmul_quantized`` / ``conv_quantized`` patterns.

So a model is a sequence of stages (segments and host steps): :class:`OnnxModel`.  When it
is one segment and nothing else, ``model.graph`` is that ``Graph`` and :func:`from_onnx`
returns it, carrying ``graph.constants`` (tensor id -> array, ``property=constant``
inputs; s4/u4 as packed bytes, as ``GraphBuilder`` keeps them), ``graph.onnx_inputs`` and
``graph.onnx_outputs`` (ONNX name -> tensor id).  Otherwise it returns the ``OnnxModel``.

Shapes come from ``onnx.shape_inference`` (strict: a shape mismatch is an error naming the
node); symbolic or missing dims become ``-1``.  ``input_shapes={"x": [1, 128]}`` fixes
dims at load, so shape computations (Shape -> Gather -> Concat -> Reshape) fold.

Errors are typed: a file that is not an ONNX protobuf (truncated, garbage) is
``InvalidArguments``; an opset outside :data:`OPSET_RANGE`, a missing initializer or a
dangling input ``InvalidGraph``; a shape mismatch ``InvalidShape``; each names the node.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..builder import GraphBuilder, Value
from ..dtypes import DataType
from ..engine import Engine
from ..enums import FPMathMode, OpKind, PartitionPolicy
from ..errors import GraphError, InvalidArguments, InvalidGraph, InvalidShape, Unimplemented
from ..runner import compile_graph
from ..tensor import Tensor
from . import onnx_attention, onnx_contrib, onnx_ops

#: the ai.onnx opsets this importer reads (ops whose meaning changed are read per version)
OPSET_RANGE = (13, 24)
#: the com.microsoft opset ONNX Runtime writes
MS_DOMAIN = "com.microsoft"
#: the consumers for which a constant DequantizeLinear is kept (not folded)
WEIGHT_USERS = {"MatMul", "Gemm", "Conv", "ConvTranspose"}
#: op types that carry subgraphs: neither mapped nor run on the host here
CONTROL_FLOW = {"If", "Loop", "Scan", "SequenceMap"}

_ONNX_TO_GA = {  # TensorProto.DataType -> graph_api DataType
    1: DataType.f32, 10: DataType.f16, 16: DataType.bf16, 2: DataType.u8, 3: DataType.s8,
    6: DataType.s32, 7: DataType.s64, 9: DataType.boolean, 17: DataType.f8_e4m3,
    19: DataType.f8_e5m2, 21: DataType.u4, 22: DataType.s4,
}


def ga_dtype(onnx_type: int) -> DataType | None:
    """The graph_api data type of an ONNX element type (None: none, e.g. double, string)."""
    return _ONNX_TO_GA.get(int(onnx_type))


def node_label(node) -> str:
    """'node "attn/qk" (com.microsoft::MatMulNBits)': how every message names a node."""
    domain = node.domain or "ai.onnx"
    return f'node "{node.name or node.output[0] if node.output else node.name}" ({domain}::{node.op_type})'


# ====================================================================== values
@dataclass
class Runtime:
    """A value known only at run time: a model input, a host step's output or a value a
    segment computes.  ``where`` is ``("input",)``, ``("host", stage)`` or ``("seg", stage)``."""

    name: str
    np_dtype: np.dtype | None
    shape: tuple | None  # -1 for unknown dims; None for unknown rank
    where: tuple


# ====================================================================== stages
@dataclass
class Segment:
    """One graph_api graph: its builder while importing, then the finalized graph."""

    index: int
    builder: GraphBuilder
    #: ONNX name -> builder Value of the runtime values this segment reads
    inputs: dict = field(default_factory=dict)
    #: ONNX name -> builder Value of the values it computes
    values: dict = field(default_factory=dict)
    #: ONNX names later stages (or the model's outputs) read
    exports: list = field(default_factory=list)
    #: id(array) -> Value: one constant tensor per initializer
    const_cache: dict = field(default_factory=dict)
    graph: object = None
    _runner: object = None

    def finalize(self) -> None:
        b = self.builder
        for name in self.exports:
            v = self.values[name]
            if _consumed(b.graph, v.id):
                b.end(v)  # read inside a partition and outside the graph: its partition must return it
        self.graph = b.build()
        engine = Engine()
        # wrapped once: run_graph takes Tensors as they are (int4 kept packed, prepared weights kept)
        self.graph.constants = {t: Tensor(self.graph.tensors[t], engine, a) for t, a in b.constants.items()
                                if t in self.graph.input_ids}
        self.graph.onnx_inputs = {n: v.id for n, v in self.inputs.items() if v.id in self.graph.input_ids}
        self.graph.onnx_outputs = {n: self.values[n].id for n in self.exports}

    def run(self, env: dict, policy, repeat: int = 0) -> None:
        if self._runner is None:
            self._runner = _SegmentRunner(self.graph, policy)
        feeds = {self.graph.onnx_inputs[n]: env[n] for n in self.graph.onnx_inputs}
        env.update(self._runner(feeds, self.graph.onnx_outputs, repeat))

    @property
    def timings(self) -> list:
        """(partition, compiled partition, compile ms, best execute ms) of the last timed run."""
        return [] if self._runner is None else self._runner.timings


def _consumed(graph, tid: int) -> bool:
    return any(lt.id == tid for op in graph.ops.values() for lt in op.inputs)


class _SegmentRunner:
    """A segment compiled per feed signature; constants wrapped once (prepared weights kept)."""

    def __init__(self, graph, policy):
        self.graph, self.policy = graph, policy
        self.partitions = [p for p in graph.get_partitions(policy)
                           if not all(op.kind == OpKind.End for op in p.ops)]
        bad = [p for p in self.partitions if not p.is_supported()]
        if bad:
            raise Unimplemented("; ".join(f"partition {p.id}: {p.unsupported_reason()}" for p in bad))
        self.engine = Engine()
        self.constants = graph.constants
        self._compiled: dict = {}
        self.timings: list = []

    def __call__(self, feeds: dict, outputs: dict, repeat: int = 0) -> dict:
        """Run; ``repeat`` > 0 executes each partition that often and keeps the best times."""
        values = {}
        for tid, array in feeds.items():
            lt = self.graph.tensors[tid]
            array = np.asarray(array)
            want = _np_of(lt.dtype)
            if array.dtype != want:
                array = array.astype(want)
            if lt.shape is not None and (len(lt.shape) != array.ndim or any(
                    d >= 0 and d != a for d, a in zip(lt.shape, array.shape))):
                raise InvalidShape(f"tensor {tid}: the graph takes shape {list(lt.shape)}, "
                                   f"given {list(array.shape)}")
            values[tid] = np.ascontiguousarray(array)
        values.update(self.constants)
        key = tuple((t, a.shape, str(a.dtype)) for t, a in feeds.items())
        compiled = self._compiled.get(key)
        if compiled is None:
            if len(self._compiled) > 8:
                self._compiled.clear()
            compiled = self._compiled[key] = compile_graph(self.graph, values, self.policy, self.partitions)
        if repeat:
            times = compiled.run(values, repeat)
            self.timings = [(part, comp, cms, ms) for (part, comp, _, _), ms, cms
                            in zip(compiled.steps, times, compiled.compile_ms)]
        else:
            compiled(values)
        out = {}
        for name, tid in outputs.items():
            out[name] = compiled.produced[tid].numpy().copy() if tid in compiled.produced \
                else np.array(values[tid])
        return out


def _np_of(dt: DataType):
    from ..dtypes import numpy_dtype
    return numpy_dtype(dt)


@dataclass
class HostStep:
    """One ONNX node run with numpy (``onnx.reference``) on run-time arrays."""

    index: int
    node: object
    run_fn: object
    ms: float = 0.0

    def run(self, env: dict, policy, repeat: int = 0) -> None:
        ins = [env[n] if n else None for n in self.node.input]
        start = time.perf_counter()
        outs = self.run_fn(ins)
        self.ms = (time.perf_counter() - start) * 1e3
        for name, value in zip(self.node.output, outs):
            if name:
                env[name] = value


# ====================================================================== the model
class OnnxModel:
    """An imported ONNX model: graph_api segments and host steps, run in order.

    Attributes:
        stages: the :class:`Segment` and :class:`HostStep` objects in run order.
        graph: the one ``Graph`` when the model is a single segment (else None).
        constants: ONNX value name -> array for outputs known at load.
        input_names, output_names: the model's run-time inputs and outputs.
    """

    def __init__(self, stages, constants, inputs, outputs, policy, opset, host_consts=None):
        self.stages = stages
        self.folded = constants
        self.host_consts = dict(host_consts or {})
        self.inputs = inputs  # name -> Runtime
        self.input_names = list(inputs)
        self.output_names = list(outputs)
        self.policy = policy
        self.opset = opset
        segments = [s for s in stages if isinstance(s, Segment)]
        only = len(stages) == 1 and segments and not any(n in constants for n in outputs)
        self.graph = segments[0].graph if only and not _has_end(segments[0].graph) else None

    @property
    def segments(self) -> list[Segment]:
        return [s for s in self.stages if isinstance(s, Segment)]

    @property
    def host_steps(self) -> list[HostStep]:
        return [s for s in self.stages if isinstance(s, HostStep)]

    def run(self, feeds: dict, repeat: int = 0) -> dict:
        """Run on ``feeds`` (input name -> array); returns {output name: array}.  ``repeat`` > 0
        times each partition (best of ``repeat``; ``Segment.timings``), as ``graph-api run``."""
        env = dict(self.host_consts)
        env.update(self.folded)
        for name in self.input_names:
            if name not in feeds:
                raise InvalidArguments(f"no value for model input {name!r}; inputs: {self.input_names}")
            env[name] = _checked_feed(self.inputs[name], feeds[name])
        unknown = set(feeds) - set(self.input_names)
        if unknown:
            raise InvalidArguments(f"{sorted(unknown)} are not model inputs; inputs: {self.input_names}")
        for stage in self.stages:
            stage.run(env, self.policy, repeat)
        return {name: np.asarray(env[name]) for name in self.output_names}

    def report(self, feeds=None, *, seed: int = 0, repeat: int = 1, check: bool = False):
        """``graph-api run model.onnx``: (lines, ok); see :mod:`.onnx_report`."""
        from . import onnx_report

        return onnx_report.report(self, feeds, seed=seed, repeat=repeat, check=check)

    def explain(self) -> list[str]:
        """One line per stage: segments with their partitions, host steps with their node."""
        lines = []
        for stage in self.stages:
            if isinstance(stage, HostStep):
                lines.append(f"stage {stage.index}: host step  {node_label(stage.node)}")
            else:
                parts = [p for p in stage.graph.get_partitions(self.policy)
                         if not all(op.kind == OpKind.End for op in p.ops)]
                kinds = ", ".join(p.get_kind() for p in parts)
                lines.append(f"stage {stage.index}: graph_api {len(stage.graph.ops)} ops, "
                             f"{len(parts)} partitions [{kinds}]")
        return lines


def _has_end(graph) -> bool:
    return any(op.kind == OpKind.End for op in graph.ops.values())


def _checked_feed(rt: Runtime, value):
    array = np.asarray(value)
    if rt.shape is not None:
        if array.ndim != len(rt.shape) or any(d >= 0 and d != a for d, a in zip(rt.shape, array.shape)):
            raise InvalidShape(f"model input {rt.name!r} has shape {list(rt.shape)} (-1: any), "
                               f"given {list(array.shape)}")
    if rt.np_dtype is not None and array.dtype != rt.np_dtype:
        if array.dtype.kind != rt.np_dtype.kind and not (array.dtype.kind in "iu" and rt.np_dtype.kind in "iu"):
            raise InvalidArguments(f"model input {rt.name!r} is {rt.np_dtype}, given {array.dtype}")
        array = array.astype(rt.np_dtype)
    return array


# ====================================================================== loading
def load_model(source):
    """A checked ``onnx.ModelProto`` from a path, bytes or a ModelProto."""
    import onnx

    if isinstance(source, onnx.ModelProto):
        model = source
    elif isinstance(source, (bytes, bytearray)):
        model = _parse(bytes(source), "the given bytes")
    elif isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.isfile(path):
            raise InvalidArguments(f"{path}: no such ONNX file")
        try:
            model = onnx.load(path)
        except Exception as err:  # noqa: BLE001 - protobuf's DecodeError and friends
            raise InvalidArguments(f"{path}: not a readable ONNX model ({type(err).__name__}: {err}); "
                                   f"truncated or not a protobuf file?") from None
    else:
        raise InvalidArguments(f"from_onnx takes a path, bytes or an onnx.ModelProto, "
                               f"got {type(source).__name__}")
    if not model.graph.node and not model.graph.output:
        raise InvalidArguments("the ONNX model has no graph (an empty or truncated file?)")
    return model


def _parse(data: bytes, what: str):
    import onnx

    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as err:  # noqa: BLE001
        raise InvalidArguments(f"{what}: not an ONNX model ({type(err).__name__}: {err})") from None
    return model


def model_opset(model) -> int:
    versions = {imp.domain or "ai.onnx": imp.version for imp in model.opset_import}
    version = versions.get("ai.onnx")
    if version is None:
        raise InvalidGraph("the model imports no ai.onnx opset (opset_import lists "
                           f"{sorted(versions)})")
    lo, hi = OPSET_RANGE
    if not lo <= version <= hi:
        raise InvalidGraph(f"the model uses ai.onnx opset {version}; this importer reads opsets "
                           f"{lo} to {hi} (convert with onnx.version_converter)")
    return version


def check_structure(model) -> None:
    """Before shape inference: every node input defined earlier (a missing initializer is
    named here, with its node), no name produced twice, ai.onnx op types ONNX knows."""
    from onnx import defs

    g = model.graph
    known = {i.name for i in g.input} | {i.name for i in g.initializer}
    if len(g.initializer) != len({i.name for i in g.initializer}):
        raise InvalidGraph("two initializers share a name")
    for node in g.node:
        for name in node.input:
            if name and name not in known:
                raise InvalidGraph(f"{node_label(node)}: input {name!r} is neither a model input, an "
                                   f"initializer nor the output of an earlier node (a missing initializer?)")
        for name in node.output:
            if name and name in known:
                raise InvalidGraph(f"{node_label(node)}: output {name!r} is already defined")
            known.add(name)
        if node.domain not in ("", "ai.onnx", MS_DOMAIN):
            raise Unimplemented(f"{node_label(node)}: domain {node.domain!r} is not supported "
                                f"(ai.onnx and {MS_DOMAIN} are)")
        if node.domain == MS_DOMAIN and node.op_type not in onnx_contrib.MAPPERS \
                and node.op_type not in onnx_attention.MAPPERS:
            raise Unimplemented(f"{node_label(node)}: no graph_api mapping and no host implementation "
                                f"for ONNX Runtime's {node.op_type}")
        if node.domain in ("", "ai.onnx") and not defs.has(node.op_type) \
                and node.op_type not in ORT_DEFAULT_DOMAIN_OPS:
            raise Unimplemented(f"{node_label(node)}: ai.onnx has no op type {node.op_type!r}")
    for out in g.output:
        if out.name not in known:
            raise InvalidGraph(f"graph output {out.name!r} is not produced by any node")


#: ops ONNX Runtime registers in the ai.onnx domain although ONNX does not define them
ORT_DEFAULT_DOMAIN_OPS = {"SimplifiedLayerNormalization"}


def _infer_shapes(model, input_shapes):
    import onnx

    if input_shapes:
        model = _with_input_shapes(model, input_shapes)
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except onnx.shape_inference.InferenceError as err:
        raise InvalidShape(f"shape inference failed: {err}") from None
    except Exception as err:  # noqa: BLE001 - protobuf/checker errors on malformed graphs
        raise InvalidGraph(f"shape inference failed: {type(err).__name__}: {err}") from None


def _with_input_shapes(model, input_shapes: dict):
    import onnx

    model = onnx.ModelProto.FromString(model.SerializeToString())
    names = {i.name for i in model.graph.input}
    unknown = set(input_shapes) - names
    if unknown:
        raise InvalidArguments(f"input_shapes names {sorted(unknown)}, not model inputs ({sorted(names)})")
    for inp in model.graph.input:
        if inp.name in input_shapes:
            dims = inp.type.tensor_type.shape.dim
            shape = list(input_shapes[inp.name])
            if len(dims) and len(dims) != len(shape):
                raise InvalidShape(f"input_shapes[{inp.name!r}] = {shape} has rank {len(shape)}; "
                                   f"the model's input has rank {len(dims)}")
            del dims[:]
            for d in shape:
                dims.add().dim_value = int(d)
    return model


def _shape_of(type_proto) -> tuple | None:
    if not type_proto.HasField("tensor_type"):
        return None
    tt = type_proto.tensor_type
    if not tt.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else -1 for d in tt.shape.dim)


def _np_dtype_of(type_proto):
    import onnx

    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.elem_type:
        return None
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(type_proto.tensor_type.elem_type))
    except Exception:  # noqa: BLE001 - string tensors and the like
        return None


# ====================================================================== the importer
class Importer:
    """Walks the nodes once; see the module docstring for the rules."""

    def __init__(self, model, fpmath, policy, input_shapes=None):
        import onnx
        from onnx import numpy_helper

        self.onnx = onnx
        self.opset = model_opset(model)
        self.ms_opset = next((i.version for i in model.opset_import if i.domain == MS_DOMAIN), None)
        self.raw = model
        check_structure(model)
        self.model = _infer_shapes(model, input_shapes)
        self.fpmath = fpmath
        self.policy = policy
        g = self.model.graph
        self.info = {}  # name -> (np dtype, shape) from shape inference
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            self.info[vi.name] = (_np_dtype_of(vi.type), _shape_of(vi.type))
        self.consts: dict[str, np.ndarray] = {}
        for init in g.initializer:
            try:
                self.consts[init.name] = numpy_helper.to_array(init)
            except Exception as err:  # noqa: BLE001
                raise InvalidGraph(f"initializer {init.name!r} cannot be read: {type(err).__name__}: {err}") from None
        self.runtime: dict[str, Runtime] = {}
        self.inputs: dict[str, Runtime] = {}
        for inp in g.input:
            if inp.name in self.consts:
                continue  # an initializer listed as input (old exporters): a constant
            dtype, shape = self.info.get(inp.name, (None, None))
            rt = Runtime(inp.name, dtype, shape, ("input",))
            self.runtime[inp.name] = self.inputs[inp.name] = rt
        self.consumers: dict[str, list] = {}  # ONNX name -> the (rewritten) nodes reading it
        #: output name -> a constant-weight DequantizeLinear not yet made (keeps_dequantize)
        self.deferred: dict[str, object] = {}
        self.stages: list = []
        self.seg: Segment | None = None
        #: constants host steps read (handed to them at run time)
        self.host_consts: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------ queries for mappers
    def dtype_of(self, name) -> np.dtype | None:
        if name in self.consts:
            return self.consts[name].dtype
        if name in self.deferred:  # a kept weight DequantizeLinear: the scale's type
            return self.consts[self.deferred[name].input[1]].dtype
        if self.seg is not None and name in self.seg.values:
            return _np_of(self.seg.values[name].dtype)
        if name in self.runtime:
            return self.runtime[name].np_dtype
        return self.info.get(name, (None, None))[0]

    def shape_of(self, name) -> tuple | None:
        if name in self.consts:
            return tuple(self.consts[name].shape)
        if name in self.deferred:
            return tuple(self.consts[self.deferred[name].input[0]].shape)
        if self.seg is not None and name in self.seg.values:
            return self.seg.values[name].shape
        if name in self.runtime:
            return self.runtime[name].shape
        return self.info.get(name, (None, None))[1]

    def const(self, name) -> np.ndarray | None:
        return self.consts.get(name) if name else None

    # ------------------------------------------------------------ building
    def segment(self) -> Segment:
        if self.seg is None:
            self.seg = Segment(len(self.stages), GraphBuilder(self.fpmath))
            self.stages.append(self.seg)
        return self.seg

    def value(self, name, dtype: DataType | None = None) -> Value:
        """The builder Value of ONNX value ``name`` in the open segment (constants become
        constant tensors, run-time values segment inputs); ``dtype`` converts a constant."""
        seg = self.segment()
        if name in seg.values:
            return seg.values[name]
        if name in self.deferred and self.map_node(self.deferred[name]):
            return seg.values[name]  # the weight's Dequantize, made in the segment that reads it
        self.materialize(name)
        if name in self.consts:
            return self.constant(self.consts[name], dtype)
        if name in seg.inputs:
            return seg.inputs[name]
        rt = self.runtime.get(name)
        if rt is None:
            raise InvalidGraph(f"value {name!r} is read before any node produces it "
                               f"(no initializer, input or producing node)")
        ga = None if rt.np_dtype is None else _from_np(rt.np_dtype)
        if ga is None:
            raise Unimplemented(f"value {name!r} ({rt.np_dtype}) has no graph_api data type")
        v = seg.builder.input(ga, list(rt.shape) if rt.shape is not None else None)
        seg.inputs[name] = v
        if rt.where[0] == "seg":
            self.stages[rt.where[1]].exports.append(name)
        return v

    def constant(self, array, dtype: DataType | None = None) -> Value:
        seg = self.segment()
        array = np.asarray(array)
        if array.ndim == 0:
            array = array.reshape(1)
        key = (id(array) if array.base is None else id(array.base), array.shape, dtype, array.dtype.str,
               array.__array_interface__["data"][0])
        cached = seg.const_cache.get(key)
        if cached is not None:
            return cached[0]
        if dtype is None and array.dtype == np.float64:
            dtype = DataType.f32
        v = seg.builder.constant(array, dtype)
        seg.const_cache[key] = (v, array)  # keep the array alive: its id stays unique
        return v

    def produce(self, name, value: Value) -> None:
        self.segment().values[name] = value

    # ------------------------------------------------------------ the walk
    def run(self) -> OnnxModel:
        from . import onnx_host

        g = self.model.graph
        nodes = self.rewritten(g)
        self.consumers = {}
        for node in nodes:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        for node in nodes:
            self.check_inputs(node)
            if node.op_type in CONTROL_FLOW:
                raise Unimplemented(f"{node_label(node)}: control flow (subgraphs) is not supported")
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                self.consts[node.output[0]] = onnx_host.constant_value(node)
                continue
            ins = [n for n in node.input if n]
            if node.op_type in ("Shape", "Size") and node.domain in ("", "ai.onnx") and self.fold_shape(node):
                continue
            if all(n in self.consts for n in ins) and node.domain in ("", "ai.onnx") and node.output:
                if self.keeps_dequantize(node):
                    self.deferred[node.output[0]] = node
                else:
                    self.fold(node)
                continue
            if self.map_node(node):
                continue
            self.host(node)
        outputs = [o.name for o in g.output]
        for name in outputs:
            self.materialize(name)
        for name in outputs:
            if name in self.consts or name in self.inputs:
                continue
            rt = self.runtime.get(name)
            if rt is None and self.seg is not None and name in self.seg.values:
                continue
            if rt is None:
                raise InvalidGraph(f"graph output {name!r} is not produced by any node")
        for name in outputs:
            if self.seg is not None and name in self.seg.values:
                self.seg.exports.append(name)
            elif name in self.runtime and self.runtime[name].where[0] == "seg":
                self.stages[self.runtime[name].where[1]].exports.append(name)
        folded = {n: self.consts[n] for n in outputs if n in self.consts}
        for name in outputs:
            if name in self.inputs:
                folded.pop(name, None)
        # a segment a declining mapper opened but left without ops has nothing to run
        self.stages = [st for st in self.stages if not (isinstance(st, Segment) and not st.builder.graph.ops)]
        for index, stage in enumerate(self.stages):
            stage.index = index
            if isinstance(stage, Segment):
                stage.exports = list(dict.fromkeys(stage.exports))
                stage.finalize()
        # a model output that is a model input is passed through by run()
        return OnnxModel(self.stages, folded, self.inputs, outputs, self.policy, self.opset, self.host_consts)

    def rewritten(self, g) -> list:
        """The nodes with the decomposed forms of :mod:`.onnx_rewrite` put back together."""
        from . import onnx_host, onnx_rewrite

        known = dict(self.consts)
        for node in g.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                try:
                    known[node.output[0]] = onnx_host.constant_value(node)
                except GraphError:
                    pass
        outputs = {o.name for o in g.output}
        nodes = onnx_rewrite.unique_dequantize(list(g.node), outputs)
        nodes = onnx_rewrite.fuse_gelu(nodes, known, outputs)
        nodes = onnx_rewrite.fuse_softmax_nan_guard(nodes, known, outputs)
        nodes, sliced = onnx_rewrite.split_projections(nodes, known, outputs)
        self.consts.update(sliced)
        return nodes

    def check_inputs(self, node) -> None:
        for name in node.input:
            if not name:
                continue
            if name in self.consts or name in self.runtime or name in self.deferred:
                continue
            if self.seg is not None and name in self.seg.values:
                continue
            raise InvalidGraph(f"{node_label(node)}: input {name!r} is neither a model input, an "
                               f"initializer nor the output of an earlier node (a missing initializer?)")

    def materialize(self, name) -> None:
        """A deferred weight DequantizeLinear folded to its f32 value (a reader that is no
        graph_api op, or a Dequantize the mappers decline)."""
        node = self.deferred.pop(name, None)
        if node is not None:
            self.fold(node)

    def keeps_dequantize(self, node) -> bool:
        """A DequantizeLinear of constant integer weights read only by MatMul/Gemm/Conv stays
        an op (Dequantize, or DynamicDequantize for blocks): the quantized and
        weight-compressed patterns take it, and the weights stay small.  It is deferred
        (``self.deferred``) and made in the segment of its reader, when the reader's mapper
        asks for it, so a host step between the two never turns the weight into an f32
        run-time value."""
        dtype = self.consts[node.input[0]].dtype if node.op_type == "DequantizeLinear" else None
        if dtype is None or dtype.name not in ("int8", "uint8", "int4", "uint4"):
            return False  # an int32 bias (QDQ's bias_DequantizeLinear) folds to f32
        users = self.consumers.get(node.output[0], [])
        return bool(users) and all(u.op_type in WEIGHT_USERS and u.domain in ("", "ai.onnx") for u in users)

    def fold_shape(self, node) -> bool:
        """Shape / Size of a value whose shape is known at load: a constant."""
        shape = self.shape_of(node.input[0])
        if shape is None or any(d < 0 for d in shape):
            return False
        if node.op_type == "Size":
            self.consts[node.output[0]] = np.array(int(np.prod(shape, dtype=np.int64)), np.int64)
            return True
        attrs = {a.name: a.i for a in node.attribute}
        start, end = attrs.get("start", 0), attrs.get("end", None)
        self.consts[node.output[0]] = np.array(shape[start:end], np.int64)
        return True

    def fold(self, node) -> None:
        from . import onnx_host

        fn = onnx_host.host_function(node, self.raw, self.opset)
        try:
            outs = fn([self.consts[n] if n else None for n in node.input])
        except GraphError:
            raise
        except Exception as err:  # noqa: BLE001 - numpy errors on bad constant inputs
            raise InvalidGraph(f"{node_label(node)}: constant folding failed: {type(err).__name__}: {err}") from None
        for name, value in zip(node.output, outs):
            if name:
                self.consts[name] = np.asarray(value)

    def map_node(self, node) -> bool:
        """Map ``node`` to graph_api ops; False when no mapping applies (then a host step)."""
        if node.domain in ("", "ai.onnx"):
            mapper = onnx_ops.MAPPERS.get(node.op_type)
        elif node.domain == MS_DOMAIN:
            mapper = onnx_contrib.MAPPERS.get(node.op_type) or onnx_attention.MAPPERS.get(node.op_type)
            if mapper is None:
                raise Unimplemented(f"{node_label(node)}: no graph_api mapping and no host "
                                    f"implementation for ONNX Runtime's {node.op_type}")
        else:
            raise Unimplemented(f"{node_label(node)}: domain {node.domain!r} is not supported")
        if mapper is None:
            return False
        ctx = NodeContext(self, node)
        try:
            done = mapper(ctx)
        except GraphError as err:
            if node_label(node) in str(err):
                raise
            raise type(err)(f"{node_label(node)}: {err.message}") from None
        if done is False or done is None:
            return False
        return True

    def host_step(self, fn, inputs: list, outputs: list, label: str) -> list[str]:
        """A host step of the importer's own (a mapper's run-time length or guard):
        ``fn(list of input arrays) -> list of outputs`` ((np dtype, shape) each); returns
        the output names."""
        names = [f"{label}:{i}" for i in range(len(outputs))]
        node = self.onnx.helper.make_node("HostStep", list(inputs), names, name=label, domain="graph_api")
        self.host(node, fn)
        for name, (dtype, shape) in zip(names, outputs):
            self.runtime[name].np_dtype, self.runtime[name].shape = np.dtype(dtype), tuple(shape)
        return names

    def host(self, node, fn=None) -> None:
        from . import onnx_host

        if fn is None:
            fn = onnx_host.host_function(node, self.raw, self.opset)  # Unimplemented when none
        reads = [n for n in node.input if n]
        for name in reads:
            self.materialize(name)
        self.host_consts.update({n: self.consts[n] for n in reads if n in self.consts})
        seg = self.seg
        needs_open = seg is not None and any(n in seg.values for n in reads)
        for name in reads:
            rt = self.runtime.get(name)
            if seg is not None and name in seg.values:
                seg.exports.append(name)
            elif rt is not None and rt.where[0] == "seg":
                self.stages[rt.where[1]].exports.append(name)
        if needs_open:  # the open segment ends here; its values this step reads leave it
            for name, v in seg.values.items():
                self.runtime[name] = Runtime(name, _np_of(v.dtype), v.shape, ("seg", seg.index))
            self.seg = None
            index = len(self.stages)
            self.stages.append(HostStep(index, node, fn))
        elif seg is not None:  # runs before the open segment
            index = seg.index
            self.stages.insert(index, HostStep(index, node, fn))
            for s in self.stages[index + 1:]:
                s.index += 1
            for rt in self.runtime.values():
                if rt.where[0] in ("seg", "host") and rt.where[1] >= index:
                    rt.where = (rt.where[0], rt.where[1] + 1)
        else:
            index = len(self.stages)
            self.stages.append(HostStep(index, node, fn))
        for name in node.output:
            if name:
                dtype, shape = self.info.get(name, (None, None))
                self.runtime[name] = Runtime(name, dtype, shape, ("host", index))


def _from_np(np_dtype) -> DataType | None:
    from ..dtypes import from_numpy

    try:
        return from_numpy(np_dtype)
    except GraphError:
        return None


class NodeContext:
    """What a mapper sees: the node, its attributes, its inputs (constant or not)."""

    def __init__(self, importer: Importer, node):
        self.imp, self.node = importer, node
        self.opset = importer.opset
        import onnx

        self.attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}

    def attr(self, name, default=None):
        value = self.attrs.get(name, default)
        return value.decode() if isinstance(value, bytes) else value

    def n_inputs(self) -> int:
        return len(self.node.input)

    def name(self, i) -> str | None:
        return self.node.input[i] if i < len(self.node.input) and self.node.input[i] else None

    def const(self, i) -> np.ndarray | None:
        return self.imp.const(self.name(i))

    def has(self, i) -> bool:
        return self.name(i) is not None

    def dtype(self, i):
        return self.imp.dtype_of(self.name(i))

    def shape(self, i):
        return self.imp.shape_of(self.name(i))

    def is_float(self, i) -> bool:
        d = self.dtype(i)
        return d is not None and np.dtype(d) in (np.dtype(np.float32), np.dtype(np.float16)) or \
            (d is not None and str(d) == "bfloat16")

    def value(self, i, dtype=None) -> Value:
        return self.imp.value(self.name(i), dtype)

    def constant(self, array, dtype=None) -> Value:
        return self.imp.constant(array, dtype)

    @property
    def b(self) -> GraphBuilder:
        return self.imp.segment().builder

    def out(self, *values) -> bool:
        for name, v in zip(self.node.output, values):
            if name and v is not None:
                self.imp.produce(name, v)
        return True

    def fail(self, cls, message):
        return cls(f"{node_label(self.node)}: {message}")


# ====================================================================== entry points
def import_onnx(source, *, fpmath=FPMathMode.strict, policy=PartitionPolicy.fusion,
                input_shapes: dict | None = None) -> OnnxModel:
    """Import an ONNX model (path, bytes or ``onnx.ModelProto``) as an :class:`OnnxModel`.

    Args:
        fpmath: the fpmath mode of every graph_api graph made (``FPMathMode`` or its name).
        input_shapes: input name -> shape fixing dims at load (symbolic dims stay -1 otherwise).
    """
    if isinstance(fpmath, str):
        try:
            fpmath = FPMathMode[fpmath]
        except KeyError:
            raise InvalidArguments(f"unknown fpmath mode {fpmath!r}; known: "
                                   f"{', '.join(m.name for m in FPMathMode)}") from None
    model = load_model(source)
    imported = Importer(model, fpmath, policy, input_shapes).run()
    imported.proto = model
    imported.source = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "<ModelProto>"
    return imported


def from_onnx(source, *, fpmath=FPMathMode.strict, policy=PartitionPolicy.fusion,
              input_shapes: dict | None = None):
    """The model as one ``Graph`` (with ``.constants``, ``.onnx_inputs``, ``.onnx_outputs``)
    when every node maps onto graph_api ops or folds at load; else the :class:`OnnxModel`
    (segments and host steps; ``.run(feeds)``)."""
    model = import_onnx(source, fpmath=fpmath, policy=policy, input_shapes=input_shapes)
    if model.graph is not None:
        model.graph.onnx_model = model
        return model.graph
    return model

"""benchdnn's graph batch files: ``graph-api run --batch FILE``.

A batch file is a list of benchdnn ``--graph`` command lines: knobs, then
``--case=FILE.json`` to run a graph with the knobs in effect.  As benchdnn:

* ``#`` starts a comment; a line ending in ``\\`` continues on the next;
* knobs stay in effect until ``--reset``; a knob value with commas
  (``--op-kind=0:Add,0:Divide``) means one run per value, and several such
  knobs run every combination;
* ``--batch=FILE`` includes another batch file; ``--case=`` and ``--batch=``
  paths are relative to the inputs root (the folder holding ``op/``,
  ``pattern/``, ``complex_fusion/``);
* every case must give ``--expected-n-partitions`` partitions (default 1;
  0 skips the check), all supported, and outputs that match the reference.

Knobs (benchdnn's meanings, applied in benchdnn's order): ``--in-shapes``
(``ID:SHAPE[*STRIDES]``, strides as numbers or a tag like ``abdc``, ``-`` for
a 0-D shape; the other tensors' shapes are inferred again; as in benchdnn an
ID no op reads is ignored, one an op reads that is not a graph input is an
error), ``--op-attrs`` (``ID:NAME:VALUE[*NAME:VALUE][+ID:...]``, lists as
``2x2``; integers read as benchdnn reads them: ``s64`` its leading integer,
``s64[]`` each dim through atof, truncated), ``--op-kind``
(``ID:KIND[+ID:KIND]``, ``undef`` removes a unary/binary op), ``--attr-fpmath``
(``MODE[:true|false]``), ``--dt`` (``DT`` for a whole floating-point graph,
or ``ID:DT[+ID:DT]``), ``--tensor-property`` (``ID:PROP[+...]``), ``--mb``.
Any other knob is an error.

Each case ends as one of benchdnn's states: passed, failed (wrong partition
count, a rewrite or graph error, or a mismatch), unimplemented (a partition is
not supported, or the runtime raises Unimplemented), skipped (too large to
hold in memory even after the batch is reduced) or missing (its JSON file
is not in the inputs folder; benchdnn cannot run it either).  Large graphs
follow the conformance tests' memory rule (``MAX_ELEMENTS``).  The summary line
is benchdnn's: ``tests:N passed:P skipped:S unimplemented:U failed:F``, plus
``missing:M`` when some files are absent.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import rewrite
from .dtypes import DataType
from .enums import FPMathMode, OpKind, PropertyType
from .errors import GraphError, InvalidArguments, Unimplemented
from .fpmath import FPMath
from .logical_tensor import LogicalTensor
from .json_io import load
from .graph import Graph
from .opset import OP_SCHEMAS
from .partition_cache import get_compiled_partition_cache_capacity, set_compiled_partition_cache_capacity

#: the knobs a batch line may set (``--reset``, ``--case``, ``--batch`` are actions)
KNOBS = ("in-shapes", "op-attrs", "op-kind", "dt", "tensor-property", "attr-fpmath", "mb",
         "expected-n-partitions")
#: the conformance tests' budget: a graph whose tensors hold more elements runs
#: with its batch (then heads) reduced, as benchdnn's --mb; one that cannot be
#: reduced runs as it is
MAX_ELEMENTS = 16_000_000
#: a graph still this big after the reduction cannot be held (f32 data, its f64
#: reference and the check copies exceed the machine's memory): skipped
SKIP_ELEMENTS = 1_000_000_000
STATES = ("passed", "skipped", "unimplemented", "failed", "missing")


class BatchError(InvalidArguments):
    """A batch file that cannot be read: unknown knob, missing batch file, bad value."""


@dataclass(frozen=True)
class Case:
    """One run: a case file and the knob values in effect (one value each)."""

    path: str
    knobs: tuple  # ((knob, value), ...) in the order given
    origin: str  # "file:line"

    def command(self) -> str:
        """The case as a benchdnn command line."""
        knobs = " ".join(f"--{k}={v}" for k, v in self.knobs)
        return f"--graph {knobs + ' ' if knobs else ''}--case={self.path}"


@dataclass
class Outcome:
    case: Case
    state: str
    message: str = ""


@dataclass
class Summary:
    outcomes: list = field(default_factory=list)

    def count(self, state: str) -> int:
        return sum(o.state == state for o in self.outcomes)

    def line(self) -> str:
        ran = [o for o in self.outcomes if o.state != "missing"]
        text = (f"tests:{len(ran)} passed:{self.count('passed')} skipped:{self.count('skipped')} "
                f"unimplemented:{self.count('unimplemented')} failed:{self.count('failed')}")
        missing = self.count("missing")
        return text + (f" missing:{missing}" if missing else "")

    @property
    def ok(self) -> bool:
        return not self.count("failed")


# ====================================================================== reading
def logical_lines(path: Path):
    """(line number, text) with comments removed and ``\\`` continuations joined."""
    pending, start = "", 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if pending and raw.lstrip().startswith("#"):
            continue  # a commented-out line inside a continuation (harness_mha_all:262) is skipped
        text = raw.split("#", 1)[0].rstrip()
        if not pending:
            start = number
        if text.endswith("\\"):
            pending += text[:-1].strip()
            continue
        line = (pending + text.strip()).strip()
        pending = ""
        if line:
            yield start, line
    if pending:
        yield start, pending


def _option(token: str, where: str) -> tuple[str, str | None]:
    if not token.startswith("--"):
        raise BatchError(f"{where}: expected an option starting with --, got {token!r}")
    name, eq, value = token[2:].partition("=")
    return name, (value if eq else None)


def expand(path, root, knobs: dict | None = None, stack=()):
    """Every :class:`Case` of batch file ``path`` (nested batches included).

    ``knobs`` maps knob -> list of values and is shared with the caller, so a
    nested batch's settings stay in effect after it, as in benchdnn.
    """
    path, root = Path(path), Path(root)
    if not path.is_file():
        raise BatchError(f"batch file {path} does not exist")
    if path.resolve() in stack:
        raise BatchError(f"batch file {path} includes itself")
    knobs = {} if knobs is None else knobs
    for number, line in logical_lines(path):
        where = f"{path}:{number}"
        for token in line.split():
            name, value = _option(token, where)
            if name == "reset":
                knobs.clear()
            elif name == "batch":
                yield from expand(root / _need(value, name, where), root, knobs,
                                  stack + (path.resolve(),))
            elif name == "case":
                yield from _cases(_need(value, name, where), knobs, where)
            elif name in KNOBS:
                knobs[name] = _need(value, name, where).split(",")
            else:
                known = ", ".join(f"--{k}" for k in ("reset", "case", "batch") + KNOBS)
                raise BatchError(f"{where}: unknown knob --{name}; known: {known}")


def _need(value, name, where) -> str:
    if value is None:
        raise BatchError(f"{where}: --{name} needs a value (--{name}=...)")
    return value


def _cases(case_path: str, knobs: dict, where: str):
    names = list(knobs)
    for values in itertools.product(*(knobs[n] for n in names)):
        chosen = tuple((n, v) for n, v in zip(names, values) if v != "")
        yield Case(case_path, chosen, where)


def find_root(batch_file) -> Path:
    """The inputs root of ``batch_file``: the nearest folder (itself or above)
    under which the paths its lines name exist."""
    batch_file = Path(batch_file)
    named = []
    for _, line in logical_lines(batch_file):
        named += [t.split("=", 1)[1] for t in line.split() if t.startswith(("--case=", "--batch="))]
    for folder in [batch_file.parent, *batch_file.parent.parents]:
        if any((folder / n).exists() for n in named):
            return folder
    return batch_file.parent


# ==================================================================== rewrites
def _ids(spec: str, what: str):
    """``ID:REST+ID:REST`` -> [(id, rest)].

    An ID is read as benchdnn's ``stoll`` reads it: its leading integer (oneDNN's
    ``harness_f32_all`` has ``2*abc:3x64x8*abc``, which benchdnn runs as tensor 2)."""
    pairs = []
    for item in spec.split("+"):
        tid, sep, rest = item.partition(":")
        leading = re.match(r"\s*(-?\d+)", tid)
        if not sep or leading is None:
            raise BatchError(f"--{what}={spec}: expected ID:VALUE entries, got {item!r}")
        pairs.append((int(leading.group(1)), rest))
    return pairs


def _dims(text: str) -> tuple[int, ...]:
    if text in ("-", ""):
        return ()
    return tuple(int(d) for d in text.split("x"))


def tag_strides(shape, tag: str) -> tuple[int, ...]:
    """Dense strides of ``shape`` laid out as ``tag`` (``abdc``: dim 2 innermost)."""
    if sorted(tag) != [chr(ord("a") + i) for i in range(len(shape))]:
        raise BatchError(f"stride tag {tag!r} does not name the {len(shape)} dims of {list(shape)}")
    strides, step = [0] * len(shape), 1
    for letter in reversed(tag):
        dim = ord(letter) - ord("a")
        strides[dim] = step
        step *= max(shape[dim], 1)
    return tuple(strides)


def _new_input(lt, spec: str) -> LogicalTensor:
    shape_text, star, stride_text = spec.partition("*")
    shape = lt.shape if (star and shape_text == "") else _dims(shape_text)
    if shape is None:
        raise BatchError(f"--in-shapes: tensor {lt.id} has no shape to lay out as {stride_text!r}")
    strides = None
    if star:
        strides = (tag_strides(shape, stride_text) if stride_text.isalpha()
                   else _dims(stride_text))
        if len(strides) != len(shape):
            raise BatchError(f"--in-shapes: strides {stride_text} do not match shape {list(shape)}")
    return LogicalTensor(lt.id, lt.dtype, shape, strides, lt.layout, lt.property, lt.encoding)


def _attr_value(op, name: str, text: str, spec: str):
    attr = OP_SCHEMAS[op.kind].attr_by_name.get(name)
    if attr is None:
        raise BatchError(f"--op-attrs={spec}: op {op.id} ({op.kind.name}) has no attribute {name!r}")
    kind = attr.kind.split("|")[-1] if "x" in text else attr.kind.split("|")[0]
    try:
        if kind == "bool":
            return bool(int(text))
        if kind == "s64":
            return _leading_int(text)
        if kind == "f32":
            return float(text)
        if kind == "s64[]":
            # benchdnn's string_to_shape: atof of each dim, stored in an int64 (so
            # truncated): harness_*16_all give InterpolateBackward sizes:1.666667x1,
            # which benchdnn runs as [1, 1] (the op ignores sizes: diff_src = src)
            return [int(float(v)) for v in text.split("x")]
        if kind == "f32[]":
            return [float(v) for v in text.split("x")]
    except ValueError:
        raise BatchError(f"--op-attrs={spec}: {name}={text!r} is not a {kind}") from None
    return text


def _leading_int(text: str) -> int:
    """benchdnn's ``stoll``: the leading integer of ``text`` (``1.5`` -> 1)."""
    leading = re.match(r"\s*([-+]?\d+)", text)
    if leading is None:
        raise ValueError(text)
    return int(leading.group(1))


def _produced(graph) -> set[int]:
    return {lt.id for op in graph.ops.values() for lt in op.outputs}


def rewrite_shapes(graph, in_shapes: str | None, op_attrs: str | None):
    """``--in-shapes`` and ``--op-attrs``; every produced tensor's shape is then
    inferred again (benchdnn's ``infer_output_shape``)."""
    shapes, attrs = {}, {}
    consumed = {lt.id for op in graph.ops.values() for lt in op.inputs}
    for tid, spec in _ids(in_shapes, "in-shapes") if in_shapes else []:
        if tid in graph.input_ids:
            shapes[tid] = _new_input(graph.tensors[tid], spec)
        elif tid in consumed:
            raise BatchError(f"--in-shapes: tensor {tid} is not an input of the graph "
                             f"(inputs: {sorted(graph.input_ids)})")
        # else, as benchdnn (which checks only the tensors ops read): an id no op
        # reads is ignored; harness_*_all give GenIndex's output tensor 1 a shape,
        # which benchdnn infers again like every produced shape
    for oid, spec in _ids(op_attrs, "op-attrs") if op_attrs else []:
        if oid not in graph.ops:
            raise BatchError(f"--op-attrs: op {oid} is not in the graph")
        for item in spec.split("*"):
            name, sep, text = item.partition(":")
            if not sep:
                raise BatchError(f"--op-attrs={op_attrs}: expected NAME:VALUE, got {item!r}")
            attrs.setdefault(oid, {})[name] = _attr_value(graph.ops[oid], name, text, op_attrs)
    produced = _produced(graph)

    def lt_fn(lt):
        if lt.id in shapes:
            return shapes[lt.id]
        if lt.id in produced:
            return LogicalTensor(lt.id, lt.dtype, None, None, lt.layout, lt.property, lt.encoding)
        return lt

    def op_fn(op):
        op.attrs.update(attrs.get(op.id, {}))

    return rewrite.rebuild(graph, op_fn=op_fn, lt_fn=lt_fn)


#: benchdnn's ``opkind2driver`` for the two drivers whose ops ``--op-kind`` may swap
DRIVERS = {
    "eltwise": frozenset(OpKind[k] for k in (
        "Abs AbsBackward Clamp ClampBackward Dropout Elu EluBackward Exp GELU GELUBackward "
        "HardSigmoid HardSigmoidBackward HardSwish HardSwishBackward LeakyReLU Log Mish "
        "MishBackward Pow ReLU ReLUBackward Reciprocal Round Sigmoid SigmoidBackward SoftPlus "
        "SoftPlusBackward Sqrt SqrtBackward Square SquaredDifference Tanh TanhBackward").split()),
    "binary": frozenset(OpKind[k] for k in (
        "Add BiasAdd BiasAddBackward Divide GreaterEqual Maximum Minimum Multiply Select "
        "Subtract").split()),
}


def _driver(kind) -> str | None:
    return next((name for name, kinds in DRIVERS.items() if kind in kinds), None)


def rewrite_op_kinds(graph, spec: str):
    """``--op-kind``: a new kind of the same benchdnn driver (eltwise or binary);
    ``undef`` removes the op (its output is replaced by its input, for a binary
    op the one another op produces).  Attributes stay: one the new kind does
    not take fails at add_op, as in oneDNN."""
    kinds, removed = {}, {}
    produced = _produced(graph)
    for oid, name in _ids(spec, "op-kind"):
        op = graph.ops.get(oid)
        if op is None:
            raise BatchError(f"--op-kind: op {oid} is not in the graph")
        driver = _driver(op.kind)
        if driver is None:
            raise BatchError(f"--op-kind: op {oid} is {op.kind.name}; only element-wise and "
                             f"binary ops can change kind")
        if name == "undef":
            fed = [lt for lt in op.inputs if lt.id in produced] or op.inputs[:1]
            removed[oid] = (op.outputs[0].id, fed[0])
        elif name not in OpKind.__members__:
            raise BatchError(f"--op-kind: unknown op kind {name!r}")
        elif _driver(OpKind[name]) != driver:
            raise BatchError(f"--op-kind: {name} is not a {driver} op like op {oid} "
                             f"({op.kind.name})")
        else:
            kinds[oid] = OpKind[name]
    passthrough = {out: lt for out, lt in removed.values()}

    def lt_fn(lt):
        return passthrough.get(lt.id, lt)

    def op_fn(op):
        if op.id in kinds:
            op.kind = kinds[op.id]

    new = Graph(graph.engine_kind, graph.fpmath.mode, graph.fpmath.apply_to_int)
    for op in graph.ops.values():
        if op.id in removed:
            continue
        copy = op.copy()
        copy.inputs = [lt_fn(lt) for lt in copy.inputs]
        op_fn(copy)
        new.add_op(copy)
    new.finalize()
    return new


_NORMS = {OpKind.BatchNormForwardTraining, OpKind.BatchNormInference, OpKind.GroupNorm,
          OpKind.LayerNorm}
_NORM_BWD = {OpKind.BatchNormTrainingBackward, OpKind.LayerNormBackward}
_LOW_PRECISION = {OpKind.TypeCast, OpKind.Quantize, OpKind.Dequantize, OpKind.DynamicQuantize,
                  OpKind.DynamicDequantize}
_FLOATS = {DataType.f32, DataType.bf16, DataType.f16}


def _whole_graph_dt(graph, dt: DataType) -> dict[int, DataType]:
    """benchdnn's ``dt_rewrite``: which tensors a plain ``--dt=DT`` changes."""
    if dt not in _FLOATS:
        raise BatchError(f"--dt={dt.name}: only f32, bf16 and f16 rewrite a whole graph")
    changes = {}
    for op in graph.ops.values():
        if op.kind in _LOW_PRECISION:
            raise BatchError(f"--dt={dt.name}: the graph has {op.kind.name} (op {op.id}); "
                             f"a mixed-precision graph cannot change type as a whole")
        ins, outs = op.inputs, op.outputs
        if op.kind == OpKind.Select:
            lts = ins[1:3] + outs[:1]
        elif op.kind in _NORM_BWD:
            lts = ins[:2] + outs[:1]
        elif op.kind in _NORMS:
            lts = ins[:1] + outs[:1]
        elif op.kind == OpKind.GenIndex:
            lts = ins[:1]
        elif op.kind == OpKind.GreaterEqual:
            lts = ins[:2] if ins[0].dtype in _FLOATS else []
        elif op.kind in (OpKind.Add, OpKind.Subtract):
            lts = ins[:2] + outs[:1] if ins[0].dtype in _FLOATS else []
        else:
            lts = ins + outs
        changes.update({lt.id: dt for lt in lts})
    return changes


def rewrite_types(graph, dt: str | None, prop: str | None):
    """``--dt`` and ``--tensor-property``."""
    types, props = {}, {}
    if dt and ":" not in dt:
        types = _whole_graph_dt(graph, _parse(DataType, dt, "dt"))
    elif dt:
        types = {tid: _parse(DataType, name, "dt") for tid, name in _ids(dt, "dt")}
    for tid, name in _ids(prop, "tensor-property") if prop else []:
        props[tid] = _parse(PropertyType, name, "tensor-property")
    unknown = sorted((set(types) | set(props)) - set(graph.tensors))
    if unknown:
        raise BatchError(f"tensor(s) {unknown} are not in the graph")

    def lt_fn(lt):
        if lt.id not in types and lt.id not in props:
            return lt
        return LogicalTensor(lt.id, types.get(lt.id, lt.dtype), lt.shape, lt.strides, lt.layout,
                             props.get(lt.id, lt.property), lt.encoding)

    return rewrite.rebuild(graph, lt_fn=lt_fn)


def _parse(enum_cls, name: str, knob: str):
    if name not in enum_cls.__members__:
        raise BatchError(f"--{knob}: unknown value {name!r}; expected one of "
                         f"{', '.join(enum_cls.__members__)}")
    return enum_cls[name]


def apply_knobs(graph, knobs: dict):
    """The graph a case runs: knobs applied in benchdnn's order."""
    if "in-shapes" in knobs or "op-attrs" in knobs:
        graph = rewrite_shapes(graph, knobs.get("in-shapes"), knobs.get("op-attrs"))
    if "op-kind" in knobs:
        graph = rewrite_op_kinds(graph, knobs["op-kind"])
    if "attr-fpmath" in knobs:
        mode, _, apply = knobs["attr-fpmath"].partition(":")
        if apply not in ("", "true", "false"):
            raise BatchError(f"--attr-fpmath={knobs['attr-fpmath']}: expected MODE[:true|false]")
        fp = FPMath.make(_parse(FPMathMode, mode, "attr-fpmath"), apply == "true")
        graph = rewrite.rebuild(graph, fpmath=fp)
    if "dt" in knobs or "tensor-property" in knobs:
        graph = rewrite_types(graph, knobs.get("dt"), knobs.get("tensor-property"))
    if "mb" in knobs:
        graph, _ = rewrite.set_batch(graph, _count(knobs["mb"], "mb", 1))
    return graph


def _count(text: str, knob: str, least: int) -> int:
    if not re.fullmatch(r"\d+", text) or int(text) < least:
        raise BatchError(f"--{knob}={text}: expected an integer >= {least}")
    return int(text)


# ====================================================================== running
def run_case(case: Case, root: Path, max_elements: int = MAX_ELEMENTS) -> Outcome:
    """Load, rewrite, partition, execute and check one case."""
    from .cli import Prepared, execute, runnable

    path = Path(root) / case.path
    if not path.is_file():
        return missing(case, root)
    knobs = dict(case.knobs)
    try:
        expected = _count(knobs.get("expected-n-partitions", "1"), "expected-n-partitions", 0)
        loaded = load(path)
        graph = rewrite.power_of_two_scales(apply_knobs(loaded, knobs))
        graph, _ = rewrite.reduce_batch(graph, max_elements)
        if rewrite.total_elements(graph) > SKIP_ELEMENTS:
            return Outcome(case, "skipped", f"{rewrite.total_elements(graph):,} elements exceed "
                                            f"the budget of {SKIP_ELEMENTS:,}")
        partitions = graph.get_partitions()
        unsupported = [p for p in runnable(partitions) if not p.is_supported()]
        if unsupported:
            return Outcome(case, "unimplemented", unsupported[0].unsupported_reason())
        if expected and len(partitions) != expected:
            return Outcome(case, "failed", f"expected {expected} partition(s), got "
                                           f"{len(partitions)}: {[p.get_kind() for p in partitions]}")
        report = execute(Prepared(str(path), loaded, graph), check=True)
    except Unimplemented as err:
        return Outcome(case, "unimplemented", str(err))
    except (GraphError, OSError) as err:
        return Outcome(case, "failed", f"{type(err).__name__}: {err}")
    except Exception as err:  # noqa: BLE001 - a crash fails this case, not the batch
        return Outcome(case, "failed", f"internal error {type(err).__name__}: {err}")
    bad = [f"output {c.tid}: {c.verdict.message}" for c in report.checks if not c.verdict.ok]
    return Outcome(case, "failed", "; ".join(bad)) if bad else Outcome(case, "passed")


def missing(case: Case, root) -> Outcome | None:
    """The outcome of a case whose JSON file is not under ``root``; None when it is there."""
    if (Path(root) / case.path).is_file():
        return None
    return Outcome(case, "missing", f"{case.path} is not in {root}")


def outcome_line(index: int, outcome: Outcome) -> str:
    """benchdnn's ``N:STATE __REPRO: command`` line, with where the case came
    from and, for a case not passed, why."""
    case = outcome.case
    why = f": {outcome.message}" if outcome.state != "passed" else ""
    return f"{index}:{outcome.state.upper()} ({case.origin}) __REPRO: {case.command()}{why}"


def run_batch(batch_file, root=None, max_elements: int = MAX_ELEMENTS, echo=print) -> Summary:
    """Every case of ``batch_file``; ``echo`` gets one line per case as it
    finishes (benchdnn prints passed cases too) and the summary.  Raises
    :class:`BatchError` before running anything when the file (or a nested
    one) cannot be read."""
    root = Path(root) if root is not None else find_root(batch_file)
    cases = list(expand(batch_file, root))
    # every case builds new partitions, and a compiled partition's cache key
    # holds its partition's serial, so no later case can hit an entry; kept
    # entries only hold memory (plans, store offsets, scratch: ~60 MB for a
    # 16M-element case; op/harness_f32_all grew to 9.8 GB and was OOM-killed):
    # the process-wide cache is off while the batch runs
    capacity = get_compiled_partition_cache_capacity()
    set_compiled_partition_cache_capacity(0)
    try:
        return collect((run_case(case, root, max_elements) for case in cases), echo)
    finally:
        set_compiled_partition_cache_capacity(capacity)


def collect(outcomes, echo=print) -> Summary:
    """The :class:`Summary` of ``outcomes`` (one per case, in the batch's order,
    as they come), echoing each case's line and then the summary line: the one
    reporting of the serial run and of :mod:`graph_api.batch_pool`."""
    summary = Summary()
    for index, outcome in enumerate(outcomes):
        summary.outcomes.append(outcome)
        echo(outcome_line(index, outcome))
    echo(summary.line())
    return summary

"""JSON fuzzing of every conformance file (issue 8, standing test).

Each mutant is a conformance file with one to three deterministic mutations
(seeded by file name and mutant index): structural (keys, ops and tensors
dropped, duplicated, swapped, made cyclic), type (a value replaced by another
JSON type, a 400-digit integer, NaN, infinity), size (dims of 0, 2^40, -5,
INT64_MIN, too many dims, megabyte strings), nesting (thousands of levels) and
strides (reversed, zero, negative, 2^60, wrong length, permuted), attribute
values off by one, negated, far out of range or of the wrong type, plus benign
changes that keep the graph valid (a permuted input layout, another fpmath
mode, another property) so that more mutants run and are checked.

The contract: ``load`` / partition / compile / execute raise only typed errors
(``GraphError`` subclasses).  A mutant that loads and is small enough
(``ELEMENT_BUDGET``) runs as ``graph-api run --check`` does and every output
must match the unfused reference.  The short version (``MUTANTS_SHORT`` per
file) runs in the default suite; ``pytest -m long`` runs ``MUTANTS_LONG`` per
file (``GRAPH_API_FUZZ_MUTANTS`` overrides).
"""
from __future__ import annotations

import copy
import json
import math
import os
import random
import traceback
from collections import Counter

import pytest

import graph_api as ga
from graph_api.cli import execute, prepare, runnable
from graph_api.errors import GraphError
from graph_api.json_io import INT64_MIN

from ..conformance_files import FILES, rel

MUTANTS_SHORT = 2
MUTANTS_LONG = int(os.environ.get("GRAPH_API_FUZZ_MUTANTS", "40"))
#: mutants whose tensors hold more elements than this are loaded and
#: partitioned but not run: the reference run stays in milliseconds
ELEMENT_BUDGET = 60_000
#: stands for a value nested 3,000 deep; replaced in the JSON text (json.dumps
#: itself cannot write that many levels)
DEEP = "\x00deep\x00"

ODD_VALUES = [None, True, False, 0, 1, -1, 2, 1.5, -0.0, "", "x", "f32", [], {}, [1, 2], {"a": 1},
              2**63, -2**63 - 1, 10**400, math.nan, math.inf, -math.inf, f"{DEEP}3000", "\ud800"]
ODD_DIMS = [0, 1, 2, 3, 7, 2**31, 2**40, 2**62, -1, -5, INT64_MIN]


# ====================================================================== mutations
def _slots(node, out):
    """Every (container, key) of the document, depth first."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        out.append((node, key))
        _slots(value, out)
    return out


def _ops(doc):
    graph = doc.get("graph") if isinstance(doc, dict) else None
    return [op for op in graph if isinstance(op, dict)] if isinstance(graph, list) else []


def _tensors(doc):
    return [t for op in _ops(doc) for side in ("inputs", "outputs")
            if isinstance(op.get(side), list) for t in op[side] if isinstance(t, dict)]


def structural(rng, doc):
    ops = _ops(doc)
    choice = rng.randrange(7)
    if choice == 0 or not ops:  # drop a key or list element anywhere
        slots = _slots(doc, [])
        parent, key = rng.choice(slots)
        del parent[key]
        return f"drop {key!r}"
    if choice == 1:
        ops.append(copy.deepcopy(rng.choice(ops)))
        return "duplicate an op"
    if choice == 2:
        doc["graph"].remove(rng.choice(ops))
        return "drop an op"
    if choice == 3:  # feed an op its own (or a later op's) output: a cycle or a self-loop
        op = rng.choice(ops)
        if op.get("inputs") and isinstance(op["inputs"], list):
            later = rng.choice(ops[ops.index(op):])
            if later.get("outputs"):
                op["inputs"][0] = copy.deepcopy(later["outputs"][0])
        return "cycle"
    if choice == 4:  # two ops write one tensor, or ids collide
        a, b = rng.choice(ops), rng.choice(ops)
        if rng.random() < 0.5:
            a["id"] = b.get("id")
            return "op id collision"
        if a.get("outputs") and b.get("outputs"):
            a["outputs"][0]["id"] = b["outputs"][0].get("id")
        return "two producers"
    if choice == 5:  # swap inputs and outputs
        op = rng.choice(ops)
        op["inputs"], op["outputs"] = op.get("outputs"), op.get("inputs")
        return "swap inputs/outputs"
    op = rng.choice(ops)
    op["kind"] = rng.choice(list(ga.OpKind.__members__) + ["NotAnOp", ""])
    return f"kind -> {op['kind']}"


def type_change(rng, doc):
    parent, key = rng.choice(_slots(doc, []))
    parent[key] = copy.deepcopy(rng.choice(ODD_VALUES))
    return f"{key!r} -> {parent[key]!r}"[:80]


def size_change(rng, doc):
    tensors = _tensors(doc)
    choice = rng.randrange(5)
    if choice == 4 or not tensors:
        ops = _ops(doc)
        if ops:
            rng.choice(ops)["name"] = "n" * 1_000_000
        return "megabyte name"
    t = rng.choice(tensors)
    shape = t.get("shape")
    if not isinstance(shape, list):
        return "no shape"
    if choice == 0 and shape:
        shape[rng.randrange(len(shape))] = rng.choice(ODD_DIMS)
    elif choice == 1:
        shape.append(rng.choice(ODD_DIMS))
    elif choice == 2 and shape:
        shape.pop()
    else:
        t["shape"] = [2] * rng.choice([13, 64, 100_000])
    return f"shape -> {str(t['shape'])[:60]}"


def nesting(rng, doc):
    parent, key = rng.choice(_slots(doc, []))
    depth = rng.choice([40, 900, 3000])
    parent[key] = f"{DEEP}{depth}"
    return f"nest {depth} at {key!r}"


def stride_change(rng, doc):
    tensors = [t for t in _tensors(doc) if isinstance(t.get("stride"), list)]
    if not tensors:
        return "no strides"
    t = rng.choice(tensors)
    stride = t["stride"]
    choice = rng.randrange(6)
    if choice == 0:
        stride.reverse()
    elif choice == 1:
        t["stride"] = [0] * len(stride)
    elif choice == 2 and stride:
        stride[rng.randrange(len(stride))] = rng.choice([-1, -7, 2**60, 2**62, INT64_MIN, 0])
    elif choice == 3:
        stride.append(1)
    elif choice == 4:
        rng.shuffle(stride)
    else:
        t["layout_type"] = rng.choice(["any", "opaque", "undef", "strided", "blocked", 3])
    return f"stride -> {str(t['stride'])[:60]} {t.get('layout_type')}"


def attr_change(rng, doc):
    entries = [e for op in _ops(doc) if isinstance(op.get("attrs"), dict)
               for e in op["attrs"].values() if isinstance(e, dict) and "value" in e]
    if not entries:
        return "no attrs"
    entry = rng.choice(entries)
    value = entry["value"]
    if isinstance(value, list) and value and rng.random() < 0.6:
        i = rng.randrange(len(value))
        value[i] = rng.choice([0, -1, -value[i] if isinstance(value[i], (int, float)) else 0, 99, 2**40])
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and rng.random() < 0.7:
        entry["value"] = rng.choice([value + 1, value - 1, -value, 99, -99, 2**40, 0, math.nan, math.inf])
    elif rng.random() < 0.5:
        entry["value"] = copy.deepcopy(rng.choice(ODD_VALUES))
    else:
        entry["type"] = rng.choice(["bool", "s64", "f32", "s64[]", "f32[]", "string", "int", 1])
    return f"attr -> {str(entry)[:60]}"


def benign(rng, doc):
    """Changes that keep the graph valid, so the mutant runs and is checked: a
    permuted (non-overlapping) input layout, another fpmath mode, a property."""
    choice = rng.randrange(3)
    tensors = [t for t in _tensors(doc) if isinstance(t.get("shape"), list) and t["shape"]
               and all(isinstance(d, int) and d > 0 for d in t["shape"])]
    if choice == 0 and tensors:
        t = rng.choice(tensors)
        order = list(range(len(t["shape"])))
        rng.shuffle(order)  # order[0] is the outermost dim
        stride, acc = [0] * len(order), 1
        for axis in reversed(order):
            stride[axis], acc = acc, acc * t["shape"][axis]
        for other in _tensors(doc):  # every use of the id agrees
            if other.get("id") == t.get("id"):
                other["stride"] = list(stride)
        return f"layout {t.get('id')} -> {stride}"
    if choice == 1:
        doc["fpmath_mode"] = rng.choice(["strict", "bf16", "f16", "tf32", "any"])
        return f"fpmath -> {doc['fpmath_mode']}"
    if tensors:
        t = rng.choice(tensors)
        t["property_type"] = rng.choice(["constant", "variable", "undef"])
        return f"property {t.get('id')} -> {t['property_type']}"
    return "nothing"


MUTATIONS = [structural, type_change, size_change, nesting, stride_change, attr_change, benign, benign]


# ---- issue 33: non-finite float attributes and rank changes (kinds of their own)
#: values a float attribute takes in :func:`non_finite_attr`
NON_FINITE = [math.nan, math.inf, -math.inf]


def non_finite_attr(rng, doc):
    """A float attribute (an ``f32`` or ``f32[]`` entry: quantization scales,
    eltwise alpha/beta, clamp bounds, epsilon, interpolate scales) becomes NaN,
    +inf or -inf; in a list one element or all of them.  The op must be refused
    at load as ``invalid_graph_op`` or run and match the reference."""
    entries = [(op, name, entry) for op in _ops(doc) if isinstance(op.get("attrs"), dict)
               for name, entry in op["attrs"].items()
               if isinstance(entry, dict) and entry.get("type") in ("f32", "f32[]")]
    if not entries:
        return "no float attrs"
    op, name, entry = rng.choice(entries)
    value, bad = entry.get("value"), rng.choice(NON_FINITE)
    if isinstance(value, list) and value:
        if rng.random() < 0.5:
            value[rng.randrange(len(value))] = bad
        else:
            entry["value"] = [bad] * len(value)
    else:
        entry["value"] = bad
    return f"{op.get('kind')}.{name} -> {str(entry['value'])[:40]}"


def _dense_stride(shape):
    stride, acc = [], 1
    for d in reversed(shape):
        stride.append(acc)
        acc *= max(d, 1)
    return stride[::-1]


def rank_change(rng, doc):
    """One tensor's rank changes at every use of its id (a dim of 1 inserted, a
    dim dropped, two adjacent dims merged, a dim split in two), with dense
    strides: the ops reading it see an unexpected rank, the same data size when
    merged or split.  Shape inference must refuse it with a typed error."""
    tensors = [t for t in _tensors(doc) if isinstance(t.get("shape"), list) and len(t["shape"]) <= 12
               and all(isinstance(d, int) and not isinstance(d, bool) and 0 < d < 2**40 for d in t["shape"])]
    if not tensors:
        return "no known shapes"
    tid = rng.choice(tensors).get("id")
    shape = list(next(t["shape"] for t in tensors if t.get("id") == tid))
    choice, at = rng.randrange(4), rng.randrange(len(shape) + 1)
    if choice == 0 or not shape:
        shape.insert(at, 1)
    elif choice == 1:
        shape.pop(min(at, len(shape) - 1))
    elif choice == 2 and len(shape) > 1:
        at = min(at, len(shape) - 2)
        shape[at:at + 2] = [shape[at] * shape[at + 1]]
    else:
        at = min(at, len(shape) - 1)
        d = shape[at]
        shape[at:at + 1] = [d // 2, 2] if d % 2 == 0 else [1, d]
    produced = [t.get("id") for op in _ops(doc) if isinstance(op.get("outputs"), list)
                for t in op["outputs"] if isinstance(t, dict)]  # a list: ids may be any JSON value
    forget = rng.random() < 0.5  # op outputs unknown: inference carries the new rank on
    for t in _tensors(doc):
        if t.get("id") == tid:
            t["shape"] = list(shape)
            if isinstance(t.get("stride"), list) and t["stride"] != [INT64_MIN]:
                t["stride"] = _dense_stride(shape)
        elif forget and t.get("id") in produced:
            t["shape"], t["stride"] = [INT64_MIN], [INT64_MIN]
    return f"rank {tid} -> {shape}" + (", op outputs unknown" if forget else "")



#: the issue-33 kinds, also run on their own (test_fuzz_issue33_kinds)
ISSUE33_KINDS = [non_finite_attr, rank_change]
MUTATIONS += ISSUE33_KINDS


def mutant(doc, name: str, index: int, kinds=None) -> tuple[str, list[str]]:
    """The JSON text of mutant ``index`` of file ``name`` and what was done
    (mutations drawn from ``kinds``, by default all of ``MUTATIONS``)."""
    rng = random.Random(f"{name}:{index}" if kinds is None else f"{name}:{index}:{kinds[0].__name__}")
    doc = copy.deepcopy(doc)
    done = [rng.choice(kinds or MUTATIONS)(rng, doc) for _ in range(rng.choice([1, 1, 2, 3]))]
    text = json.dumps(doc)
    for depth in (40, 900, 3000):
        text = text.replace(json.dumps(f"{DEEP}{depth}"), "[" * depth + "]" * depth)
    return text, done


# ====================================================================== running
def total_elements(graph) -> int | None:
    """Elements of every tensor, or None when a shape is not known."""
    total = 0
    for lt in graph.tensors.values():
        if not lt.is_shape_known():
            return None
        total += math.prod(lt.shape)
    return total


def run_mutant(path) -> str:
    """Outcome: 'load error', 'run error', 'too big', 'checked'; raises on a broken contract."""
    try:
        prepared = prepare(path, max_elements=ELEMENT_BUDGET)
        for policy in (ga.PartitionPolicy.fusion, ga.PartitionPolicy.debug):
            prepared.graph.get_partitions(policy)
    except GraphError:
        return "load error"
    total = total_elements(prepared.graph)
    if total is None or total > ELEMENT_BUDGET:
        return "too big"
    if not all(p.is_supported() for p in runnable(prepared.graph.get_partitions())):
        return "unsupported"
    try:
        report = execute(prepared, check=True)
    except GraphError:
        return "run error"
    bad = [f"output {c.tid}: {c.verdict.message}" for c in report.checks if not c.verdict.ok]
    if bad:
        raise AssertionError("wrong --check: " + "; ".join(bad))
    return "checked"


def _failure(what: str, err: Exception) -> str:
    """One line of a fuzz report: the mutant, the error and the line that raised it."""
    where = traceback.extract_tb(err.__traceback__)[-1]
    return (f"{what}: {type(err).__name__}: {str(err)[:300]} "
            f"(at {where.filename.split('/')[-1]}:{where.lineno})")


def fuzz(tmp_path, mutants_per_file: int, kinds=None) -> Counter:
    outcomes, failures = Counter(), []
    for path in FILES:
        name = rel(path)
        doc = json.loads(path.read_text())
        for index in range(mutants_per_file):
            text, done = mutant(doc, name, index, kinds)
            target = tmp_path / f"mutant-{index}.json"
            target.write_text(text)
            try:
                outcomes[run_mutant(target)] += 1
            except Exception as err:  # noqa: BLE001 - the contract under test
                outcomes["FAILED"] += 1
                failures.append(_failure(f"{name} mutant {index} {done}", err))
    print(f"\nJSON fuzzing: {len(FILES)} files, {sum(outcomes.values())} mutants: {dict(outcomes)}")
    assert not failures, f"{len(failures)} mutants broke the contract:\n" + "\n".join(failures)
    return outcomes


# ====================================================================== tests
def test_mutants_are_deterministic():
    doc = json.loads(FILES[0].read_text())
    assert mutant(doc, "a", 3) == mutant(doc, "a", 3)
    assert mutant(doc, "a", 3) != mutant(doc, "a", 4)


@pytest.mark.parametrize("text", [
    '{"version": ' + "[" * 3000 + "]" * 3000 + "}",
    '{"a": ' * 3000 + "1" + "}" * 3000,
])
def test_json_nested_3000_deep_is_a_typed_error_naming_the_file(tmp_path, text):
    path = tmp_path / "deep.json"
    path.write_text(text)
    with pytest.raises(ga.InvalidGraph, match="deep.json: .*nested deeper"):
        ga.load(path)


def test_huge_integers_are_typed_errors(tmp_path):
    doc = json.loads(FILES[0].read_text())
    doc["graph"][0]["inputs"][0]["shape"][0] = 10**400
    with pytest.raises(ga.InvalidGraphOp, match="64-bit"):
        ga.Graph.from_json(json.dumps(doc))


def test_fuzz_every_conformance_file_short(tmp_path):
    outcomes = fuzz(tmp_path, MUTANTS_SHORT)
    assert sum(outcomes.values()) == MUTANTS_SHORT * len(FILES)
    assert outcomes["checked"] > 0 and outcomes["load error"] > 0  # both sides of the contract exercised


@pytest.mark.long
def test_fuzz_every_conformance_file_long(tmp_path):
    fuzz(tmp_path, MUTANTS_LONG)


@pytest.mark.parametrize("kind", ISSUE33_KINDS, ids=lambda k: k.__name__)
def test_fuzz_issue33_kind_short(tmp_path, kind):
    """Non-finite float attributes and rank changes alone (issue 33): one mutant
    per file; each is refused with a typed error or runs and matches the reference."""
    outcomes = fuzz(tmp_path, 1, [kind])
    assert outcomes["load error"] > 0


@pytest.mark.long
@pytest.mark.parametrize("kind", ISSUE33_KINDS, ids=lambda k: k.__name__)
def test_fuzz_issue33_kind_long(tmp_path, kind):
    fuzz(tmp_path, MUTANTS_LONG, [kind])


# ====================================================================== regressions found here
def _relu_graph(in_strides, out_strides, shape=(4, 3)):
    g = ga.Graph()
    g.add_op(ga.Op(0, ga.OpKind.ReLU, [ga.LogicalTensor(0, ga.DataType.f32, shape, in_strides)],
                   [ga.LogicalTensor(1, ga.DataType.f32, shape, out_strides)]))
    g.add_op(ga.Op(1, ga.OpKind.Exp, [ga.LogicalTensor(1, ga.DataType.f32, shape, out_strides)],
                   [ga.LogicalTensor(2, ga.DataType.f32, shape)]))
    g.finalize()
    return g


@pytest.mark.parametrize("strides", [(0, 1), (1, 1), (1, 2), (0, 0)])
def test_a_self_overlapping_output_layout_is_refused_at_compile(strides):
    """Strides whose elements share memory lost results silently (issue 8.3;
    found as wrong --check by the fuzzer): outputs must have one element per address."""
    g = _relu_graph(None, strides)
    part = g.get_partitions(ga.PartitionPolicy.debug)[0]
    with pytest.raises(ga.InvalidArguments, match="output tensor 1 has strides .* elements overlap in memory"):
        part.compile(part.get_input_ports(), part.get_output_ports(), ga.Engine())


def test_a_self_overlapping_input_is_a_broadcast_view():
    """An input layout with stride 0 holds one row: run_graph takes values that
    agree where elements share memory and refuses values it would lose."""
    import numpy as np

    g = _relu_graph((0, 1), None)
    row = np.array([-1.0, 0.5, 2.0], np.float32)
    out = ga.run_graph(g, {0: np.broadcast_to(row, (4, 3))}).outputs[2]
    want = np.broadcast_to(np.exp(np.maximum(row.astype(np.float64), 0)), (4, 3))
    np.testing.assert_allclose(out, want, rtol=2**-22)  # exp in f32: within 2 ulps
    with pytest.raises(ga.InvalidArguments, match="differ where its elements share memory"):
        ga.run_graph(g, {0: np.arange(12, dtype=np.float32).reshape(4, 3)})


def test_is_self_overlapping():
    from graph_api.tensor import self_overlapping as is_self_overlapping

    assert not is_self_overlapping((4, 3), (3, 1)) and not is_self_overlapping((4, 3), (1, 4))
    assert not is_self_overlapping((1, 3), (0, 1)) and not is_self_overlapping((2, 3), (-3, 1))
    assert is_self_overlapping((4, 3), (0, 1)) and is_self_overlapping((16, 13), (1, 13))
    assert is_self_overlapping((32, 28), (28, 784)) and not is_self_overlapping((28, 28), (28, 784))


def test_the_filler_takes_a_zero_point_beyond_the_type():
    """A u8 Dequantize with a zero point beyond u8 (zps is s64[]; beyond s32 add_op
    refuses it) made the filler raise OverflowError; now its inputs sit at the
    nearest end of the type."""
    import numpy as np

    g = ga.Graph()
    g.add_op(ga.Op(0, ga.OpKind.Dequantize, [ga.LogicalTensor(0, ga.DataType.u8, [8])],
                   [ga.LogicalTensor(1, ga.DataType.f32, [8])],
                   attrs={"qtype": "per_tensor", "scales": [0.5], "zps": [1000]}))
    g.finalize()
    from graph_api import fill

    values = fill.fill_inputs(g)[0]
    assert values.dtype == np.uint8 and values.max() == 255


def test_a_huge_stride_on_a_size_one_dim_is_moot():
    """An output stride of 2^62 on a dim of size 1 overflowed numpy's view
    (OverflowError at execute); such a stride is never stepped along."""
    import numpy as np

    g = _relu_graph(None, (2**62, 1), shape=(1, 3))
    out = ga.run_graph(g, {0: np.array([[-1, 0, 1]], np.float32)}, ga.PartitionPolicy.debug).outputs
    np.testing.assert_array_equal(out[1], [[0, 0, 1]])


def test_a_huge_stride_on_a_real_dim_is_refused():
    """A span past 2^63 bytes is refused when the logical tensor is made; one
    that fits int64 but not memory is refused at compile by the budget."""
    with pytest.raises(ga.InvalidArguments, match="span more than"):
        _relu_graph(None, (2**60, 1))
    g = _relu_graph(None, (2**40, 1))
    part = g.get_partitions(ga.PartitionPolicy.debug)[0]
    with pytest.raises(ga.OutOfMemory, match="partition 0"):
        part.compile(part.get_input_ports(), part.get_output_ports(), ga.Engine())


@pytest.mark.parametrize("axis", [2, 5, -3, -99])
def test_a_per_channel_axis_outside_the_shape_is_refused_at_add_op(axis):
    """Found by the fuzzer as an IndexError in the CLI's scale rewrite and at
    execute; -3 on rank 2 used to wrap silently (issue 8.6)."""
    g = ga.Graph()
    op = ga.Op(0, ga.OpKind.Dequantize, [ga.LogicalTensor(0, ga.DataType.u8, [2, 3])],
               [ga.LogicalTensor(1, ga.DataType.f32, [2, 3])],
               attrs={"qtype": "per_channel", "scales": [0.5] * 3, "zps": [0] * 3, "axis": axis})
    with pytest.raises(ga.InvalidGraphOp, match=f"axis={axis} is out of range for rank-2"):
        g.add_op(op)


# ====================================================================== huge batch under a small budget (issue 33)
#: the batch dim of the mutants; tensors of 2^20 rows passed the budget's
#: tensor count and then failed as bare MemoryErrors in offset tables, the
#: filler and the SDPA's buffers
HUGE_BATCH = 1 << 20
SMALL_BUDGET = 64 << 20
#: the short version's share of the files (every n-th)
HUGE_BATCH_EVERY_SHORT = 32


def with_batch(doc, batch: int):
    """``doc`` with every dim equal to its first tensor's leading dim set to ``batch``
    (the batch, where the file has one), dense strides kept in their order; None
    when no tensor has a positive leading dim."""
    doc = copy.deepcopy(doc)
    tensors = [t for t in _tensors(doc) if isinstance(t.get("shape"), list) and t["shape"]
               and all(isinstance(d, int) for d in t["shape"])]
    leading = [t["shape"][0] for t in tensors if t["shape"][0] > 0]
    if not leading:
        return None
    for t in tensors:
        if t["shape"][0] == leading[0]:
            t["shape"][0] = batch
        stride = t.get("stride")
        if isinstance(stride, list) and len(stride) == len(t["shape"]) and all(d > 0 for d in t["shape"]):
            order = sorted(range(len(stride)), key=lambda i: -stride[i] if isinstance(stride[i], int) else 0)
            acc = 1
            for axis in reversed(order):
                stride[axis], acc = acc, acc * t["shape"][axis]
    return doc


def run_under_budget(path, budget: int | None) -> str:
    """Load, fill, compile and run ``path`` under ``budget`` (None: the graph's own
    counted need, so only what plans and the filler allocate can pass it)."""
    from graph_api import memory

    try:
        prepared = prepare(path)
        if budget is None:
            need = memory.check_graph(prepared.graph, runnable(prepared.graph.get_partitions()))
            budget = max(need.total, 1)
        ga.set_memory_budget(budget)
        execute(prepared)
    except ga.OutOfMemory:
        return "out of memory"
    except GraphError:
        return "other typed error"
    finally:
        ga.set_memory_budget(None)
    return "ran"


def fuzz_huge_batch(tmp_path, files) -> Counter:
    outcomes, failures = Counter(), []
    for path in files:
        name = rel(path)
        doc = json.loads(path.read_text())
        for batch, budget, kind in ((HUGE_BATCH, SMALL_BUDGET, "2^20 batch, 64 MiB budget"),
                                    (64, None, "batch 64, budget = the graph's counted tensors")):
            mutated = with_batch(doc, batch)
            if mutated is None:
                outcomes["no batch dim"] += 1
                continue
            target = tmp_path / "huge-batch.json"
            target.write_text(json.dumps(mutated))
            try:
                outcomes[run_under_budget(target, budget)] += 1
            except Exception as err:  # noqa: BLE001 - the contract under test
                outcomes["FAILED"] += 1
                failures.append(_failure(f"{name} ({kind})", err))
    print(f"\nhuge batch under a small budget: {len(files)} files: {dict(outcomes)}")
    assert not failures, f"{len(failures)} mutants escaped the error hierarchy:\n" + "\n".join(failures)
    return outcomes


def test_huge_batch_under_a_small_budget_short(tmp_path):
    outcomes = fuzz_huge_batch(tmp_path, FILES[::HUGE_BATCH_EVERY_SHORT])
    assert outcomes["out of memory"] > 0


@pytest.mark.long
def test_huge_batch_under_a_small_budget_long(tmp_path):
    fuzz_huge_batch(tmp_path, FILES)


# ---- issue 33 regressions (found by the probes the non_finite_attr / rank_change kinds now run)
def _set_float_attr(doc, kind: str, name: str, value):
    """Every ``kind`` op's float attribute ``name`` (a list: its every entry) set to ``value``."""
    for op in _ops(doc):
        entry = op.get("attrs", {}).get(name) if op.get("kind") == kind else None
        if entry is not None:
            entry["value"] = [value] * len(entry["value"]) if isinstance(entry["value"], list) else value
    return json.dumps(doc)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name, kind, attr", [
    ("pattern/int8/int8_matmul_mul_add_mul_fusion.json", "Dequantize", "scales"),
    ("pattern/int8/int8_matmul_bias_sum_fusion.json", "Quantize", "scales"),
    ("pattern/int8/int8_convtranspose_post_ops_sum_fusion.json", "Dequantize", "scales"),
    ("pattern/f32/interpolate_post_ops_chain_fusion.json", "Interpolate", "scales"),
    ("op/f32/interpolate_3d.json", "Interpolate", "scales"),
])
def test_non_finite_float_attributes_in_json_are_refused_at_load(name, kind, attr, value):
    """Such graphs ran and the fused int8 kernels gave 127/-128 where the
    reference gave 0 (inf scales), or shape inference raised ValueError /
    OverflowError (Interpolate); now the load names the op and attribute."""
    doc = json.loads(next(p for p in FILES if rel(p) == name).read_text())
    with pytest.raises(ga.InvalidGraphOp, match=f"\\({kind}.*attribute {attr}=.*must be finite") as err:
        ga.Graph.from_json(_set_float_attr(doc, kind, attr, value))
    assert err.value.status.name == "invalid_graph_op"


def test_deconv_backward_data_with_a_rank_change_is_invalid_shape():
    """A rank change of ConvTransposeBackwardData's weights raised IndexError in
    shapes.split_weights, or (rank 3 under a rank-4 diff_dst) ran into a numpy
    broadcast error at execute."""
    doc = json.loads(next(p for p in FILES if rel(p) == "op/f32/deconv_bwd_d.json").read_text())
    wei = doc["graph"][0]["inputs"][1]
    for shape in ([wei["shape"][0]], wei["shape"][:3]):
        wei["shape"], wei["stride"] = shape, _dense_stride(shape)
        with pytest.raises(ga.InvalidShape, match="ConvTransposeBackwardData.*must have the same rank >= 3"):
            ga.Graph.from_json(json.dumps(doc))


def test_a_self_overlapping_intermediate_layout_loses_no_results():
    """An intermediate declared with overlapping strides ([1, 2, 4, 4] on
    [1, 1, 2, 2]: found by the long fuzz, a stride mutant of
    int8_avgpool_reshape_fusion.json) was allocated in that layout by the
    per-op plan, so the AvgPool results sharing memory were lost (-3 for -6).
    Inside a partition the layout is the partition's own: it is made dense."""
    import numpy as np

    f32, s8 = ga.DataType.f32, ga.DataType.s8
    q = {"qtype": "per_tensor", "scales": [0.5], "zps": [0]}
    g = ga.Graph()
    g.add_op(ga.Op(0, ga.OpKind.Dequantize, [ga.LogicalTensor(0, s8, [1, 1, 3, 3])],
                   [ga.LogicalTensor(1, f32, [1, 1, 3, 3])], attrs=q))
    g.add_op(ga.Op(1, ga.OpKind.AvgPool, [ga.LogicalTensor(1, f32, [1, 1, 3, 3])],
                   [ga.LogicalTensor(2, f32, [1, 1, 2, 2], [1, 2, 4, 4])],
                   attrs=dict(kernel=[2, 2], strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0],
                              exclude_pad=False, data_format="NCX")))
    g.add_op(ga.Op(2, ga.OpKind.StaticReshape, [ga.LogicalTensor(2, f32, [1, 1, 2, 2])],
                   [ga.LogicalTensor(3, f32, [4])], attrs={"shape": [-1], "special_zero": False}))
    g.add_op(ga.Op(3, ga.OpKind.Quantize, [ga.LogicalTensor(3, f32, [4])], [ga.LogicalTensor(4, s8, [4])], attrs=q))
    g.finalize()
    assert len(g.get_partitions()) == 1
    values = (np.arange(9) * 2).astype(np.int8).reshape(1, 1, 3, 3)
    out = ga.run_graph(g, {0: values}).outputs[4]
    np.testing.assert_array_equal(out, [4, 6, 10, 12])  # the means of the four 2x2 windows

"""Input data for running a graph file, chosen the way benchdnn's graph driver does.

benchdnn fills every graph input with the filler of the op that consumes it
and then overrides inputs with a known meaning in attention graphs (facts
sheet §6).  This module does the same with fixed seeds, so a run is
reproducible and its result can be compared with the unfused reference.

Each graph input gets one *role*, the first of this list that one of its uses
has (a use looks through StaticReshape/StaticTranspose/Reorder/TypeCast, so a
mask reshaped before its Add is still a mask).  "Scores" are tensors computed
from a MatMul::

    role           use                                         values
    -------------  ------------------------------------------  -----------------------------------
    dropout_*      Dropout seed / offset / probability         123456 / 1 / 0.5
    causal_skv/sq  s32 into Add/Subtract after a GenIndex      the real S_kv / S_q of the scores
    select_cond    Select condition beside scores              causal keep-pattern (see below),
                                                               inverted when scores sit at port 2
    select_fill    Select value beside scores                  -inf
    stats          Subtract(scores, x) -> Exp  (SDPA bwd)      logsumexp of the scores over the last
                                                               axis, computed from the other inputs
    scale_div      Divide(scores, x)                           one of {2, 4, 8}
    scale_mul      Multiply(scores, x), x a single value       one of {0.25, 0.5, 1}
    mask           Add(scores, x) leading to SoftMax or Exp    0 where kept, -inf elsewhere
    dq_src         Dequantize src                              zero point + integers in [-16, 16]
                                                               (f8: integers in [-4, 4])
    ddq_src        DynamicDequantize src                       small integers (table INT_RANGES)
    ddq_zps        DynamicDequantize zero points               the middle of the src range +- 1
    ddq_scales     DynamicDequantize scales                    2^-(e+1) or 2^-(e+2), e as for weights
    dq_scales      DynamicQuantize scales                      one of {0.25, 0.5, 1}
    weights        MatMul input 1                              integers in [-2, 2] * 2^-e,
                                                               e = floor(log2(K) / 2)
    src            MatMul input 0                              integers in [-4, 4]
    bias           MatMul input 2                              integers in [-2, 2]
    divisor        Divide input 1                              one of {1, 2, 4}
    positive       Log / Sqrt / Pow / Reciprocal input,        uniform in [0.25, 4]
                   variances, SqrtBackward input 0
    generic        anything else                               floats uniform in [-2, 2]; integers
                                                               in INT_RANGES; booleans coin flips

Why these values: MatMul operands are small integers, and weights are scaled
by a power of two so that a K-long sum stays O(1): a MatMul of filled inputs is
then exact in f32 whatever the summation order (fused and unfused kernels
agree), the values are exact in bf16/f16/f8 too, and chains such as gated MLP
(K = 14336) never overflow f16.
Quantization scales are powers of two (Quantize divides exactly).  The causal
keep-pattern of a mask whose last two dims are (A, B) keeps column j of row i
when ``j <= i + max(0, B - A)`` (bottom-right aligned; a [.., 1, B] padding
mask keeps everything), so no softmax row is ever fully masked.

The graph rewrites benchdnn makes before filling (power-of-two quantization
scales, ``--mb``) are in :mod:`graph_api.rewrite`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx
import numpy as np

from . import backend, dtypes, memory
from .dtypes import DataType
from .enums import LayoutType, OpKind
from .errors import InvalidArguments
from .logical_tensor import LogicalTensor, dense_strides
from .sparse_storage import prune

SEED = 0
DROPOUT_SEED, DROPOUT_OFFSET, DROPOUT_PROBABILITY = 123456, 1, 0.5

#: ops a use is followed through: they only move or re-type data
LOOK_THROUGH = {OpKind.StaticReshape, OpKind.StaticTranspose, OpKind.Reorder, OpKind.TypeCast}

#: role priority: when an input has several uses, the earliest role here wins
ROLE_ORDER = ("dropout_seed", "dropout_offset", "dropout_prob", "causal_skv", "causal_sq",
              "select_cond", "select_fill", "stats", "scale_div", "scale_mul", "mask",
              "dq_src", "ddq_src", "ddq_scales", "ddq_zps", "dq_scales", "weights", "src",
              "bias", "divisor", "positive", "generic")

#: inclusive integer ranges: (data dequantized by DynamicDequantize, anything else)
INT_RANGES = {
    DataType.s8: ((-4, 4), (-8, 8)),
    DataType.u8: ((0, 8), (0, 16)),
    DataType.s4: ((-2, 2), (-4, 4)),
    DataType.u4: ((0, 4), (0, 8)),
    DataType.s32: ((-4, 4), (-8, 8)),
    DataType.s64: ((0, 8), (0, 8)),
}


@dataclass(frozen=True)
class Role:
    """Why an input gets its values: the role name and the use that decided it."""

    name: str
    op: object = None
    port: int = -1
    k: int = 0  # the K of the MatMul a weight feeds


# ================================================================ graph analysis
def _producer(graph, tid):
    entry = graph.producer.get(tid)
    return None if entry is None else graph.ops[entry[0]]


def computed_from_matmul(graph) -> set[int]:
    """Ids of the tensors that have a MatMul among their producers ("scores")."""
    scores: set[int] = set()
    for op_id in graph.topological_op_ids():
        op = graph.ops[op_id]
        if op.kind == OpKind.MatMul or any(lt.id in scores for lt in op.inputs):
            scores.update(lt.id for lt in op.outputs)
    return scores


def _uses(graph, tid, depth: int = 0):
    """(op, port) pairs consuming ``tid``, looking through data-movement ops."""
    for op_id, port in graph.consumers.get(tid, []):
        op = graph.ops[op_id]
        if op.kind in LOOK_THROUGH and port == 0 and depth < 4:
            yield from _uses(graph, op.outputs[0].id, depth + 1)
        else:
            yield op, port


def _leads_to(graph, tid, kinds, depth: int = 4) -> bool:
    """Does ``tid`` flow into one of ``kinds`` within ``depth`` ops (not through a MatMul)?"""
    for op_id, _ in graph.consumers.get(tid, []):
        op = graph.ops[op_id]
        if op.kind in kinds:
            return True
        if depth > 1 and op.kind != OpKind.MatMul and op.outputs \
                and _leads_to(graph, op.outputs[0].id, kinds, depth - 1):
            return True
    return False


def _find_upstream(graph, tid, kind, depth: int = 4):
    """The nearest op of ``kind`` producing (through a few ops) ``tid``."""
    op = _producer(graph, tid)
    if op is None or depth == 0:
        return None
    if op.kind == kind:
        return op
    for lt in op.inputs:
        found = _find_upstream(graph, lt.id, kind, depth - 1)
        if found is not None:
            return found
    return None


def matmul_k(graph, op) -> int:
    """The reduction length K of a MatMul (from its src and ``transpose_a``)."""
    shape = graph.tensors[op.inputs[0].id].shape
    if not shape:
        return 1
    if len(shape) == 1:
        return shape[0]
    return shape[-2] if op.attrs.get("transpose_a") else shape[-1]


def weight_exponent(k: int) -> int:
    """e of the 2^-e weight scale: a K-long dot product of the fill values stays O(1)."""
    return int(math.floor(math.log2(max(k, 1)) / 2))


#: (op kind, input port) that a finite run needs positive: variances (benchdnn
#: fills them positive) and SqrtBackward's src or dst
POSITIVE_PORTS = frozenset({(OpKind.BatchNormInference, 4), (OpKind.BatchNormForwardTraining, 2),
                            (OpKind.BatchNormTrainingBackward, 3), (OpKind.LayerNormBackward, 3),
                            (OpKind.SqrtBackward, 0)})


def _role_of_use(graph, scores, op, port, lt) -> Role:
    kind, others = op.kind, [x.id for i, x in enumerate(op.inputs) if i != port]
    beside_scores = any(t in scores for t in others)
    if kind == OpKind.Dropout and port > 0:
        return Role(("", "dropout_seed", "dropout_offset", "dropout_prob")[port], op, port)
    if lt.dtype == DataType.s32 and kind in (OpKind.Add, OpKind.Subtract) \
            and any(_find_upstream(graph, t, OpKind.GenIndex) for t in others):
        return Role("causal_skv" if kind == OpKind.Add else "causal_sq", op, port)
    if kind == OpKind.Select:
        if port == 0 and any(op.inputs[i].id in scores for i in (1, 2)):
            return Role("select_cond", op, port)
        if port in (1, 2) and op.inputs[3 - port].id in scores:
            return Role("select_fill", op, port)
    if kind == OpKind.Subtract and port == 1 and beside_scores \
            and _leads_to(graph, op.outputs[0].id, {OpKind.Exp}, 1):
        return Role("stats", op, port)
    if kind == OpKind.Divide and port == 1 and beside_scores:
        return Role("scale_div", op, port)
    if kind == OpKind.Multiply and beside_scores and max(lt.nelems(), 1) == 1:
        return Role("scale_mul", op, port)
    if kind == OpKind.Add and beside_scores and lt.shape and len(lt.shape) >= 2 \
            and _leads_to(graph, op.outputs[0].id, {OpKind.SoftMax, OpKind.Exp}):
        return Role("mask", op, port)
    if kind == OpKind.Dequantize:
        return Role("dq_src", op, port)
    if kind == OpKind.DynamicDequantize:
        k = next((matmul_k(graph, use) for use, p in _uses(graph, op.outputs[0].id)
                  if use.kind == OpKind.MatMul and p == 1), 0)
        return Role(("ddq_src", "ddq_scales", "ddq_zps")[port], op, port, k)
    if kind == OpKind.DynamicQuantize and port == 1:
        return Role("dq_scales", op, port)
    if kind == OpKind.MatMul:
        return Role(("src", "weights", "bias")[port], op, port, matmul_k(graph, op))
    if kind == OpKind.Divide and port == 1:
        return Role("divisor", op, port)
    if kind in (OpKind.Log, OpKind.Sqrt, OpKind.Pow, OpKind.Reciprocal) and port == 0:
        return Role("positive", op, port)
    if (kind, port) in POSITIVE_PORTS:  # variances, and SqrtBackward's src/dst
        return Role("positive", op, port)
    return Role("generic", op, port)


def input_roles(graph) -> dict[int, Role]:
    """The role of every graph input (see the module docstring)."""
    scores = computed_from_matmul(graph)
    roles = {}
    for tid in graph.input_ids:
        lt = graph.tensors[tid]
        found = [_role_of_use(graph, scores, op, port, lt) for op, port in _uses(graph, tid)]
        roles[tid] = min(found or [Role("generic")], key=lambda r: ROLE_ORDER.index(r.name))
    return roles


# ================================================================ value makers
def keep_pattern(shape) -> np.ndarray:
    """Boolean causal keep-pattern over the last two dims, bottom-right aligned."""
    if len(shape) < 2:
        return np.ones(shape, dtype=bool)
    rows, cols = shape[-2], shape[-1]
    i = np.arange(rows)[:, None]
    j = np.arange(cols)[None, :]
    return np.broadcast_to(j <= i + max(0, cols - rows), shape)


# Values are made as int16 or float32 (every value used is exact in them) to keep
# the 58M-element weights of the gated-MLP files cheap; dtypes.convert makes the tensor's type.
def _choice(rng, values, shape) -> np.ndarray:
    return rng.choice(np.asarray(values, dtype=np.float32), size=shape)


def _ints(rng, lo, hi, shape) -> np.ndarray:
    return rng.integers(lo, hi + 1, size=shape, dtype=np.int16)


def _uniform(rng, lo, hi, shape) -> np.ndarray:
    values = rng.random(shape, dtype=np.float32)
    values *= np.float32(hi - lo)  # in place: the same values as ``r * (hi - lo) + lo``
    values += np.float32(lo)
    return values


def _zero_point(op, lowest: int, highest: int) -> int:
    """The mean zero point, clipped to the src type's range (a zero point past
    it only saturates the filled values)."""
    zps = op.attrs.get("zps") or [0]
    return int(np.clip(np.round(np.mean(np.asarray(zps, dtype=np.float64))), lowest, highest))


def _scores_shape(graph, role: Role):
    gen = next(filter(None, (_find_upstream(graph, x.id, OpKind.GenIndex)
                             for x in role.op.inputs)), None)
    return graph.tensors[gen.inputs[0].id].shape


#: roles with one value everywhere: (value, numpy dtype)
FIXED = {"dropout_seed": (DROPOUT_SEED, np.int64), "dropout_offset": (DROPOUT_OFFSET, np.int64),
         "dropout_prob": (DROPOUT_PROBABILITY, np.float32), "select_fill": (-np.inf, np.float32)}
#: roles whose elements are each one of a few values
CHOICES = {"scale_div": (2, 4, 8), "scale_mul": (0.25, 0.5, 1), "dq_scales": (0.25, 0.5, 1),
           "divisor": (1, 2, 4)}
#: roles whose elements are integers in an inclusive range
INTEGERS = {"src": (-4, 4), "bias": (-2, 2)}


def _values(graph, rng, lt: LogicalTensor, role: Role) -> np.ndarray:
    """Values (float32, integers or bool, shaped as ``lt``) for one role; stats are done later."""
    shape, name = lt.shape, role.name
    if name in FIXED:
        return np.full(shape, *FIXED[name])
    if name in CHOICES:
        return _choice(rng, CHOICES[name], shape)
    if name in INTEGERS:
        return _ints(rng, *INTEGERS[name], shape)
    if name == "weights":
        return _ints(rng, -2, 2, shape) * np.float32(2.0 ** -weight_exponent(role.k))
    if name in ("causal_skv", "causal_sq"):
        scores = _scores_shape(graph, role)
        return np.full(shape, scores[-1] if name == "causal_skv" else scores[-2], dtype=np.int64)
    if name == "select_cond":
        keep = keep_pattern(shape)  # Select(cond, a, b) = cond ? a : b
        return np.array(keep if _scores_at(graph, role.op) == 1 else ~keep)
    if name == "mask":
        return np.where(keep_pattern(shape), np.float32(0), np.float32(-np.inf))
    if name == "positive":
        return _uniform(rng, 0.25, 4.0, shape)
    if name in ("dq_src", "ddq_src", "ddq_zps", "ddq_scales"):
        return _quantized(rng, lt, role)
    return _generic(rng, lt)


def _quantized(rng, lt: LogicalTensor, role: Role) -> np.ndarray:
    """Inputs of Dequantize / DynamicDequantize: narrow ints, dequantized values O(1)."""
    info, shape = dtypes.info(lt.dtype), lt.shape
    if role.name == "dq_src":
        if info.kind == "float":  # f8
            return _ints(rng, -4, 4, shape)
        spread = 16 if info.bits == 8 else 4
        lo, hi = int(info.lowest), int(info.highest)
        values = _ints(rng, -spread, spread, shape) + np.int16(_zero_point(role.op, lo, hi))
        return np.clip(values, lo, hi)
    if role.name == "ddq_scales":
        e = weight_exponent(role.k) if role.k else 0
        return _choice(rng, (2.0 ** -(e + 1), 2.0 ** -(e + 2)), shape)
    src_range = INT_RANGES.get(role.op.inputs[0].dtype, ((0, 8), None))[0]
    if role.name == "ddq_src":
        return _ints(rng, *src_range, shape)
    middle = sum(src_range) // 2  # zero points mid-range: (src - zp) takes both signs
    return np.clip(_ints(rng, middle - 1, middle + 1, shape), int(info.lowest), int(info.highest))


def _scores_at(graph, select_op) -> int:
    """1 or 2: which Select value port carries the scores."""
    scores = computed_from_matmul(graph)
    return 1 if select_op.inputs[1].id in scores else 2


def _generic(rng, lt: LogicalTensor) -> np.ndarray:
    info = dtypes.info(lt.dtype)
    if info.kind == "bool":
        return rng.random(lt.shape) < 0.5
    if info.kind == "int":
        return _ints(rng, *INT_RANGES.get(lt.dtype, (None, (0, 8)))[1], lt.shape)
    return _uniform(rng, -2.0, 2.0, lt.shape)


def _stats(graph, feeds, role: Role, lt: LogicalTensor) -> np.ndarray:
    """logsumexp over the last axis of the scores the stats are subtracted from."""
    scores_id = role.op.inputs[0].id
    scores = reference_arrays(graph, feeds, [scores_id])[scores_id].astype(np.float64)
    peak = np.max(scores, axis=-1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(divide="ignore"):
        lse = peak + np.log(np.sum(np.exp(scores - peak), axis=-1, keepdims=True))
    return np.broadcast_to(lse, lt.shape) if lse.shape != tuple(lt.shape) else lse


# ================================================================ public
def fill_inputs(graph, seed: int = SEED, roles: dict | None = None) -> dict[int, np.ndarray]:
    """Values for every input of a finalized graph, keyed by tensor id.

    Arrays are in the logical dtype (``dtypes.numpy_dtype``); host scalars are
    0-D arrays.  Deterministic for a given graph and ``seed``.

    Raises:
        InvalidArguments: the graph is not finalized or an input shape is unknown.
    """
    if not graph.is_finalized():
        raise InvalidArguments("fill_inputs: the graph must be finalized")
    roles = roles or input_roles(graph)
    feeds: dict[int, np.ndarray] = {}
    for tid in graph.input_ids:
        lt = graph.tensors[tid]
        if not lt.is_shape_known():
            raise InvalidArguments(f"fill_inputs: input tensor {tid} has no concrete shape ({lt!r})")
        if roles[tid].name == "stats":
            continue
        rng = np.random.default_rng([seed, tid])  # per tensor: adding an input changes nothing else
        with _filling(lt, feeds, roles[tid]):
            feeds[tid] = _convert(_values(graph, rng, lt, roles[tid]), lt.dtype)
            if lt.encoding is not None:  # sparse: values the encoding can hold (n:m blocks pruned)
                feeds[tid] = prune(feeds[tid], lt.encoding)
    for tid in graph.input_ids:
        if roles[tid].name == "stats":
            lt = graph.tensors[tid]
            with _filling(lt, feeds, roles[tid]):
                feeds[tid] = dtypes.convert(_stats(graph, feeds, roles[tid], lt), lt.dtype)
    return feeds


def fill_bytes(lt: LogicalTensor, role: Role) -> int:
    """What filling ``lt`` may hold at once: the values as made (int16 or f32,
    with one temporary; a choice's int64 indices) and the tensor's own type."""
    per_element = 12 if role.name in CHOICES else 8
    if role.name == "stats":  # the reference scores in f64, and their exp
        return memory.nbytes_of(lt.shape, np.float64) * 4
    return math.prod(lt.shape) * per_element + memory.nbytes_of(lt.shape, dtypes.numpy_dtype(lt.dtype))


class _filling(memory.working):
    """One input's fill as a working block: its temporaries are checked against
    the memory budget on top of the inputs filled so far, and the system's
    refusal is OutOfMemory naming the tensor."""

    def __init__(self, lt: LogicalTensor, feeds: dict, role: Role):
        super().__init__(f"filling input tensor {lt.id} ({lt.dtype.name} {list(lt.shape)})",
                         sum(a.nbytes for a in feeds.values()))
        self.need = fill_bytes(lt, role)

    def __enter__(self):
        super().__enter__()
        try:
            memory.reserve(self.need, "its values and their temporaries")
        except BaseException:
            super().__exit__(None, None, None)
            raise
        return self


def _convert(values: np.ndarray, dtype) -> np.ndarray:
    """``dtypes.convert`` of made values, without its int64 temporaries for int16
    values (the same results: int16 values clipped to the type's range)."""
    info = dtypes.info(dtype)
    if values.dtype == np.int16 and info.kind == "int" and info.np_dtype is not None:
        np.clip(values, max(int(info.lowest), -2**15), min(int(info.highest), 2**15 - 1), out=values)
        return values.astype(info.np_dtype)
    if values.dtype == np.float32 and dtype == DataType.f32:
        return values
    return dtypes.convert(values, dtype)


def reference_arrays(graph, feeds: dict, wanted=None) -> dict[int, np.ndarray]:
    """Run the ops (only those ``wanted`` needs, default all) through the numpy
    reference kernels in one composed plan, as the unfused ground truth."""
    order = graph.topological_op_ids()
    if wanted is not None:
        needed = set()
        for tid in wanted:
            op = _producer(graph, tid)
            if op is not None:
                needed |= nx.ancestors(graph.nx, op.id) | {op.id}
        order = [i for i in order if i in needed]
    ops = [graph.ops[i] for i in order]
    lts = {tid: _concrete(lt) for tid, lt in graph.tensors.items()}
    request = backend.CompileRequest(None, ops, lts, list(graph.input_ids), list(graph.output_ids), graph.fpmath)
    with memory.working(f"the reference run of the graph ({len(ops)} ops)", sum(a.nbytes for a in feeds.values())):
        return backend.reference_plan(request).run_arrays(feeds)


def _concrete(lt: LogicalTensor) -> LogicalTensor:
    if lt.strides is None and lt.is_shape_known():
        return lt.with_shape(lt.shape, dense_strides(lt.shape), LayoutType.strided)
    return lt

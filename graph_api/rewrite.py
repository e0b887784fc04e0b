"""Graph rewrites benchdnn's graph driver makes before running a file.

* :func:`power_of_two_scales` — static Quantize/Dequantize ``scales`` rounded
  up to a power of two (so quantization divides exactly), per-channel lists
  tiled to the channel count and zero points padded.  Only the run's copy of
  the graph changes, never the file.
* :func:`set_batch` / :func:`reduce_batch` — ``--mb``: a new leading batch dim
  (and, for CI-sized runs, fewer heads) for every tensor and reshape that
  carries it; finalize re-checks every shape of the rewritten graph.
* :func:`rebuild` — the tool under both, also used for an fpmath override.
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np

from .enums import OpKind
from .errors import GraphError
from .logical_tensor import LogicalTensor
from .graph import Graph


def rebuild(graph, op_fn=None, lt_fn=None, fpmath=None):
    """A new finalized graph from ``graph``'s ops, optionally rewritten.

    Args:
        op_fn: ``op -> None`` editing a copy of each op's attrs in place.
        lt_fn: ``LogicalTensor -> LogicalTensor`` applied to every port.
        fpmath: an :class:`~graph_api.fpmath.FPMath` replacing the graph's.
    """

    fp = fpmath or graph.fpmath
    new = Graph(graph.engine_kind, fp.mode, fp.apply_to_int)
    for name in ("recorded_engine_kind", "json_meta"):
        if hasattr(graph, name):
            setattr(new, name, getattr(graph, name))
    for op in graph.ops.values():
        copy = op.copy()
        if lt_fn is not None:
            copy.inputs = [lt_fn(lt) for lt in copy.inputs]
            copy.outputs = [lt_fn(lt) for lt in copy.outputs]
        if op_fn is not None:
            op_fn(copy)
        new.add_op(copy)
    new.finalize()
    return new


def _pow2_up(x: float) -> float:
    """The smallest power of two >= ``x``; non-positive, non-finite values and
    values whose power of two is past the f32 range (scales are f32: 2^128 is
    +inf there, which add_op refuses) are kept as they are."""
    if not (x > 0 and math.isfinite(x)):
        return x
    exponent = math.ceil(math.log2(x))
    return 2.0 ** exponent if exponent < 128 else x


def power_of_two_scales(graph):
    """A copy whose static Quantize/Dequantize ``scales`` are powers of two
    (rounded up), per-channel lists tiled to the channel count, zps padded."""

    def edit(op):
        if op.kind not in (OpKind.Quantize, OpKind.Dequantize):
            return
        scales = [_pow2_up(s) for s in op.attrs["scales"]]
        if op.attrs.get("qtype") == "per_channel":
            quantized = op.inputs[0] if op.kind == OpKind.Dequantize else op.outputs[0]
            shape, axis = graph.tensors[quantized.id].shape, op.attrs.get("axis", 1)
            # an axis outside the rank is left for compile to report
            channels = shape[axis] if shape and -len(shape) <= axis < len(shape) else len(scales)
            if channels > 0 and len(scales) != channels:
                scales = list(np.resize(scales, channels))
                zps = op.attrs.get("zps")
                if zps is not None:
                    op.attrs["zps"] = [int(z) for z in np.resize(zps, channels)]
        op.attrs["scales"] = [float(s) for s in scales]

    if not any(op.kind in (OpKind.Quantize, OpKind.Dequantize) for op in graph.ops.values()):
        return graph
    return rebuild(graph, op_fn=edit)


def total_elements(graph) -> int:
    """Elements in all tensors of known shape: what a reference run allocates, roughly."""
    return sum(lt.nelems() for lt in graph.tensors.values() if lt.is_shape_known())


def _common_dim(graph, axis: int, min_rank: int) -> int | None:
    dims = Counter(lt.shape[axis] for lt in (graph.tensors[t] for t in graph.input_ids)
                   if lt.shape is not None and len(lt.shape) >= min_rank and lt.shape[axis] > 1)
    return dims.most_common(1)[0][0] if dims else None


def _resized_strides(shape, strides, new_shape):
    """Strides for ``new_shape`` keeping the dim order (and gaps) of ``strides``;
    ``None`` (dense) when the layout is not a clean nesting of its dims."""
    if strides is None or len(strides) != len(shape):
        return None
    result = list(strides)
    num, den = 1, 1  # how much the dims inner to the current one grew
    for d in sorted(range(len(shape)), key=lambda d: strides[d]):  # innermost first
        if (strides[d] * num) % den:
            return None
        result[d] = strides[d] * num // den
        if new_shape[d] != shape[d]:
            num, den = num * new_shape[d], den * max(shape[d], 1)
    return tuple(result)


def _resize_dim(graph, axis: int, old: int, new: int, min_rank: int):
    def lt_fn(lt):
        if lt.shape is None or len(lt.shape) < min_rank or lt.shape[axis] != old:
            return lt
        shape = list(lt.shape)
        shape[axis] = new
        return LogicalTensor(lt.id, lt.dtype, shape, _resized_strides(lt.shape, lt.strides, shape),
                             lt.layout, lt.property, lt.encoding)

    def op_fn(op):
        target = op.attrs.get("shape")
        if op.kind == OpKind.StaticReshape and axis == 0 and len(target or ()) >= 2 and target[0] == old:
            op.attrs["shape"] = [new] + list(target[1:])

    return rebuild(graph, op_fn=op_fn, lt_fn=lt_fn)


def set_batch(graph, mb: int):
    """The graph with its leading batch dim set to ``mb`` (benchdnn ``--mb``).

    Returns ``(graph, description)``, e.g. ``"mb 8->2"``; the description is
    ``None`` when the graph has no batch dim or it already is ``mb``.

    Raises:
        InvalidShape / InvalidGraph: the rewritten graph is inconsistent (a
            reshape or a non-batch dim equal to the batch).
    """
    old = _common_dim(graph, 0, 3)
    if old is None or old == mb:
        return graph, None
    return _resize_dim(graph, 0, old, mb, 2), f"mb {old}->{mb}"


def reduce_batch(graph, max_elements: int):
    """Shrink the leading batch dim, then (in graphs without reshapes or
    transposes, where heads stay dim 1) the heads dim, so that the graph's
    tensors hold at most ``max_elements`` elements, as far as those two dims
    allow (both stop at 1; sequence and feature dims are never touched).

    Returns ``(graph, description)``; the description is ``None`` when nothing
    changed, else e.g. ``"mb 8->1, heads 6->2"``.  A dim whose rewrite leaves
    the graph inconsistent is left alone (finalize re-checks every shape).
    """
    steps = []
    moves_heads = any(op.kind in (OpKind.StaticReshape, OpKind.StaticTranspose) for op in graph.ops.values())
    for axis, label, min_rank in ((0, "mb", 2), (1, "heads", 4)):
        total = total_elements(graph)
        if total <= max_elements or (axis == 1 and moves_heads):
            break
        old = _common_dim(graph, axis, 3 if axis == 0 else 4)
        if old is None:
            continue
        new = max(1, int(old * max_elements / total))
        if new >= old:
            continue
        try:
            graph = _resize_dim(graph, axis, old, new, min_rank)
        except GraphError:
            continue
        steps.append(f"{label} {old}->{new}")
    return graph, (", ".join(steps) or None)

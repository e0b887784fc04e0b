"""Shape propagation through a list of ops (graph finalize and compile).

Each op's schema infers output shapes from input shapes; the result is merged
with what the op declares: a known declared dim must agree with a known
inferred one, unknown dims are filled in.
"""
from __future__ import annotations

from .errors import InvalidShape, op_label
from .logical_tensor import UNKNOWN_DIM, LogicalTensor


def merge_shapes(declared, inferred, op, lt_id: int):
    """The most concrete shape consistent with both; InvalidShape when they clash."""
    if declared is None:
        return inferred
    if inferred is None:
        return declared
    if len(declared) != len(inferred):
        raise InvalidShape(
            f"{op_label(op)}: output tensor {lt_id} is declared with shape {list(declared)} "
            f"but the inputs give {list(inferred)}")
    merged = []
    for d, i in zip(declared, inferred):
        if d != UNKNOWN_DIM and i != UNKNOWN_DIM and d != i:
            raise InvalidShape(
                f"{op_label(op)}: output tensor {lt_id} is declared with shape {list(declared)} "
                f"but the inputs give {list(inferred)}")
        merged.append(i if d == UNKNOWN_DIM else d)
    return tuple(merged)


def _refine(lt: LogicalTensor, shape) -> LogicalTensor:
    if shape == lt.shape:
        return lt
    strides = lt.strides if (lt.strides is not None and lt.shape is not None
                             and len(lt.shape) == len(shape or ())) else None
    return lt.with_shape(shape, strides)


def propagate(ops, known: dict[int, LogicalTensor], schemas) -> dict[int, LogicalTensor]:
    """Infer every op output in ``ops`` (topological order) from ``known``.

    ``known`` maps tensor id to its best-known logical tensor and is updated
    in place (inputs should already be there); returns it.
    """
    for op in ops:
        schema = schemas[op.kind]
        in_shapes = [known.get(lt.id, lt).shape for lt in op.inputs]
        inferred = schema.infer_shapes(op, in_shapes)
        for lt, shape in zip(op.outputs, inferred):
            current = known.get(lt.id, lt)
            known[lt.id] = _refine(current, merge_shapes(current.shape, shape, op, lt.id))
    return known

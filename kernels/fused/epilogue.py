"""Post-op chains of a fused partition as Numba epilogue programs.

A chain is a list of op ids that each take the running value (one input) and,
for binary ops, one operand from outside.  :func:`chain_program` turns it into
``(name, operand tensor id or constant)`` steps understood by
``kernels.wmatmul.make_epilogue``; the operands' arrays are bound per execute.
"""
from __future__ import annotations

from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K

#: binary post-op kind -> epilogue name with the running value at input 0 / at input 1
BINARY = {K.Add: ("add", "add"), K.Multiply: ("mul", "mul"), K.Subtract: ("sub", "rsub"),
          K.Divide: ("div", "rdiv"), K.Maximum: ("max", "max"), K.Minimum: ("min", "min")}


def _unary(op):
    kind, a = op.kind, op.attrs
    if kind == K.ReLU:
        return "relu", None
    if kind == K.GELU:
        return a.get("mode", "gelu_erf"), None
    if kind == K.Sigmoid:
        return "sigmoid", None
    if kind == K.Tanh:
        return "tanh", None
    if kind == K.Clamp:
        return "clamp", (a["min"], a["max"])
    if kind == K.Elu:
        return "elu", a["alpha"]
    if kind == K.LeakyReLU:
        return "leaky_relu", a["alpha"]
    if kind == K.Abs:
        return "abs", None
    if kind == K.Exp:
        return "exp", None
    if kind == K.Square:
        return "square", None
    return None


def chain_program(ops_by_id, chain: list[int], value_id: int, lts) -> tuple[list, int] | str:
    """Epilogue steps for ``chain`` applied to tensor ``value_id``.

    Returns ``(steps, last_value_id)`` where a step is ``(name, arg)`` and a
    binary step's ``arg`` is the operand's tensor id; or a reason string.
    Every running value must be f32 (the epilogue computes in f32 and does
    not round between steps).
    """
    steps = []
    chain_values = {value_id}  # the epilogue holds only the latest: none can be an operand
    i = 0
    while i < len(chain):
        op = ops_by_id[chain[i]]
        if lts[op.outputs[0].id].dtype != DataType.f32:
            return f"post-op {op.kind.name} (op {op.id}) produces {lts[op.outputs[0].id].dtype.name}, not f32"
        # SiLU written as Sigmoid followed by Multiply(x, sigmoid(x))
        if op.kind == K.Sigmoid and i + 1 < len(chain):
            nxt = ops_by_id[chain[i + 1]]
            ids = {lt.id for lt in nxt.inputs}
            if nxt.kind == K.Multiply and ids == {value_id, op.outputs[0].id}:
                steps.append(("silu", 1.0))
                value_id = nxt.outputs[0].id
                chain_values |= {op.outputs[0].id, value_id}
                i += 2
                continue
        if op.kind in BINARY:
            ids = [lt.id for lt in op.inputs]
            if value_id not in ids:
                return f"post-op {op.kind.name} (op {op.id}) does not take the running value"
            pos = ids.index(value_id)
            other = ids[1 - pos]
            if other in chain_values:
                return f"post-op {op.kind.name} (op {op.id}) reads a value of the chain as its other operand"
            steps.append((BINARY[op.kind][pos], other))
        else:
            unary = _unary(op)
            if unary is None:
                return f"post-op {op.kind.name} (op {op.id}) has no epilogue form"
            steps.append(unary)
        value_id = op.outputs[0].id
        chain_values.add(value_id)
        i += 1
    return steps, value_id


def bind(steps, arrays_of, out_shape, M: int, N: int) -> list:
    """Steps with binary operands replaced by arrays broadcast to ``[M, N]``-able form."""
    import numpy as np

    bound = []
    for name, arg in steps:
        if isinstance(arg, int) and name in ("add", "mul", "sub", "div", "max", "min", "rsub", "rdiv"):
            value = np.asarray(arrays_of(arg))
            shape = value.shape
            if value.ndim <= 1 or all(d == 1 for d in shape[:-1]):
                value = value.reshape(1, -1) if value.ndim else value.reshape(1, 1)
            else:
                value = np.broadcast_to(value, out_shape).reshape(M, N)
            bound.append((name, value))
        else:
            bound.append((name, arg))
    return bound

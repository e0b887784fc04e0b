"""Post-op chains of a fused partition as Numba epilogue programs.

A chain is a list of op ids that each take the running value (one input) and,
for binary ops, one operand from outside.  :func:`chain_program` turns it into
``(name, operand tensor id or constant)`` steps understood by
``graph_api.kernels.weight_compressed.wmatmul.make_epilogue``; the operands' arrays are bound per execute.
"""
from __future__ import annotations

from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K
from graph_api.postops import POST_OPS, RNAMES

#: binary post-op kind -> epilogue name with the running value at input 0 / at input 1
BINARY = {k: (p.name, RNAMES[p.name]) for k, p in POST_OPS.items() if p.binary}
#: intermediate types the epilogue rounds to between steps
_ROUND_STEP = {DataType.bf16: "round_bf16", DataType.f16: "round_f16"}


def _unary(op):
    """(step name, f32 parameters) of a unary op of the post-op table, else None."""
    row = POST_OPS.get(op.kind)
    if row is None or row.binary:
        return None
    name, _, params = row.step(op.attrs)
    return name, params


def chain_program(ops_by_id, chain: list[int], value_id: int, lts,
                  round_types: bool = False) -> tuple[list, int] | str:
    """Epilogue steps for ``chain`` applied to tensor ``value_id``.

    Returns ``(steps, last_value_id)`` where a step is ``(name, arg)`` and a
    binary step's ``arg`` is the operand's tensor id; or a reason string.
    Every running value must be f32 (the epilogue computes in f32), unless
    ``round_types``: then a bf16/f16 running value gets a rounding step, as
    the unfused ops round their outputs.
    """
    from graph_api.kernels.weight_compressed.wmatmul import RUNNING

    steps = []
    inside = {value_id}  # values computed in the chain: not bindable operands
    i = 0
    while i < len(chain):
        op = ops_by_id[chain[i]]
        out_type = lts[op.outputs[0].id].dtype
        if out_type != DataType.f32 and not (round_types and out_type in _ROUND_STEP):
            return f"post-op {op.kind.name} (op {op.id}) produces {lts[op.outputs[0].id].dtype.name}, not f32"
        # SiLU written as Sigmoid followed by Multiply(x, sigmoid(x))
        if op.kind == K.Sigmoid and out_type == DataType.f32 and i + 1 < len(chain):
            nxt = ops_by_id[chain[i + 1]]
            ids = {lt.id for lt in nxt.inputs}
            if nxt.kind == K.Multiply and ids == {value_id, op.outputs[0].id}:
                steps.append(("silu", 1.0))
                inside.add(op.outputs[0].id)
                value_id = nxt.outputs[0].id
                inside.add(value_id)
                i += 2
                continue
        if op.kind in BINARY:
            ids = [lt.id for lt in op.inputs]
            if value_id not in ids:
                return f"post-op {op.kind.name} (op {op.id}) does not take the running value"
            pos = ids.index(value_id)
            other = ids[1 - pos]
            if other == value_id:  # Multiply(y, y): the epilogue reads its running value
                steps.append((BINARY[op.kind][0], RUNNING))
            elif other in inside:
                return f"post-op {op.kind.name} (op {op.id}) reads tensor {other}, an earlier " \
                       f"value of the chain; the epilogue keeps only the running value"
            else:
                steps.append((BINARY[op.kind][pos], other))
        else:
            unary = _unary(op)
            if unary is None:
                return f"post-op {op.kind.name} (op {op.id}) has no epilogue form"
            steps.append(unary)
        if out_type in _ROUND_STEP:
            steps.append((_ROUND_STEP[out_type], None))
        value_id = op.outputs[0].id
        inside.add(value_id)
        i += 1
    return steps, value_id


#: epilogue steps whose argument, when an int, is the id of an operand tensor
OPERAND_STEPS = ("add", "mul", "sub", "div", "max", "min", "rsub", "rdiv")


def bind(steps, arrays_of, out_shape, M: int, N: int) -> list:
    """Steps with binary operands replaced by arrays broadcast to ``[M, N]``-able form."""
    import numpy as np

    bound = []
    for name, arg in steps:
        if isinstance(arg, int) and name in OPERAND_STEPS:
            value = np.asarray(arrays_of(arg))
            shape = value.shape
            if value.ndim <= 1 or all(d == 1 for d in shape[:-1]):
                value = value.reshape(1, -1) if value.ndim else value.reshape(1, 1)
            elif shape == tuple(out_shape):  # a view, not a read-only broadcast
                value = value.reshape(M, N)
            else:
                value = np.broadcast_to(value, out_shape).reshape(M, N)
            bound.append((name, value))
        else:
            bound.append((name, arg))
    return bound

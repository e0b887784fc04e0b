"""Node-level rewrites before the walk: decomposed forms exporters write, put back together.

GELU (exact).  PyTorch and Hugging Face exports below opset 20 write ``gelu(x)`` as::

    x ─ Div(√2) | Mul(1/√2) ─ Erf ─ Add(1) ─┬ Mul(x) ─ Mul(0.5)        (HF BERT)
                                            ├ Mul(0.5) ─ Mul(x)
                                            └ Mul(Mul(x, 0.5))          (x * 0.5 first)

ONNX has no Erf counterpart in oneDNN, so left alone the Erf would run on the host and cut the
graph at every layer.  A chain whose intermediates nothing else reads becomes one ``Gelu`` node
(approximate="none"), which maps to ``GELU(gelu_erf)``.  Constants are compared with a relative
tolerance of 1e-6 (exporters write √2 and 1/√2 as f32).
"""
from __future__ import annotations

import math

import numpy as np


def _scalar(consts, name):
    value = consts.get(name)
    if value is None or value.size != 1:
        return None
    return float(np.asarray(value, np.float64).reshape(-1)[0])


def _near(value, target) -> bool:
    return value is not None and abs(value - target) <= 1e-6 * abs(target)


def fuse_gelu(nodes: list, consts: dict, outputs: set) -> list:
    """``nodes`` with each exact-GELU chain replaced by one Gelu node."""
    from onnx import helper

    producer = {o: n for n in nodes for o in n.output if o}
    users: dict[str, list] = {}
    for n in nodes:
        for i in n.input:
            if i:
                users.setdefault(i, []).append(n)

    def sole(name, op_type):
        found = users.get(name, [])
        if len(found) != 1 or name in outputs or found[0].op_type != op_type or found[0].domain not in ("", "ai.onnx"):
            return None
        return found[0]

    def other(node, name):
        ins = list(node.input)
        return ins[1] if ins[0] == name else ins[0] if len(ins) == 2 and ins[1] == name else None

    replaced: dict[int, object] = {}
    dropped: set[int] = set()
    for erf in nodes:
        if erf.op_type != "Erf" or erf.domain not in ("", "ai.onnx"):
            continue
        pre = producer.get(erf.input[0])
        if pre is None or len(users.get(pre.output[0], [])) != 1 or pre.output[0] in outputs:
            continue
        if pre.op_type == "Div" and _near(_scalar(consts, pre.input[1]), math.sqrt(2)):
            x = pre.input[0]
        elif pre.op_type == "Mul" and _near(_scalar(consts, pre.input[1]), 1 / math.sqrt(2)):
            x = pre.input[0]
        elif pre.op_type == "Mul" and _near(_scalar(consts, pre.input[0]), 1 / math.sqrt(2)):
            x = pre.input[1]
        else:
            continue
        add = sole(erf.output[0], "Add")
        if add is None or not _near(_scalar(consts, other(add, erf.output[0])), 1.0):
            continue
        mul1 = sole(add.output[0], "Mul")
        if mul1 is None:
            continue
        partner = other(mul1, add.output[0])
        chain, out = [pre, erf, add, mul1], None
        if partner == x or _near(_scalar(consts, partner), 0.5):
            mul2 = sole(mul1.output[0], "Mul")
            if mul2 is not None:
                last = other(mul2, mul1.output[0])
                if (partner == x and _near(_scalar(consts, last), 0.5)) or \
                        (partner != x and last == x):
                    chain.append(mul2)
                    out = mul2.output[0]
        else:
            half = producer.get(partner)
            if half is not None and half.op_type == "Mul" and len(users.get(partner, [])) == 1 and \
                    x in half.input and _near(_scalar(consts, other(half, x)), 0.5):
                chain.append(half)
                out = mul1.output[0]
        if out is None:
            continue
        keys = [id(n) for n in chain]
        if any(k in dropped or k in replaced for k in keys):
            continue
        last = max(chain, key=nodes.index)
        name = erf.name or out
        replaced[id(last)] = helper.make_node("Gelu", [x], [out], name=f"{name}/gelu")
        dropped.update(k for k in keys if k != id(last))
    if not replaced:
        return nodes
    return [replaced.get(id(n), n) for n in nodes if id(n) not in dropped]

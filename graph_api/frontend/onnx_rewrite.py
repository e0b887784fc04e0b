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


def fuse_softmax_nan_guard(nodes: list, consts: dict, outputs: set) -> list:
    """``Where(IsNaN(p), 0, p)`` after ``p = Softmax(s)`` (PyTorch's SDPA decomposition zeroes
    the rows a mask hides completely) becomes the Softmax with oneDNN's ``inf_as_zero`` mode,
    marked by the attribute ``graph_api_inf_as_zero`` on the rewritten node.  (A NaN that comes
    from a NaN input stays NaN here, where PyTorch's form would zero it.)"""
    from onnx import helper

    producer = {o: n for n in nodes for o in n.output if o}
    users: dict[str, list] = {}
    for n in nodes:
        for i in n.input:
            if i:
                users.setdefault(i, []).append(n)
    replaced, dropped = {}, set()
    for where in nodes:
        if where.op_type != "Where" or len(where.input) != 3:
            continue
        isnan = producer.get(where.input[0])
        p = where.input[2]
        soft = producer.get(p)
        zero = _scalar(consts, where.input[1])
        if isnan is None or isnan.op_type != "IsNaN" or isnan.input[0] != p or soft is None or \
                soft.op_type != "Softmax" or zero != 0.0:
            continue
        if {id(u) for u in users.get(p, [])} != {id(isnan), id(where)} or \
                len(users.get(isnan.output[0], [])) != 1 or p in outputs or isnan.output[0] in outputs:
            continue
        new = helper.make_node("Softmax", list(soft.input), [where.output[0]], name=soft.name)
        new.attribute.extend(soft.attribute)
        new.attribute.append(helper.make_attribute("graph_api_inf_as_zero", 1))
        replaced[id(where)] = new
        dropped.update({id(soft), id(isnan)})
    if not replaced:
        return nodes
    return [replaced.get(id(n), n) for n in nodes if id(n) not in dropped]

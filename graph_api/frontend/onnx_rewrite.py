"""Node-level rewrites before the walk: decomposed forms exporters write, put back together.

GELU.  PyTorch and Hugging Face exports below opset 20 write ``gelu(x)`` as::

    x ─ Div(√2) | Mul(1/√2) ─ Erf ─ Add(1) ─┬ Mul(x) ─ Mul(0.5)        (HF BERT)
                                            ├ Mul(0.5) ─ Mul(x)
                                            └ Mul(Mul(x, 0.5))          (x * 0.5 first)

ONNX has no Erf counterpart in oneDNN, so left alone the Erf would run on the host and cut the
graph at every layer.  A chain whose intermediates nothing else reads becomes one ``Gelu`` node
(approximate="none"), which maps to ``GELU(gelu_erf)``.  GPT-2's tanh form,
``0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`` with ``Pow(x, 3)``, becomes ``Gelu``
(approximate="tanh"), ``GELU(gelu_tanh)``.  Constants are compared with a relative
tolerance of 1e-6 (exporters write √2 and 1/√2 as f32).

One DequantizeLinear per reader.  ONNX Runtime's static quantizer (QDQ format) writes one
``DequantizeLinear`` for a value several nodes read (a residual branch: the block input feeds a
Conv/MatMul and the Add after it).  The quantized patterns take their ``src_dequant`` only when
nothing else reads its output, so :func:`unique_dequantize` gives each reader a copy of its
own, as ONNX Runtime's ``EnsureUniqueDQForNodeUnit`` transformer does before its QDQ fusions
(each copy computes the same values: nothing changes numerically).
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


class _Graph:
    """Producers and users of a node list."""

    def __init__(self, nodes, outputs):
        self.nodes, self.outputs = nodes, outputs
        self.producer = {o: n for n in nodes for o in n.output if o}
        self.users: dict[str, list] = {}
        for n in nodes:
            for i in n.input:
                if i:
                    self.users.setdefault(i, []).append(n)

    def sole(self, name, op_type):
        """The one node reading ``name`` (a node of ``op_type``; ``name`` not a graph output)."""
        found = self.users.get(name, [])
        if len(found) != 1 or name in self.outputs or found[0].op_type != op_type or \
                found[0].domain not in ("", "ai.onnx"):
            return None
        return found[0]

    def private(self, name) -> bool:
        return len(self.users.get(name, [])) == 1 and name not in self.outputs


def _other(node, name):
    ins = list(node.input)
    if len(ins) != 2:
        return None
    return ins[1] if ins[0] == name else ins[0] if ins[1] == name else None


def _erf_head(g, consts, erf):
    """(x, chain) of ``Erf(x / √2)`` or ``Erf(x * (1/√2))``."""
    pre = g.producer.get(erf.input[0])
    if pre is None or not g.private(pre.output[0]) or pre.op_type not in ("Div", "Mul"):
        return None
    target = math.sqrt(2) if pre.op_type == "Div" else 1 / math.sqrt(2)
    for x, c in ((pre.input[0], pre.input[1]), (pre.input[1], pre.input[0])):
        if _near(_scalar(consts, c), target) and (pre.op_type == "Mul" or x == pre.input[0]):
            return x, [pre]
    return None


def _tanh_head(g, consts, tanh):
    """(x, chain) of ``Tanh(√(2/π) * (x + 0.044715 * x^3))`` (x^3 as Pow(x, 3) or x * x * x)."""
    scale = g.producer.get(tanh.input[0])
    if scale is None or scale.op_type != "Mul" or not g.private(scale.output[0]):
        return None
    inner = next((i for i in scale.input if _near(_scalar(consts, _other(scale, i)), math.sqrt(2 / math.pi))), None)
    add = g.producer.get(inner) if inner else None
    if add is None or add.op_type != "Add" or not g.private(add.output[0]):
        return None
    for x in add.input:
        cube_scaled = g.producer.get(_other(add, x))
        if cube_scaled is None or cube_scaled.op_type != "Mul" or not g.private(cube_scaled.output[0]):
            continue
        for cube_name in cube_scaled.input:
            if not _near(_scalar(consts, _other(cube_scaled, cube_name)), 0.044715):
                continue
            cube = g.producer.get(cube_name)
            if cube is not None and cube.op_type == "Pow" and cube.input[0] == x and \
                    _near(_scalar(consts, cube.input[1]), 3.0) and g.private(cube_name):
                return x, [cube, cube_scaled, add, scale]
    return None


def _gelu_tail(g, consts, fn, x):
    """(chain, output) of ``0.5 * x * (1 + fn)`` after ``fn`` (the Erf or Tanh node)."""
    add = g.sole(fn.output[0], "Add")
    if add is None or not _near(_scalar(consts, _other(add, fn.output[0])), 1.0):
        return None
    mul1 = g.sole(add.output[0], "Mul")
    if mul1 is None:
        return None
    partner = _other(mul1, add.output[0])
    if partner == x or _near(_scalar(consts, partner), 0.5):
        mul2 = g.sole(mul1.output[0], "Mul")
        if mul2 is None:
            return None
        last = _other(mul2, mul1.output[0])
        if (partner == x and _near(_scalar(consts, last), 0.5)) or (partner != x and last == x):
            return [add, mul1, mul2], mul2.output[0]
        return None
    half = g.producer.get(partner)
    if half is not None and half.op_type == "Mul" and g.private(partner) and x in half.input and \
            _near(_scalar(consts, _other(half, x)), 0.5):
        return [add, mul1, half], mul1.output[0]
    return None


def fuse_gelu(nodes: list, consts: dict, outputs: set) -> list:
    """``nodes`` with each exact-GELU (Erf) and tanh-GELU chain replaced by one Gelu node."""
    from onnx import helper

    g = _Graph(nodes, outputs)
    replaced: dict[int, object] = {}
    dropped: set[int] = set()
    position = {id(n): i for i, n in enumerate(nodes)}
    for fn in nodes:
        if fn.op_type not in ("Erf", "Tanh") or fn.domain not in ("", "ai.onnx"):
            continue
        head = (_erf_head if fn.op_type == "Erf" else _tanh_head)(g, consts, fn)
        if head is None:
            continue
        x, chain = head
        tail = _gelu_tail(g, consts, fn, x)
        if tail is None:
            continue
        chain = chain + [fn] + tail[0]
        keys = [id(n) for n in chain]
        if any(k in dropped or k in replaced for k in keys):
            continue
        last = max(chain, key=lambda n: position[id(n)])
        name = fn.name or tail[1]
        replaced[id(last)] = helper.make_node("Gelu", [x], [tail[1]], name=f"{name}/gelu",
                                              approximate="none" if fn.op_type == "Erf" else "tanh")
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


def split_projections(nodes: list, consts: dict, outputs: set) -> tuple[list, dict]:
    """A Split along the output features of a MatMul/Gemm with constant weights (GPT-2's fused
    QKV projection, ``c_attn``) becomes one MatMul/Gemm per part on the weights' slices, cut
    at load (oneDNN has no Slice; the Split would otherwise run on the host and cut the graph)::

        Gemm(x, W, b) [-> Reshape(..., 3H)]? -> Split(last axis)
            =>  Gemm(x, W[part], b[part]) [-> Reshape(..., part)]?   for each part

    Returns (nodes, new constants by name)."""
    from onnx import helper

    g = _Graph(nodes, outputs)
    new_consts: dict = {}
    replaced: dict[int, list] = {}
    dropped: set[int] = set()
    for split in nodes:
        if split.op_type != "Split" or split.domain not in ("", "ai.onnx"):
            continue
        source = g.producer.get(split.input[0])
        reshape = None
        if source is not None and source.op_type == "Reshape" and g.private(source.output[0]):
            reshape, source = source, g.producer.get(source.input[0])
            shape = consts.get(reshape.input[1])
            if shape is None or shape.size == 0 or int(shape.reshape(-1)[-1]) <= 0:
                continue
        if source is None or source.op_type not in ("MatMul", "Gemm") or not g.private(source.output[0]):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in source.attribute}
        w = consts.get(source.input[1])
        if w is None or w.ndim != 2 or attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0:
            continue
        trans_b = bool(attrs.get("transB", 0))
        width = w.shape[0] if trans_b else w.shape[1]
        bias = consts.get(source.input[2]) if len(source.input) > 2 and source.input[2] else None
        if len(source.input) > 2 and source.input[2] and (bias is None or bias.size not in (1, width)
                                                          or attrs.get("beta", 1.0) != 1.0):
            continue
        split_attrs = {a.name: helper.get_attribute_value(a) for a in split.attribute}
        axis = int(split_attrs.get("axis", 0))
        rank = 2 if reshape is None else int(consts[reshape.input[1]].size)
        if axis % rank != rank - 1:
            continue
        parts = len(split.output)
        sizes = consts.get(split.input[1]) if len(split.input) > 1 and split.input[1] else None
        sizes = [int(v) for v in (sizes.reshape(-1) if sizes is not None else split_attrs.get("split", []))]
        if not sizes:
            if width % parts:
                continue
            sizes = [width // parts] * parts
        if sum(sizes) != width or len(sizes) != parts:
            continue
        made, start = [], 0
        for i, (size, out) in enumerate(zip(sizes, split.output)):
            tag = f"{split.name or split.output[0]}/part{i}"
            piece = w[start:start + size] if trans_b else w[:, start:start + size]
            new_consts[f"{tag}/w"] = np.ascontiguousarray(piece)
            ins = [source.input[0], f"{tag}/w"]
            if bias is not None:
                new_consts[f"{tag}/b"] = np.ascontiguousarray(
                    np.broadcast_to(bias.reshape(-1), (width,))[start:start + size])
                ins.append(f"{tag}/b")
            mm_out = f"{tag}/mm" if reshape is not None else out
            node = helper.make_node(source.op_type, ins, [mm_out], name=f"{tag}/{source.op_type}")
            node.attribute.extend(source.attribute)
            made.append(node)
            if reshape is not None:
                shape = consts[reshape.input[1]].reshape(-1).copy()
                shape[-1] = size
                new_consts[f"{tag}/shape"] = shape
                made.append(helper.make_node("Reshape", [mm_out, f"{tag}/shape"], [out], name=f"{tag}/Reshape"))
                made[-1].attribute.extend(reshape.attribute)
            start += size
        replaced[id(split)] = made
        dropped.update({id(source)} | ({id(reshape)} if reshape is not None else set()))
    if not replaced:
        return nodes, {}
    result = []
    for n in nodes:
        if id(n) in dropped:
            continue
        result.extend(replaced.get(id(n), [n]))
    return result, new_consts


def unique_dequantize(nodes: list, outputs: set) -> list:
    """Each ``DequantizeLinear`` read by several nodes (or by a node and the graph's outputs)
    becomes one copy per reader, placed right after it; the first reader keeps the original."""
    from onnx import helper

    users: dict[str, list] = {}
    for n in nodes:
        for i in n.input:
            if i:
                users.setdefault(i, []).append(n)
    renamed: dict[tuple[int, str], str] = {}  # (id(reader), old name) -> copy's output
    copies: dict[int, list] = {}
    for dq in nodes:
        if dq.op_type != "DequantizeLinear" or dq.domain not in ("", "ai.onnx") or not dq.output:
            continue
        out = dq.output[0]
        readers = list({id(u): u for u in users.get(out, [])}.values())
        if len(readers) + (out in outputs) < 2:
            continue
        keep = 0 if out in outputs else 1  # a graph output keeps the original for itself
        for k, reader in enumerate(readers[keep:]):
            name = f"{out}/dq{k}"
            copy = helper.make_node("DequantizeLinear", list(dq.input), [name], name=f"{dq.name or out}/dq{k}")
            copy.attribute.extend(dq.attribute)
            copies.setdefault(id(dq), []).append(copy)
            renamed[(id(reader), out)] = name
    if not copies:
        return nodes
    result = []
    for n in nodes:
        if any((id(n), i) in renamed for i in n.input):
            new = helper.make_node(n.op_type, [renamed.get((id(n), i), i) for i in n.input], list(n.output),
                                   name=n.name, domain=n.domain)
            new.attribute.extend(n.attribute)
            n = new
        result.append(n)
        result.extend(copies.get(id(n), []))
    return result

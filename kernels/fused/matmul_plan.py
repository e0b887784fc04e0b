"""MatMul partitions on f32 BLAS plus one Numba epilogue pass.

Serves ``matmul_post_ops``, ``matmul_transpose``, ``binary_matmul_binary``,
``matmul_dropout``, ``matmul_quantized`` and single MatMul ops::

    acc = A @ B                           numpy matmul in f32 (OpenBLAS sgemm),
                                          batched / broadcast / transposed views
    y   = chain(acc)                      bias, post-ops (graph_api.postops),
                                          bf16/f16 roundings where an op's
                                          output has that type
    out[layout(m, n)] = convert(y)        reshape/transpose/reorder written by
                                          the store (kernels.store)

The chain is found by walking from the MatMul output through its single
consumers; ops the walk does not cover (Dequantize prologues, binary
pre-ops, Select, Dropout, Quantize tails) run as reference steps before or
after, in the plan's name.  fpmath: inputs rounded exactly as the reference
MatMul rounds them (``round_input`` / ``round_dequantized_weight``); the sum
is f32 (the reference's f64 sum rounded once differs by at most the f32
accumulation bound ``~K * 2**-24 * sum |a b|``).
"""
from __future__ import annotations

import numpy as np

from graph_api import dtypes
from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K
from graph_api.enums import PropertyType
from graph_api.postops import POST_OPS
from kernels.plan import ComposedPlan, CompileRequest, dequantized_inputs

from .epilogue import _ROUND_STEP, bind, chain_program

LAYOUT = {K.StaticReshape, K.StaticTranspose, K.Reorder}
_OKIND = {DataType.f32: 0, DataType.bf16: 1, DataType.f16: 2}


class _Walk:
    """The MatMul's output chain: element-wise steps, then layout ops."""

    def __init__(self, request: CompileRequest, mm):
        self.request, self.mm = request, mm
        self.ops_by_id = {op.id: op for op in request.ops}
        self.consumers: dict[int, list] = {}
        for op in request.ops:
            for lt in op.inputs:
                self.consumers.setdefault(lt.id, []).append(op)
        self.covered = [mm.id]
        self.steps: list = []
        self.layout: list = []
        self.value = mm.outputs[0].id
        self.shape = tuple(request.lts[self.value].shape)

    def _next(self):
        """The single consumer of the running value (or a Sigmoid+Multiply pair)."""
        if self.value in self.request.output_ids:
            return None
        cons = self.consumers.get(self.value, [])
        if len(cons) == 2 and not self.layout:
            sig = next((op for op in cons if op.kind == K.Sigmoid), None)
            mul = next((op for op in cons if op.kind == K.Multiply), None)
            if sig is not None and mul is not None and \
                    {lt.id for lt in mul.inputs} == {self.value, sig.outputs[0].id} and \
                    sig.outputs[0].id not in self.request.output_ids:
                return [sig.id, mul.id]
        return [cons[0].id] if len(cons) == 1 else None

    def _elementwise(self, ids) -> bool:
        lts = self.request.lts
        op = self.ops_by_id[ids[-1]]
        if tuple(lts[op.outputs[0].id].shape) != self.shape:
            return False
        if op.kind == K.TypeCast:
            out_type = lts[op.outputs[0].id].dtype
            if out_type not in _OKIND:
                return False
            if out_type in _ROUND_STEP:
                self.steps.append((_ROUND_STEP[out_type], None))
        elif op.kind == K.BiasAdd:
            if op.inputs[0].id != self.value or \
                    (op.attrs["data_format"] == "NCX" and len(self.shape) > 1):
                return False
            self.steps.append(("add", op.inputs[1].id))
            self._round(op)
        elif op.kind in POST_OPS:
            program = chain_program(self.ops_by_id, ids, self.value, lts, round_types=True)
            if isinstance(program, str):
                return False
            self.steps += program[0]
        else:
            return False
        self.covered += ids
        self.value = op.outputs[0].id
        return True

    def _round(self, op):
        out_type = self.request.lts[op.outputs[0].id].dtype
        if out_type in _ROUND_STEP:
            self.steps.append((_ROUND_STEP[out_type], None))

    def run(self):
        while (ids := self._next()) is not None:
            op = self.ops_by_id[ids[-1]]
            if op.kind in LAYOUT and len(ids) == 1:
                self.layout.append(op)
                self.covered.append(op.id)
                self.value = op.outputs[0].id
            elif self.layout or not self._elementwise(ids):
                break
        return self


def _ancestors(request, targets: set[int]) -> set[int]:
    """Op ids inside the partition that produce (transitively) tensors ``targets``."""
    producer = {lt.id: op for op in request.ops for lt in op.outputs}
    seen, todo = set(), list(targets)
    while todo:
        op = producer.get(todo.pop())
        if op is not None and op.id not in seen:
            seen.add(op.id)
            todo += [lt.id for lt in op.inputs]
    return seen


class MatmulPlan:
    """See the module docstring.  ``name`` says what runs as reference steps."""

    def __init__(self, request: CompileRequest, walk: _Walk):
        lts, mm = request.lts, walk.mm
        self.request, self.walk = request, walk
        self.a_id, self.b_id = mm.inputs[0].id, mm.inputs[1].id
        self.ta, self.tb = bool(mm.attrs["transpose_a"]), bool(mm.attrs["transpose_b"])
        int_in = dequantized_inputs(request.ops).get(mm.id, frozenset())
        fp = request.fpmath
        self.round = [(fp.round_dequantized_weight if i in int_in else
                       (lambda x, t=lts[lt.id].dtype: fp.round_input(x, t)))
                      for i, lt in enumerate(mm.inputs[:2])]
        pre: list = []
        if mm.attrs["accumulation_mode"] == "f16":
            pre.append(("round_f16", None))
        if len(mm.inputs) > 2:
            pre.append(("add", mm.inputs[2].id))
        mm_type = lts[mm.outputs[0].id].dtype
        if mm_type in _ROUND_STEP:
            pre.append((_ROUND_STEP[mm_type], None))
        self.steps = pre + walk.steps
        self.mm_shape = walk.shape
        self.N = self.mm_shape[-1] if self.mm_shape else 1
        self.R = int(np.prod(self.mm_shape)) // max(self.N, 1)
        self.b_const = lts[self.b_id].property == PropertyType.constant and self.b_id in request.input_ids
        self._b_cache: dict = {}
        # reference steps before (producers of A, B and chain operands) and after
        covered = set(walk.covered)
        operands = {self.a_id, self.b_id} | {lt.id for op in request.ops if op.id in covered
                                              for lt in op.inputs}
        before = _ancestors(request, operands) - covered
        ref = ComposedPlan(request)
        self.pre_steps = [s for s in ref.steps if s[1].id in before]
        self.post_steps = [s for s in ref.steps if s[1].id not in before and s[1].id not in covered]
        self.dest = walk.value
        dest_lt = lts[self.dest]
        self.okind = _OKIND[dest_lt.dtype]
        self.dest_out = self.dest in request.output_ids
        strides = dest_lt.strides if self.dest_out else None
        from kernels import store

        self._store = store
        off = store.element_offsets(dest_lt.shape, strides or _dense(dest_lt.shape))
        for op in reversed(walk.layout):
            if op.kind == K.StaticTranspose:
                order = [o % off.ndim for o in op.attrs["order"]]
                off = off.transpose(np.argsort(order))
            else:
                off = off.reshape(lts[op.inputs[0].id].shape)
        self.offsets = store.separable(off.reshape(self.R, self.N))
        self.direct = (not self.steps and not walk.layout and self.okind == 0 and self.dest_out
                       and tuple(dest_lt.strides) == _dense(dest_lt.shape))
        parts = ["blas_matmul_epilogue"]
        if self.pre_steps:
            parts.append("ref_pre[" + ",".join(s[1].kind.name for s in self.pre_steps) + "]")
        if self.post_steps:
            parts.append("ref_post[" + ",".join(s[1].kind.name for s in self.post_steps) + "]")
        self.name = "+".join(parts)

    def _operand(self, arrays, i: int):
        tid = (self.a_id, self.b_id)[i]
        if i == 1 and self.b_const:
            src = arrays[tid]
            key = (src.__array_interface__["data"][0], src.shape)
            hit = self._b_cache.get(key)
            if hit is None:
                self._b_cache.clear()
                hit = self._b_cache[key] = np.ascontiguousarray(self.round[1](src))
            x = hit
        else:
            x = self.round[i](arrays[tid])
        if (self.ta if i == 0 else self.tb) and x.ndim > 1:
            x = np.swapaxes(x, -1, -2)
        return x

    def execute(self, inputs: dict, outputs: dict) -> None:
        arrays = {tid: t.numpy() for tid, t in inputs.items()}
        for fn, op, out_lts, ctx in self.pre_steps:
            for lt, v in zip(out_lts, fn(op, [arrays[x.id] for x in op.inputs], out_lts, ctx)):
                arrays[lt.id] = v
        a, b = self._operand(arrays, 0), self._operand(arrays, 1)
        if self.direct and a.ndim > 1 and b.ndim > 1:  # no epilogue: BLAS writes the output
            np.matmul(a, b, out=outputs[self.dest].numpy())
            return self._post(arrays, outputs)
        acc = np.matmul(a, b)
        if acc.shape != self.mm_shape:
            acc = np.broadcast_to(acc, self.mm_shape)
        acc2 = np.ascontiguousarray(acc.reshape(self.R, self.N) if acc.ndim else acc.reshape(1, 1))
        from kernels import wmatmul as wm

        post = bind(self.steps, lambda tid: arrays[tid], self.mm_shape, self.R, self.N)
        ep = wm.make_epilogue(post, self.R, self.N)
        if self.dest_out:
            buf = outputs[self.dest].buffer
        else:
            dlt = self.request.lts[self.dest]
            buf = np.empty(int(np.prod(dlt.shape)), dtypes.numpy_dtype(dlt.dtype))
        flat = buf.view(np.uint16) if self.okind else buf
        self._store.store(acc2, flat, self.offsets[0], self.offsets[1], self.okind, ep)
        if not self.dest_out:
            arrays[self.dest] = buf.reshape(self.request.lts[self.dest].shape)
        self._post(arrays, outputs)

    def _post(self, arrays, outputs):
        if not self.post_steps:
            return
        for fn, op, out_lts, ctx in self.post_steps:
            for lt, v in zip(out_lts, fn(op, [arrays[x.id] for x in op.inputs], out_lts, ctx)):
                arrays[lt.id] = v
        for tid, tensor in outputs.items():
            if tid != self.dest or not self.dest_out:
                tensor.write(arrays[tid])


def _dense(shape) -> tuple:
    strides, acc = [], 1
    for d in reversed(tuple(shape)):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


def build(request: CompileRequest):
    """A :class:`MatmulPlan` for a partition with one MatMul, or why not."""
    mms = [op for op in request.ops if op.kind == K.MatMul]
    if len(mms) != 1:
        return f"{len(mms)} MatMul ops (the BLAS plan takes one)"
    mm, lts = mms[0], request.lts
    for lt in mm.inputs[:2]:
        if dtypes.info(lts[lt.id].dtype).kind != "float":
            return f"MatMul input {lt.id} is {lts[lt.id].dtype.name}"
    if lts[mm.outputs[0].id].dtype not in _OKIND:
        return f"MatMul output is {lts[mm.outputs[0].id].dtype.name}"
    walk = _Walk(request, mm).run()
    dest = lts[walk.value]
    if dest.dtype not in _OKIND:
        return f"chain ends in {dest.dtype.name}"
    if walk.value in request.output_ids and any(s < 0 for s in dest.strides):
        return "negative output strides"
    plan = MatmulPlan(request, walk)
    if plan.offsets is None:
        return "the output layout is not a row/column-separable view of the MatMul result"
    return plan

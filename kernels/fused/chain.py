"""A partition as ``head -> element-wise chain -> [layout ops]``, run in one store pass.

The *head* is the op that produces an f32 result (a MatMul on BLAS, a
normalization, a reduction, a binary op with broadcasting, or just the
widened input of a unary op).  :class:`Walk` follows the head's output
through its single consumers: ops of the post-op table
(``graph_api.postops``), BiasAdd, TypeCast to a float type, then
StaticReshape / StaticTranspose / Reorder.  The covered chain becomes one
epilogue program; the layout ops become the store's offsets
(``graph_api.kernels.store``).  Ops the walk does not cover run as reference steps
before (producers of the head's or chain's operands) or after (Select,
Dropout, Quantize tails); the plan's name lists them.
"""
from __future__ import annotations

import numpy as np

from graph_api import dtypes
from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K
from graph_api.postops import POST_OPS
from graph_api.kernels import scratch
from graph_api.kernels.plan import ComposedPlan, CompileRequest

from .epilogue import _ROUND_STEP, OPERAND_STEPS, bind, chain_program

LAYOUT = {K.StaticReshape, K.StaticTranspose, K.Reorder}
OKIND = {DataType.f32: 0, DataType.bf16: 1, DataType.f16: 2}


class Walk:
    """The head's output chain: element-wise steps, then layout ops."""

    def __init__(self, request: CompileRequest, head, value_id: int | None = None):
        self.request, self.head = request, head
        self.ops_by_id = {op.id: op for op in request.ops}
        self.consumers: dict[int, list] = {}
        for op in request.ops:
            for lt in op.inputs:
                self.consumers.setdefault(lt.id, []).append(op)
        self.covered = [head.id]
        self.steps: list = []
        self.layout: list = []
        self.value = head.outputs[0].id if value_id is None else value_id
        self.shape = tuple(request.lts[self.value].shape)

    def _next(self):
        """The single consumer of the running value (or a Sigmoid+Multiply pair)."""
        if self.value in self.request.output_ids:
            return None
        # an op reading the value at two inputs (Multiply(y, y)) is one consumer:
        # the epilogue reads its running value for the second input
        cons = list({op.id: op for op in self.consumers.get(self.value, [])}.values())
        if len(cons) == 2 and not self.layout:
            sig = next((op for op in cons if op.kind == K.Sigmoid), None)
            mul = next((op for op in cons if op.kind == K.Multiply), None)
            if sig is not None and mul is not None and \
                    {lt.id for lt in mul.inputs} == {self.value, sig.outputs[0].id} and \
                    sig.outputs[0].id not in self.request.output_ids:
                return [sig.id, mul.id]
        return [cons[0].id] if len(cons) == 1 else None

    def _round(self, op):
        out_type = self.request.lts[op.outputs[0].id].dtype
        if out_type in _ROUND_STEP:
            self.steps.append((_ROUND_STEP[out_type], None))

    def _elementwise(self, ids) -> bool:
        lts = self.request.lts
        op = self.ops_by_id[ids[-1]]
        if tuple(lts[op.outputs[0].id].shape) != self.shape:
            return False
        if any(dtypes.info(lts[lt.id].dtype).kind != "float" for lt in op.inputs):
            return False
        if op.kind == K.TypeCast:
            if lts[op.outputs[0].id].dtype not in OKIND:
                return False
            self._round(op)
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

    def run(self, layout: bool = True):
        lts = self.request.lts
        while (ids := self._next()) is not None:
            op = self.ops_by_id[ids[-1]]
            if op.kind == K.Reorder and lts[op.outputs[0].id].dtype == lts[self.value].dtype:
                # same logical values in another memory layout: nothing to compute
                self.covered.append(op.id)
                self.value = op.outputs[0].id
            elif op.kind in LAYOUT and len(ids) == 1 and layout:
                self.layout.append(op)
                self.covered.append(op.id)
                self.value = op.outputs[0].id
            elif self.layout or not self._elementwise(ids):
                break
        return self


def _is_f32_row(lt, shape) -> bool:
    """An f32 operand of one value per column of ``shape`` ([N], [1, N], [1, 1, N], ...)."""
    dims = tuple(lt.shape)
    return (lt.dtype == DataType.f32 and len(shape) > 0 and len(dims) <= len(shape) and len(dims) > 0
            and dims[-1] == shape[-1] and all(d == 1 for d in dims[:-1]))


def ancestors(request, targets: set[int]) -> set[int]:
    """Op ids inside the partition that produce (transitively) tensors ``targets``."""
    producer = {lt.id: op for op in request.ops for lt in op.outputs}
    seen, todo = set(), list(targets)
    while todo:
        op = producer.get(todo.pop())
        if op is not None and op.id not in seen:
            seen.add(op.id)
            todo += [lt.id for lt in op.inputs]
    return seen


def dense_strides(shape) -> tuple:
    strides, acc = [], 1
    for d in reversed(tuple(shape)):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


def _store_offsets(store, layout, lts, shape, strides, R, N):
    """``(roff, coff)``: where element [r, n] of the head's result goes in the
    destination (``shape``, ``strides``) through the ``layout`` ops (reshapes and
    transposes, applied from the destination back), or None when that is not
    ``roff[r] + coff[n]``.  Stride arithmetic (``O(R + N)`` memory); a reshape
    that strides cannot express is checked on a table of offsets, for at most
    :data:`store.TABLE_ELEMENTS` elements."""
    if R * N == 0:
        return np.zeros(R, np.int64), np.zeros(N, np.int64)
    strides = tuple(strides)
    for op in reversed(layout):
        if op.kind == K.StaticTranspose:
            back = np.argsort([o % len(shape) for o in op.attrs["order"]])
            shape, strides = tuple(shape[a] for a in back), tuple(strides[a] for a in back)
            continue
        new_shape = tuple(lts[op.inputs[0].id].shape)
        new_strides = store.reshape_strides(shape, strides, new_shape)
        if new_strides is None:
            return _table_offsets(store, layout, lts, shape, strides, op, R, N)
        shape, strides = new_shape, new_strides
    return store.row_col_offsets(shape, strides)


def _table_offsets(store, layout, lts, shape, strides, stuck, R, N):
    """The general case of :func:`_store_offsets` from the op ``stuck`` on, on a table."""
    if R * N > store.TABLE_ELEMENTS:
        return None
    off = store.element_offsets(shape, strides)
    ops = list(reversed(layout))
    for op in ops[ops.index(stuck):]:
        if op.kind == K.StaticTranspose:
            off = off.transpose(np.argsort([o % off.ndim for o in op.attrs["order"]]))
        else:
            off = off.reshape(lts[op.inputs[0].id].shape)
    return store.separable(off.reshape(R, N))


class ChainPlan:
    """Head (subclass) + epilogue store + reference steps around them.

    Subclasses set ``kernel`` (a name) and implement ``head(arrays)`` returning
    the head's f32 result (shape ``walk.shape``) and the epilogue steps that
    come before the walk's steps; ``head_inputs`` are the tensor ids it reads.
    """

    kernel = "chain"

    def __init__(self, request: CompileRequest, walk: Walk, head_inputs, head_steps=()):
        from graph_api.kernels import store

        lts = request.lts
        self.request, self.walk, self._store = request, walk, store
        self.steps = list(head_steps) + walk.steps
        #: id of an f32 [N] row :meth:`store` adds before the epilogue, or None (see
        #: :meth:`take_head_add`)
        self.head_add = None
        self.shape = walk.shape
        self.N = self.shape[-1] if self.shape else 1
        self.R = int(np.prod(self.shape)) // max(self.N, 1)
        covered = set(walk.covered)
        operands = set(head_inputs) | {lt.id for op in request.ops if op.id in covered
                                       for lt in op.inputs}
        before = ancestors(request, operands) - covered
        ref = ComposedPlan(request)
        self.pre_steps = [s for s in ref.steps if s[1].id in before]
        self.post_steps = [s for s in ref.steps if s[1].id not in before and s[1].id not in covered]
        self.dest = walk.value
        dest_lt = lts[self.dest]
        self.okind = OKIND.get(dest_lt.dtype)
        self.dest_out = self.dest in request.output_ids
        strides = tuple(dest_lt.strides) if self.dest_out else dense_strides(dest_lt.shape)
        self.dest_dense = strides == dense_strides(dest_lt.shape)
        self.offsets = _store_offsets(store, walk.layout, lts, tuple(dest_lt.shape), strides, self.R, self.N)
        #: columns stored consecutively (the store's run length), worked out once
        self.run_length = store.contiguous_run(self.offsets[1]) if self.offsets is not None else 1
        parts = [self.kernel]
        if self.pre_steps:
            parts.append("ref_pre[" + ",".join(s[1].kind.name for s in self.pre_steps) + "]")
        if self.post_steps:
            parts.append("ref_post[" + ",".join(s[1].kind.name for s in self.post_steps) + "]")
        self.name = "+".join(parts)

    def take_head_add(self) -> None:
        """Move a first ``add`` step of an f32 row operand (a MatMul's bias) out of the
        program into :meth:`store`'s row read: one pass less, and the program keeps at
        most the other operand as its buffer (no copy of a residual per call).  Only
        for plans whose every result goes through :meth:`store`."""
        first = self.steps[0] if self.steps else (None, None)
        if first[0] == "add" and isinstance(first[1], int) and \
                _is_f32_row(self.request.lts[first[1]], self.shape):
            self.head_add = first[1]
            self.steps = self.steps[1:]

    def reason(self) -> str | None:
        """Why this plan cannot run these shapes/types, or None."""
        if self.okind is None:
            return f"the chain ends in {self.request.lts[self.dest].dtype.name}"
        if self.offsets is None:
            return "the output layout is not a row/column-separable view of the result"
        if self.dest_out and any(s < 0 for s in self.request.lts[self.dest].strides):
            return "negative output strides"
        return None

    # -------------------------------------------------------------- running
    def _dest_buffer(self, outputs):
        if self.dest_out:
            return outputs[self.dest].buffer
        dlt = self.request.lts[self.dest]
        return scratch.empty(int(np.prod(dlt.shape)), dtypes.numpy_dtype(dlt.dtype))

    def epilogue(self, arrays, R=None, N=None):
        """The epilogue program of this call's operand arrays.

        Kept while the operands are the same memory (address, shape, strides): a
        program whose buffer is the one operand itself is reused as it is; one whose
        buffer holds copies (several operands, converted or broadcast ones) gets
        them copied again into the same buffer (the values may have changed).
        """
        R = self.R if R is None else R
        N = self.N if N is None else N
        operands = [arrays[arg] for name, arg in self.steps if isinstance(arg, int) and name in OPERAND_STEPS]
        cached = self.__dict__.get("_ep_cache")
        if cached is not None and not cached[2] and cached[3] == (R, N) and len(cached[4]) == len(operands) \
                and all(a is b for a, b in zip(cached[4], operands)):
            return cached[1]  # the same array objects (so the same memory) as last time
        key = (R, N) + tuple((a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str)
                             for a in operands)
        if cached is not None and cached[0] == key and not cached[2]:
            self._ep_cache = cached[:4] + (operands,)
            return cached[1]
        from graph_api.kernels.weight_compressed import wmatmul as wm

        old_buf = cached[1].buf if cached is not None and cached[2] else None
        ep = wm.make_epilogue(bind(self.steps, lambda tid: arrays[tid], self.shape, R, N), R, N, old_buf)
        copied = bool(operands) and not (
            len(operands) == 1 and ep.buf.__array_interface__["data"][0] == key[2][0])
        self._ep_cache = (key, ep, copied, (R, N), operands)
        return ep

    def store(self, acc, arrays, outputs) -> None:
        """Epilogue + convert + strided store of the f32 head result ``acc``."""
        buf = self._dest_buffer(outputs)
        if acc.size:
            acc2 = np.ascontiguousarray(acc.reshape(self.R, self.N), dtype=np.float32)
            head = self._store.NO_HEAD if self.head_add is None else \
                np.ascontiguousarray(arrays[self.head_add], dtype=np.float32).reshape(-1)
            self._store.store(acc2, buf.view(np.uint16) if self.okind else buf,
                              self.offsets[0], self.offsets[1], self.okind, self.epilogue(arrays),
                              self.run_length, head)
        self.finish(buf, arrays, outputs)

    def finish(self, buf, arrays, outputs) -> None:
        if not self.dest_out:
            arrays[self.dest] = buf.reshape(self.request.lts[self.dest].shape)
        if not self.post_steps:
            return
        run_steps(self.post_steps, arrays)
        for tid, tensor in outputs.items():
            if tid != self.dest or not self.dest_out:
                tensor.write(arrays[tid])

    def head(self, arrays):
        """The f32 head result the chain runs on; each subclass (matmul, element-wise,
        norm, reduce, formula plans) computes its own."""
        raise NotImplementedError(f"{type(self).__name__} defines no head")  # abstract

    def execute(self, inputs: dict, outputs: dict) -> None:
        arrays = {tid: t.numpy() for tid, t in inputs.items()}
        run_steps(self.pre_steps, arrays)
        self.run(arrays, outputs)

    def run(self, arrays, outputs) -> None:
        self.store(self.head(arrays), arrays, outputs)


def run_steps(steps, arrays) -> None:
    for fn, op, out_lts, ctx in steps:
        for lt, v in zip(out_lts, fn(op, [arrays[x.id] for x in op.inputs], out_lts, ctx)):
            arrays[lt.id] = v

"""Sparse MatMul partitions: SpMM on Numba kernels with the MatMul post-op epilogue fused.

Serves ``sparse_matmul_post_ops`` (a MatMul with one sparse 2-D operand, then
bias and post-ops) and single sparse MatMul ops::

    out = S_eff @ D_eff                 graph_api.kernels.sparse: CSR / BCSR / 2:4 row kernels,
                                        row-parallel, f32 sums of stored entries
    y   = chain(out)                    bias + post-ops (graph_api.postops) applied to each
                                        finished row inside the kernel when the
                                        result lands in the output as is; otherwise
                                        in the store pass (graph_api.kernels.store)

Orientation: ``S @ D`` runs S's row form directly; ``D @ S`` runs
``(S^T @ D^T)^T`` (the dense operand is transposed once, the result is
transposed by the store).  A row form that needs a conversion (CSC rows, a
transposed CSR, COO/DCSR as CSR, a transposed BCSR) is built with the
conversion kernels and cached on the storage for constant tensors (oneDNN's
rule: constant data does not change).

Every other partition touching sparse tensors runs
``graph_api.kernels.sparse_ops.SparseComposedPlan``.
"""
from __future__ import annotations

import numpy as np

from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K
from graph_api.enums import PropertyType
from graph_api.sparse_encoding import kind as encoding_kind
from graph_api.kernels.plan import CompileRequest
from graph_api.kernels.sparse_ops import Coo, SparseComposedPlan, _csr_of, operand

from .chain import ChainPlan, Walk


def row_form(storage, transpose: bool):
    """``S`` (or ``S^T``) as ('csr', indptr, indices, values) | ('bcsr', bptr, bidx, blocks)
    | ('2of4', values and 2-bit indices interleaved by blocks of rows: kernels.sparse.interleave_2of4)."""
    from graph_api.kernels import sparse as sk

    key = ("row_form", transpose)
    hit = storage._cache.get(key)
    if hit is not None:
        return hit
    kind = encoding_kind(storage.encoding)
    R, C = storage.shape
    f32 = lambda v: np.ascontiguousarray(v, np.float32)
    if kind in ("csr", "csc") and (kind == "csc") == transpose:  # the arrays are the rows we want
        lv = storage.levels[1]
        form = ("csr", lv.positions, lv.coordinates, f32(storage.values))
    elif kind in ("csr", "csc"):  # rows of the other orientation: counting-sort transpose
        lv = storage.levels[1]
        ptr, idx, perm = sk.csr_transpose(lv.positions, lv.coordinates, R if kind == "csc" else C)
        form = ("csr", ptr, idx, f32(storage.values[perm]))
    elif kind == "bcsr":
        br, bc = storage.encoding.levels[2].block, storage.encoding.levels[3].block
        lv = storage.levels[1]
        blocks = f32(storage.values).reshape(-1, br, bc)
        if not transpose:
            form = ("bcsr", lv.positions, lv.coordinates, blocks)
        else:
            ptr, idx, perm = sk.csr_transpose(lv.positions, lv.coordinates, C // bc)
            form = ("bcsr", ptr, idx, np.ascontiguousarray(blocks[perm].transpose(0, 2, 1)))
    elif kind == "nm" and _is_2of4(storage.encoding, transpose, C):
        form = ("2of4",) + sk.interleave_2of4(storage.values, storage.levels[2].coordinates, R)
    else:  # any other encoding: CSR built from its canonical COO
        coords, values = storage.canonical()
        c = Coo(storage.shape, coords, values)
        if transpose:
            from graph_api.kernels.sparse_ops import _t

            c = _t(c)
        form = ("csr",) + _csr_of(c)
    # uint32 views of the (validated, non-negative) indices: no wrap-around checks in the kernels
    form = tuple(a.view(np.uint32) if isinstance(a, np.ndarray) and a.dtype == np.int32 else a for a in form)
    storage._cache[key] = form
    return form


def _is_2of4(enc, transpose: bool, columns: int) -> bool:
    """The 2:4 kernel's case: rows of 2:4 groups, a whole number of index bytes per row."""
    return not transpose and (enc.levels[2].n, enc.levels[2].m) == (2, 4) and columns % 8 == 0


def form_name(enc, transpose: bool, columns: int = 8) -> str:
    """The kernel :func:`row_form` leads to, and the conversion before it: 'spmm_csr',
    'spmm_csr(from csc)', 'spmm_bcsr(transposed)', 'spmm_2of4', 'spmm_csr(from COO)'..."""
    kind = encoding_kind(enc)
    if kind in ("csr", "csc"):
        return "spmm_csr" if (kind == "csc") == transpose else f"spmm_csr(transposed {kind})"
    if kind == "bcsr":
        return "spmm_bcsr" + ("(transposed)" if transpose else "")
    if kind == "nm" and _is_2of4(enc, transpose, columns):
        return "spmm_2of4"
    return f"spmm_csr(from {enc!r})"


def spmm(form, D, out, ep, use_ep: bool) -> None:
    from graph_api.kernels import sparse as sk

    if form[0] == "csr":
        sk.spmm_csr(form[1], form[2], form[3], D, out, ep.ops, ep.fpar, ep.ipar, ep.buf, use_ep)
    elif form[0] == "bcsr":
        sk.spmm_bcsr(form[1], form[2], form[3], D, out, ep.ops, ep.fpar, ep.ipar, ep.buf, use_ep)
    else:
        kernel = sk.spmv_2of4 if D.shape[1] == 1 else sk.spmm_2of4
        kernel(form[1], form[2], D.reshape(-1) if D.shape[1] == 1 else D, out, ep.ops, ep.fpar, ep.ipar,
               ep.buf, use_ep)


class SparseMatmulPlan(ChainPlan):
    """See the module docstring."""

    kernel = "spmm"

    def __init__(self, request: CompileRequest, walk: Walk):
        lts, mm = request.lts, walk.head
        self.a_id, self.b_id = mm.inputs[0].id, mm.inputs[1].id
        self.ta, self.tb = bool(mm.attrs["transpose_a"]), bool(mm.attrs["transpose_b"])
        self.sparse_a = lts[self.a_id].encoding is not None
        sparse_id = self.a_id if self.sparse_a else self.b_id
        self.sparse_const = lts[sparse_id].property == PropertyType.constant
        pre = [("add", mm.inputs[2].id)] if len(mm.inputs) > 2 else []
        super().__init__(request, walk, [lt.id for lt in mm.inputs], pre)
        enc = lts[sparse_id].encoding
        self.transpose_s = self.ta if self.sparse_a else not self.tb  # S_eff = op(A), or op(B)^T
        self.kernel_name = form_name(enc, self.transpose_s, lts[sparse_id].shape[1])
        self.name = self.name.replace("spmm", self.kernel_name, 1)
        self.direct = self.sparse_a and not walk.layout and self.okind == 0 and self.dest_out and self.dest_dense
        from graph_api.kernels.weight_compressed.wmatmul import make_epilogue

        self._no_epilogue = make_epilogue([], 1, 1)  # the kernel's epilogue arguments when the store applies it

    def _form(self, storage, transpose: bool):
        form = row_form(storage, transpose)
        if not self.sparse_const:  # variable data may change between executes: do not keep conversions
            storage._cache.pop(("row_form", transpose), None)
        return form

    def execute(self, inputs: dict, outputs: dict) -> None:
        arrays = {tid: operand(t) for tid, t in inputs.items()}
        from .chain import run_steps

        run_steps(self.pre_steps, arrays)
        self.run(arrays, outputs)

    def run(self, arrays, outputs) -> None:
        if self.sparse_a:
            form = self._form(arrays[self.a_id], self.transpose_s)
            b = np.asarray(arrays[self.b_id])
            D = np.ascontiguousarray((b.T if self.tb else b), np.float32)
            if self.direct:
                out = outputs[self.dest].numpy().reshape(self.R, self.N)
                spmm(form, D, out, self.epilogue(arrays), True)
                return self.finish(outputs[self.dest].buffer, arrays, outputs)
            acc = np.empty((self.R, self.N), np.float32)
            spmm(form, D, acc, self._no_epilogue, False)
            return self.store(acc, arrays, outputs)
        # D @ S = (S^T @ D^T)^T, D's rows flattened (a linear layer over [..., K])
        form = self._form(arrays[self.b_id], self.transpose_s)
        a = np.asarray(arrays[self.a_id])
        a2 = a.reshape(-1, a.shape[-1]) if not self.ta else a.T
        D = np.ascontiguousarray(a2.T, np.float32)
        res = np.empty((self.shape[-1], D.shape[1]), np.float32)
        spmm(form, D, res, self._no_epilogue, False)
        self.store(res.T, arrays, outputs)


def build(request: CompileRequest):
    """A :class:`SparseMatmulPlan`, else the sparse composed plan (never the dense kernels)."""
    plan = _matmul_plan(request)
    if isinstance(plan, str):
        from graph_api.config import log

        log(f"refused,{request.pattern},spmm,{plan}")
        return SparseComposedPlan(request)
    return plan


def _matmul_plan(request: CompileRequest):
    lts = request.lts
    mms = [op for op in request.ops if op.kind == K.MatMul]
    if len(mms) != 1:
        return f"{len(mms)} MatMul ops"
    mm = mms[0]
    a, b = (lts[lt.id] for lt in mm.inputs[:2])
    if (a.encoding is None) == (b.encoding is None):
        return "SpMM needs exactly one sparse MatMul operand"
    s, d = (a, b) if a.encoding is not None else (b, a)
    if len(s.shape) != 2:
        return f"sparse operand of rank {len(s.shape)} (the SpMM kernels take 2-D)"
    if s.dtype != DataType.f32 or d.dtype != DataType.f32 or lts[mm.outputs[0].id].dtype != DataType.f32:
        return "SpMM kernels take f32 operands and result"
    if (a.encoding is not None and len(d.shape) != 2) or (a.encoding is None and mm.attrs["transpose_a"]
                                                            and len(d.shape) != 2):
        return "the dense operand must be 2-D here"
    if 0 in a.shape or 0 in b.shape:
        return "empty operand"
    if any(lts[t].encoding is not None for t in request.output_ids) or \
            any(lts[lt.id].encoding is not None for op in request.ops if op is not mm
                for lt in list(op.inputs) + list(op.outputs)):
        return "sparse tensors beyond the MatMul operand"
    if len(mm.inputs) > 2 and lts[mm.inputs[2].id].dtype != DataType.f32:
        return "bias is not f32"
    walk = Walk(request, mm).run()
    plan = SparseMatmulPlan(request, walk)
    return plan.reason() or plan

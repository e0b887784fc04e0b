"""Sparse semantics of the closed-world ops (``graph_api.sparse_ops``), op by op.

``SparseComposedPlan`` runs a partition that touches sparse tensors: each op
with a sparse operand or result runs its function in :data:`SPARSE_KERNELS`
on *canonical COO* (row-major sorted dimension coordinates, duplicates summed)
or dense arrays; other ops run the numpy reference.  Value arithmetic reuses
the reference op on the 1-D arrays of stored values, so rounding and type
conversion are the reference's.  A result is stored as the output logical
tensor declares: dense, or the declared encoding built from the result's
coordinates (explicit zeros kept; dense -> sparse keeps the non-zeros).

Operands with matching patterns (same encoding and level arrays) and unary
ops keep the storage's structure and compute on the value arrays only.

Semantics (docs/sparse.md): only stored entries take part, so ``x * 0`` and
``0 * NaN`` are skipped: Multiply keeps the intersection of the patterns,
Add/Subtract the union (a dense operand makes the result dense), MatMul sums
products of stored entries only, ReduceMax includes the implicit zeros of a
slice that is not fully stored.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graph_api import dtypes
from graph_api.enums import OpKind as K
from graph_api.errors import Unimplemented, op_label
from graph_api.logical_tensor import LogicalTensor
from graph_api.sparse_ops import CONVERSIONS, ZERO_PRESERVING_UNARY
from graph_api.sparse_storage import SparseStorage, canonical_coo
from graph_api.kernels.plan import CompileRequest, ComposedPlan
from graph_api.kernels.reference import REFERENCE
from graph_api.kernels.reference._common import norm_axis


@dataclass
class Coo:
    """Canonical COO: coordinates ``[nse, rank]`` row-major sorted and unique."""

    shape: tuple
    coords: np.ndarray
    values: np.ndarray

    def dense(self, dtype=None) -> np.ndarray:
        out = np.zeros(self.shape, self.values.dtype if dtype is None else dtype)
        out[tuple(self.coords.T)] = self.values
        return out

    def linear(self) -> np.ndarray:
        return np.ravel_multi_index(tuple(self.coords.T), self.shape) if self.coords.size else \
            np.zeros(0, np.int64)


def as_coo(x) -> Coo:
    if isinstance(x, Coo):
        return x
    if isinstance(x, SparseStorage):
        return Coo(x.shape, *x.canonical())
    x = np.asarray(x)  # a dense operand of a sparse-result op: its non-zeros (the seed's convert)
    coords = np.argwhere(x != 0)
    return Coo(x.shape, coords, x[tuple(coords.T)])


def as_dense(x) -> np.ndarray:
    if isinstance(x, SparseStorage):
        return x.to_dense()
    if isinstance(x, Coo):
        return x.dense()
    return x


def _values_lt(lt: LogicalTensor, n: int) -> LogicalTensor:
    return LogicalTensor(lt.id, lt.dtype, (n,))


def _on_values(op, values: list, out_lt, ctx) -> np.ndarray:
    """The reference op applied to aligned 1-D value arrays."""
    n = values[0].shape[0]
    return REFERENCE[op.kind](op, values, [_values_lt(out_lt, n)], ctx)[0]


# ---------------------------------------------------------------- element-wise
def same_pattern(a, b) -> bool:
    """Two storages with the same encoding, shape and level arrays (matching patterns)."""
    if not (isinstance(a, SparseStorage) and isinstance(b, SparseStorage)) or not unique(a):
        return False
    if a is b:
        return True
    if a.encoding != b.encoding or a.shape != b.shape or a.nse != b.nse:
        return False
    return all(np.array_equal(x.positions, y.positions) and np.array_equal(x.coordinates, y.coordinates)
               for x, y in zip(a.levels, b.levels))


def unique(st: SparseStorage) -> bool:
    """No duplicates: each stored value is one element (with duplicates an element is their sum)."""
    return all(lv.unique for lv in st.encoding.levels)


def with_values(st: SparseStorage, values: np.ndarray, lt) -> SparseStorage:
    """``st``'s structure (level arrays shared, not copied) with new values of ``lt``'s type."""
    return SparseStorage(st.encoding, st.shape, lt.dtype, st.levels, values, validate=False)


def unary(op, ins, out_lts, ctx):
    x = ins[0]
    if isinstance(x, np.ndarray):
        return REFERENCE[op.kind](op, ins, out_lts, ctx)
    if isinstance(x, SparseStorage) and unique(x):  # stored values only; the structure is kept
        return [with_values(x, _on_values(op, [x.values], out_lts[0], ctx), out_lts[0])]
    c = as_coo(x)
    return [Coo(c.shape, c.coords, _on_values(op, [c.values], out_lts[0], ctx))]


def binary(op, ins, out_lts, ctx):
    out_shape = tuple(out_lts[0].shape)
    a, b = ins
    if same_pattern(a, b):  # matching patterns: one pass over the value arrays
        return [with_values(a, _on_values(op, [a.values, b.values], out_lts[0], ctx), out_lts[0])]
    sparse = [not isinstance(x, np.ndarray) for x in (a, b)]
    if op.kind == K.Multiply and any(sparse):
        # intersection: a stored entry times the other operand's value there (0 * x skipped)
        if all(sparse):
            ca, cb = as_coo(a), as_coo(b)
            la, lb = ca.linear(), cb.linear()
            common, ia, ib = np.intersect1d(la, lb, assume_unique=True, return_indices=True)
            coords = np.stack(np.unravel_index(common, out_shape), axis=1) if common.size else ca.coords[:0]
            return [Coo(out_shape, coords, _on_values(op, [ca.values[ia], cb.values[ib]], out_lts[0], ctx))]
        s, d = (as_coo(a), b) if sparse[0] else (as_coo(b), a)
        dvals = np.broadcast_to(d, out_shape)[tuple(s.coords.T)]
        pair = [s.values, dvals] if sparse[0] else [dvals, s.values]
        return [Coo(out_shape, s.coords, _on_values(op, pair, out_lts[0], ctx))]
    if all(sparse):  # Add / Subtract: union, the missing side is 0
        ca, cb = as_coo(a), as_coo(b)
        la, lb = ca.linear(), cb.linear()
        union = np.union1d(la, lb)
        va = np.zeros(union.size, ca.values.dtype)
        vb = np.zeros(union.size, cb.values.dtype)
        va[np.searchsorted(union, la)] = ca.values
        vb[np.searchsorted(union, lb)] = cb.values
        coords = np.stack(np.unravel_index(union, out_shape), axis=1) if union.size else ca.coords[:0]
        return [Coo(out_shape, coords, _on_values(op, [va, vb], out_lts[0], ctx))]
    # Add / Subtract with a dense operand: the result is dense (x + 0 = x)
    return REFERENCE[op.kind](op, [as_dense(a), as_dense(b)], out_lts, ctx)


def convert(op, ins, out_lts, ctx):
    """Reorder / TypeCast: the seed's convert (storage follows the output's declaration)."""
    x = ins[0]
    if isinstance(x, np.ndarray):
        return REFERENCE[op.kind](op, ins, out_lts, ctx)
    c = as_coo(x)
    return [Coo(c.shape, c.coords, _on_values(op, [c.values], out_lts[0], ctx))]


# ---------------------------------------------------------------- reductions
def reduce(op, ins, out_lts, ctx):
    from graph_api.kernels.reference.reduce import reduce_axes

    c = as_coo(ins[0])
    axes = reduce_axes(op, [c.values] + list(ins[1:]), len(c.shape))
    keep = [d for d in range(len(c.shape)) if d not in axes]
    kept_shape = tuple(c.shape[d] for d in keep)
    slot = np.ravel_multi_index(tuple(c.coords[:, keep].T), kept_shape) if keep and c.coords.size else \
        np.zeros(c.coords.shape[0], np.int64)
    size = int(np.prod(kept_shape))
    values = c.values.astype(np.float64)
    if op.kind == K.ReduceSum:
        out = np.bincount(slot, weights=values, minlength=size)
    else:  # ReduceMax: stored values, and 0 where a slice has an unstored entry
        out = np.full(size, -np.inf)
        np.maximum.at(out, slot, values)
        per_slice = int(np.prod([c.shape[a] for a in axes]))
        partial = np.bincount(slot, minlength=size) < per_slice
        out[partial] = np.maximum(out[partial], 0.0)
        nan = np.zeros(size, bool)
        nan[slot[np.isnan(values)]] = True
        out[nan] = np.nan
    return [dtypes.convert(out.astype(np.float32).reshape(out_lts[0].shape), out_lts[0].dtype)]


# ---------------------------------------------------------------- reshaping
def reshape(op, ins, out_lts, ctx):
    c = as_coo(ins[0])
    shape = tuple(out_lts[0].shape)
    coords = np.stack(np.unravel_index(c.linear(), shape), axis=1) if c.coords.size else \
        np.zeros((0, len(shape)), np.int64)
    return [Coo(shape, coords, c.values)]


def transpose(op, ins, out_lts, ctx):
    c = as_coo(ins[0])
    rank = len(c.shape)
    order = [norm_axis(int(a), rank) for a in op.attrs.get("order") or []] or list(range(rank))[::-1]
    shape = tuple(out_lts[0].shape)
    coords, values = canonical_coo(shape, c.coords[:, order], c.values)
    return [Coo(shape, coords, values)]


def concat(op, ins, out_lts, ctx):
    shape = tuple(out_lts[0].shape)
    axis = norm_axis(int(op.attrs["axis"]), len(shape))
    parts, offset = [], 0
    for x in ins:
        c = as_coo(x)
        coords = c.coords.copy()
        coords[:, axis] += offset
        offset += c.shape[axis]
        parts.append((coords, c.values.astype(np.float32)))
    coords = np.concatenate([p[0] for p in parts])
    values = np.concatenate([p[1] for p in parts])
    coords, values = canonical_coo(shape, coords, values)
    return [Coo(shape, coords, dtypes.convert(values, out_lts[0].dtype))]


# ---------------------------------------------------------------- MatMul
def _csr_of(c: Coo):
    """(indptr, indices, values f32) of a canonical 2-D COO (rows already sorted)."""
    rows = c.coords[:, 0]
    indptr = np.zeros(c.shape[0] + 1, np.int32)
    indptr[1:] = np.cumsum(np.bincount(rows, minlength=c.shape[0]))
    return (indptr.view(np.uint32), np.ascontiguousarray(c.coords[:, 1], np.int32).view(np.uint32),
            np.ascontiguousarray(c.values, np.float32))


def _t(c: Coo) -> Coo:
    coords = c.coords[:, ::-1] if len(c.shape) == 2 else c.coords
    shape = c.shape[::-1]
    return Coo(shape, *canonical_coo(shape, np.ascontiguousarray(coords), c.values))


def _batches(x, rank: int):
    """{batch index tuple: 2-D slice} of an operand (COO or dense)."""
    if isinstance(x, np.ndarray):
        lead = x.shape[:-2]
        return {idx: x[idx] for idx in np.ndindex(*lead)} if lead else {(): x}
    lead = x.shape[:-2]
    out = {}
    for idx in (np.ndindex(*lead) if lead else [()]):
        out[idx] = Coo(x.shape[-2:], np.zeros((0, 2), np.int64), x.values[:0])
    if lead and x.coords.size:
        lin = np.ravel_multi_index(tuple(x.coords[:, :-2].T), lead)
        for k in np.unique(lin):
            sel = lin == k
            out[tuple(np.unravel_index(k, lead))] = Coo(x.shape[-2:], x.coords[sel, -2:], x.values[sel])
    elif x.coords.size:
        out[()] = Coo(x.shape, x.coords, x.values)
    return out


def _mm2d(a, b) -> np.ndarray:
    """f32 ``a @ b`` of 2-D operands, at least one canonical COO; stored entries only."""
    from graph_api.kernels import sparse as sk
    from graph_api.kernels.weight_compressed.wmatmul import make_epilogue

    ep = make_epilogue([], 1, 1)
    if isinstance(a, Coo) and isinstance(b, Coo):
        out = np.empty((a.shape[0], b.shape[1]), np.float32)
        sk.spmspm_csr(*_csr_of(a), *_csr_of(b), out)
        return out
    if isinstance(a, Coo):
        d = np.ascontiguousarray(b, np.float32)
        out = np.empty((a.shape[0], d.shape[1]), np.float32)
        sk.spmm_csr(*_csr_of(a), d, out, ep.ops, ep.fpar, ep.ipar, ep.buf, False)
        return out
    return _mm2d(_t(b), np.ascontiguousarray(np.asarray(a, np.float32).T)).T  # a @ b = (b^T a^T)^T


def matmul(op, ins, out_lts, ctx):
    a, b = ins[0], ins[1]
    a = a if isinstance(a, np.ndarray) else as_coo(a)
    b = b if isinstance(b, np.ndarray) else as_coo(b)
    if op.attrs["transpose_a"]:
        a = np.swapaxes(a, -1, -2) if isinstance(a, np.ndarray) else _swap_last(a)
    if op.attrs["transpose_b"]:
        b = np.swapaxes(b, -1, -2) if isinstance(b, np.ndarray) else _swap_last(b)
    out_shape = tuple(out_lts[0].shape)
    lead = out_shape[:-2]
    ba, bb = _batches(a, len(a.shape)), _batches(b, len(b.shape))
    acc = np.zeros(out_shape, np.float32)
    for idx in (np.ndindex(*lead) if lead else [()]):
        ia = _bcast(idx, a.shape[:-2])
        ib = _bcast(idx, b.shape[:-2])
        acc[idx] = _mm2d(ba[ia], bb[ib])
    if len(ins) > 2:  # dense bias, broadcast as the reference does
        acc = (acc + np.asarray(ins[2], np.float32)).astype(np.float32)
    return [dtypes.convert(acc, out_lts[0].dtype)]


def _swap_last(c: Coo) -> Coo:
    coords = c.coords.copy()
    coords[:, [-2, -1]] = coords[:, [-1, -2]]
    shape = c.shape[:-2] + (c.shape[-1], c.shape[-2])
    return Coo(shape, *canonical_coo(shape, coords, c.values))


def _bcast(idx, lead) -> tuple:
    """The batch index of an operand with batch dims ``lead`` for output batch ``idx``."""
    idx = idx[len(idx) - len(lead):] if lead else ()
    return tuple(0 if d == 1 else i for i, d in zip(idx, lead))


#: op kind -> sparse semantics; every kind of graph_api.sparse_ops.SPARSE_OPS has one
SPARSE_KERNELS = {
    K.MatMul: matmul,
    **{k: unary for k in ZERO_PRESERVING_UNARY},
    **{k: binary for k in (K.Add, K.Subtract, K.Multiply)},
    **{k: convert for k in CONVERSIONS},
    K.ReduceSum: reduce, K.ReduceMax: reduce,
    K.StaticReshape: reshape, K.StaticTranspose: transpose, K.Concat: concat,
}


def materialize(result, lt: LogicalTensor):
    """A kernel's result as the output logical tensor declares it."""
    if lt.encoding is None:
        array = as_dense(result)
        return array if array.dtype == dtypes.numpy_dtype(lt.dtype) else dtypes.convert(array, lt.dtype)
    if isinstance(result, Coo):
        return SparseStorage.from_coo(lt.encoding, lt.shape, lt.dtype, result.coords, result.values)
    if isinstance(result, SparseStorage):
        if result.encoding == lt.encoding and result.dtype == lt.dtype:
            return result
        return SparseStorage.from_coo(lt.encoding, lt.shape, lt.dtype, *result.canonical())
    return SparseStorage.from_dense(lt.encoding, np.asarray(result), lt.dtype)


def compile_checks(request: CompileRequest) -> str | None:
    """Shape rules of the sparse semantics, checked before anything runs (or None)."""
    lts = request.lts
    for op in request.ops:
        encs = [lts[lt.id].encoding for lt in op.inputs]
        if not any(encs) and lts[op.outputs[0].id].encoding is None:
            continue
        out_shape = tuple(lts[op.outputs[0].id].shape)
        if op.kind in (K.Add, K.Subtract, K.Multiply):
            for lt, enc in zip(op.inputs, encs):
                if enc is not None and tuple(lts[lt.id].shape) != out_shape:
                    return (f"{op_label(op)}: sparse input {lt.id} of shape {list(lts[lt.id].shape)} would "
                            f"broadcast to {list(out_shape)}; sparse operands do not broadcast")
            if op.attrs.get("auto_broadcast") == "none" and len({tuple(lts[lt.id].shape) for lt in op.inputs}) > 1:
                return f"{op_label(op)}: auto_broadcast none with different shapes"
        if op.kind == K.MatMul:
            for lt, enc in zip(op.inputs[:2], encs[:2]):
                if enc is not None and len(lts[lt.id].shape) < 2:
                    return f"{op_label(op)}: sparse input {lt.id} must have rank >= 2"
    return None


class SparseComposedPlan:
    """Sparse ops through :data:`SPARSE_KERNELS`, the others through the reference."""

    name = "sparse_composed"

    def __init__(self, request: CompileRequest):
        reason = compile_checks(request)
        if reason:
            raise Unimplemented(reason)
        self.request = request
        self.steps = ComposedPlan(request).steps
        lts = request.lts
        self.sparse_step = [any(lts[lt.id].encoding is not None for lt in list(op.inputs) + list(op.outputs))
                            for _, op, _, _ in self.steps]

    def run_arrays(self, arrays: dict) -> dict:
        lts = self.request.lts
        for (fn, op, out_lts, ctx), sparse in zip(self.steps, self.sparse_step):
            ins = [arrays[lt.id] for lt in op.inputs]
            if sparse:
                results = SPARSE_KERNELS[op.kind](op, ins, out_lts, ctx)
                results = [materialize(r, lts[lt.id]) for r, lt in zip(results, op.outputs)]
            else:
                results = fn(op, ins, out_lts, ctx)
            for lt, value in zip(out_lts, results):
                arrays[lt.id] = value
        return arrays

    def execute(self, inputs: dict, outputs: dict) -> None:
        arrays = self.run_arrays({tid: operand(t) for tid, t in inputs.items()})
        for tid, tensor in outputs.items():
            tensor.write(arrays[tid])


def operand(tensor):
    """What plans compute on: the storage of a sparse tensor, the array of a dense one."""
    return tensor.storage if tensor.lt.encoding is not None else tensor.numpy()

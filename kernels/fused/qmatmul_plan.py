"""Static int8/u8 MatMul (``matmul_quantized``) on an exact integer GEMM.

::

    Dequantize(qa; sa, za) ─┐
    [Quantize(W)] ─ Dequantize(qb; sb, zb) ─┴ MatMul ─ [bias] ─ post-ops ─ [Quantize(qs, qz)]

    acc   = (qa - za) @ (qb - zb)      exact integer sums: the int8 GEMM of kernels/igemm.py
                                       (AVX-512 VNNI, int32), or, when the zero points vary
                                       along K or M or the sum may pass int32: f32 BLAS over
                                       K chunks of at most 2**24 / (max|qa - za| * max|qb - zb|)
                                       terms (every partial sum an exact f32 integer), or
                                       one f64 GEMM when that needs > MAX_CHUNKS
    out   = quantize(chain(f32(acc * sa * sb[n])))      one pass, kernels.qmatmul

Both GEMMs give the same exact integers.  The weight (packed for the int8
GEMM, or its centred f32 values ``qb - zb``; after the weight Quantize when the
partition quantizes a constant f32 weight) is prepared once per constant
buffer.  The scales must factor out of the sum: the src scale per tensor,
the weight scale per tensor or per output column (N); zero points may have
any granularity (they are subtracted before the GEMM).

Against the reference (which sums the f32-rounded dequantized values in f64)
the result differs only by the rounding of each ``(q - z) * s`` product, a
relative ``2**-24`` per term (the f32 accumulation bound), so a quantized
output may differ by one where the reference lands that close to a .5
boundary (``graph_api.check``'s integer rule).  Refused (the BLAS MatMul plan
with the dequantizing ops as reference steps runs instead): TypeCasts between
Dequantize and MatMul, fp8 data, scales varying along K, fpmath rounding of
dequantized inputs, f16 accumulation, 1-D operands.
"""
from __future__ import annotations

import numpy as np

from graph_api import constant_cache, dtypes
from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K
from graph_api.enums import PropertyType
from graph_api.kernels import scratch
from graph_api.kernels.plan import CompileRequest

from .chain import ChainPlan, Walk
from .epilogue import _ROUND_STEP

_INT8 = (DataType.s8, DataType.u8)
#: more K chunks than this and one f64 GEMM is cheaper than C f32 GEMMs plus their partial sums
MAX_CHUNKS = 4
#: integers up to this magnitude are exact in f32 (24-bit significand)
_F32_EXACT = 2.0 ** 24


def _params(op):
    """(scales, zps or None) of a static (de)quantize op as f32 arrays."""
    zps = op.attrs["zps"]
    return (np.asarray(op.attrs["scales"], np.float32),
            np.asarray(zps, np.float32) if zps else None)


def _centre(op, q) -> np.ndarray:
    """``q - zp`` in f32 (exact for 8-bit data), zp broadcast per the op's qtype."""
    from graph_api.kernels.reference.quant import apply_params

    scales, zps = _params(op)
    x = np.asarray(q).astype(np.float32)
    if zps is None:
        return x
    return apply_params(lambda v, s, z: v - z, x, scales, zps, op)


class _Operand:
    """One MatMul operand dequantized from s8/u8 in the partition.

    ``tid`` is the tensor the plan reads: the integer input of the Dequantize,
    or the f32 constant that a weight Quantize turns into integers.
    """

    def __init__(self, request, deq, quant, transpose: bool):
        self.deq, self.quant, self.transpose = deq, quant, transpose
        self.tid = (quant or deq).inputs[0].id
        lts = request.lts
        self.int_lt = lts[deq.inputs[0].id]
        info = dtypes.info(lts[deq.inputs[0].id].dtype)
        self.scales, zps = _params(deq)
        z = np.zeros(1, np.float32) if zps is None else zps
        #: the largest |q - zp| the integer type allows
        self.bound = float(max(np.max(np.abs(info.highest - z)), np.max(np.abs(info.lowest - z))))
        self.per_tensor_zp = zps is None or zps.size == 1
        self.zp = np.float32(0.0 if zps is None else zps.reshape(-1)[0])
        self.const = lts[self.tid].property == PropertyType.constant and self.tid in request.input_ids

    def centred(self, arrays):
        """(q - zp) as f32 (transposed view when the MatMul transposes), and its max |.|;
        a constant's is kept in the constant tensor cache."""
        src = arrays[self.tid]
        if self.const:
            def build():
                x = np.ascontiguousarray(self._values(src))
                return x, float(np.max(np.abs(x))) if x.size else 0.0
            return constant_cache.CACHE.get(self, "centred", [src], build)
        return self._values(src), self.bound

    def integers(self, arrays):
        """The s8/u8 values (after the weight Quantize), a transposed view when the MatMul transposes."""
        src = arrays[self.tid]
        if self.quant is not None:
            src = self._quantized(src)
        return np.swapaxes(src, -1, -2) if self.transpose else src

    def packed(self, arrays, a_dtype, zb):
        """The weight packed for :func:`graph_api.kernels.igemm.gemm`: an object array of
        ``PackedB`` over its batch dims, kept in the constant tensor cache."""
        from graph_api.kernels import igemm

        def pack():
            b = self.integers(arrays)
            flat = b.reshape((-1,) + b.shape[-2:])
            packs = np.empty(flat.shape[0], object)
            for i, mat in enumerate(flat):
                packs[i] = igemm.PackedB(mat, a_dtype, zb)
            return packs.reshape(b.shape[:-2])

        if not self.const:
            return pack()
        z = np.asarray(zb)
        slot = ("packed", np.dtype(a_dtype).str, z.dtype.str, z.shape, z.tobytes())
        return constant_cache.CACHE.get(self, slot, [arrays[self.tid]], pack)

    def as_f64(self, arrays, x):
        """``x`` (this operand's :meth:`centred` values) as f64, a constant's kept in the cache."""
        if not self.const:
            return x.astype(np.float64)
        return constant_cache.CACHE.get(self, "f64", [arrays[self.tid]], lambda: x.astype(np.float64))

    def _quantized(self, src):
        from graph_api.kernels.reference.quant import quantize
        from graph_api.kernels.reference import RefContext

        (q,) = quantize(self.quant, [src], [self.int_lt], RefContext(fpmath=None))
        return q

    def _values(self, src):
        if self.quant is not None:  # the weight Quantize, as the reference computes it
            src = self._quantized(src)
        if self.per_tensor_zp:
            x = np.subtract(src, self.zp, dtype=np.float32)
        else:
            x = _centre(self.deq, src)
        return np.swapaxes(x, -1, -2) if self.transpose else x


class QuantMatmulPlan(ChainPlan):
    """See the module docstring."""

    kernel = "int_gemm_epilogue"

    def __init__(self, request: CompileRequest, walk: Walk, src: _Operand, wei: _Operand,
                 colscale, quant):
        mm, lts = walk.head, request.lts
        self.src, self.wei, self.colscale = src, wei, colscale
        pre: list = []
        if len(mm.inputs) > 2:
            pre.append(("add", mm.inputs[2].id))
        mm_type = lts[mm.outputs[0].id].dtype
        if mm_type in _ROUND_STEP:
            pre.append((_ROUND_STEP[mm_type], None))
        walk.covered += [op.id for op in (src.deq, wei.deq, wei.quant) if op is not None]
        super().__init__(request, walk, [src.tid, wei.tid], pre)
        self.K = int(lts[mm.inputs[0].id].shape[-2 if mm.attrs["transpose_a"] else -1])
        N = self.N
        #: the weight zero point per output column for the int8 GEMM, or None (the f32 BLAS path)
        self.int8_zb = _int8_gemm_zb(src, wei, self.K, N, len(lts[mm.inputs[1].id].shape))
        if quant is not None:  # the Quantize tail, applied by the store
            from graph_api.kernels import qmatmul

            out_info = dtypes.info(lts[quant.outputs[0].id].dtype)
            qs, qz = _params(quant)
            self.okind = qmatmul.OUT_QUANT
            # astype copies: a writeable array (a read-only one, as a broadcast view of
            # length N is, would be one more compiled signature of the store kernel)
            self.qs = np.broadcast_to(qs.reshape(-1), (N,)).astype(np.float32)
            self.qz = np.zeros(N, np.float32) if qz is None else \
                np.broadcast_to(qz.reshape(-1), (N,)).astype(np.float32)
            self.qrange = (out_info.lowest, out_info.highest)
        else:
            self.qs = self.qz = np.ones(1, np.float32)
            self.qrange = (0, 0)

    def _int8_gemm(self, arrays):
        """Exact integer sums (q_a - z_a) @ (q_b - z_b) as int32 [R, N] on the int8 GEMM."""
        from graph_api.kernels import igemm

        a = self.src.integers(arrays)
        packs = self.wei.packed(arrays, a.dtype, self.int8_zb)
        za = int(self.src.zp)
        if packs.ndim == 0:  # a linear layer: one [B*S, K] x [K, N] GEMM
            return igemm.gemm(a.reshape(-1, a.shape[-1]), packs[()], za)
        batch = np.broadcast_shapes(a.shape[:-2], packs.shape)
        out = scratch.empty(batch + (a.shape[-2], self.N), np.int32)
        a, packs = np.broadcast_to(a, batch + a.shape[-2:]), np.broadcast_to(packs, batch)
        for idx in np.ndindex(*batch):
            igemm.gemm(a[idx], packs[idx], za, out=out[idx])
        return out.reshape(self.R, self.N)

    def _gemm(self, arrays):
        """Exact integer sums (q_a - z_a) @ (q_b - z_b) as [R, N] (int32, f32 or f64)."""
        if self.int8_zb is not None:
            return self._int8_gemm(arrays)
        a, _ = self.src.centred(arrays)
        b, bmax = self.wei.centred(arrays)
        span = self.src.bound * bmax
        chunk = self.K if span * self.K <= _F32_EXACT else max(int(_F32_EXACT // span), 1)
        count = -(-self.K // chunk) if self.K else 1
        if b.ndim == 2 and a.ndim > 2:  # a linear layer: one [B*S, K] x [K, N] GEMM
            a = a.reshape(-1, a.shape[-1])
        if count > MAX_CHUNKS:
            acc = np.matmul(a.astype(np.float64), self.wei.as_f64(arrays, b))
            return acc.reshape(self.R, self.N)
        # per execution, from the scratchpad: a buffer kept on the plan would be shared by
        # concurrent executions of one compiled partition
        parts = scratch.empty((count, self.R, self.N), np.float32)
        mm_shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
        for c in range(count):
            k0, k1 = c * chunk, min((c + 1) * chunk, self.K)
            np.matmul(a[..., k0:k1], b[..., k0:k1, :], out=parts[c].reshape(mm_shape))
        return parts[0] if count == 1 else parts.sum(axis=0, dtype=np.float64)  # f64: exact

    def run(self, arrays, outputs) -> None:
        from graph_api.kernels import qmatmul

        buf = self._dest_buffer(outputs)
        if buf.size:
            acc = self._gemm(arrays)
            out = buf.view(np.uint16) if self.okind in (1, 2) else buf
            qmatmul.store(acc, self.colscale, out, self.offsets[0], self.offsets[1], self.okind,
                          self.epilogue(arrays), self.qs, self.qz, *self.qrange, run=self.run_length)
        self.finish(buf, arrays, outputs)


def _int8_gemm_zb(src: _Operand, wei: _Operand, K: int, N: int, wei_rank: int):
    """The weight zero points as an int64 [N] array when the int8 GEMM serves this MatMul
    (src zero point per tensor, weight zero points per tensor or per output column,
    every sum within int32), else None."""
    from graph_api.kernels import igemm

    if not igemm.HAVE_VNNI:
        # without VNNI the int8 GEMM runs its portable tile, which LLVM vectorises poorly:
        # 129 ms for 512 x 384 x 1536 on a Zen 3 core pair, where the exact f32 BLAS
        # products of the centred integers take a few ms
        return None
    if not src.per_tensor_zp or not igemm.exact_in_int32(K, src.bound, wei.bound):
        return None
    _, zps = _params(wei.deq)
    if zps is None or zps.size == 1:
        return np.full(N, 0 if zps is None else int(zps.reshape(-1)[0]), np.int64)
    axis = wei.deq.attrs["axis"] % wei_rank
    if wei.deq.attrs["qtype"] != "per_channel" or axis != (wei_rank - 2 if wei.transpose else wei_rank - 1):
        return None
    return zps.reshape(-1).astype(np.int64)


def _dequantized(request, producer, lt, int_dtypes=_INT8):
    """(Dequantize op, weight Quantize op or None) feeding ``lt`` directly, or a reason."""
    deq = producer.get(lt.id)
    if deq is None or deq.kind != K.Dequantize:
        return f"MatMul input {lt.id} is not a Dequantize output (a TypeCast rounds the dequantized values)"
    if request.lts[deq.inputs[0].id].dtype not in int_dtypes:
        return f"Dequantize op {deq.id} reads {request.lts[deq.inputs[0].id].dtype.name}, not s8/u8"
    quant = producer.get(deq.inputs[0].id)
    if quant is not None and quant.kind != K.Quantize:
        return f"Dequantize op {deq.id} reads the output of {quant.kind.name}"
    if quant is not None and (quant.inputs[0].id not in request.input_ids or
                              request.lts[quant.inputs[0].id].property != PropertyType.constant):
        return f"weight Quantize op {quant.id} does not read a constant input"
    return deq, quant


def _column_scale(src_deq, wei_deq, tb: bool, rank: int):
    """src scale * weight scale per output column (f64), or why they do not factor out."""
    s_src, _ = _params(src_deq)
    s_wei, _ = _params(wei_deq)
    if s_src.size != 1:
        return f"src scales vary along an axis (Dequantize op {src_deq.id}); only per-tensor factors out"
    if s_wei.size != 1:
        axis = wei_deq.attrs["axis"]
        axis = axis % rank if isinstance(axis, int) else None
        if wei_deq.attrs["qtype"] != "per_channel" or axis != (rank - 2 if tb else rank - 1):
            return f"weight scales of Dequantize op {wei_deq.id} vary along K, not per output column"
    return np.float64(s_src[0]) * s_wei.reshape(-1).astype(np.float64)


def _quant_tail(request, walk: Walk):
    """The static s8/u8 Quantize that ends the chain (per tensor or per column), else None."""
    ids = walk._next() if not walk.layout else None
    if ids is None or len(ids) != 1:
        return None
    op = walk.ops_by_id[ids[0]]
    lts = request.lts
    if op.kind != K.Quantize or lts[op.outputs[0].id].dtype not in _INT8 or \
            lts[walk.value].dtype != DataType.f32:
        return None
    qs, qz = _params(op)
    N = walk.shape[-1]
    for p in (qs, qz):
        if p is not None and p.size != 1 and not (
                op.attrs["qtype"] == "per_channel" and op.attrs["axis"] % len(walk.shape) == len(walk.shape) - 1
                and p.size == N):
            return None
    walk.covered.append(op.id)
    walk.value = op.outputs[0].id
    return op


def build(request: CompileRequest):
    """A :class:`QuantMatmulPlan` for a static s8/u8 MatMul partition, or why not."""
    from graph_api.kernels.weight_compressed.wmatmul_plan import zero_size_reason

    reason = zero_size_reason(request)
    if reason:
        return reason
    mms = [op for op in request.ops if op.kind == K.MatMul]
    if len(mms) != 1:
        return f"{len(mms)} MatMul ops"
    mm, lts, fp = mms[0], request.lts, request.fpmath
    if fp.apply_to_int and fp.rounding is not None:
        return f"fpmath {fp} rounds the dequantized inputs"
    if mm.attrs["accumulation_mode"] == "f16":
        return "f16 accumulation"
    if any(len(lts[lt.id].shape) < 2 for lt in mm.inputs[:2]):
        return "a 1-D MatMul operand"
    producer = {lt.id: op for op in request.ops for lt in op.outputs}
    found = [_dequantized(request, producer, lt) for lt in mm.inputs[:2]]
    for f in found:
        if isinstance(f, str):
            return f
    (src_deq, src_quant), (wei_deq, wei_quant) = found
    if src_quant is not None:
        return f"src of MatMul op {mm.id} is quantized inside the partition"
    tb = bool(mm.attrs["transpose_b"])
    colscale = _column_scale(src_deq, wei_deq, tb, len(lts[mm.inputs[1].id].shape))
    if isinstance(colscale, str):
        return colscale
    N = int(lts[mm.outputs[0].id].shape[-1])
    colscale = np.broadcast_to(colscale, (N,)).copy()  # writeable: one kernel signature (see qs)
    walk = Walk(request, mm).run()
    quant = _quant_tail(request, walk)
    plan = QuantMatmulPlan(request, walk,
                           _Operand(request, src_deq, None, bool(mm.attrs["transpose_a"])),
                           _Operand(request, wei_deq, wei_quant, tb), colscale, quant)
    return plan.reason() or plan

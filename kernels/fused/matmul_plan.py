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

from graph_api import constant_cache, dtypes
from graph_api.enums import OpKind as K
from graph_api.enums import PropertyType
from graph_api.kernels.plan import CompileRequest, dequantized_inputs

from .chain import OKIND, ChainPlan, Walk
from .epilogue import _ROUND_STEP


class MatmulPlan(ChainPlan):
    """See the module docstring."""

    kernel = "blas_matmul_epilogue"

    def __init__(self, request: CompileRequest, walk: Walk):
        lts, mm = request.lts, walk.head
        self.a_id, self.b_id = mm.inputs[0].id, mm.inputs[1].id
        self.ta, self.tb = bool(mm.attrs["transpose_a"]), bool(mm.attrs["transpose_b"])
        # inputs dequantized from integers: found in the partition, or told by the
        # per-op plan that runs this MatMul alone (request.int_inputs)
        int_in = request.int_inputs or dequantized_inputs(request.ops).get(mm.id, frozenset())
        fp = request.fpmath
        #: the unit the product runs on (kernels.bf16_matmul: "amx_bf16", "avx512_bf16")
        #: when both operands are bf16 values after the mode's rounding and the host has
        #: one (exact products, f32 sums: the reference's arithmetic on the rounded
        #: operands, summed in another order), else None (f32 BLAS)
        unit = _bf16_unit()
        self.unit = unit if unit and all(
            fp.operand_type(lts[lt.id].dtype, i in int_in) == dtypes.DataType.bf16
            for i, lt in enumerate(mm.inputs[:2])) else None
        if self.unit:
            self.kernel = f"{self.unit}_matmul_epilogue"
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
        super().__init__(request, walk, [lt.id for lt in mm.inputs], pre)
        self.b_const = lts[self.b_id].property == PropertyType.constant and self.b_id in request.input_ids
        self.direct = (not self.steps and not walk.layout and self.okind == 0 and self.dest_out
                       and self.dest_dense)
        self.take_head_add()  # every result below goes through self.store

    def _operand(self, arrays, i: int, want_max: bool = True):
        """(the rounded, maybe transposed operand ``i``, its max |x|; None for a variable
        operand when not ``want_max``)."""
        tid = (self.a_id, self.b_id)[i]
        if i == 1 and self.b_const:  # oneDNN's rule: a constant tensor's data does not change
            src = arrays[tid]
            x, xmax = constant_cache.CACHE.get(self, "b", [src], lambda: self._prepare_b(src))
            if x is None:  # the rounding kept the weights as they are: no copy was cached
                x = np.ascontiguousarray(self.round[1](src))
        else:
            x = self.round[i](arrays[tid])
            xmax = _abs_max(x) if want_max else None
        if (self.ta if i == 0 else self.tb) and x.ndim > 1:
            x = np.swapaxes(x, -1, -2)
        return x, xmax

    def _prepare_b(self, src):
        """(the rounded contiguous constant B, or None where that is ``src`` itself; its max |x|)."""
        x = np.ascontiguousarray(self.round[1](src))
        return (None if np.shares_memory(x, src) else x), _abs_max(x)

    def _gemm_args(self, a, b, arrays, outputs):
        """(:func:`graph_api.kernels.store.gemm_store`'s arguments, the output buffer) for
        a linear layer (``a`` [R, K], ``b`` [K, N], no broadcast), or None (not that
        shape, or numpy's OpenBLAS cannot be called from the kernels)."""
        from graph_api.kernels import openblas, store

        if not (a.ndim == 2 and b.ndim == 2 and a.shape[0] * b.shape[1] >= store.SERIAL_BELOW
                and (a.shape[0], b.shape[1]) == (self.R, self.N) and a.dtype == np.float32 and b.dtype == np.float32
                and a.flags.c_contiguous and b.flags.c_contiguous and a.shape[1] > 0 and openblas.available()):
            return None
        buf = self._dest_buffer(outputs)
        head = self._store.NO_HEAD if self.head_add is None else \
            np.ascontiguousarray(arrays[self.head_add], dtype=np.float32).reshape(-1)
        # the tile products come from the execution's scratchpad (gemm_store): a buffer kept
        # on the plan would be shared by concurrent executions of one compiled partition
        return (a, b, buf.view(np.uint16) if self.okind else buf, self.offsets[0], self.offsets[1],
                self.okind, self.epilogue(arrays), self.run_length, head, self.direct), buf

    def _gemm_store(self, a, b, arrays, outputs) -> bool:
        """A linear layer as one fused :func:`graph_api.kernels.store.gemm_store` call,
        or False (see :meth:`_gemm_args`)."""
        got = self._gemm_args(a, b, arrays, outputs)
        if got is None:
            return False
        self._store.gemm_store(*got[0])
        self.finish(got[1], arrays, outputs)
        return True

    def bind(self, inputs, outputs):
        """A callable that runs this plan on these tensors (see
        ``CompiledPartition.bind``): a linear layer whose operands, bias, epilogue
        operands and output are the tensors' memory itself, as one
        :func:`graph_api.kernels.store.gemm_runner`; None for every other case
        (rounded or copied operands, reference steps), which runs :meth:`execute`."""
        if self.pre_steps or self.post_steps or self.ta or not self.dest_out or self.unit:
            return None
        arrays = {tid: t.numpy() for tid, t in inputs.items()}
        b, _ = self._operand(arrays, 1, want_max=False)
        a = self.round[0](arrays[self.a_id])
        if a is not arrays[self.a_id] or a.ndim < 2 or not a.flags.c_contiguous or \
                (not self.b_const and b is not arrays[self.b_id]):
            return None  # an operand made per call (rounded or converted)
        if self.head_add is not None and not _is_view_f32(arrays[self.head_add]):
            return None
        got = self._gemm_args(a.reshape(-1, a.shape[-1]), b, arrays, outputs)
        if got is None or self._ep_cache[2]:  # epilogue operands copied per call
            return None
        return self._store.gemm_runner(*got[0])

    def _unit_run(self, arrays, outputs) -> bool:
        """A linear layer (``a`` [..., K] x ``b`` [K, N]) on the bf16 unit, its epilogue by
        :meth:`store`; False for other shapes (batched B, transposed A)."""
        from graph_api.kernels import bf16_matmul, scratch

        src, b_src = arrays[self.a_id], arrays[self.b_id]
        if self.ta or b_src.ndim != 2 or src.ndim < 2:
            return False
        K = src.shape[-1]
        a = dtypes.to_f32(src).reshape(-1, K)
        if (a.shape[0], self.N) != (self.R, self.N) or K == 0:
            return False

        def pack():
            b = dtypes.to_f32(b_src)
            return bf16_matmul.pack_b(bf16_matmul.bf16_bits(b.T if self.tb else b))

        # oneDNN's rule: a constant tensor's data does not change
        packed_b = constant_cache.CACHE.get(self, "b_bf16", [b_src], pack) if self.b_const else pack()
        acc = scratch.empty(self.R * self.N, np.float32).reshape(self.R, self.N)
        bf16_matmul.matmul(a, packed_b, lambda: self._operand(arrays, 1, want_max=False)[0], acc)
        self.store(acc, arrays, outputs)
        return True

    def run(self, arrays, outputs) -> None:
        from graph_api.kernels.weight_compressed.wmatmul import _SAFE  # no f32 partial sum reaches f32's range below it

        if self.unit and self._unit_run(arrays, outputs):
            return
        b, bmax = self._operand(arrays, 1, want_max=False)
        if not self.ta:
            a = self.round[0](arrays[self.a_id])
            if a.ndim >= 2 and a.flags.c_contiguous and \
                    self._gemm_store(a.reshape(-1, a.shape[-1]), b, arrays, outputs):
                return  # overflow checked per tile there
        a, amax = self._operand(arrays, 0)
        if bmax is None:
            bmax = _abs_max(b)
        if not amax * bmax * max(a.shape[-1], 1) < _SAFE:  # NaN compares False
            # inf/NaN or f32 partial sums that may overflow: float64 sums rounded
            # once, as the reference MatMul (sgemm gives inf - inf = NaN where the
            # reference has a finite value or an infinity)
            with np.errstate(all="ignore"):
                acc = np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
            if acc.shape != self.shape:
                acc = np.broadcast_to(acc, self.shape)
            return self.store(acc, arrays, outputs)
        if b.ndim == 2 and a.ndim > 2 and a.flags.c_contiguous:
            # a linear layer: one [B*S, K] x [K, N] GEMM, not B stacked ones (numpy
            # calls sgemm per slice, each a thread-pool wake-up)
            a = a.reshape(-1, a.shape[-1])
            if self.direct:
                np.matmul(a, b, out=outputs[self.dest].numpy().reshape(a.shape[0], -1))
                return self.finish(outputs[self.dest].buffer, arrays, outputs)
            return self.store(np.matmul(a, b), arrays, outputs)
        if self.direct and a.ndim > 1 and b.ndim > 1:  # no epilogue: BLAS writes the output
            out = outputs[self.dest]
            np.matmul(a, b, out=out.numpy())
            return self.finish(out.buffer, arrays, outputs)
        acc = np.matmul(a, b)
        if acc.shape != self.shape:
            acc = np.broadcast_to(acc, self.shape)
        self.store(acc, arrays, outputs)


def _bf16_unit() -> str | None:
    from graph_api.kernels import bf16_matmul

    return bf16_matmul.UNIT


def _is_view_f32(x) -> bool:
    """``x`` is C-contiguous f32: its flat row is a view, not a copy."""
    return x.dtype == np.float32 and x.flags.c_contiguous


def _abs_max(x) -> float:
    """max |x|; NaN when x holds an inf or a NaN (0 for an empty x)."""
    from graph_api.kernels.store import abs_max

    return abs_max(x)


def build(request: CompileRequest):
    """A :class:`MatmulPlan` for a partition with one MatMul, or why not."""
    from graph_api.kernels.weight_compressed.wmatmul_plan import zero_size_reason

    reason = zero_size_reason(request)  # the reference computes empty outputs / empty sums
    if reason:
        return reason
    mms = [op for op in request.ops if op.kind == K.MatMul]
    if len(mms) != 1:
        return f"{len(mms)} MatMul ops (the BLAS plan takes one)"
    mm, lts = mms[0], request.lts
    for lt in mm.inputs[:2]:
        if dtypes.info(lts[lt.id].dtype).kind != "float":
            return f"MatMul input {lt.id} is {lts[lt.id].dtype.name}"
    if lts[mm.outputs[0].id].dtype not in OKIND:
        return f"MatMul output is {lts[mm.outputs[0].id].dtype.name}"
    plan = MatmulPlan(request, Walk(request, mm).run())
    return plan.reason() or plan

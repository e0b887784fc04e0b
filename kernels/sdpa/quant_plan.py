"""Static-quantized SDPA (``sdpa_quantized``: x8_sdpa, int8-bf16 and the int8 GPT forms) on the exact two-pass attention kernel.

::

    Q8 ─ q_dequant ─ [q_cast]? ─┐
    K8 ─ k_dequant ─ [k_cast]? ─┴ qk_matmul ─ scores (scale, masks) ─ softmax ─ [softmax_cast]?
        ─ prob_quant ─ prob_dequant ─ [prob_cast]? ─┐
                  V8 ─ v_dequant ─ [v_cast]? ───────┴ pv_matmul
        ─ [out_transpose ─ out_reshape]? ─ [out_cast]? ─ [quant_out]?

Rounding at every quantize point is the reference's (kernels/reference/quant.py):

* Q, K, V: dequantized by the reference Dequantize function itself (``(x - zp) *
  scale`` in f32, any granularity), then rounded to the TypeCast's type (the
  int8-bf16 form), once per call, into the kernel's dense f32 operands.
* Scores: rounded to their graph type after the product, the scale and the mask
  (``score_rnd``: one type for all of them), as the reference rounds each op's
  output; the kernel's f32 dot products differ from the reference's float64 ones
  by summation order, so a score within that distance of a bf16 rounding boundary
  may round the other way.
* Probabilities (s8/u8/f8): the kernel (``sdpa.prefill``'s ``quantized`` work-item kernel)
  has each row's scores, max and sum before ``P V``; it normalises ``p = e / sum``,
  rounds it to the SoftMax output type, applies the Quantize -> Dequantize pair in
  f32 as the reference (``q = saturate(rne(p / qs + qz))``, ``p' = (q - dz) * ds``)
  and rounds ``p'`` to the ``prob_cast`` type.  The kernel's ``p`` differs from the
  reference's (f64 softmax of f64-summed scores) by a few f32 ulps, so a probability
  within that distance of a rounding boundary may land one step away
  (test_sdpa_family.py checks that nothing else differs).  f8 rounds to nearest
  even with subnormals (``prefill._round_f8``, as ml_dtypes converts f32);
  refused when ``1 / scale + |zp|`` exceeds the f8 range (no saturation in the kernel).
* Output: the kernel's f32 ``P V`` rounded to pv_matmul's type, transposed/reshaped,
  ``out_cast``, then ``quant_out`` by the reference Quantize function: exact for the
  same values; f32 summation order can move a value next to a .5 boundary by one
  integer unit (the check rule's allowance for integer outputs).

Refused: per-channel probability parameters, values rounded to two different
half types in turn, an fpmath mode with ``apply_to_int`` (it rounds the
dequantized MatMul inputs; without it every MatMul operand, coming from a
Dequantize, is used as is: docs/fpmath.md), more than ``prefill.MAX_S`` keys, tensors other than the final
output leaving the partition.  A row with no visible key runs the reference for
that call.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from graph_api import dtypes
from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K
from graph_api.kernels.bits import RND_BF16, RND_F16, RND_NONE, rounding_code
from graph_api.kernels.fused.hybrid import HybridPlan
from graph_api.kernels.plan import CompileRequest

from .plan_operands import _compose, _swap

#: float types and the rounding code that gives their values from f32
_RND = {DataType.f32: RND_NONE, DataType.bf16: RND_BF16, DataType.f16: RND_F16}
_INT8 = (DataType.s8, DataType.u8)
#: f8 probability types: (mantissa bits, exponent of the smallest normal)
_F8 = {DataType.f8_e4m3: (3, -6), DataType.f8_e5m2: (2, -14)}


def _one_param(op, name):
    """The single f32 value of a per_tensor Quantize/Dequantize attribute (zps: 0 if absent)."""
    values = op.attrs.get(name) or ([0] if name == "zps" else [])
    if len(values) != 1:
        return None
    return np.float32(values[0])


def _one_rounding(types):
    """The rounding code of values rounded to each of ``types`` in turn (floats), or None."""
    if any(t not in _RND for t in types):
        return None
    return _compose([_RND[t] for t in types])


def _chain(ops, b, roles, value):
    """Follow ``roles`` (present ones) from tensor ``value``: (last id, op outputs' types) or None."""
    kinds = []
    for role in roles:
        if b.get(role) is None:
            continue
        op = ops[b[role]]
        if op.inputs[0].id != value:
            return None
        value = op.outputs[0].id
        kinds.append(op.outputs[0])
    return value, [lt.dtype for lt in kinds]


def _operand(request, b, ops, role, matmul_input):
    """(Dequantize op, type the MatMul reads) of Q/K/V, or a reason."""
    deq = ops[b[f"{role}_dequant"]]
    got = _chain(ops, b, (f"{role}_cast",), deq.outputs[0].id)
    if got is None or got[0] != matmul_input:
        return f"{role.upper()} does not enter its MatMul from its Dequantize [-> TypeCast]"
    types = [request.lts[deq.outputs[0].id].dtype] + got[1]
    if _one_rounding(types) is None:
        return f"{role.upper()} rounded to {[t.name for t in types]} in turn"
    return deq, types[-1]


def _prob_params(request, b, ops):
    """The kernel's probability parameters (see ``prefill._quantize_row``), or a reason."""
    quant, deq = ops[b["prob_quant"]], ops[b["prob_dequant"]]
    softmax = ops[b["softmax"]]
    into_quant = _chain(ops, b, ("softmax_cast",), softmax.outputs[0].id)
    if into_quant is None or quant.inputs[0].id != into_quant[0] or \
            deq.inputs[0].id != quant.outputs[0].id:
        return "prob_quant -> prob_dequant does not take the SoftMax output"
    p_rnd = _one_rounding([request.lts[softmax.outputs[0].id].dtype] + into_quant[1])
    into_pv = _chain(ops, b, ("prob_cast",), deq.outputs[0].id)
    if into_pv is None or into_pv[0] != ops[b["pv_matmul"]].inputs[0].id:
        return "pv_matmul does not take the dequantized probabilities"
    out_rnd = _one_rounding([request.lts[deq.outputs[0].id].dtype] + into_pv[1])
    if p_rnd is None or out_rnd is None:
        return "probabilities rounded to two different half types in turn"
    qdt = request.lts[quant.outputs[0].id].dtype
    if qdt not in _INT8 and qdt not in _F8:
        return f"{qdt.name} probabilities (the kernel rounds to s8/u8/f8 only)"
    params = [_one_param(quant, "scales"), _one_param(quant, "zps"),
              _one_param(deq, "scales"), _one_param(deq, "zps")]
    if any(p is None for p in params):
        return "per-channel probability scales or zero points (one value each only)"
    info = dtypes.info(qdt)
    qs, qz, ds, dz = params
    if qdt in _INT8:
        return (qs, qz, np.float32(info.lowest), np.float32(info.highest), ds, dz, 0, 0, 0, 0,
                p_rnd, out_rnd)
    if not 1.0 / abs(float(qs)) + abs(float(qz)) <= float(ml_dtypes.finfo(info.np_dtype).max):
        return f"probabilities / {qs} + {qz} may leave the {qdt.name} range (saturation or inf " \
               f"not in the kernel)"
    mbits, emin = _F8[qdt]
    return (qs, qz, 0, 0, ds, dz, 1, 23 - mbits, 2.0 ** emin, 2.0 ** (emin - mbits), p_rnd, out_rnd)


def _padded(x, shape4, Dp):
    """``x`` as a dense f32 ``shape4`` array with zero columns up to head size ``Dp``.
    The zeros change no score (each adds an exact 0 to the f32 dot product: the
    dequantized values are finite) and give output columns that are dropped."""
    x = np.reshape(x, shape4)
    if Dp == shape4[-1]:
        return np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros(shape4[:-1] + (Dp,), np.float32)
    out[..., :shape4[-1]] = x
    return out


@dataclass
class QuantCore:
    """Execute of a static-quantized SDPA: numpy dequantize, the kernel, numpy quantize."""

    core: object          # plan.SdpaCore: geometry, scores, masks, output steps
    q_deq: tuple          # (Dequantize op, type of the MatMul input) of Q, K, V
    k_deq: tuple
    v_deq: tuple
    k_swapped: bool       # K as the MatMul reads it is [.., D, S]
    v_swapped: bool
    prob: tuple
    score_rnd: int        # rounding code of the scores (their type in the graph)
    pv_type: DataType     # pv_matmul's output type
    out_cast: DataType | None
    quant_out: object     # the final Quantize op, or None
    final_id: int         # the partition's output

    def _dequant(self, deq, inputs, swapped):
        """The reference Dequantize, then the TypeCast to the MatMul input type, as f32."""
        from graph_api.kernels.reference.quant import dequantize

        op, cast = deq
        lts = self.core.request.lts
        x = inputs[op.inputs[0].id].numpy()
        y = dequantize(op, [x], [lts[op.outputs[0].id]], None)[0]
        y = dtypes.to_f32(dtypes.convert(y, cast))
        return np.swapaxes(y, -1, -2) if swapped else y

    def __call__(self, inputs, arrays, outputs=None):
        """``outputs`` (given to every SDPA core) is not written here: the quantize
        tail makes a new array, which the plan copies into the output tensor."""
        from graph_api.kernels import sdpa as SD
        from graph_api.kernels.reference.quant import quantize

        from .plan import _Fallback

        c = self.core
        g, sc = c.geo, c.scores
        scale = 1.0
        if sc.scale_id is not None:
            scale = float(c._value(inputs, sc.scale_id).reshape(-1)[0])
        mask, causal, _ = c._masks(inputs, scale)
        Dp = -(-g.D // 16) * 16  # the kernel's head size: zero columns added to Q, K, V
        q = _padded(self._dequant(self.q_deq, inputs, False), (g.B, g.Hq, g.Sq, g.D), Dp)
        k = _padded(self._dequant(self.k_deq, inputs, self.k_swapped), (g.B, g.Hkv, g.S, g.D), Dp)
        v = _padded(self._dequant(self.v_deq, inputs, self.v_swapped), (g.B, g.Hkv, g.S, g.D), Dp)
        shape4 = (g.B, g.Hkv, g.S, Dp)
        out = SD.sdpa(q, SD.KV(k, "f32", shape4), SD.KV(v, "f32", shape4), scale=scale,
                      scale_mode=sc.scale_mode, mask=None if mask is None else g.kernel_mask(mask),
                      causal=causal, prob_quant=self.prob, score_rnd=self.score_rnd)
        if np.isnan(out).any():  # a row with no visible key (0/0) or a NaN input
            raise _Fallback("NaN rows in a quantized SDPA (the reference quantizes NaN to 0)")
        out = dtypes.convert(out[..., :g.D].reshape(g.lead + (g.Sq, g.D)), self.pv_type)
        for kind, arg in c.steps:
            out = np.reshape(out, arg) if kind == "reshape" else np.transpose(out, arg)
        if self.out_cast is not None:
            out = dtypes.convert(out, self.out_cast)
        if self.quant_out is not None:
            op = self.quant_out
            out = quantize(op, [out], [c.request.lts[op.outputs[0].id]], None)[0]
        arrays[self.final_id] = out


def build(request: CompileRequest):
    """The plan of an ``sdpa_quantized`` partition, or why the kernel does not apply."""
    from graph_api.kernels.sdpa import prefill

    from . import plan as SP

    b, lts = request.bindings, request.lts
    ops = {op.id: op for op in request.ops}
    reason = SP._unknown_ops(request, b) or SP.zero_size_reason(request)
    if reason:
        return reason
    dynamic = [op for op in ops.values() if op.kind in (K.DynamicQuantize, K.DynamicDequantize)]
    if dynamic:
        return f"dynamic (de)quantization (op {dynamic[0].id}: scales as tensors; the kernel reads attributes)"
    if rounding_code(request.fpmath, for_int_weights=True) != RND_NONE:  # docs/fpmath.md
        return f"fpmath {request.fpmath} with apply_to_int rounds the dequantized MatMul inputs"
    qk, pv = ops[b["qk_matmul"]], ops[b["pv_matmul"]]
    if len(qk.inputs) > 2 or len(pv.inputs) > 2 or qk.attrs.get("transpose_a", False) or \
            pv.attrs.get("transpose_a", False):
        return "a MatMul with a bias or a transposed Q / probabilities"
    operands = [_operand(request, b, ops, role, mm.inputs[port].id)
                for role, mm, port in (("q", qk, 0), ("k", qk, 1), ("v", pv, 1))]
    reason = next((o for o in operands if isinstance(o, str)), None)
    if reason:
        return reason
    q_deq, k_deq, v_deq = operands
    k_swapped = not qk.attrs.get("transpose_b", False)
    v_swapped = bool(pv.attrs.get("transpose_b", False))
    q_shape = lts[qk.inputs[0].id].shape
    k_shape, v_shape = lts[qk.inputs[1].id].shape, lts[pv.inputs[1].id].shape
    geo = SP._geometry(q_shape, _swap(k_shape) if k_swapped else k_shape,
                       _swap(v_shape) if v_swapped else v_shape)
    if isinstance(geo, str):
        return geo
    if not 0 < geo.S <= prefill.MAX_S:
        return f"{geo.S} keys (the exact two-pass kernel takes at most {prefill.MAX_S})"
    if lts[qk.outputs[0].id].shape != geo.lead + (geo.Sq, geo.S):
        return f"scores {list(lts[qk.outputs[0].id].shape)} are not Q's batch x Sq x S"
    scores = SP._scores(request, b, ops)
    if isinstance(scores, str):
        return scores
    score_rnd = _one_rounding(scores.score_types)
    if score_rnd is None:
        return f"scores of types {[t.name for t in scores.score_types]} (one float type only)"
    prob = _prob_params(request, b, ops)
    if isinstance(prob, str):
        return prob
    out_lt = lts[pv.outputs[0].id]
    if out_lt.dtype not in _RND or out_lt.shape != geo.lead + (geo.Sq, geo.D):
        return f"attention output {out_lt!r}"
    chain = SP._output_chain(request, b, ops)
    if isinstance(chain, str):
        return chain
    steps, final = chain
    out_cast = None
    if b.get("out_cast") is not None:
        op = ops[b["out_cast"]]
        if op.inputs[0].id != final:
            return "out_cast does not take the attention output"
        final, out_cast = op.outputs[0].id, lts[op.outputs[0].id].dtype
    quant_out = ops[b["quant_out"]] if b.get("quant_out") is not None else None
    if quant_out is not None:
        if quant_out.inputs[0].id != final:
            return "quant_out does not take the attention output"
        final = quant_out.outputs[0].id
    if list(request.output_ids) != [final]:
        return f"tensors {[t for t in request.output_ids if t != final]} leave the partition"
    reason = SP._inside(request, {}, [scores])
    if reason:
        return reason
    core = SP.SdpaCore(request, geo, q_deq[0].inputs[0].id, False, None, None, scores, 0,
                       DataType.f32, steps, chain[1], {})
    run = QuantCore(core, q_deq, k_deq, v_deq, k_swapped, v_swapped, prob, score_rnd,
                    out_lt.dtype, out_cast, quant_out, final)
    return HybridPlan(request, "numba_sdpa_quantized", SP._with_fallback(request, run),
                      {op.id for op in request.ops})

"""Static-quantized SDPA (``sdpa_quantized``, f32 form) on the exact two-pass attention kernel.

::

    Q8 ─ q_dequant ─┐
    K8 ─ k_dequant ─┴ qk_matmul ─ scores (scale, masks) ─ softmax ─ prob_quant ─ prob_dequant ─┐
                                                        V8 ─ v_dequant ───────────────────────┴ pv_matmul
        ─ [out_transpose ─ out_reshape] ─ [quant_out]

Rounding at every quantize point is the reference's (kernels/reference/quant.py):

* Q, K, V: dequantized by the reference Dequantize function itself, in f32
  (``(x - zp) * scale``; any granularity), once per call, into the kernel's
  dense f32 operands.
* Probabilities (s8/u8/f8): the kernel (``sdpa_prefill.prefill_items`` with ``pq``) has each
  row's scores, max and sum before ``P V``; it normalises ``p = e / sum`` and
  applies the Quantize -> Dequantize pair in registers, in f32 as the reference:
  ``q = saturate(rne(p / qs + qz))``, ``p' = (q - dz) * ds``.  The kernel's ``p``
  differs from the reference's (f64 softmax of f64-summed scores, rounded to f32)
  by a few f32 ulps, so a probability within that distance of a rounding boundary
  may land one integer step away (test_sdpa_family.py measures how often).
* Output: ``quant_out`` is the reference Quantize function on the f32 attention
  output (after the numpy transpose/reshape), so it rounds exactly as the
  reference does for the same f32 values; f32 summation-order differences can
  move a value next to a .5 boundary by one integer unit (the check rule's
  allowance for integer outputs).

f8 probabilities round to nearest even with subnormals in the kernel
(``sdpa_prefill._round_f8``), as ml_dtypes converts f32; refused when
``1 / scale + |zp|`` exceeds the type's range (no saturation in the kernel).

Refused: the int8-bf16 form (TypeCasts to bf16: the reference rounds scores and
probabilities to bf16, which the kernel does not), per-channel probability
parameters, fpmath modes other than strict (they round the f32
MatMul inputs), more than ``sdpa_prefill.MAX_S`` keys), tensors other than the final output
leaving the partition.  A row with no visible key runs the reference for that call.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from graph_api import dtypes
from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K
from graph_api.kernels.plan import CompileRequest

from .hybrid import HybridPlan
from .sdpa_operands import _swap

_BF16_ROLES = ("q_cast", "k_cast", "v_cast", "softmax_cast", "prob_cast", "out_cast")
_INT8 = (DataType.s8, DataType.u8)
#: f8 probability types: (mantissa bits, exponent of the smallest normal)
_F8 = {DataType.f8_e4m3: (3, -6), DataType.f8_e5m2: (2, -14)}


def _one_param(op, name):
    """The single f32 value of a per_tensor Quantize/Dequantize attribute (zps: 0 if absent)."""
    values = op.attrs.get(name) or ([0] if name == "zps" else [])
    if len(values) != 1:
        return None
    return np.float32(values[0])


def _prob_params(request, b, ops, prob_id):
    """(qs, qz, lo, hi, ds, dz) of the probability Quantize -> Dequantize pair, or a reason."""
    quant, deq = ops[b["prob_quant"]], ops[b["prob_dequant"]]
    if quant.inputs[0].id != prob_id or deq.inputs[0].id != quant.outputs[0].id:
        return "prob_quant -> prob_dequant does not take the SoftMax output"
    qdt = request.lts[quant.outputs[0].id].dtype
    if qdt not in _INT8 and qdt not in _F8:
        return f"{qdt.name} probabilities (the kernel rounds to s8/u8/f8 only)"
    if request.lts[deq.outputs[0].id].dtype != DataType.f32:
        return "prob_dequant does not give f32"
    params = [_one_param(quant, "scales"), _one_param(quant, "zps"),
              _one_param(deq, "scales"), _one_param(deq, "zps")]
    if any(p is None for p in params):
        return "per-channel probability scales or zero points (one value each only)"
    info = dtypes.info(qdt)
    qs, qz, ds, dz = params
    if qdt in _INT8:
        return (qs, qz, np.float32(info.lowest), np.float32(info.highest), ds, dz, 0, 0, 0, 0)
    if not 1.0 / abs(float(qs)) + abs(float(qz)) <= float(ml_dtypes.finfo(info.np_dtype).max):
        return f"probabilities / {qs} + {qz} may leave the {qdt.name} range (saturation or inf " \
               f"not in the kernel)"
    mbits, emin = _F8[qdt]
    return (qs, qz, 0, 0, ds, dz, 1, 23 - mbits, 2.0 ** emin, 2.0 ** (emin - mbits))


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

    core: object          # sdpa_plan.SdpaCore: geometry, scores, masks, output steps
    q_deq: object         # the Dequantize ops of Q, K, V
    k_deq: object
    v_deq: object
    k_swapped: bool       # K as the MatMul reads it is [.., D, S]
    v_swapped: bool
    prob: tuple
    quant_out: object     # the final Quantize op, or None

    def _dequant(self, op, inputs, swapped):
        from graph_api.kernels.reference.quant import dequantize

        lts = self.core.request.lts
        x = inputs[op.inputs[0].id].numpy()
        y = dequantize(op, [x], [lts[op.outputs[0].id]], None)[0]
        return np.swapaxes(y, -1, -2) if swapped else y

    def __call__(self, inputs, arrays):
        from graph_api.kernels import sdpa as SD
        from graph_api.kernels.reference.quant import quantize

        from .sdpa_plan import _Fallback

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
                      causal=causal, prob_quant=self.prob)
        if np.isnan(out).any():  # a row with no visible key (0/0) or a NaN input
            raise _Fallback("NaN rows in a quantized SDPA (the reference quantizes NaN to 0)")
        out = out[..., :g.D].reshape(g.lead + (g.Sq, g.D))
        for kind, arg in c.steps:
            out = np.reshape(out, arg) if kind == "reshape" else np.transpose(out, arg)
        if self.quant_out is not None:
            op = self.quant_out
            out = quantize(op, [out], [c.request.lts[op.outputs[0].id]], None)[0]
            arrays[op.outputs[0].id] = out
        else:
            arrays[c.final_id] = out


def build(request: CompileRequest):
    """The plan of an ``sdpa_quantized`` partition, or why the kernel does not apply."""
    from graph_api.kernels import sdpa_prefill

    from . import sdpa_plan as SP

    b, lts = request.bindings, request.lts
    ops = {op.id: op for op in request.ops}
    reason = SP._unknown_ops(request, b) or SP.zero_size_reason(request)
    if reason:
        return reason
    present = [r for r in _BF16_ROLES if b.get(r) is not None]
    if present:
        return f"int8-bf16 form ({', '.join(present)}): the reference rounds scores and " \
               f"probabilities to bf16, the kernel keeps f32"
    if request.fpmath.rounding is not None:
        return f"fpmath {request.fpmath} rounds the dequantized f32 MatMul inputs"
    qk, pv = ops[b["qk_matmul"]], ops[b["pv_matmul"]]
    if len(qk.inputs) > 2 or len(pv.inputs) > 2 or qk.attrs.get("transpose_a", False) or \
            pv.attrs.get("transpose_a", False):
        return "a MatMul with a bias or a transposed Q / probabilities"
    q_deq, k_deq, v_deq = ops[b["q_dequant"]], ops[b["k_dequant"]], ops[b["v_dequant"]]
    if qk.inputs[0].id != q_deq.outputs[0].id or qk.inputs[1].id != k_deq.outputs[0].id or \
            pv.inputs[1].id != v_deq.outputs[0].id:
        return "Q/K/V do not enter the MatMuls straight from their Dequantize"
    if any(lts[d.outputs[0].id].dtype != DataType.f32 for d in (q_deq, k_deq, v_deq)):
        return "Q/K/V Dequantize does not give f32"
    k_swapped = not qk.attrs.get("transpose_b", False)
    v_swapped = bool(pv.attrs.get("transpose_b", False))
    q_shape = lts[qk.inputs[0].id].shape
    k_shape, v_shape = lts[qk.inputs[1].id].shape, lts[pv.inputs[1].id].shape
    geo = SP._geometry(q_shape, _swap(k_shape) if k_swapped else k_shape,
                       _swap(v_shape) if v_swapped else v_shape)
    if isinstance(geo, str):
        return geo
    if not 0 < geo.S <= sdpa_prefill.MAX_S:
        return f"{geo.S} keys (the exact two-pass kernel takes at most {sdpa_prefill.MAX_S})"
    if lts[qk.outputs[0].id].shape != geo.lead + (geo.Sq, geo.S):
        return f"scores {list(lts[qk.outputs[0].id].shape)} are not Q's batch x Sq x S"
    scores = SP._scores(request, b, ops)
    if isinstance(scores, str):
        return scores
    if any(t != DataType.f32 for t in scores.types):
        return f"scores/probabilities of types {[t.name for t in scores.types]} (f32 only)"
    prob = _prob_params(request, b, ops, scores.prob_id)
    if isinstance(prob, str):
        return prob
    if pv.inputs[0].id != ops[b["prob_dequant"]].outputs[0].id:
        return "pv_matmul does not take the dequantized probabilities"
    out_lt = lts[pv.outputs[0].id]
    if out_lt.dtype != DataType.f32 or out_lt.shape != geo.lead + (geo.Sq, geo.D):
        return f"attention output {out_lt!r}"
    chain = SP._output_chain(request, b, ops)
    if isinstance(chain, str):
        return chain
    steps, final = chain
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
    core = SP.SdpaCore(request, geo, q_deq.inputs[0].id, False, None, None, scores, 0,
                       DataType.f32, steps, chain[1], {})
    run = QuantCore(core, q_deq, k_deq, v_deq, k_swapped, v_swapped, prob, quant_out)
    return HybridPlan(request, "numba_sdpa_int8", SP._with_fallback(request, run),
                      {op.id for op in request.ops})

"""SDPA family: float, compressed K/V, static-quant, 4-D GQA, JAX, training.

All forward patterns share :func:`scores`, the optional block between the
QK MatMul and SoftMax (oneDNN's "scale+masks")::

    qk_matmul -> [pre_select]? -> [scale]? -> [softcap_tanh -> softcap_mul]?
              -> [implicit causal mask]? -> [mask_add]? -> [select_mask]? -> softmax

* ``pre_select`` (Select, scores at input 1 or 2): the GPT form, mask before
  the scale (equivalent when the fill is -inf and the scale positive);
* ``scale`` (Multiply|Divide, scores at input 0, either input for Multiply);
* ``softcap_tanh``/``softcap_mul``: Gemma-2 logit soft-capping;
* the implicit causal mask, all present or all absent (group ``causal``)::

      causal_row = GenIndex(S, axis=-2)      causal_col = GenIndex(S, axis=-1)
      [causal_add = Add(causal_row, s_kv) -> causal_sub = Subtract(., s_q)]?  (bottom-right)
      causal_ge  = GreaterEqual(row, causal_col)
      causal_select = Select(causal_ge, S, -inf)

* ``mask_add`` (Add, additive mask), ``select_mask`` (Select, boolean mask,
  scores at input 1 or 2; the other two inputs come from outside).

Bindings: every node name below is a role (op id, or None when absent).
"""
from __future__ import annotations

from graph_api.enums import OpKind as K

from ..pattern import (In, Node, Pattern, all_inputs_dtype, attr_is, axis_is_last, fed_by,
                       in_dtype, present)
from .common import FLOATS, FP8, INT4, INT8, SCALE

_CAST = K.TypeCast


def scores(prev: str, *, pre_select: bool = True, softcap: bool = True) -> list:
    """The optional scale+masks block after node ``prev``; ends with 'select_mask'."""
    nodes = []
    if pre_select:
        nodes.append(Node("pre_select", K.Select, [In(prev, (1, 2))], optional=True))
        prev = "pre_select"
    nodes.append(Node("scale", SCALE, [In(prev, 0, swap=True)], optional=True))
    prev = "scale"
    if softcap:
        nodes += [
            Node("softcap_tanh", K.Tanh, [In(prev, 0)], optional="softcap"),
            Node("softcap_mul", K.Multiply, [In("softcap_tanh", 0, swap=True)], optional="softcap"),
        ]
        prev = "softcap_mul"
    nodes += [
        Node("causal_row", K.GenIndex, [In(prev, 0)], optional="causal", when=[axis_is_last(2)]),
        Node("causal_col", K.GenIndex, [In(prev, 0)], optional="causal", when=[axis_is_last(1)]),
        Node("causal_add", K.Add, [In("causal_row", 0, swap=True)], optional="causal.br"),
        Node("causal_sub", K.Subtract, [In("causal_add", 0)], optional="causal.br"),
        Node("causal_ge", K.GreaterEqual, [In("causal_sub", 0), In("causal_col", 1)],
             optional="causal"),
        Node("causal_select", K.Select, [In(prev, 1), In("causal_ge", 0)], optional="causal"),
        Node("mask_add", K.Add, [In("causal_select", 0, swap=True)], optional=True),
        Node("select_mask", K.Select, [In("mask_add", (1, 2))], optional=True),
    ]
    return nodes


def _softmax(prev: str) -> Node:
    return Node("softmax", K.SoftMax, [In(prev, 0)], when=[axis_is_last(1)], escape=(1,))


def _output_transpose(prev: str) -> list:
    return [
        Node("out_transpose", K.StaticTranspose, [In(prev, 0)], optional="out_transpose"),
        Node("out_reshape", {K.StaticReshape, K.Reorder}, [In("out_transpose", 0)],
             optional="out_transpose"),
    ]


def _dequant(role: str, kinds, dtypes_, optional: bool = True) -> list:
    """``{role}_dequant [-> {role}_cast]?`` (the dequantizer's inputs are free)."""
    return [
        Node(f"{role}_dequant", kinds, optional=optional, via=None, when=[in_dtype(0, *dtypes_)]),
        Node(f"{role}_cast", _CAST, [In(f"{role}_dequant", 0)], optional=True,
             when=[fed_by(0, kinds)]),
    ]


def _float_sdpa(name: str, priority: float, compressed: bool, doc: str) -> Pattern:
    nodes = []
    if compressed:
        nodes += _dequant("k", {K.DynamicDequantize}, INT8 + INT4)
    qk_inputs = [In("k_cast", 1)] if compressed else []
    nodes.append(Node("qk_matmul", K.MatMul, qk_inputs, when=[all_inputs_dtype(*FLOATS)]))
    nodes += scores("qk_matmul")
    nodes += [
        _softmax("select_mask"),
        Node("dropout", K.Dropout, [In("softmax", 0)], optional=True, escape=(1,)),
        Node("prob_cast", _CAST, [In("dropout", 0)], optional=True),
    ]
    if compressed:
        nodes += _dequant("v", {K.DynamicDequantize}, INT8 + INT4)
    pv_inputs = [In("prob_cast", 0)] + ([In("v_cast", 1)] if compressed else [])
    nodes.append(Node("pv_matmul", K.MatMul, pv_inputs, when=[all_inputs_dtype(*FLOATS)]))
    nodes += _output_transpose("pv_matmul")
    checks = [present("k_dequant", "v_dequant")] if compressed else []
    return Pattern(name, priority, nodes, checks, doc)


SDPA = _float_sdpa("sdpa", 21.0, False, """Float SDPA (f32/bf16/f16), inference and training forward.

    Q ─┐
    K ─┴ qk_matmul ─ scores(...) ─ softmax ─ [dropout]? ─ [prob_cast]? ─┐
                                     │ stats (may leave)          V ───┴ pv_matmul
                                                    ─ [out_transpose ─ out_reshape|Reorder]?

oneDNN: float_sdp_fusion (+ gemma soft-capping, GPT Select-before-scale form).
Roles: qk_matmul, pre_select, scale, softcap_tanh, softcap_mul, causal_row,
causal_col, causal_add, causal_sub, causal_ge, causal_select, mask_add,
select_mask, softmax, dropout, prob_cast, pv_matmul, out_transpose, out_reshape.
SoftMax's stats output (training forward) may be a partition output.""")

SDPA_COMPRESSED = _float_sdpa("sdpa_compressed", 22.0, True, """SDPA with int4/int8 K and/or V.

    K_int, scales[, zps] ─ [k_dequant (DynamicDequantize)]? ─ [k_cast]? ─┐
                                                              Q ─ qk_matmul ─ scores ─ softmax ...
    V_int, scales[, zps] ─ [v_dequant (DynamicDequantize)]? ─ [v_cast]? ─┐
                                                 ... [prob_cast]? ────────┴ pv_matmul ─ [out]?

oneDNN: sdp_with_compressed_{k,v,kv}_fusion; at least one of k_dequant /
v_dequant must be present.  Unlike oneDNN this also accepts the float
pattern's Dropout, TypeCast and output transpose.
Roles: those of ``sdpa`` plus k_dequant, k_cast, v_dequant, v_cast.""")


def _quantized_sdpa() -> Pattern:
    q8 = INT8 + FP8
    # static (scales as attributes) or dynamic (scales as tensors: oneDNN's
    # sdpa_dynamic_quantized example, per-head scales by the quantization mask)
    deq, quant = {K.Dequantize, K.DynamicDequantize}, {K.Quantize, K.DynamicQuantize}
    nodes = (_dequant("q", deq, q8, False) + _dequant("k", deq, q8, False) + [
        Node("qk_matmul", K.MatMul, [In("q_cast", 0), In("k_cast", 1)]),
    ] + scores("qk_matmul", softcap=False) + [
        _softmax("select_mask"),
        Node("softmax_cast", _CAST, [In("softmax", 0)], optional=True),
        Node("prob_quant", quant, [In("softmax_cast", 0)]),
        Node("prob_dequant", deq, [In("prob_quant", 0)]),
        Node("prob_cast", _CAST, [In("prob_dequant", 0)], optional=True),
    ] + _dequant("v", deq, q8, False) + [
        Node("pv_matmul", K.MatMul, [In("prob_cast", 0), In("v_cast", 1)]),
    ] + _output_transpose("pv_matmul") + [
        Node("out_cast", _CAST, [In("out_reshape", 0)], optional=True),
        Node("quant_out", quant, [In("out_cast", 0)], optional=True),
    ])
    return Pattern("sdpa_quantized", 22.0, nodes, doc="""
Static int8/fp8 SDPA (x8_sdpa, int8_bf16_sdp and the int8 GPT forms).

    Q8 ─ q_dequant ─ [q_cast]? ─┐
    K8 ─ k_dequant ─ [k_cast]? ─┴ qk_matmul ─ scores ─ softmax ─ [softmax_cast]?
        ─ prob_quant ─ prob_dequant ─ [prob_cast]? ─┐
                  V8 ─ v_dequant ─ [v_cast]? ───────┴ pv_matmul
        ─ [out_transpose ─ out_reshape]? ─ [out_cast]? ─ [quant_out]?

Dequantize inputs are s8/u8/f8.  Each (de)quantizer may be static (Quantize /
Dequantize) or dynamic (DynamicQuantize / DynamicDequantize, scales as tensors; an
extension of oneDNN's pattern for its sdpa_dynamic_quantized example: f8 Q/K/V with
per-head scales by ``mask``).  Roles: q_dequant, q_cast, k_dequant, k_cast,
qk_matmul, the score roles, softmax, softmax_cast, prob_quant, prob_dequant,
prob_cast, v_dequant, v_cast, pv_matmul, out_transpose, out_reshape,
out_cast, quant_out.""")


SDPA_QUANTIZED = _quantized_sdpa()


def _gqa() -> Pattern:
    reshape = K.StaticReshape
    nodes = [
        Node("q_reshape", reshape),
        Node("k_reshape", reshape),
        Node("qk_matmul", K.MatMul, [In("q_reshape", 0), In("k_reshape", 1)],
             when=[all_inputs_dtype(*FLOATS)]),
        Node("scale", SCALE, [In("qk_matmul", 0, swap=True)]),
        Node("mask_reshape", reshape, optional=True, via=None),
        Node("mask_add", K.Add, [In("scale", 0, swap=True), In("mask_reshape", 1, swap=True)],
             optional=True),
        Node("select_mask", K.Select, [In("mask_add", (1, 2))], optional=True),
        _softmax("select_mask"),
        Node("dropout", K.Dropout, [In("softmax", 0)], optional=True, escape=(1,)),
        Node("v_reshape", reshape),
        Node("pv_matmul", K.MatMul, [In("dropout", 0), In("v_reshape", 1)]),
        Node("pv_reshape", reshape, [In("pv_matmul", 0)]),
    ] + _output_transpose("pv_reshape")
    return Pattern("sdpa_gqa", 21.1, nodes, doc="""4-D GQA written with reshapes (float_gqa_fusion).

    Q ─ q_reshape ─┐   (N,Hq,S,D) -> (N,Hkv,Nrep,S,D)
    K ─ k_reshape ─┴ qk_matmul ─ scale ─ [mask_add(., [mask_reshape]?)]? ─ [select_mask]?
       ─ softmax ─ [dropout]? ─┐
           V ─ v_reshape ──────┴ pv_matmul ─ pv_reshape ─ [out_transpose ─ out_reshape]?

5-D GQA and MQA (already broadcastable shapes) are plain ``sdpa``.
Roles: q_reshape, k_reshape, qk_matmul, scale, mask_reshape, mask_add,
select_mask, softmax, dropout, v_reshape, pv_matmul, pv_reshape,
out_transpose, out_reshape.""")


SDPA_GQA = _gqa()

SDPA_JAX = Pattern("sdpa_jax", 21.0, [
    Node("qk_matmul", K.MatMul, when=[all_inputs_dtype(*FLOATS)]),
    Node("scale", SCALE, [In("qk_matmul", 0, swap=True)]),
    Node("mask_add", K.Add, [In("scale", 0, swap=True)]),
    _softmax("mask_add"),
    Node("prob_transpose", K.StaticTranspose, [In("softmax", 0)]),
    Node("prob_reorder", K.Reorder, [In("prob_transpose", 0)]),
    Node("pv_matmul", K.MatMul, [In("prob_reorder", 1)]),
    Node("out_transpose", K.StaticTranspose, [In("pv_matmul", 0)]),
    Node("out_reshape", {K.Reorder, K.StaticReshape}, [In("out_transpose", 0)]),
], doc="""JAX MHA (float_sdp_jax_fusion): probabilities enter the 2nd MatMul at input 1.

    qk_matmul ─ scale ─ mask_add ─ softmax ─ prob_transpose ─ prob_reorder ─┐
                                                                    Vt ─ pv_matmul (input 1)
        ─ out_transpose ─ out_reshape (Reorder|StaticReshape)

Roles: qk_matmul, scale, mask_add, softmax, prob_transpose, prob_reorder,
pv_matmul, out_transpose, out_reshape.""")

MQA_JAX = Pattern("mqa_jax", 21.0, [
    Node("qk_matmul", K.MatMul, when=[all_inputs_dtype(*FLOATS)]),
    Node("qk_reshape", K.StaticReshape, [In("qk_matmul", 0)]),
    Node("qk_transpose", K.StaticTranspose, [In("qk_reshape", 0)]),
    Node("mask_add", K.Add, [In("qk_transpose", 0, swap=True)]),
    _softmax("mask_add"),
    Node("prob_transpose", K.StaticTranspose, [In("softmax", 0)]),
    Node("prob_reshape", K.StaticReshape, [In("prob_transpose", 0)]),
    Node("pv_matmul", K.MatMul, [In("prob_reshape", 1)]),
], doc="""JAX MQA (float_mqa_jax_fusion).

    qk_matmul ─ qk_reshape ─ qk_transpose ─ mask_add ─ softmax ─ prob_transpose
        ─ prob_reshape ─ pv_matmul (input 1)

Roles: qk_matmul, qk_reshape, qk_transpose, mask_add, softmax, prob_transpose,
prob_reshape, pv_matmul.""")


def _backward() -> Pattern:
    ta = attr_is("transpose_a", True)
    nodes = [Node("qk_matmul", K.MatMul, when=[all_inputs_dtype(*FLOATS)])]
    nodes += scores("qk_matmul", pre_select=False, softcap=False)
    nodes += [
        Node("sub_stats", K.Subtract, [In("select_mask", 0)]),
        Node("exp", K.Exp, [In("sub_stats", 0)]),
        Node("p_dropout", K.Dropout, [In("exp", 0)], optional=True, escape=(1,)),
        Node("p_cast", _CAST, [In("p_dropout", 0)], optional=True),
        Node("dv_matmul", K.MatMul, [In("p_cast", 0)], when=[ta], escape=(0,)),
        Node("dv_reduce", K.ReduceSum, [In("dv_matmul", 0)], optional=True, escape=(0,)),
        Node("dp_matmul", K.MatMul),
        Node("dp_dropout", K.Dropout, [In("dp_matmul", 0)], optional=True, escape=(1,)),
        Node("o_do", K.Multiply),
        Node("corr", K.ReduceSum, [In("o_do", 0)]),
        Node("sub_corr", K.Subtract, [In("dp_dropout", 0), In("corr", 1)]),
        Node("ds", K.Multiply, [In("exp", 0, swap=True), In("sub_corr", 1, swap=True)]),
        Node("ds_end", K.End, [In("ds", 0)], optional=True),
        Node("ds_scale", SCALE, [In("ds", 0, swap=True)]),
        Node("ds_cast", _CAST, [In("ds_scale", 0)], optional=True),
        Node("dk_matmul", K.MatMul, [In("ds_cast", 0)], when=[ta], escape=(0,)),
        Node("dk_reduce", K.ReduceSum, [In("dk_matmul", 0)], optional=True, escape=(0,)),
        Node("dq_matmul", K.MatMul, [In("ds_cast", 0)], when=[attr_is("transpose_a", False)]),
    ]

    return Pattern("sdpa_backward", 21.0, nodes, doc="""
SDPA training backward (float_sdp_backward_fusion, float_gqa_backward_fusion).

    S  = scores(qk_matmul(Q, K))             P = exp(sub_stats(S, stats))
    dV = dv_matmul([p_cast]?([p_dropout]?(P)), dO)   [-> dv_reduce (GQA)]?
    dP = [dp_dropout]?(dp_matmul(dO, V))     corr = corr(o_do(O, dO))   (ReduceSum)
    dS = ds(P, sub_corr(dP, corr))           [ds_end (End: dMask output)]?
    dS' = [ds_cast]?(ds_scale(dS, scale))
    dK = dk_matmul(dS', Q) [-> dk_reduce]?   dQ = dq_matmul(dS', K)   (the sink)

Roles: qk_matmul, the score roles (no pre_select/softcap), sub_stats, exp,
p_dropout, p_cast, dv_matmul, dv_reduce, dp_matmul, dp_dropout, o_do, corr,
sub_corr, ds, ds_end, ds_scale, ds_cast, dk_matmul, dk_reduce, dq_matmul.
dV/dK/dQ (and the End'ed dS) leave the partition.  dK/dV/dQ are told apart
by transpose_a (true for dK and dV).  oneDNN's xf16 variant requires the two
TypeCasts; here MatMul's same-type rule already forces them.""")


SDPA_BACKWARD = _backward()


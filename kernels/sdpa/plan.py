"""SDPA partitions (``sdpa``, ``sdpa_compressed``, ``sdpa_gqa``, ``sdpa_jax``) on the Numba kernel of ``graph_api.kernels.sdpa``.

``sdpa_quantized`` partitions are handed to :mod:`.quant_plan` (same
score chain, exact quantize points), ``sdpa_backward`` ones to
:mod:`.backward_plan` (same geometry and score chain).  ``mqa_jax`` has no plan: as written
(graphs.jax_mqa, oneDNN's float_mqa_jax_fusion) SoftMax normalises over one
axis and the second MatMul contracts over the other, which is not the
kernel's ``softmax(s) v``.

The whole partition becomes one ``graph_api.kernels.sdpa.sdpa`` call plus numpy
reshapes/transposes of its output::

    Q ─[q_reshape]─┐
    K ─[k_reshape | k_dequant ─ [k_cast]]─┴ qk_matmul ─ [pre_select] ─ [scale] ─ [causal]
        ─ [mask_add] ─ [select_mask] ─ softmax ─ [prob_cast] ─┐
    V ─[v_reshape | v_dequant ─ [v_cast]]─────────────────────┴ pv_matmul
        ─ [pv_reshape] ─ [out_transpose ─ out_reshape|Reorder]

JAX form (``sdpa_jax``): the probabilities pass ``prob_transpose`` (swapping
the last two dims) and ``prob_reorder`` into pv_matmul's input 1, V^T at input
0 (``[.., D, S]``, or ``[.., S, D]`` with ``transpose_a``): pv_matmul gives
``O^T = V^T P^T``, which the plan produces as a transpose of the kernel's O
before ``out_transpose``/``out_reshape``.

Shapes.  Q = qk_matmul input 0 ``[*L, Sq, D]``; K = qk_matmul input 1,
``[*Lk, S, D]`` with ``transpose_b`` or ``[*Lk, D, S]`` without; V = pv_matmul
input 1 ``[*Lk, S, D]``.  The leading dims of K and V (left-padded with 1s)
must be equal, match L on a prefix and be 1 after it: 4-D MHA and MQA
(``[B, 1, S, D]``), 5-D GQA (Q ``[B, Hkv, rep, Sq, D]``, K/V
``[B, Hkv, 1, S, D]``), K/V broadcast over the batch.  The kernel sees
``q [B, Hq, Sq, D]`` and K/V ``[B, Hkv, S, D]``, query head ``h`` reading KV
head ``h // (Hq / Hkv)``; the output is reshaped back.

Memory.  Each K/V is given to the kernel in the order its strides store it:
``[.., S, D]`` dense ("bhsd"), for K also ``[.., D, S]`` dense (the kernel's
"transposed" K, e.g. the conformance int4 K, logically ``[B, H, D, S]``).
int4 data are the tensor's packed bytes (strided-offset order, so a storage
that permutes dims is a dense packed buffer in the permuted order); other
layouts of byte-sized data are copied dense, of int4 data refused.
Scales/zero points: DynamicDequantize per_group with the group along D only,
or per_tensor.

Scores.  ``scale`` (Multiply, or Divide with the scores as dividend) by a
one-element tensor or host scalar read at execute.  Every mask becomes one
additive f32 mask broadcast to the scores: ``mask_add``'s operand, and each
Select (``pre_select``, ``select_mask``, the implicit causal ``causal_select``)
as 0 / -inf.  That is exact when the Select's fill is -inf and, for
``pre_select`` (applied before the scale), the scale is positive: these are
values, checked at execute; otherwise the partition runs the composed
reference plan for that call.  The implicit causal mask uses the kernel's
``top_left`` (no causal_add/causal_sub, or s_kv == s_q) or ``bottom_right``
(s_kv - s_q == S - Sq) alignment, any other offset an additive triangle.
SoftMax ``inf_as_zero``: rows the masks hide completely are set to 0 (the
kernel gives 0/0 there; ``mode=none`` gives NaN like the reference).  Any
other NaN row (scores all -inf because of an inf scale or inf inputs, or a
NaN input) makes that call run the composed reference plan, which tells a
row to zero from a NaN to keep.

Numerics.  The kernel keeps scores and probabilities in f32 where the
reference rounds them to their intermediate types (bf16/f16 scores, SoftMax
output, ``prob_cast``).  Accepted when no such type is coarser than the output
type (or the fpmath type): ``graph_api.check`` allows a few ulps of that type
relative to max|out|.  Rounding the probabilities costs <= 1 ulp of their type
times max|V|; rounding the scores costs about ``|logit| * ulp`` in each
exponent, so half-precision scores stay within the rule for logits up to
roughly +-10 (measured: f16 scores, logits ~N(0,1)..N(0,9): <= 60% of the
tolerance; larger logits can exceed it, while the fused result is the more
accurate one).  A partition with a coarser intermediate (bf16 probabilities,
f32 output, strict) is refused.
fpmath is applied exactly (docs/fpmath.md): Q, K and V are rounded as the
reference MatMul rounds them (f32 data by the mode; dequantized K/V to the
DynamicDequantize/TypeCast type and by the mode only with ``apply_to_int``)
through the kernel's one rounding code, refused when they need different
ones (f32 Q with int K/V under bf16 without apply_to_int) or a double
rounding (bf16 values under f16).  The reference also rounds f32
probabilities by the mode before the PV MatMul, which an online softmax
cannot reproduce: f32 probabilities under a rounding mode are refused, so
under bf16/f16/tf32 only half-precision SDPA graphs take the kernel.  fpmath
bf16 with ``apply_to_int`` lets the int4/int8 decode compute both products with
bf16 inputs (``bf16_dot``: graph_api.kernels.sdpa.decode_bf16, AVX512_BF16).

Training forward: SoftMax's stats output (``max + ln(sum exp(s - max))`` per
row, f32) may leave the partition; the kernel records each row's max and sum
of exponentials and the plan evaluates the formula in float64 from them
(``kernels.sdpa.merge.row_stats``), -inf for rows the masks hide (``inf_as_zero``)
and NaN there in mode ``none``, as the reference.  Refused when the reference
rounds the scores to a half type before SoftMax (the stats are judged as f32).

Refused (reference path): soft-capping, Dropout, any other intermediate
leaving the partition, non-scalar scales, K/V head size different from Q's,
transposed probabilities.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

import numpy as np

from graph_api import dtypes
from graph_api.check import EPS
from graph_api.config import log
from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K
from graph_api.enums import PropertyType
from graph_api.kernels.bits import RND_BF16, RND_F16, RND_NONE, RND_TF32, rounding_code
from graph_api.kernels.sdpa import prefill_bf16
from graph_api.kernels.fused.hybrid import HybridPlan
from graph_api.kernels.weight_compressed.wmatmul_plan import zero_size_reason
from graph_api.kernels.plan import ComposedPlan, CompileRequest

from .plan_operands import (_FLOATS, _ANY_RND, _swap, Operand, _compressed, _float_operand, make_kv)

_REFUSED_ROLES = {"softcap_tanh": "soft-capping (tanh) has no kernel form",
                  "dropout": "Dropout has no kernel form"}
_NEG_INF = np.float32(-np.inf)


class _Fallback(Exception):
    """A value read at execute that the kernel cannot express."""


@dataclass
class Geometry:
    """How the partition's shapes map to the kernel's 4-D ones."""

    lead: tuple      # Q's leading dims L
    Sq: int
    S: int
    D: int
    B: int
    Hq: int
    Hkv: int
    split: bool      # kernel B is L[0] (else 1, all of L in the heads)

    def kernel_mask(self, m):
        """An additive mask broadcastable to [*L, Sq, S] as one broadcastable to [B, Hq, Sq, S]."""
        r = len(self.lead) + 2
        m = np.asarray(m)
        m = m.reshape((1,) * (r - m.ndim) + m.shape)
        ml, tail = m.shape[:-2], m.shape[-2:]
        lead, first = (self.lead[1:], ml[:1]) if self.split else (self.lead, (1,))
        rest = ml[1:] if self.split else ml
        if all(d == 1 for d in rest):
            return m.reshape(first + (1,) + tail)
        if tuple(rest) != tuple(lead):
            m = np.broadcast_to(m, tuple(ml[:1] if self.split else ()) + tuple(lead) + tail)
        return m.reshape(first + (self.Hq,) + tail)


def _geometry(q_shape, k_shape, v_shape):
    """Geometry from Q [*L,Sq,D], K [*Lk,S,D], V [*Lk,S,D] (canonical orders), or a reason."""
    if min(len(q_shape), len(k_shape), len(v_shape)) < 2:
        return "1-D Q/K/V"
    lq, lk, lv = tuple(q_shape[:-2]), tuple(k_shape[:-2]), tuple(v_shape[:-2])
    Sq, D = q_shape[-2:]
    S, Dk = k_shape[-2:]
    if Dk != D or v_shape[-2] != S:
        return f"Q {list(q_shape)}, K {list(k_shape)}, V {list(v_shape)} do not chain"
    if v_shape[-1] != D:
        return f"V head size {v_shape[-1]} differs from Q/K's {D} (the kernel has one head size)"
    if len(lk) > len(lq) or len(lv) > len(lq):
        return "K/V have more dims than Q (Q broadcast)"
    lk = (1,) * (len(lq) - len(lk)) + lk
    lv = (1,) * (len(lq) - len(lv)) + lv
    if lk != lv:
        return f"K leading dims {list(lk)} differ from V's {list(lv)}"
    p = len(lk)
    while p and lk[p - 1] == 1:
        p -= 1
    if any(lk[i] != lq[i] for i in range(p)):
        return f"K/V leading dims {list(lk)} are not Q's {list(lq)} then broadcast dims"
    split = p >= 1
    prod = lambda t: int(np.prod(t, dtype=np.int64))  # noqa: E731
    return Geometry(lq, Sq, S, D, lq[0] if split else 1, prod(lq[1:] if split else lq),
                    prod(lk[1:]) if split else 1, split)


@dataclass
class Scores:
    """The score chain between the two MatMuls, ready to bind at execute."""

    scale_id: int | None = None
    scale_mode: str = "mul"
    pre_select: bool = False
    masks: tuple = ()          # ("select", cond_id, fill_id, keep_when_true) | ("add", tid)
    causal: tuple | None = None  # (s_kv id | None, s_q id | None, fill id)
    inf_as_zero: bool = False
    prob_id: int = -1          # the pv_matmul input 0
    types: tuple = ()          # types the reference rounds scores / probabilities to
    score_types: tuple = ()    # the same up to SoftMax's input (what its stats see)


def _select(op, value):
    """("select", cond, fill, keep_when_true) of a Select taking the scores ``value``, or None."""
    ids = [lt.id for lt in op.inputs]
    if ids[1] == value:
        return ("select", ids[0], ids[2], True)
    if ids[2] == value:
        return ("select", ids[0], ids[1], False)
    return None


def _scalar_operand(op, value, lts):
    """The other operand's id of a binary ``op`` taking ``value``, if it holds one value."""
    ids = [lt.id for lt in op.inputs]
    if value not in ids:
        return None
    other = ids[1 - ids.index(value)]
    return other if lts[other].nelems() == 1 else None


def score_chain(request, b, ops):
    """(Scores, masked-score tensor id, types it was rounded to) of the chain from
    ``qk_matmul`` through ``select_mask`` (the part the training backward shares),
    or a reason."""
    lts = request.lts
    sc = Scores()
    value = ops[b["qk_matmul"]].outputs[0].id
    scores_shape = lts[value].shape
    kinds = [lts[value].dtype]
    masks = []
    if b.get("pre_select") is not None:
        entry = _select(ops[b["pre_select"]], value)
        if entry is None:
            return "pre_select does not take the scores"
        masks.append(entry)
        sc.pre_select = True
        value = ops[b["pre_select"]].outputs[0].id
        kinds.append(lts[value].dtype)
    if b.get("scale") is not None:
        op = ops[b["scale"]]
        sc.scale_id = _scalar_operand(op, value, lts)
        if sc.scale_id is None or (op.kind == K.Divide and op.inputs[0].id != value):
            return f"scale {op.kind.name} (op {op.id}) is not (scores, one value)"
        sc.scale_mode = "div" if op.kind == K.Divide else "mul"
        value = op.outputs[0].id
        kinds.append(lts[value].dtype)
    if b.get("causal_select") is not None:
        reason = _causal(request, b, ops, value, sc)
        if reason:
            return reason
        value = ops[b["causal_select"]].outputs[0].id
        kinds.append(lts[value].dtype)
    for role in ("mask_add", "select_mask"):
        if b.get(role) is None:
            continue
        op = ops[b[role]]
        if role == "mask_add":
            ids = [lt.id for lt in op.inputs]
            entry = ("add", ids[1 - ids.index(value)]) if value in ids else None
        else:
            entry = _select(op, value)
        if entry is None:
            return f"{role} (op {op.id}) does not take the scores"
        masks.append(entry)
        value = op.outputs[0].id
        kinds.append(lts[value].dtype)
    if lts[value].shape != scores_shape:
        return f"a mask widens the scores {list(scores_shape)}"
    sc.masks = tuple(masks)
    return sc, value, kinds


def _scores(request, b, ops) -> Scores | str:
    chain = score_chain(request, b, ops)
    if isinstance(chain, str):
        return chain
    sc, value, kinds = chain
    lts = request.lts
    scores_shape = lts[ops[b["qk_matmul"]].outputs[0].id].shape
    softmax = ops[b["softmax"]]
    if softmax.inputs[0].id != value:
        return "SoftMax does not take the masked scores"
    if any(lts[o.id].shape != scores_shape for o in softmax.outputs[:1]):
        return f"a mask widens the scores {list(scores_shape)}"
    sc.inf_as_zero = softmax.attrs.get("mode", "none") == "inf_as_zero"
    sc.score_types = tuple(kinds)
    prob = softmax.outputs[0].id
    kinds.append(lts[prob].dtype)
    if b.get("prob_cast") is not None:
        prob = ops[b["prob_cast"]].outputs[0].id
        kinds.append(lts[prob].dtype)
    if b.get("prob_transpose") is not None:  # sdpa_jax: P^T enters pv_matmul at input 1
        tr, ro = ops[b["prob_transpose"]], ops[b["prob_reorder"]]
        r = len(scores_shape)
        order = [int(a) % r for a in tr.attrs.get("order") or []]
        if tr.inputs[0].id != prob or order != list(range(r - 2)) + [r - 1, r - 2]:
            return f"prob_transpose (op {tr.id}) does not swap the probabilities' last two dims"
        if ro.inputs[0].id != tr.outputs[0].id or lts[ro.outputs[0].id].dtype != lts[prob].dtype:
            return f"prob_reorder (op {ro.id}) does not copy the transposed probabilities"
        prob = ro.outputs[0].id
    sc.prob_id, sc.types = prob, tuple(kinds)
    return sc


def _causal(request, b, ops, value, sc: Scores) -> str | None:
    lts = request.lts
    sel = ops[b["causal_select"]]
    if [lt.id for lt in sel.inputs][1] != value:
        return "causal_select does not keep the scores where the condition holds"
    ge, row = ops[b["causal_ge"]], ops[b["causal_row"]].outputs[0].id
    skv = sq = None
    if b.get("causal_add") is not None:
        add, sub = ops[b["causal_add"]], ops[b["causal_sub"]]
        skv = _scalar_operand(add, row, lts)
        sq = sub.inputs[1].id if lts[sub.inputs[1].id].nelems() == 1 else None
        if skv is None or sq is None or sub.inputs[0].id != add.outputs[0].id:
            return "bottom-right causal offsets are not single values"
        row = sub.outputs[0].id
    if [lt.id for lt in ge.inputs] != [row, ops[b["causal_col"]].outputs[0].id] or \
            sel.inputs[0].id != ge.outputs[0].id:
        return "the implicit causal mask is not row >= column"
    sc.causal = (skv, sq, sel.inputs[2].id)
    return None


def _roundings(request, q_lt, k: Operand, v: Operand):
    q = frozenset({rounding_code(request.fpmath)}) if q_lt.dtype == DataType.f32 else _ANY_RND
    common = q & k.rnd & v.rnd
    if not common:
        names = {RND_NONE: "none", RND_BF16: "bf16", RND_F16: "f16", RND_TF32: "tf32"}
        show = lambda s: "|".join(names[c] for c in sorted(s))  # noqa: E731
        return f"Q, K and V need different fpmath roundings (Q {show(q)}, K {show(k.rnd)}, " \
               f"V {show(v.rnd)}; fpmath {request.fpmath}) and the kernel applies one"
    return RND_NONE if RND_NONE in common else min(common)


def _precision(request, out_dt, kinds) -> str | None:
    limit = EPS[out_dt]
    if request.fpmath.rounding is not None:
        limit = max(limit, EPS["tf32" if request.fpmath.rounding == "tf32" else DataType[request.fpmath.rounding]])
    coarse = [t.name for t in kinds if t in EPS and EPS[t] > limit]
    if coarse:
        return f"the reference rounds scores/probabilities to {', '.join(coarse)}, coarser than " \
               f"the {out_dt.name} output and fpmath {request.fpmath} the check allows"
    return None


def _output_chain(request, b, ops):
    """([("reshape", shape) | ("transpose", order)], final id) after pv_matmul, or a reason."""
    steps, value = [], ops[b["pv_matmul"]].outputs[0].id
    if b.get("prob_transpose") is not None:  # sdpa_jax: pv_matmul gives O^T = V^T P^T
        steps.append(("transpose", _swap(tuple(range(len(request.lts[value].shape))))))
    for role in ("pv_reshape", "out_transpose", "out_reshape"):
        if b.get(role) is None:
            continue
        op = ops[b[role]]
        if op.inputs[0].id != value:
            return f"{role} does not take the attention output"
        out = request.lts[op.outputs[0].id]
        if out.dtype != request.lts[value].dtype:
            return f"{role} changes the data type"
        if op.kind == K.StaticTranspose:
            order = [int(a) % len(out.shape) for a in op.attrs.get("order") or []]
            steps.append(("transpose", tuple(order) or None))
        else:
            steps.append(("reshape", tuple(out.shape)))
        value = out.id
    return steps, value


def _stats_output(request, b, ops, final_id, scores: Scores):
    """The id of SoftMax's stats when it leaves the partition (else None), or a reason."""
    softmax = ops[b["softmax"]]
    stats = softmax.outputs[1].id if len(softmax.outputs) > 1 else None
    others = [t for t in request.output_ids if t not in (final_id, stats)]
    if others or final_id not in request.output_ids:
        return f"tensors {others} leave the partition (an intermediate); the kernel " \
               f"produces the attention output and SoftMax's stats"
    if stats not in request.output_ids:
        return None
    if request.lts[stats].dtype != DataType.f32:
        return f"{request.lts[stats].dtype.name} SoftMax stats"
    coarse = [t.name for t in scores.score_types if t != DataType.f32]
    if coarse:  # the stats are f32 values judged at f32 precision
        return f"the reference rounds the scores to {', '.join(coarse)} before the f32 stats; " \
               f"the kernel keeps them f32"
    return stats


def score_masks(g, sc, fetch, inputs, scale):
    """(additive f32 mask or None, causal alignment or None, causal offset) for this call:
    every mask of ``sc`` as one additive f32 mask (Selects as 0 / -inf), ``fetch(inputs, id)``
    reading a tensor; raises :class:`_Fallback` for values the additive form cannot express."""
    parts = []
    for entry in sc.masks:
        if entry[0] == "add":
            parts.append(fetch(inputs, entry[1]))
            continue
        _, cond_id, fill_id, keep = entry
        if not np.all(np.isneginf(_f32_value(fetch, inputs, fill_id))):
            raise _Fallback("a Select mask fills with values other than -inf")
        cond = np.asarray(fetch(inputs, cond_id), dtype=bool)
        parts.append(np.where(cond, np.float32(0), _NEG_INF) if keep else
                     np.where(cond, _NEG_INF, np.float32(0)))
    if sc.pre_select and sc.scale_id is not None and not (0 < scale < np.inf):
        raise _Fallback(f"scale {scale} before a pre_select mask is not positive")
    causal, offset = None, 0
    if sc.causal is not None:
        skv, sq, fill = sc.causal
        if not np.all(np.isneginf(_f32_value(fetch, inputs, fill))):
            raise _Fallback("the causal Select fills with values other than -inf")
        if skv is not None:
            offset = int(np.asarray(fetch(inputs, skv)).reshape(-1)[0]) - \
                int(np.asarray(fetch(inputs, sq)).reshape(-1)[0])
        if offset == 0:
            causal = "top_left"
        elif offset == g.S - g.Sq:
            causal = "bottom_right"
        else:
            i, j = np.arange(g.Sq)[:, None], np.arange(g.S)[None, :]
            parts.append(np.where(j > i + offset, _NEG_INF, np.float32(0)))
    if not parts:
        return None, causal, offset
    mask = parts[0] if len(parts) == 1 else reduce(np.add, (dtypes.to_f32(p) for p in parts))
    return mask, causal, offset


def _f32_value(fetch, inputs, tid) -> np.ndarray:
    return dtypes.to_f32(np.asarray(fetch(inputs, tid)))


# ====================================================================== the plan
@dataclass
class SdpaCore:
    """Everything the execute needs, computed at compile."""

    request: CompileRequest
    geo: Geometry
    q_id: int
    q_transposed: bool
    k: Operand
    v: Operand
    scores: Scores
    rnd: int
    out_dtype: DataType
    steps: list
    final_id: int
    reshaped: dict           # tensor id -> source id of a StaticReshape inside (sdpa_gqa)
    stats_id: int | None = None  # SoftMax's stats output, when it leaves the partition
    bf16_probs: bool = False  # the probabilities enter pv_matmul as bf16 (their type or the mode)

    def fetch(self, inputs, tid):
        """The logical array of ``tid``: a partition input, or a reshape of one."""
        if tid in self.reshaped:
            return np.reshape(self.fetch(inputs, self.reshaped[tid]), self.request.lts[tid].shape)
        return inputs[tid].numpy()

    def _value(self, inputs, tid) -> np.ndarray:
        return dtypes.to_f32(np.asarray(self.fetch(inputs, tid)))

    def _masks(self, inputs, scale):
        return score_masks(self.geo, self.scores, self.fetch, inputs, scale)

    def _zero_dead_rows(self, out, mask, causal, offset):
        """inf_as_zero: rows whose every position is masked are 0 (the kernel gave 0/0)."""
        g = self.geo
        hidden = np.zeros((1, 1), bool)
        if mask is not None:
            hidden = hidden | (dtypes.to_f32(np.asarray(mask)) == _NEG_INF)
        if causal is not None:
            i, j = np.arange(g.Sq)[:, None], np.arange(g.S)[None, :]
            hidden = hidden | (j > i + offset)
        dead = hidden.all(axis=-1)
        dead = np.broadcast_to(dead.reshape((1,) * (len(g.lead) + 1 - dead.ndim) + dead.shape),
                               g.lead + (g.Sq,))
        out[dead] = 0

    def _out_view(self, inputs, outputs):
        """The attention result ``[*lead, Sq, D]`` as a view of the final output tensor's
        memory (the output chain's transposes and reshapes undone), so the kernel
        writes the partition's output with no copy; None when that layout needs a
        copy, the output is not f32, or the output's memory overlaps an input (the
        kernel reads inputs while it writes)."""
        t = (outputs or {}).get(self.final_id)
        if t is None or self.out_dtype != DataType.f32 or t.packed or not t.is_direct():
            return None
        dest = t.numpy()
        if any(np.may_share_memory(dest, x.memory()) for x in inputs.values()):
            return None
        g = self.geo
        shapes = [g.lead + (g.Sq, g.D)]
        for kind, arg in self.steps:
            last = shapes[-1]
            shapes.append(tuple(arg) if kind == "reshape" else
                          last[::-1] if arg is None else tuple(last[i] for i in arg))
        v = dest
        try:
            for (kind, arg), shape_in in zip(reversed(self.steps), reversed(shapes[:-1])):
                v = np.reshape(v, shape_in, copy=False) if kind == "reshape" else \
                    np.transpose(v, None if arg is None else np.argsort(arg))
            return np.reshape(v, (g.B, g.Hq, g.Sq, g.D), copy=False)
        except ValueError:  # a reshape of this strided view would copy
            return None

    def __call__(self, inputs, arrays, outputs=None):
        from graph_api.kernels import sdpa as SD

        g, sc = self.geo, self.scores
        scale = 1.0
        if sc.scale_id is not None:
            scale = float(self._value(inputs, sc.scale_id).reshape(-1)[0])
        mask, causal, offset = self._masks(inputs, scale)
        q = self.fetch(inputs, self.q_id)
        if self.q_transposed:
            q = np.swapaxes(q, -1, -2)
        shape4 = (g.B, g.Hkv, g.S, g.D)
        k = make_kv(self.k, inputs, self.fetch, shape4, allow_bhds=True)
        v = make_kv(self.v, inputs, self.fetch, shape4, allow_bhds=False)
        stats = None if self.stats_id is None else np.empty((g.B, g.Hq, g.Sq), np.float32)
        out = SD.sdpa(np.reshape(q, (g.B, g.Hq, g.Sq, g.D)), k, v, scale=scale,
                      scale_mode=sc.scale_mode, mask=None if mask is None else g.kernel_mask(mask),
                      causal=causal, out=self._out_view(inputs, outputs),
                      out_dtype=_FLOATS[self.out_dtype], rnd=self.rnd, stats=stats,
                      bf16_dot=self.request.fpmath.rounding == "bf16" and self.request.fpmath.apply_to_int,
                      bf16_probs=self.bf16_probs)
        out = out.view(dtypes.numpy_dtype(self.out_dtype)).reshape(g.lead + (g.Sq, g.D))
        if sc.inf_as_zero and np.isnan(out).any():
            if mask is not None or causal is not None:
                self._zero_dead_rows(out, mask, causal, offset)
            if np.isnan(out).any():  # NaN from the values (inf/NaN inputs or scale): a row
                # of all -inf scores must be 0, a NaN input must stay NaN; the kernel
                # cannot tell them apart, the reference can
                raise _Fallback("NaN rows under inf_as_zero that the masks do not explain")
        for kind, arg in self.steps:
            out = np.reshape(out, arg) if kind == "reshape" else np.transpose(out, arg)
        arrays[self.final_id] = out
        if stats is not None:
            if not sc.inf_as_zero:  # mode none: a row of -inf scores gives NaN (-inf - -inf)
                stats[stats == _NEG_INF] = np.nan
            arrays[self.stats_id] = stats.reshape(g.lead + (g.Sq, 1))

    def bind(self, inputs, outputs):
        """A callable that runs this attention on these tensors (see
        ``CompiledPartition.bind``): the f32 prefill kernel on the tensors' own memory
        (:func:`graph_api.kernels.sdpa.prefill_runner`), writing the output in place;
        None where a call does more (Select or causal masks, a stats output, the
        inf_as_zero check, a variable scale, operands converted or copied, an output
        layout the kernel cannot write), which runs the plan's execute."""
        from graph_api.kernels import sdpa as SD

        g, sc = self.geo, self.scores
        if self.stats_id is not None or sc.inf_as_zero or sc.causal is not None or self.q_transposed or \
                len(sc.masks) > 1 or any(m[0] != "add" for m in sc.masks) or \
                (sc.scale_id is not None and self.request.lts[sc.scale_id].property != PropertyType.constant):
            return None
        out = self._out_view(inputs, outputs)
        if out is None:
            return None
        scale = 1.0 if sc.scale_id is None else float(self._value(inputs, sc.scale_id).reshape(-1)[0])
        mask = None if not sc.masks else self.fetch(inputs, sc.masks[0][1])
        q = np.reshape(self.fetch(inputs, self.q_id), (g.B, g.Hq, g.Sq, g.D))
        shape4 = (g.B, g.Hkv, g.S, g.D)
        k = make_kv(self.k, inputs, self.fetch, shape4, allow_bhds=True)
        v = make_kv(self.v, inputs, self.fetch, shape4, allow_bhds=False)
        memories = [t.memory() for t in inputs.values()]
        if mask is not None:
            mask = g.kernel_mask(mask)
        for x in (q, k.data, v.data) + (() if mask is None else (mask,)):
            if not any(np.may_share_memory(x, m) for m in memories):
                return None  # a copy made for this call
        return SD.prefill_runner(q, k, v, scale=scale, scale_mode=sc.scale_mode, mask=mask, out=out)


def _jax(b) -> bool:
    """sdpa_jax: the probabilities enter pv_matmul transposed, at input 1."""
    return b.get("prob_transpose") is not None


def _unknown_ops(request, b) -> str | None:
    bound = {v for v in b.values() if isinstance(v, int)}
    extra = [op for op in request.ops if op.id not in bound]
    if extra:
        return f"ops {[f'{op.kind.name} {op.id}' for op in extra]} have no role the plan knows"
    for role, why in _REFUSED_ROLES.items():
        if b.get(role) is not None:
            return why
    return None


def _reshapes(b, ops) -> dict:
    """Output id -> input id of the StaticReshapes of sdpa_gqa (done in numpy at execute)."""
    out = {}
    for role in ("q_reshape", "k_reshape", "v_reshape", "mask_reshape"):
        if b.get(role) is not None:
            op = ops[b[role]]
            out[op.outputs[0].id] = op.inputs[0].id
    return out


def _operands(request, b, ops):
    """(K Operand, V Operand, canonical K shape, canonical V shape) or a reason."""
    lts = request.lts
    qk, pv = ops[b["qk_matmul"]], ops[b["pv_matmul"]]
    k_swapped = not qk.attrs.get("transpose_b", False)
    v_port = 0 if _jax(b) else 1  # sdpa_jax: O^T = V^T P^T, V^T at input 0
    v_swapped = not pv.attrs.get("transpose_a", False) if _jax(b) else \
        bool(pv.attrs.get("transpose_b", False))
    if b.get("k_dequant") is not None:
        k = _compressed(request, b["k_dequant"], b.get("k_cast"), k_swapped, allow_bhds=True)
    else:
        k = _float_operand(request, qk.inputs[1].id, k_swapped)
    if isinstance(k, str):
        return f"K: {k}"
    if b.get("v_dequant") is not None:
        v = _compressed(request, b["v_dequant"], b.get("v_cast"), v_swapped, allow_bhds=False)
    else:
        v = _float_operand(request, pv.inputs[v_port].id, v_swapped)
    if isinstance(v, str):
        return f"V: {v}"
    k_shape, v_shape = lts[qk.inputs[1].id].shape, lts[pv.inputs[v_port].id].shape
    return k, v, _swap(k_shape) if k_swapped else k_shape, _swap(v_shape) if v_swapped else v_shape


def build(request: CompileRequest):
    """The plan of an SDPA partition, or why the fast path does not apply."""
    b, lts = request.bindings, request.lts
    if b.get("prob_quant") is not None:  # sdpa_quantized
        from . import quant_plan

        return quant_plan.build(request)
    if b.get("sub_stats") is not None:  # sdpa_backward
        from . import backward_plan

        return backward_plan.build(request)
    ops = {op.id: op for op in request.ops}
    reason = _unknown_ops(request, b) or zero_size_reason(request)
    if reason:
        return reason
    qk, pv = ops[b["qk_matmul"]], ops[b["pv_matmul"]]
    prob_port, prob_flag = (1, "transpose_b") if _jax(b) else (0, "transpose_a")
    if pv.attrs.get(prob_flag, False):
        return f"transposed probabilities (pv_matmul {prob_flag})"
    if len(qk.inputs) > 2 or len(pv.inputs) > 2:
        return "a MatMul with a bias"
    operands = _operands(request, b, ops)
    if isinstance(operands, str):
        return operands
    k, v, k_shape, v_shape = operands
    q_lt = lts[qk.inputs[0].id]
    if q_lt.dtype not in _FLOATS:
        return f"{q_lt.dtype.name} Q"
    q_transposed = bool(qk.attrs.get("transpose_a", False))
    geo = _geometry(_swap(q_lt.shape) if q_transposed else q_lt.shape, k_shape, v_shape)
    if isinstance(geo, str):
        return geo
    if lts[qk.outputs[0].id].shape != geo.lead + (geo.Sq, geo.S):
        return f"scores {list(lts[qk.outputs[0].id].shape)} are not Q's batch x Sq x S"
    scores = _scores(request, b, ops)
    if isinstance(scores, str):
        return scores
    if pv.inputs[prob_port].id != scores.prob_id:
        return "pv_matmul does not take the probabilities"
    out_lt = lts[pv.outputs[0].id]
    o_shape = geo.lead + ((geo.D, geo.Sq) if _jax(b) else (geo.Sq, geo.D))
    if out_lt.dtype not in _FLOATS or out_lt.shape != o_shape:
        return f"attention output {out_lt!r}"
    reason = _precision(request, out_lt.dtype, scores.types)
    if reason:
        return reason
    rnd = _roundings(request, q_lt, k, v)
    if isinstance(rnd, str):
        return rnd
    # f32 probabilities under bf16: the bf16 unit's prefill rounds them as the reference does
    # (kernels/sdpa/prefill_bf16.py); the other kernels' online softmax keeps them f32
    f32_probs_on_unit = (request.fpmath.rounding == "bf16" and rnd == RND_BF16 and k.kind in ("f32", "bf16")
                         and v.kind in ("f32", "bf16") and prefill_bf16.usable(geo.D, geo.S, geo.Sq))
    if lts[scores.prob_id].dtype == DataType.f32 and request.fpmath.rounding is not None \
            and not f32_probs_on_unit:
        return f"fpmath {request.fpmath} rounds the f32 probabilities entering pv_matmul; the " \
               f"kernel's online softmax keeps them f32 (docs/fpmath.md: modes apply exactly)"
    chain = _output_chain(request, b, ops)
    if isinstance(chain, str):
        return chain
    stats_id = _stats_output(request, b, ops, chain[1], scores)
    if isinstance(stats_id, str):
        return stats_id
    reshaped = _reshapes(b, ops)
    reason = _inside(request, reshaped, [q_lt.id, k, v, scores])
    if reason:
        return reason
    if f32_probs_on_unit and lts[scores.prob_id].dtype == DataType.f32 and stats_id is not None:
        return "SoftMax's stats with f32 probabilities under fpmath bf16 (the bf16 prefill keeps no stats)"
    core = SdpaCore(request, geo, q_lt.id, q_transposed, k, v, scores, rnd, out_lt.dtype,
                    chain[0], chain[1], reshaped, stats_id,
                    bf16_probs=lts[scores.prob_id].dtype == DataType.bf16 or f32_probs_on_unit)
    return HybridPlan(request, "numba_sdpa", _with_fallback(request, core), {op.id for op in request.ops})


def _inside(request, reshaped, things) -> str | None:
    """Why a tensor read at execute is not a partition input (or a reshape of one), if so."""
    ids = []
    for t in things:
        if isinstance(t, Operand):
            ids += [t.data_id, t.scale_id, t.zp_id]
        elif isinstance(t, Scores):
            ids += [t.scale_id] + [i for m in t.masks for i in m[1:3] if not isinstance(i, bool)]
            ids += list(t.causal or ())
        else:
            ids.append(t)
    for tid in ids:
        src = tid
        while src in reshaped:
            src = reshaped[src]
        if src is not None and src not in request.input_ids:
            return f"tensor {tid} is computed inside the partition where the kernel needs an input"
    return None


def _with_fallback(request, core):
    """``core``, running the composed reference plan when it raises :class:`_Fallback`."""
    reference = ComposedPlan(request)

    def run(inputs, arrays, outputs=None):
        try:
            core(inputs, arrays, outputs)
        except _Fallback as why:
            log(f"fallback,{request.pattern},reference,{why}")
            arrays.update(reference.run_arrays({tid: t.numpy() for tid, t in inputs.items()}))

    run.core = core
    bind = getattr(core, "bind", None)
    if bind is not None:  # the bound form meets no fallback condition (see SdpaCore.bind)
        run.bind = bind
    run.writes_outputs = True
    return run

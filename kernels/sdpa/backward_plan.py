"""``sdpa_backward`` partitions on the kernel of ``graph_api.kernels.sdpa.backward``.

The partition (patterns/library/sdpa.py ``_backward``, oneDNN's
float_sdp_backward_fusion / float_gqa_backward_fusion) becomes one
``sdpa.backward.backward`` call::

    Q, K ─ qk_matmul ─ scores (scale, causal, mask_add, select_mask) ─ sub_stats(stats) ─ exp = P
    P ─ [p_dropout] ─ [p_cast] ─┐
                          dO ───┴ dv_matmul ─ [dv_reduce]                 -> dV
    dO, V ─ dp_matmul ─ [dp_dropout] ─ sub_corr(corr = ReduceSum(o_do(O, dO)))
        ─ ds(P, .) ─ [ds_end: dS out] ─ ds_scale ─ [ds_cast] ─┬ dk_matmul(., Q) ─ [dk_reduce] -> dK
                                                              └ dq_matmul(., K)               -> dQ

Shared with the forward plans (kernels/sdpa/plan.py): the geometry
(Q ``[*L, Sq, D]``, K/V ``[*Lk, S, D]`` broadcast over trailing head dims: MHA,
MQA, 5-D GQA), the score chain (``score_chain``: scale, masks and the implicit
causal mask folded into one additive mask and a causal offset, ``score_masks``
at execute, with the composed reference for Select fills other than -inf; the
implicit causal Select is the kernel's own, any fill value), the
fpmath operand rules (``_float_operand``) and the reference fallback.

Numerics (module docstring of the kernel): f32 throughout, each value the
f32 value the reference ops compute except that the GEMMs sum in f32 where the
reference MatMul sums in float64 and rounds once — an error of at most
``n * 2**-24 * sum |terms|`` per product entry (n = D for the scores and dP,
Sq for dK/dV, S for dQ), which then propagates through exp and the products.
Rounding happens exactly where the graph rounds: ``p_cast``/``ds_cast`` inside
the kernel, each MatMul's output type (dV/dK per query head before a
``ReduceSum``, as ``dv_matmul``/``dk_matmul`` store them), then the ReduceSum
(float64 sum, one rounding, as the reference).  ``corr`` is computed as the
reference does (f32 products, float64 sum, one rounding).  Dropout is the
reference's generator element for element (same seed, offset, linear index):
the mask and the ``x / (1 - p)`` scaling are identical.

Refused (the per-op plan runs): intermediates of another type than f32 (other
than the two casts), intermediates leaving the partition (other than dS through
End, and the per-head dK/dV before a ReduceSum), a Dropout mask output, MatMul
transposes other than the pattern's canonical ones (K and V ``[.., S, D]``),
a bias, and fpmath modes that round an f32 MatMul input (the reference rounds
P and dS too, which the kernel does not).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from graph_api import dtypes
from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K
from graph_api.kernels.bits import RND_NONE, rounding_code
from graph_api.kernels.fused.hybrid import HybridPlan
from graph_api.kernels.weight_compressed.wmatmul_plan import zero_size_reason
from graph_api.kernels.plan import CompileRequest

from .plan import (Geometry, Scores, _geometry, _inside, _scalar_operand, _unknown_ops,
                   _with_fallback, score_chain, score_masks)
from .plan_operands import _FLOATS, _KEEPS, _TYPE_RND

_F32 = DataType.f32


@dataclass
class Backward:
    """What the execute reads, found at compile."""

    request: CompileRequest
    geo: Geometry
    scores: Scores
    ids: dict            # "q" "k" "v" "o" "do" "stats" -> partition input ids
    grad_scale: tuple    # (scalar id, "mul" | "div")
    p_rnd: int
    ds_rnd: int
    dropouts: dict       # "p" | "dp" -> (seed id, offset id, prob id)
    outs: dict           # "dq" "dk" "dv" "dk_head" "dv_head" "ds" -> (tensor id, DataType)
    reduce_rep: bool     # dK/dV summed over the query heads of a KV head (GQA ReduceSum)

    def fetch(self, inputs, tid):
        return inputs[tid].numpy()

    def _f32(self, inputs, name):
        return dtypes.to_f32(self.fetch(inputs, self.ids[name]))

    def _scalar(self, inputs, tid) -> float:
        return float(dtypes.to_f32(self.fetch(inputs, tid)).reshape(-1)[0])

    def __call__(self, inputs, arrays, outputs=None):
        from graph_api.kernels.sdpa import backward as SB

        g, sc = self.geo, self.scores
        scale = 1.0 if sc.scale_id is None else self._scalar(inputs, sc.scale_id)
        # the causal Select as the kernel's (offset, fill): any fill value, not only -inf
        mask, _, _ = score_masks(g, replace(sc, causal=None), self.fetch, inputs, scale)
        offset = fill = None
        if sc.causal is not None:
            skv, sq, fill_id = sc.causal
            offset = 0 if skv is None else int(self.fetch(inputs, skv).reshape(-1)[0]) - \
                int(self.fetch(inputs, sq).reshape(-1)[0])
            fill = self._scalar(inputs, fill_id)
        shape4 = lambda name, n: self._f32(inputs, name).reshape(g.B, n, -1, g.D)  # noqa: E731
        q, do = shape4("q", g.Hq), shape4("do", g.Hq)
        k, v = shape4("k", g.Hkv), shape4("v", g.Hkv)
        o = shape4("o", g.Hq)
        # corr as the reference computes it: f32 products (o_do), float64 sum, one rounding
        corr = np.multiply(o, do, dtype=np.float32).sum(axis=-1, dtype=np.float64).astype(np.float32)
        stats = self._f32(inputs, "stats").reshape(g.B, g.Hq, g.Sq)
        drop = {}
        for name, (seed, off, prob) in self.dropouts.items():
            drop[name] = (self.fetch(inputs, seed), self.fetch(inputs, off), self.fetch(inputs, prob))
        dq_dest = self._direct(inputs, outputs, "dq")
        gid, gmode = self.grad_scale
        dq, dk, dv, ds = SB.backward(
            q, k, v, do, stats, corr, scale=scale, scale_mode=sc.scale_mode,
            grad_scale=self._scalar(inputs, gid), grad_scale_mode=gmode,
            mask=None if mask is None else g.kernel_mask(dtypes.to_f32(np.asarray(mask))),
            causal_offset=offset, causal_fill=-np.inf if fill is None else fill,
            p_rnd=self.p_rnd, ds_rnd=self.ds_rnd,
            p_dropout=drop.get("p"), dp_dropout=drop.get("dp"), want_ds="ds" in self.outs,
            dq=dq_dest)
        self._store(arrays, "dq", dq, g.lead + (g.Sq, g.D))
        if "ds" in self.outs:
            self._store(arrays, "ds", ds, g.lead + (g.Sq, g.S))
        for name, grad in (("dk", dk), ("dv", dv)):
            head_id, head_dt = self.outs[name + "_head"]
            per_head = dtypes.convert(grad, head_dt) if head_dt != _F32 else grad
            if head_id in self.request.output_ids:
                arrays[head_id] = per_head.reshape(g.lead + (g.S, g.D))
            if self.reduce_rep:  # the reference ReduceSum: float64 sum of the stored values, one rounding
                rep = g.Hq // g.Hkv
                total = dtypes.to_f32(per_head).reshape(g.B, g.Hkv, rep, g.S, g.D).sum(axis=2, dtype=np.float64)
                self._store(arrays, name, total.astype(np.float32), None)

    def _store(self, arrays, name, value, shape):
        tid, dt = self.outs[name]
        value = np.reshape(value, shape or self.request.lts[tid].shape)
        arrays[tid] = value if dt == _F32 else dtypes.convert(value, dt)

    def _direct(self, inputs, outputs, name):
        """dQ's output memory when the kernel can write it as it is (f32, dense, no overlap)."""
        tid, dt = self.outs[name]
        t = (outputs or {}).get(tid)
        if t is None or dt != _F32 or t.packed or not t.is_direct():
            return None
        dest = t.numpy()
        if not dest.flags.c_contiguous or any(np.may_share_memory(dest, x.memory()) for x in inputs.values()):
            return None
        return dest.reshape(self.geo.B, self.geo.Hq, self.geo.Sq, self.geo.D)


def _attrs(op, **want) -> bool:
    return all(bool(op.attrs.get(name, False)) == value for name, value in want.items())


def _ids(op) -> list:
    return [lt.id for lt in op.inputs]


def _fpmath_reason(request, mm_ops) -> str | None:
    """Why the fpmath mode rounds a MatMul input the kernel keeps, if it does."""
    code = rounding_code(request.fpmath)
    if code == RND_NONE:
        return None
    for op in mm_ops:
        for lt in op.inputs:
            dt = request.lts[lt.id].dtype
            if code not in _KEEPS.get(dt, ()):
                return f"fpmath {request.fpmath} rounds the {dt.name} input {lt.id} of MatMul {op.id} " \
                       f"(the reference rounds P and dS too; the kernel applies no fpmath rounding)"
    return None


def _wiring(request, b, ops):
    """{"q","k","v","o","do","stats"} -> tensor ids, read off the ops, or a reason."""
    qk, dv, dp, dk, dq = (ops[b[r]] for r in ("qk_matmul", "dv_matmul", "dp_matmul", "dk_matmul", "dq_matmul"))
    if any(len(op.inputs) > 2 for op in (qk, dv, dp, dk, dq)):
        return "a MatMul with a bias"
    if not (_attrs(qk, transpose_a=False, transpose_b=True) and _attrs(dp, transpose_a=False, transpose_b=True)
            and _attrs(dv, transpose_b=False) and _attrs(dk, transpose_b=False) and _attrs(dq, transpose_b=False)):
        return "MatMul transposes other than Q K^T, dO V^T, P^T dO, dS^T Q, dS K (K, V stored [.., S, D])"
    q, k = _ids(qk)
    do, v = _ids(dp)
    if _ids(dv)[1] != do or _ids(dk)[1] != q or _ids(dq)[1] != k:
        return "dv/dk/dq_matmul do not take dO / Q / K of qk_matmul and dp_matmul"
    o_do = _ids(ops[b["o_do"]])
    if do not in o_do:
        return "o_do does not multiply dO"
    o = o_do[1 - o_do.index(do)]
    stats = _ids(ops[b["sub_stats"]])[1]
    return {"q": q, "k": k, "v": v, "o": o, "do": do, "stats": stats}


def _f32_chain(request, b, ops, kinds) -> str | None:
    """Why an intermediate the kernel keeps in f32 has another type, if one has."""
    lts = request.lts
    roles = ("sub_stats", "exp", "p_dropout", "dp_matmul", "dp_dropout", "o_do", "corr", "sub_corr",
             "ds", "ds_scale")
    types = [(f"score step {i}", t) for i, t in enumerate(kinds)]
    types += [(role, lts[ops[b[role]].outputs[0].id].dtype) for role in roles if b.get(role) is not None]
    coarse = [f"{name} ({t.name})" for name, t in types if t != _F32]
    if coarse:
        return f"the reference rounds {', '.join(coarse)}; the kernel keeps them f32"
    return None


def _cast_code(request, b, ops, role) -> int | str:
    if b.get(role) is None:
        return RND_NONE
    dt = request.lts[ops[b[role]].outputs[0].id].dtype
    return RND_NONE if dt == _F32 else _TYPE_RND.get(dt, f"{role} to {dt.name}")


def _grad_scale(request, b, ops):
    op, ds = ops[b["ds_scale"]], ops[b["ds"]].outputs[0].id
    sid = _scalar_operand(op, ds, request.lts)
    if sid is None or (op.kind == K.Divide and op.inputs[0].id != ds):
        return f"ds_scale {op.kind.name} (op {op.id}) is not (dS, one value)"
    return sid, "div" if op.kind == K.Divide else "mul"


def _dropouts(request, b, ops):
    out = {}
    for name, role in (("p", "p_dropout"), ("dp", "dp_dropout")):
        if b.get(role) is None:
            continue
        op = ops[b[role]]
        if len(op.outputs) > 1 and op.outputs[1].id in request.output_ids:
            return f"{role}'s mask leaves the partition"
        out[name] = tuple(_ids(op)[1:4])
    return out


def _gradients(request, b, ops, geo):
    """(outs, reduce_rep) or a reason: every partition output must be one the plan makes."""
    lts = request.lts
    outs, reduce_rep = {}, None
    outs["dq"] = (ops[b["dq_matmul"]].outputs[0].id, lts[ops[b["dq_matmul"]].outputs[0].id].dtype)
    for name in ("dk", "dv"):
        mm = ops[b[f"{name}_matmul"]].outputs[0]
        outs[name + "_head"] = (mm.id, lts[mm.id].dtype)
        red = b.get(f"{name}_reduce")
        if red is None:
            outs[name] = outs[name + "_head"]
            this = False
        else:
            op = ops[red]
            kv_shape = lts[_ids(ops[b["qk_matmul"]])[1]].shape
            axes = sorted(int(a) % len(lts[mm.id].shape) for a in op.attrs.get("axes") or [])
            lead = len(geo.lead)
            kv_lead = (1,) * (lead - (len(kv_shape) - 2)) + tuple(kv_shape[:-2])
            summed = [i for i in range(lead) if kv_lead[i] == 1 and geo.lead[i] > 1]
            if any(a >= lead for a in axes) or not summed or [a for a in axes if geo.lead[a] > 1] != summed:
                return f"{name}_reduce sums axes {axes}, not the query-head axes K/V broadcast over"
            outs[name] = (op.outputs[0].id, lts[op.outputs[0].id].dtype)
            this = True
        if reduce_rep is not None and this != reduce_rep:
            return "one of dK/dV is reduced over the query heads and the other is not"
        reduce_rep = this
    if b.get("ds_end") is not None:
        outs["ds"] = (ops[b["ds"]].outputs[0].id, lts[ops[b["ds"]].outputs[0].id].dtype)
    made = {tid for tid, _ in outs.values()}
    extra = [t for t in request.output_ids if t not in made]
    if extra:
        return f"tensors {extra} leave the partition (an intermediate the kernel does not store)"
    if any(dt not in _FLOATS for _, dt in outs.values()):
        return "a gradient of a non-float type"
    return outs, reduce_rep


def build(request: CompileRequest):
    """The plan of an ``sdpa_backward`` partition, or why the fused kernel does not apply."""
    b, lts = request.bindings, request.lts
    ops = {op.id: op for op in request.ops}
    reason = _unknown_ops(request, b) or zero_size_reason(request)
    if reason:
        return reason
    ids = _wiring(request, b, ops)
    if isinstance(ids, str):
        return ids
    if any(lts[ids[n]].dtype not in _FLOATS for n in ("q", "k", "v", "o", "do")):
        return "Q/K/V/O/dO of a non-float type"
    q_shape, k_shape, v_shape = (lts[ids[n]].shape for n in ("q", "k", "v"))
    geo = _geometry(q_shape, k_shape, v_shape)
    if isinstance(geo, str):
        return geo
    if lts[ids["o"]].shape != q_shape or lts[ids["do"]].shape != q_shape:
        return f"O {list(lts[ids['o']].shape)} / dO {list(lts[ids['do']].shape)} are not Q's shape"
    scores_shape = lts[ops[b["qk_matmul"]].outputs[0].id].shape
    if scores_shape != geo.lead + (geo.Sq, geo.S):
        return f"scores {list(scores_shape)} are not Q's batch x Sq x S"
    chain = score_chain(request, b, ops)
    if isinstance(chain, str):
        return chain
    scores, value, kinds = chain
    if _ids(ops[b["sub_stats"]])[0] != value:
        return "sub_stats does not take the masked scores"
    if tuple(lts[ids["stats"]].shape) != geo.lead + (geo.Sq, 1):
        return f"stats {list(lts[ids['stats']].shape)} are not one value per query row"
    corr = ops[b["corr"]]
    axes = [int(a) % len(q_shape) for a in corr.attrs.get("axes") or []]
    if axes != [len(q_shape) - 1] or lts[corr.outputs[0].id].shape[:-1] != q_shape[:-1]:
        return "corr does not sum O * dO over the head size"
    reason = _f32_chain(request, b, ops, kinds) or _fpmath_reason(
        request, [ops[b[r]] for r in ("qk_matmul", "dv_matmul", "dp_matmul", "dk_matmul", "dq_matmul")])
    if reason:
        return reason
    p_rnd, ds_rnd = _cast_code(request, b, ops, "p_cast"), _cast_code(request, b, ops, "ds_cast")
    for code in (p_rnd, ds_rnd):
        if isinstance(code, str):
            return code
    grad_scale = _grad_scale(request, b, ops)
    if isinstance(grad_scale, str):
        return grad_scale
    dropouts = _dropouts(request, b, ops)
    if isinstance(dropouts, str):
        return dropouts
    grads = _gradients(request, b, ops, geo)
    if isinstance(grads, str):
        return grads
    outs, reduce_rep = grads
    reads = list(ids.values()) + [grad_scale[0], scores] + [t for d in dropouts.values() for t in d]
    reason = _inside(request, {}, reads)
    if reason:
        return reason
    core = Backward(request, geo, scores, ids, grad_scale, p_rnd, ds_rnd, dropouts, outs, reduce_rep)
    return HybridPlan(request, "numba_sdpa_backward", _with_fallback(request, core),
                      {op.id for op in request.ops})

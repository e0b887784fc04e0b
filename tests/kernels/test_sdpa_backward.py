"""SDPA training backward on its fused kernel (kernels/sdpa/backward_plan.py,
kernels/sdpa/backward.py).

Each graph's fused outputs are checked three ways:

* against a float64 formula with an elementwise bound (:func:`formula`) derived
  from f32 accumulation: a sum of ``n`` products is within ``n * 2**-24 *
  sum |terms|`` of its exact value (any order, with or without FMA); each f32
  operation adds ``2**-24`` of its result; ``exp32`` is within 2 ulp
  (``2**-22`` relative); an error ``e`` of an exponent multiplies P by at most
  ``exp(e)``; the graph's TypeCasts round to within half an ulp of their type
  (``2**-8`` relative for bf16, ``2**-11`` for f16) — the formula keeps exact
  values, the bound adds each rounding.  Errors propagate through products as
  ``|x| e_y + |y| e_x + e_x e_y``;
* against the composed reference plan (graph_api.check's rule);
* in check mode (``settings.check``), which compares every execute.

The bound must also be tight enough to fail: it is asserted to stay below
``1e-3`` of the output's magnitude for f32 graphs.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api.check import compare
from graph_api.config import settings
from graph_api.kernels.sdpa import backward as SB
from graph_api.kernels.reference.dropout import uniform
from tests.patterns.builder import G

U = 2.0 ** -24  #: f32 unit roundoff
HALF_EPS = {dt.f32: 0.0, dt.bf16: 2.0 ** -8, dt.f16: 2.0 ** -11}  #: half an ulp, relative
SEED, OFFSET, PROB = 7, 1000, 0.25


def swap(x):
    return np.swapaxes(x, -1, -2)


# ====================================================================== float64 formula + bound
def formula(q, k, v, o, do, stats, scale, *, mask=None, causal=None, p_eps=0.0, ds_eps=0.0,
            keep=None, prob=0.0):
    """(values, bounds) of dq, dk, dv (per query head) and ds from f64 copies of the
    f32 inputs (q, o, do ``[B, Hq, Sq, D]``; k, v ``[B, Hkv, S, D]``; stats ``[B, Hq, Sq]``).

    ``causal`` = (offset, fill); ``keep``: the Dropout keep mask (both Dropouts share it)."""
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    Sq, D = q.shape[-2:]
    S = k.shape[-2]
    fin = lambda x, e: np.where(np.isfinite(x), e, 0.0)  # noqa: E731  (exact -inf: no error)
    s = q @ swap(k) * scale
    es = D * U * (np.abs(q) @ swap(np.abs(k))) * abs(scale) + U * np.abs(s)
    if causal is not None:
        offset, fill = causal
        hidden = np.arange(S)[None, :] > np.arange(Sq)[:, None] + offset
        s, es = np.where(hidden, fill, s), np.where(hidden, 0.0, es)
    if mask is not None:
        s = s + mask
        es = fin(s, es + U * np.abs(s))
    x = s - stats[..., None]
    ex = fin(x, es + U * np.abs(x))
    p = np.exp(x)
    with np.errstate(invalid="ignore"):
        ep = fin(x, p * np.expm1(ex) + 4 * U * p * np.exp(ex)) + 2.0 ** -126  # exp32 flushes below e^-87
    dp = do @ swap(v)
    edp = D * U * (np.abs(do) @ swap(np.abs(v)))
    if keep is not None:
        inv = 1.0 / (1.0 - prob)
        pd, epd = np.where(keep, p * inv, 0.0), np.where(keep, ep * inv + 2 * U * p * inv, 0.0)
        edp = np.where(keep, edp * inv + 2 * U * np.abs(dp) * inv, 0.0)
        dp = np.where(keep, dp * inv, 0.0)
    else:
        pd, epd = p, ep
    epd = epd + p_eps * (pd + epd)  # p_cast
    corr = (o * do).sum(axis=-1, keepdims=True)
    ecorr = 2 * U * (np.abs(o) * np.abs(do)).sum(axis=-1, keepdims=True)
    t = dp - corr
    et = edp + ecorr + U * (np.abs(t) + edp + ecorr)
    ds = p * t
    eds = ep * np.abs(t) + (p + ep) * et + U * np.abs(ds)
    dsp = ds * scale
    edsp = abs(scale) * eds + U * np.abs(dsp)
    edsp = edsp + ds_eps * (np.abs(dsp) + edsp)  # ds_cast
    adsp = np.abs(dsp) + edsp
    values = {"dq": dsp @ k, "dk": swap(dsp) @ q, "dv": swap(pd) @ do, "ds": ds, "p": pd, "dsp": dsp}
    bounds = {"dq": S * U * (adsp @ np.abs(k)) + edsp @ np.abs(k),
              "dk": Sq * U * (swap(adsp) @ np.abs(q)) + swap(edsp) @ np.abs(q),
              "dv": Sq * U * (swap(pd + epd) @ np.abs(do)) + swap(epd) @ np.abs(do),
              "ds": eds, "p": epd, "dsp": edsp}  # p, dsp: the MatMul operands (with their casts' eps)
    return values, bounds


def rounded(value, bound, eps):
    """A stored result: one more rounding (``eps`` relative; f32: 2**-24)."""
    return bound + (eps or U) * (np.abs(value) + bound)


# ====================================================================== graphs
class Case:
    """A backward graph, its feeds and the float64 model of its outputs."""

    def __init__(self, B=2, Hq=4, Hkv=None, Sq=24, S=24, D=16, dtype=dt.f32, mask="add",
                 dmask=False, dropout=False, scale=0.25, seed=0, scale_op=K.Multiply, fpmath="strict"):
        Hkv = Hkv or Hq
        self.rep, self.dtype, self.dropout = Hq // Hkv, dtype, dropout
        g = G(fpmath)
        gqa = Hkv != Hq
        lead_q = (B, Hkv, self.rep) if gqa else (B, Hq)
        lead_k = (B, Hkv, 1) if gqa else (B, Hkv)
        qs, ks, ss = lead_q + (Sq, D), lead_k + (S, D), lead_q + (Sq, S)
        q, k, v, o, do = (g.input(sh, dtype) for sh in (qs, ks, ks, qs, qs))
        sc = g.input((1,), dtype)
        x = g.op(K.MatMul, q, k, dtype=dt.f32, attrs={"transpose_b": True})
        x = g.op(scale_op, x, sc)
        self.causal_ids = None
        if mask in ("causal", "causal_br"):
            row = g.op(K.GenIndex, x, dtype=dt.s32, attrs={"axis": -2})
            col = g.op(K.GenIndex, x, dtype=dt.s32, attrs={"axis": -1})
            skv = sq = None
            if mask == "causal_br":
                skv, sq = g.scalar(dt.s32), g.scalar(dt.s32)
                row = g.op(K.Subtract, g.op(K.Add, row, skv), sq)
            cond = g.op(K.GreaterEqual, row, col, dtype=dt.boolean)
            fill = g.input((1,))
            x = g.op(K.Select, cond, x, fill, dtype=dt.f32)
            self.causal_ids = (skv, sq, fill)
        mask_lt = None
        if mask in ("add", "causal"):
            mask_lt = g.input((B, 1) + ((1,) if gqa else ()) + (Sq, S), dtype)
            x = g.op(K.Add, x, mask_lt)
        stats = g.input(lead_q + (Sq, 1))
        p = g.op(K.Exp, g.op(K.Subtract, x, stats))
        drop_ids = None
        pc = p
        if dropout:
            drop_ids = (g.scalar(dt.s64), g.scalar(dt.s64), g.scalar(dt.f32))
            pc = g.op(K.Dropout, pc, *drop_ids)
        if dtype != dt.f32:
            pc = g.op(K.TypeCast, pc, dtype=dtype)
        dv = g.op(K.MatMul, pc, do, dtype=dtype, attrs={"transpose_a": True})
        dp = g.op(K.MatMul, do, v, dtype=dt.f32, attrs={"transpose_b": True})
        if dropout:
            dp = g.op(K.Dropout, dp, *drop_ids)
        corr = g.op(K.ReduceSum, g.op(K.Multiply, o, do, dtype=dt.f32), attrs={"axes": [-1], "keep_dims": True})
        ds = g.op(K.Multiply, p, g.op(K.Subtract, dp, corr))
        self.ds_id = ds.id if dmask else None
        if dmask:
            g.op(K.End, ds, outputs=0)
        ds = g.op(scale_op, ds, sc, dtype=dt.f32)
        if dtype != dt.f32:
            ds = g.op(K.TypeCast, ds, dtype=dtype)
        dk = g.op(K.MatMul, ds, q, dtype=dtype, attrs={"transpose_a": True})
        dq = g.op(K.MatMul, ds, k, dtype=dtype)
        if gqa:
            dk, dv = (g.op(K.ReduceSum, t, attrs={"axes": [2], "keep_dims": True}) for t in (dk, dv))
        self.out_ids = {"dq": dq.id, "dk": dk.id, "dv": dv.id}
        self.graph = g.done()

        rng = np.random.default_rng(seed)
        npdt = ga.dtypes.numpy_dtype(dtype)
        rnd = lambda sh, a=1.0: (rng.standard_normal(sh) * a).astype(npdt)  # noqa: E731
        self.scale = scale
        f = {q.id: rnd(qs), k.id: rnd(ks), v.id: rnd(ks), o.id: rnd(qs, 0.5), do.id: rnd(qs),
             sc.id: np.array([1 / scale if scale_op == K.Divide else scale], npdt)}
        if mask_lt is not None:
            m = rnd(mask_lt.shape)
            m[..., 0, 1::3] = -np.inf  # some hidden positions (row 0 keeps its first key)
            f[mask_lt.id] = m
        self.offset = 0 if mask == "causal" else S - Sq
        if self.causal_ids is not None:
            if mask == "causal_br":
                f[skv.id], f[sq.id] = np.array(S, np.int32), np.array(Sq, np.int32)
            f[fill.id] = np.array([-np.inf if mask == "causal" else -3.0], np.float32)
        if dropout:
            f[drop_ids[0].id], f[drop_ids[1].id] = np.array(SEED, np.int64), np.array(OFFSET, np.int64)
            f[drop_ids[2].id] = np.array(PROB, np.float32)
        self.ids = dict(q=q.id, k=k.id, v=v.id, o=o.id, do=do.id, stats=stats.id)
        self.mask_id = None if mask_lt is None else mask_lt.id
        self.shapes = (B, Hq, Hkv, Sq, S, D)
        self.feeds = f
        f[stats.id] = self._stats()

    def _f64(self, name, heads):
        B, Hq, Hkv, Sq, S, D = self.shapes
        return self.feeds[self.ids[name]].astype(np.float64).reshape(B, heads, -1, D)

    def _masked_scores(self):
        B, Hq, Hkv, Sq, S, D = self.shapes
        q, k = self._f64("q", Hq), np.repeat(self._f64("k", Hkv), self.rep, axis=1)
        s = q @ swap(k) * self.scale
        if self.causal_ids is not None:
            hidden = np.arange(S)[None, :] > np.arange(Sq)[:, None] + self.offset
            s = np.where(hidden, float(self.feeds[self.causal_ids[2].id][0]), s)
        return s if self.mask_id is None else s + self._mask()

    def _mask(self):
        B, Hq, Hkv, Sq, S, D = self.shapes
        return self.feeds[self.mask_id].astype(np.float64).reshape(B, 1, Sq, S)

    def _stats(self):
        """The forward's stats (max + ln(sum exp)) of the masked scores, as f32."""
        B, Hq, Hkv, Sq, S, D = self.shapes
        s = self._masked_scores()
        m = s.max(axis=-1, keepdims=True)
        st = m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True))
        lead = self.feeds[self.ids["q"]].shape[:-1]
        return st.reshape(lead + (1,)).astype(np.float32)

    def expected(self):
        """{output id: (value, bound)} of the float64 model."""
        B, Hq, Hkv, Sq, S, D = self.shapes
        keep = None
        if self.dropout:
            keep = (uniform(np.int64(SEED), np.int64(OFFSET), B * Hq * Sq * S) > np.float32(PROB))
            keep = keep.reshape(B, Hq, Sq, S)
        eps = HALF_EPS[self.dtype]
        values, bounds = formula(
            self._f64("q", Hq), self._f64("k", Hkv), self._f64("v", Hkv), self._f64("o", Hq),
            self._f64("do", Hq), self.feeds[self.ids["stats"]].astype(np.float64).reshape(B, Hq, Sq),
            self.scale, mask=None if self.mask_id is None else self._mask(),
            causal=None if self.causal_ids is None else
            (self.offset, float(self.feeds[self.causal_ids[2].id][0])),
            p_eps=eps, ds_eps=eps, keep=keep, prob=PROB)
        out = {}
        for name in ("dq", "dk", "dv"):
            value, bound = values[name], rounded(values[name], bounds[name], eps)
            if name != "dq" and self.rep > 1:  # ReduceSum of the stored per-head values
                value = value.reshape(B, Hkv, self.rep, S, D).sum(axis=2)
                bound = bound.reshape(B, Hkv, self.rep, S, D).sum(axis=2)
                bound = rounded(value, bound, eps)
            out[self.out_ids[name]] = (value, bound)
        if self.ds_id is not None:
            out[self.ds_id] = (values["ds"], rounded(values["ds"], bounds["ds"], 0.0))
        return out


def run(case, reference=False):
    old = settings.reference
    settings.reference = reference
    try:
        result = ga.run_graph(case.graph, case.feeds)
    finally:
        settings.reference = old
    return result


def assert_within(case, result):
    for tid, (value, bound) in case.expected().items():
        got = np.asarray(result.outputs[tid], np.float64).reshape(value.shape)
        excess = np.abs(got - value) - bound * (1 + 2.0 ** -10)  # second-order terms
        assert np.all(excess <= 0), \
            f"output {tid}: {np.count_nonzero(excess > 0)} values outside the bound, worst excess {excess.max():.3g}"
        if case.dtype == dt.f32:  # the bound is tight enough to catch a wrong result
            assert bound.max() < 1e-3 * np.abs(value).max(), (tid, bound.max(), np.abs(value).max())


CASES = {
    "mha_mask": dict(),
    "mha_odd": dict(B=1, Hq=3, Sq=37, S=53, D=24),
    "mha_long": dict(B=1, Hq=2, Sq=150, S=130, D=32),  # several query blocks
    "gqa_reduce": dict(Hq=4, Hkv=2),
    "mqa_reduce": dict(Hq=4, Hkv=1, Sq=19, S=33),
    "causal": dict(mask="causal"),
    "causal_br_fill": dict(mask="causal_br", Sq=12, S=20),
    "no_mask_divide": dict(mask=None, scale_op=K.Divide),
    "dmask": dict(dmask=True),
    "dropout": dict(dropout=True),
    "bf16": dict(dtype=dt.bf16),
    "bf16_gqa_dmask": dict(dtype=dt.bf16, Hq=4, Hkv=2, dmask=True),
    "bf16_gqa_dropout": dict(dtype=dt.bf16, Hq=4, Hkv=2, dropout=True, mask="causal"),
    "f16_odd": dict(dtype=dt.f16, B=1, Hq=2, Sq=21, S=17, D=8),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fused_plan_within_the_f32_bound_of_the_float64_formula(name):
    case = Case(**CASES[name])
    result = run(case)
    assert [r.compiled.plan.name for r in result.partitions] == ["numba_sdpa_backward"]
    assert_within(case, result)


@pytest.mark.parametrize("name", list(CASES))
def test_fused_plan_matches_the_reference_in_check_mode(name):
    case = Case(**CASES[name])
    ref = run(case, reference=True)
    old = settings.check
    settings.check = True  # raises if the fused plan differs from the composed reference
    try:
        fused = run(case)
    finally:
        settings.check = old
    for tid in case.graph.output_ids:
        verdict = compare(ref.outputs[tid], fused.outputs[tid], case.graph.tensors[tid].dtype)
        assert verdict.ok, (tid, verdict.message)


def test_dropout_keeps_the_reference_mask():
    """The kernel's Dropout is the reference's generator: with p = 0.25 a different
    mask would move dV by whole P entries, far outside the f32 bound (checked above);
    here the dS output (dMask) is compared element for element with the reference's."""
    case = Case(dropout=True, dmask=True, mask=None)
    fused, ref = run(case), run(case, reference=True)
    got, exp = fused.outputs[case.ds_id], ref.outputs[case.ds_id]
    assert np.array_equal(got == 0, exp == 0)


# ====================================================================== the kernel itself
@pytest.mark.parametrize("use_blas", [True, False], ids=["openblas", "f32_loops"])
@pytest.mark.parametrize("splits", [1, 3])
def test_kernel_paths_within_the_bound(use_blas, splits):
    """The OpenBLAS and the plain-loop GEMMs, and dK/dV split over query rows."""
    B, Hq, Hkv, Sq, S, D = 1, 4, 2, 150, 40, 16
    rng = np.random.default_rng(3)
    q, o, do = (rng.standard_normal((B, Hq, Sq, D)).astype(np.float32) for _ in range(3))
    k, v = (rng.standard_normal((B, Hkv, S, D)).astype(np.float32) for _ in range(2))
    scale = 0.25
    s = q.astype(np.float64) @ swap(np.repeat(k, 2, axis=1).astype(np.float64)) * scale
    stats = (s.max(-1) + np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1))).astype(np.float32)
    corr = np.multiply(o, do).sum(-1, dtype=np.float64).astype(np.float32)
    dq, dk, dv, _ = SB.backward(q, k, v, do, stats, corr, scale=scale, grad_scale=scale,
                                splits=splits, use_blas=use_blas)
    f64 = lambda x: x.astype(np.float64)  # noqa: E731
    values, bounds = formula(f64(q), f64(k), f64(v), f64(o), f64(do), f64(stats), scale)
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        bound = rounded(values[name], bounds[name], 0.0)
        assert np.all(np.abs(got - values[name]) <= bound * (1 + 2.0 ** -10)), name


# ====================================================================== refusals
def test_fpmath_rounding_f32_inputs_is_refused_with_a_reason():
    """fpmath bf16 rounds the f32 P and dS entering the reference MatMuls; the kernel
    applies no fpmath rounding, so the partition runs its ops on their own plans."""
    graph = Case(fpmath="bf16").graph
    (part,) = graph.get_partitions()
    compiled = part.compile(part.get_input_ports(), part.get_output_ports(), ga.Engine())
    assert compiled.plan.name.startswith("per_op")
    assert "fpmath bf16" in compiled.plan.fallback_reason


@pytest.mark.parametrize("dtype", [dt.bf16, dt.f16])
def test_casts_round_where_the_graph_rounds(dtype):
    """With one query row, each dV entry is one product ``round(P[j]) * dO[d]`` and each
    dK entry ``round(dS'[j]) * Q[d]``: exact in f32 for half-precision factors, then
    rounded once to the output type.  P and dS' are f32 values within a few f32 ulps of
    their exact values (exp32 against numpy's exp, sums over D in other orders, with or
    without FMA: the digits differ between ISAs), so where an exact value lies that close
    to a half-type rounding boundary its cast may land on either neighbour, in the fused
    plan and in the reference alike (the fused plan and the reference disagreed on a few
    dK rows on an AMX host, agreed on AVX2).  What holds on every ISA: each key's row is
    ``round(c * factor)`` for a half-type value ``c`` that rounding some f32 value within
    the float64 model's bound of P[j] (dS'[j]) gives; for almost every key there is only
    one such ``c``.  Skipping a cast (or rounding elsewhere) changes most entries."""
    case = Case(dtype=dtype, B=2, Hq=3, Sq=1, S=64, D=32, mask=None)
    B, Hq, Hkv, Sq, S, D = case.shapes
    npdt = ga.dtypes.numpy_dtype(dtype)
    values, bounds = formula(
        case._f64("q", Hq), case._f64("k", Hkv), case._f64("v", Hkv), case._f64("o", Hq), case._f64("do", Hq),
        case.feeds[case.ids["stats"]].astype(np.float64).reshape(B, Hq, Sq), case.scale)
    half = lambda x: x.astype(np.float32).astype(npdt)  # noqa: E731
    ambiguous = 0
    for name, operand, factor in (("dv", "p", "do"), ("dk", "dsp", "q")):
        # the half-type values the cast can give: rounding is monotone, so every value from
        # the rounded lower end of the bound to the rounded upper end (mostly one value)
        lo, hi = (half(values[operand] + sign * bounds[operand] * (1 + 2.0 ** -10)) for sign in (-1, 1))
        ambiguous += np.count_nonzero(lo != hi)
        candidates, c = [lo], lo
        while np.any(c != hi):
            c = np.where(c == hi, hi, np.nextafter(c, hi))
            candidates.append(c)
        assert len(candidates) <= 8, "the bound spans more than 8 half-type values"
        f = case._f64(factor, Hq)  # [B, Hq, 1, D], half-type values
        rows = [half(swap(c.astype(np.float64)) * f) for c in candidates]  # [B, Hq, S, D]: rounded once
        for result in (run(case), run(case, reference=True)):
            got = np.asarray(result.outputs[case.out_ids[name]]).reshape(B, Hq, S, D)
            fits = np.any([np.all(got == row, axis=-1) for row in rows], axis=0)
            assert fits.all(), f"{name}: {np.count_nonzero(~fits)} of {fits.size} rows are not round(c * {factor})"
    assert ambiguous <= 0.05 * 2 * B * Hq * S, ambiguous  # the check has force: few keys have two candidates

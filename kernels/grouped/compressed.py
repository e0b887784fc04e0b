"""Compressed experts on one stacked weight buffer and one parallel launch per stage.

A *stage* is one MatMul role of the template (``matmul``; for the gated MLP the
gate and up projections together, then down): every expert's weight of that
role, prepared (:func:`~graph_api.kernels.weight_compressed.wmatmul.prepare`:
int4 interleaved, int8 blocked) and concatenated once per set of constant
weights.  A call stacks the tokens of the experts with at most
``GROUPED_MAX_ROWS`` rows, prepares them once (f32 rows and group sums), runs
:func:`~graph_api.kernels.grouped.grouped_gemv.grouped4` / ``grouped8`` over all
of them, and copies each expert's rows to its output.  Larger experts run
:func:`~graph_api.kernels.weight_compressed.wmatmul.wmatmul` on a view of the
stacked weights (the prefill kernels; one call each).

Gated MLP: ``h = act(gate) * up`` in f32 between the two launches, with ``act``
Sigmoid-then-Multiply (swish, as the graph writes it) or none; other activations
take the per-expert plans.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K
from graph_api.kernels.plan import CompileRequest
from graph_api.kernels.weight_compressed.wmatmul_plan import ConstantCache, Linear, make_linear

from .plan import GROUPED_MAX_ROWS, expert_ops, sub_request, write_output

_STAGES = {"expert_matmul": (("matmul",),), "gated_mlp": (("gate", "up"), ("down",))}


def _linears(request: CompileRequest) -> list[dict] | str:
    """Per expert: role -> Linear, or why the grouped kernel does not apply."""
    template = request.bindings["template"]
    found = []
    for b, ops in zip(request.bindings["experts"], expert_ops(request)):
        sub = sub_request(request, b, template, ops, one_row=True)
        roles = {}
        for role in ("matmul",) if template == "expert_matmul" else ("gate", "up", "down"):
            prefix = "" if template == "expert_matmul" else role + "_"
            deq = b.get(prefix + "wei_dequant")
            if deq is None:
                return "float expert weights"
            mm = next(op for op in ops if op.id == b[prefix + "matmul"])
            if len(mm.inputs) > 2:
                return "an expert MatMul has a bias input"
            linear = make_linear(sub, deq, mm.id)
            if isinstance(linear, str):
                return linear
            if not linear.constant or linear.rnd_x or linear.rnd_w or linear.bf16_pairs or linear.act:
                return "the grouped kernel takes constant weights, f32 activations and strict fpmath"
            if request.lts[mm.outputs[0].id].dtype != DataType.f32:
                return "the grouped kernel stores f32"
            roles[role] = linear
        found.append(roles)
    return found


def _gate_act(request: CompileRequest) -> str | None:
    """'swish' or 'none' when every expert's gating is what the kernel computes, else None."""
    by_id = {op.id: op for op in request.ops}
    acts = set()
    for b in request.bindings["experts"]:
        if b.get("mlp_cast") is not None or by_id[b["gate_mul"]].kind != K.Multiply:
            return None
        act = [by_id[i] for i in (b.get("gate_act") or [])]
        if not act:
            acts.add("none")
        elif [op.kind for op in act] == [K.Sigmoid, K.Multiply]:
            acts.add("swish")
        else:
            return None
    return acts.pop() if len(acts) == 1 else None


@dataclasses.dataclass
class Stacked:
    """One stage's weights, every expert's prepared copy in one buffer."""

    w: np.ndarray
    sc: np.ndarray
    zf: np.ndarray
    table: np.ndarray | None
    zmode: int
    wbs: int
    sbs: int
    nblk: int
    woff: list  # [expert][role] byte offsets
    soff: list
    views: list  # [expert][role] PreparedWeight on the stacked arrays (the per-expert prefill)


def _stack(linears: list[dict], roles: tuple, inputs) -> Stacked:
    from graph_api.kernels.weight_compressed import wmatmul as wm

    prepared = [[wm.prepare(*_sources(lin[r], inputs)) for r in roles] for lin in linears]
    flat = [pw for per in prepared for pw in per]
    zmode = flat[0].zmode
    w = np.concatenate([pw.w for pw in flat])
    sc = np.concatenate([pw.sc for pw in flat])
    zf = np.concatenate([pw.zf for pw in flat]) if zmode else flat[0].zf
    woff, soff, views, wo, so = [], [], [], 0, 0
    for per in prepared:
        woff.append([]), soff.append([]), views.append([])
        for pw in per:
            n, m = pw.w.size, pw.sc.size
            views[-1].append(dataclasses.replace(pw, w=w[wo:wo + n], sc=sc[so:so + m],
                                                 zf=zf[so:so + m] if zmode else pw.zf))
            woff[-1].append(wo), soff[-1].append(so)
            wo, so = wo + n, so + m
    pw0 = flat[0]
    return Stacked(w, sc, zf, pw0.table, zmode, pw0.wbs, pw0.sbs, pw0.nblk, woff, soff, views)


def _sources(linear: Linear, inputs):
    w = inputs[linear.w_id].get_data_handle()
    scales = linear._params(inputs[linear.s_id])
    zps = None if linear.z_id is None else linear._params(inputs[linear.z_id])
    return w, linear.spec, scales, zps


def _launch(st: Stacked, xf, xs, jobs, cols: int, G: int) -> np.ndarray:
    """part [T, cols]: every job ``(r0, r1, expert, role)`` in one launch."""
    from . import grouped_gemv as gg

    items = []
    for r0, r1, e, j in jobs:
        starts = np.arange(r0, r1, gg.ROWS, dtype=np.int64)
        blk = np.arange(st.nblk, dtype=np.int64)
        a = np.repeat(starts, st.nblk)
        b = np.minimum(a + gg.ROWS, r1)
        bb = np.tile(blk, starts.size)
        items.append(np.stack([a, b, st.woff[e][j] + bb * st.wbs, st.soff[e][j] + bb * st.sbs,
                               bb + j * st.nblk], axis=1))
    part = np.empty((xf.shape[0], cols), np.float32)
    if not items:
        return part
    items = np.ascontiguousarray(np.concatenate(items))
    if st.table is not None:
        gg.grouped4(xf, xs, st.w, st.table, st.sc, st.zf, st.zmode, G, items, part)
    else:
        gg.grouped8(xf, xs, st.w, st.sc, st.zf, st.zmode, G, items, part)
    return part


def _prep(x: np.ndarray, G: int):
    """(f32 rows, group sums, max |x|) of stacked f32 activations."""
    from graph_api.kernels.weight_compressed import wmatmul as wm

    xf = np.empty(x.shape, np.float32)
    xs = np.empty((x.shape[0], x.shape[1] // G), np.float32)
    amax = float(wm._prep_x_serial(np.ascontiguousarray(x, np.float32), 0, 0, G, xf, xs))
    return xf, xs, amax


def _exact(xf, amax, st: Stacked, linears, roles, experts) -> bool:
    from graph_api.kernels.weight_compressed import wmatmul as wm

    return all(wm._fast_is_exact(xf, linears[e][r].spec, None, None, st.views[e][j], amax)
               for e in experts for j, r in enumerate(roles))


def build(request: CompileRequest):
    """The grouped plan of compressed experts, or why not."""
    template = request.bindings["template"]
    linears = _linears(request)
    if isinstance(linears, str):
        return linears
    act = None
    if template == "gated_mlp":
        act = _gate_act(request)
        if act is None:
            return "the grouped gated MLP takes swish (Sigmoid, Multiply) or no activation and a Multiply gate"
    stages = _STAGES[template]
    cache = ConstantCache()
    E = len(linears)
    spec0 = linears[0][stages[0][0]]
    out_ids = [request.lts[next(op for op in ops if op.id == b[("" if template == "expert_matmul" else "down_")
                                                              + "matmul"]).outputs[0].id].id
               for b, ops in zip(request.bindings["experts"], expert_ops(request))]
    x_ids = [lin[stages[0][0]].x_id for lin in linears]

    def stacked(inputs) -> list[Stacked]:
        srcs = [inputs[t] for lin in linears for r in lin.values()
                for t in (r.w_id, r.s_id, r.z_id) if t is not None]
        return cache.get(srcs, lambda: [_stack(linears, roles, inputs) for roles in stages])

    def linear_rows(st, stage, x, M_of):
        """One stage for every expert: the grouped launch for small experts, per-expert
        wmatmul for large; ``x[e]`` [M_e, K] -> list of f32 [M_e, N * len(roles)] pieces."""
        from graph_api.kernels.weight_compressed import wmatmul as wm

        roles = stages[stage]
        lin0 = linears[0][roles[0]]
        N, G = lin0.N, lin0.spec.group
        cols = st.nblk * 128  # int4 and int8 blocks are 128 columns
        small = [e for e in range(E) if 0 < M_of[e] <= GROUPED_MAX_ROWS]
        large = [e for e in range(E) if M_of[e] > GROUPED_MAX_ROWS]
        result = [None] * E
        if small:
            xcat = np.concatenate([x[e] for e in small]) if len(small) > 1 else x[small[0]]
            xf, xs, amax = _prep(xcat, G)
            if _exact(xf, amax, st, linears, roles, small):
                offs = np.concatenate([[0], np.cumsum([M_of[e] for e in small])])
                jobs = [(int(offs[i]), int(offs[i + 1]), e, j) for i, e in enumerate(small)
                        for j in range(len(roles))]
                part = _launch(st, xf, xs, jobs, cols * len(roles), G)
                for i, e in enumerate(small):
                    rows = part[offs[i]:offs[i + 1]]
                    result[e] = [rows[:, j * cols:j * cols + N] for j in range(len(roles))]
            else:
                large = sorted(large + small)
        for e in large:
            result[e] = []
            for j, r in enumerate(roles):
                pw = st.views[e][j]
                w, scales, zps = pw.src
                result[e].append(wm.wmatmul(np.ascontiguousarray(x[e], np.float32), w, linears[e][r].spec,
                                            scales, zps, prepared=pw))
        return result

    def core(inputs, outputs):
        sts = stacked(inputs)
        xs = [inputs[t].numpy() for t in x_ids]
        M_of = [x.size // spec0.K for x in xs]
        x = [a.reshape(M, spec0.K) for a, M in zip(xs, M_of)]
        pieces = linear_rows(sts[0], 0, x, M_of)
        if template == "gated_mlp":
            h = [None] * E
            for e in range(E):
                if M_of[e]:
                    g, u = pieces[e]
                    with np.errstate(over="ignore"):  # exp(-g) = inf: sigmoid 0, as the reference
                        h[e] = (g * (np.float32(1) / (np.float32(1) + np.exp(-g))) if act == "swish" else g) * u
            pieces = linear_rows(sts[1], 1, h, M_of)
        for e, tid in enumerate(out_ids):
            if M_of[e]:
                write_output(outputs[tid], pieces[e][0])

    return GroupedPlan(request, "numba_grouped_gated_mlp" if template == "gated_mlp" else "numba_grouped_wmatmul",
                       core)


class GroupedPlan:
    """Runs ``core(inputs, outputs)``, which writes every expert's output (empty ones: nothing)."""

    def __init__(self, request: CompileRequest, name: str, core):
        self.request, self.name, self.core = request, name, core

    def execute(self, inputs: dict, outputs: dict) -> None:
        self.core(inputs, outputs)

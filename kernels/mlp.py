"""Gated MLP: ``y = (act(x @ Wg) * (x @ Wu)) @ Wd`` (+ the down projection's post-ops).

The gate and up projections share one read of ``x`` and one weight pass: for
int4 weights :func:`prepare_mlp` concatenates the two blocked weights along
the block axis, so a single decode GEMV (``wmatmul._gemv4``) produces
``[gate | up]``; the activation and the multiply are fused in one pass over
that row (``_gate_mul``), then the down projection runs through
:func:`kernels.wmatmul.wmatmul`.  Dense f32 weights use one BLAS call on the
concatenated ``[K, 2N]`` matrix.  Activation codes: silu (swish), gelu_erf,
gelu_tanh, relu, sigmoid.
"""
from __future__ import annotations

from dataclasses import dataclass

from kernels.numba_setup import numba  # noqa: F401

import numpy as np
from numba import njit, prange

from graph_api.postops import MLP_ACTIVATIONS
from kernels import wmatmul as WM

ACTS = MLP_ACTIVATIONS


@njit(parallel=True, cache=True)
def _gate_mul(gu, N, off_up, act, h):
    """h[m, n] = act(gu[m, n]) * gu[m, off_up + n]."""
    M = h.shape[0]
    ops = np.full(1, act, np.int32)
    fpar = np.ones((1, 2), np.float32)
    ipar = np.zeros((1, 3), np.int64)
    buf = np.zeros(1, np.float32)
    for m in prange(M):
        for n in range(N):
            h[m, n] = WM._ep_one(gu[m, n], m, n, ops, fpar, ipar, buf) * gu[m, off_up + n]


@dataclass
class PreparedMLP:
    gate_up: WM.PreparedWeight  # blocks of gate then blocks of up
    down: WM.PreparedWeight
    N: int  # intermediate size
    off_up: int  # column offset of "up" in the concatenated output


def prepare_mlp(wg, sg, wu, su, wd, sd, spec_gu: WM.WeightSpec, spec_d: WM.WeightSpec,
                zg=None, zu=None, zd=None) -> PreparedMLP:
    """Blocked int4 weights for the gated MLP (gate/up share ``spec_gu``)."""
    pg = WM.prepare(wg, spec_gu, sg, zg)
    pu = WM.prepare(wu, spec_gu, su, zu)
    assert pg.zmode == pu.zmode
    cat = lambda a, b: np.ascontiguousarray(np.concatenate([a, b], axis=0))
    zf = cat(pg.zf, pu.zf) if pg.zmode == 1 else pg.zf
    spec = WM.WeightSpec(spec_gu.kind, spec_gu.K, 2 * pg.wb.shape[0] * 128, spec_gu.group, False)
    gu = WM.PreparedWeight(spec, cat(pg.wb, pu.wb), cat(pg.sc, pu.sc), zf, pg.zmode, 0)
    return PreparedMLP(gu, WM.prepare(wd, spec_d, sd, zd), spec_gu.N, pg.wb.shape[0] * 128)


def gated_mlp(x, prepared: PreparedMLP, act="silu", post_ops=(), out=None, out_dtype="f32"):
    """Gated MLP with int4 weights prepared by :func:`prepare_mlp`. x: [M, K] f32."""
    x = np.ascontiguousarray(x, np.float32)
    M = x.shape[0]
    gu = WM.wmatmul(x, None, prepared.gate_up.spec, prepared=prepared.gate_up)
    h = np.empty((M, prepared.N), np.float32)
    _gate_mul(gu, prepared.N, prepared.off_up, ACTS[act], h)
    return WM.wmatmul(h, None, prepared.down.spec, prepared=prepared.down, post_ops=post_ops,
                      out=out, out_dtype=out_dtype)


def gated_mlp_dense(x, wg, wu, wd, act="silu"):
    """Gated MLP with dense f32 weights [K, N], [K, N], [N, K2] (one BLAS call for gate+up)."""
    x = np.ascontiguousarray(x, np.float32)
    N = wg.shape[1]
    gu = x @ np.concatenate([wg, wu], axis=1)
    h = np.empty((x.shape[0], N), np.float32)
    _gate_mul(gu, N, N, ACTS[act], h)
    return h @ wd

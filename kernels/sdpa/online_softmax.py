"""The online-softmax step every SDPA kernel shares (the register-blocked f32 kernel,
the compressed decode and its fpmath-bf16 form): one row's tile of scores joins the
running max, sum and rescale factor."""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (numba: configured first)

import numpy as np
from numba import njit

from graph_api.kernels.bits import exp32, vadd, vexp, vload, vmax, vmul, vsplat, vstore, vsub
from graph_api.kernels.sdpa.operands import NEG_INF


@njit(inline="always", cache=True)
def online_softmax_row(sc, o, n, rr, m, alpha, lv, part):
    """One row's tile of ``n`` scores (a multiple of 16) at ``sc[o:]`` joins the running
    softmax: the new running max ``m[rr]``, the factor ``alpha[rr]`` that rescales the
    earlier sums, the scores turned into ``exp(score - max)`` and added to the running
    sums ``lv[rr*16:]``.  A row masked so far keeps max -inf, alpha 1 and zero weights."""
    mv = vsplat(m[rr])
    for t in range(0, n, 16):
        mv = vmax(mv, vload(sc, o + t))
    vstore(part, 0, mv)
    mt = m[rr]
    for j in range(16):
        mt = max(mt, part[j])
    if mt == NEG_INF:
        alpha[rr] = np.float32(1.0)
        for t in range(n):
            sc[o + t] = np.float32(0.0)
        return
    al = exp32(m[rr] - mt)
    alpha[rr] = al
    m[rr] = mt
    # one pass: exponentials (:func:`vexp`, exp32's values) and the running sums; the
    # scalar exp32 loop LLVM vectorised ran ~3x slower (~10% of the decode tile)
    mv = vsplat(mt)
    lsum = vmul(vload(lv, rr * 16), vsplat(al))
    for t in range(0, n, 16):
        e = vexp(vsub(vload(sc, o + t), mv))
        vstore(sc, o + t, e)
        lsum = vadd(lsum, e)
    vstore(lv, rr * 16, lsum)

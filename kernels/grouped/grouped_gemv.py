"""All experts' int4/int8 decode GEMVs in one parallel launch.

Formula (per token row ``m`` of expert ``e``, output column ``n``; groups ``g`` of
``G`` consecutive ``k``)::

    part[m, c0_e + n] = sum_g s_e[g, n] * (sum_{k in g} x[m, k] * q_e[k, n] - z_e[g, n] * xs[m, g])

the formula of :mod:`graph_api.kernels.weight_compressed.wgemv4` (int4, the
interleaved layout) and :mod:`~graph_api.kernels.weight_compressed.wgemv8` (int8,
blocked), whose serial block kernels (``_M1`` one row, ``_ROWS`` 2..8 rows) each
work item calls, so a grouped result equals the per-expert decode bit for bit.

Work items (rows of ``items``): ``(r0, r1, wo, so, blk)``, one per (expert, block of
at most 8 token rows, 128-column weight block): rows ``r0:r1`` of the stacked
activations ``xf`` (every expert's tokens, expert after expert, as oneDNN's grouped
memory with its offsets), the byte offset ``wo`` of the block in the stacked weights,
the offset ``so`` of its scales, and the output block ``blk`` of ``part`` (a second
weight set read by the same rows, the gated MLP's up projection, stores at
``blk + nblk``).  No K splits: the experts' blocks give the threads their work.
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (configures numba first)

import numpy as np
from numba import njit, prange

from graph_api.kernels.weight_compressed.wgemv4 import _M1 as _M1_4, _ROWS as _ROWS_4
from graph_api.kernels.weight_compressed.wgemv8 import _M1 as _M1_8, _ROWS as _ROWS_8

#: token rows per work item (the block kernels' register tiles serve up to 8 rows)
ROWS = 8


@njit(parallel=True, cache=True)
def grouped4(xf, xs, w, table, sc, zf, zmode, G, items, part):
    """int4 (interleaved layout): part[T, cols] raw sums for every work item."""
    ng = xf.shape[1] // G
    cols = part.shape[1]
    for i in prange(items.shape[0]):
        r0 = items[i, 0]
        r1 = items[i, 1]
        p = part[r0:r1].reshape((1, r1 - r0, cols))
        if r1 - r0 == 1:
            _M1_4(xf[r0:r1], xs[r0:r1], w, items[i, 2], table, sc, zf, items[i, 3], zmode, G, 0, ng, p, 0,
                  items[i, 4])
        else:
            _ROWS_4(xf[r0:r1], xs[r0:r1], w, items[i, 2], table, sc, zf, items[i, 3], zmode, G, 0, ng, p, 0,
                    items[i, 4])


@njit(parallel=True, cache=True)
def grouped8(xf, xs, w, sc, zf, zmode, G, items, part):
    """int8 (blocked layout): :func:`grouped4` for s8/u8 weights."""
    ng = xf.shape[1] // G
    cols = part.shape[1]
    for i in prange(items.shape[0]):
        r0 = items[i, 0]
        r1 = items[i, 1]
        p = part[r0:r1].reshape((1, r1 - r0, cols))
        if r1 - r0 == 1:
            _M1_8(xf[r0:r1], xs[r0:r1], w, items[i, 2], sc, zf, items[i, 3], zmode, G, 0, ng, p, 0, items[i, 4])
        else:
            _ROWS_8(xf[r0:r1], xs[r0:r1], w, items[i, 2], sc, zf, items[i, 3], zmode, G, 0, ng, p, 0,
                    items[i, 4])


def work_items(row_offsets, experts, wbs: int, sbs: int, nblk: int, woffs, soffs, blk0: int = 0) -> np.ndarray:
    """Items for ``experts`` (indices into the per-expert weight offsets ``woffs``/``soffs``),
    whose token rows are ``row_offsets[e]:row_offsets[e + 1]`` of the stacked activations."""
    items = []
    for e in experts:
        r0, r1 = int(row_offsets[e]), int(row_offsets[e + 1])
        for a in range(r0, r1, ROWS):
            b = min(a + ROWS, r1)
            items += [(a, b, woffs[e] + blk * wbs, soffs[e] + blk * sbs, blk0 + blk) for blk in range(nblk)]
    return np.array(items, np.int64).reshape(-1, 5)

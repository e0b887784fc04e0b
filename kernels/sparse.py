"""Numba kernels for sparse tensors: SpMM (CSR, BCSR, 2:4), SpMSpM, conversions.

Every SpMM computes ``out[R, N] = S[R, C] @ D[C, N]`` with ``S`` in a row form
(CSR, block CSR, n:m rows) and ``D`` dense, C-contiguous f32; other
orientations (``D @ S``, transposed operands) are mapped onto it by the plan
(``graph_api.kernels.fused.sparse_plan``).  Only stored entries are multiplied
(x * 0 is skipped, even for NaN/Inf in ``D``; docs/sparse.md).  Sums are f32 in
storage order per output element, strict (no fastmath flags: mul then add, no
reassociation), so an output element is independent of the thread count.  The
MatMul post-op epilogue (``graph_api.kernels.weight_compressed.wmatmul._ep_steps``, shared with the MatMul stores) is applied to each finished
output row when ``use_ep``.

Index arrays come as uint32 views of the storage's int32 arrays (validated
non-negative): with signed indices Numba adds a negative-index wrap-around to
every gather, which made the SpMV loop ~3x slower.

Parallel over output rows (row blocks for BCSR): each thread owns its rows, no
atomics.  The inner loop is an axpy over 1-D row views (``out[r] += v * D[j]``),
which LLVM vectorizes; the same loop written with 2-D indexing did not vectorize
and ran ~7x slower.  (Tiling D's columns to keep a slice in L2 measured slower
than whole rows at 4096 x 512 on this machine.)
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (configures numba first)

import numpy as np
from numba import njit, prange

from graph_api.kernels.weight_compressed.wmatmul import _ep_steps

#: output rows per parallel task (CSR / n:m)
ROWS = 16


@njit(inline="always", cache=True)
def _axpy(orow, v, drow):
    """orow += v * drow over 1-D rows (contiguous: LLVM vectorizes it; 2-D indexing did not)."""
    for n in range(orow.shape[0]):
        orow[n] += v * drow[n]


@njit(parallel=True, cache=True)
def spmm_csr(indptr, indices, values, D, out, ops, fpar, ipar, buf, use_ep):
    """``out[r, :] = sum_{p in row r} values[p] * D[indices[p], :]`` (then the epilogue)."""
    R, N = out.shape
    x = D.reshape(-1)  # N == 1: the vector, 1-D contiguous
    nblocks = (R + ROWS - 1) // ROWS
    for blk in prange(nblocks):
        for r in range(blk * ROWS, min(R, blk * ROWS + ROWS)):
            orow = out[r]
            if N == 1:
                acc = np.float32(0.0)
                for p in range(indptr[r], indptr[r + 1]):
                    acc += values[p] * x[indices[p]]
                orow[0] = acc
            else:
                orow[:] = np.float32(0.0)
                for p in range(indptr[r], indptr[r + 1]):
                    _axpy(orow, values[p], D[indices[p]])
            if use_ep:
                _ep_steps(orow, np.int64(r), np.int64(0), ops, fpar, ipar, buf)


@njit(parallel=True, cache=True)
def spmm_bcsr(bptr, bidx, blocks, D, out, ops, fpar, ipar, buf, use_ep):
    """Block CSR: ``out[bi*br + ii, :] += blocks[p, ii, jj] * D[bidx[p]*bc + jj, :]``."""
    R, N = out.shape
    nb, br, bc = blocks.shape
    x = D.reshape(-1)
    for bi in prange(R // br):
        for ii in range(br):
            r = bi * br + ii
            orow = out[r]
            if N == 1:
                acc = np.float32(0.0)
                for p in range(bptr[bi], bptr[bi + 1]):
                    xb = x[np.uint64(bidx[p]) * np.uint64(bc):]  # unsigned: no wrap-around check
                    brow = blocks[p, ii]
                    for jj in range(bc):
                        acc += brow[jj] * xb[np.uint64(jj)]
                orow[0] = acc
            else:
                orow[:] = np.float32(0.0)
                for p in range(bptr[bi], bptr[bi + 1]):
                    c0 = bidx[p] * bc
                    for jj in range(bc):
                        _axpy(orow, blocks[p, ii, jj], D[c0 + jj])
            if use_ep:
                _ep_steps(orow, np.int64(r), np.int64(0), ops, fpar, ipar, buf)


#: rows interleaved per 2:4 block: the SpMV keeps RB independent sums (one per row, each
#: in storage order) in flight instead of one dependent chain
RB = 16


@njit(parallel=True, cache=True)
def spmv_2of4(vt, pt, x, out, ops, fpar, ipar, buf, use_ep):
    """The N = 1 case of :func:`spmm_2of4` (its own kernel: the inner loop over the RB rows of
    a block vectorizes when it is the whole loop body)."""
    R = out.shape[0]
    nblk, Q, rb = pt.shape
    for blk in prange(nblk):
        acc = np.zeros(rb, np.float32)
        for q in range(Q):
            vq = vt[blk, 4 * q:4 * q + 4]
            pq = pt[blk, q]
            xa = x[8 * q:8 * q + 8]
            for rr in range(rb):  # unsigned indices: no wrap-around check per gather
                byte = np.uint64(pq[rr])
                t = acc[rr] + vq[0, rr] * xa[byte & np.uint64(3)]
                t = t + vq[1, rr] * xa[(byte >> np.uint64(2)) & np.uint64(3)]
                t = t + vq[2, rr] * xa[np.uint64(4) + ((byte >> np.uint64(4)) & np.uint64(3))]
                acc[rr] = t + vq[3, rr] * xa[np.uint64(4) + (byte >> np.uint64(6))]
        r0 = blk * rb
        for rr in range(min(rb, R - r0)):
            if use_ep:  # output (r0 + rr, 0): a one-element row
                _ep_steps(acc[rr:rr + 1], np.int64(r0 + rr), np.int64(0), ops, fpar, ipar, buf)
            out[r0 + rr, 0] = acc[rr]


@njit(parallel=True, cache=True)
def spmm_2of4(vt, pt, D, out, ops, fpar, ipar, buf, use_ep):
    """2:4 rows in blocks of RB rows (:func:`interleave_2of4`): ``vt[blk, 4q + k, rr]`` is value k
    of byte q of row ``blk * RB + rr``, ``pt[blk, q, rr]`` that byte: four 2-bit in-block
    column indices (bits 0-1, 2-3 for group 2q; 4-5, 6-7 for group 2q + 1).  Reads half the
    weight bytes of the dense matrix plus 2 bits per value.  N = 1: :func:`spmv_2of4`."""
    R, N = out.shape
    nblk, Q, rb = pt.shape
    for blk in prange(nblk):
        r0 = blk * rb
        for rr in range(min(rb, R - r0)):
            r = r0 + rr
            orow = out[r]
            orow[:] = np.float32(0.0)
            for q in range(Q):
                byte = np.int64(pt[blk, q, rr])
                base = 8 * q
                _axpy(orow, vt[blk, 4 * q, rr], D[base + (byte & 3)])
                _axpy(orow, vt[blk, 4 * q + 1, rr], D[base + ((byte >> 2) & 3)])
                _axpy(orow, vt[blk, 4 * q + 2, rr], D[base + 4 + ((byte >> 4) & 3)])
                _axpy(orow, vt[blk, 4 * q + 3, rr], D[base + 4 + (byte >> 6)])
            if use_ep:
                _ep_steps(orow, np.int64(r), np.int64(0), ops, fpar, ipar, buf)


def interleave_2of4(values: np.ndarray, coordinates: np.ndarray, rows: int):
    """(vt [nblk, 4Q, RB] f32, pt [nblk, Q, RB] uint8) of 2:4 storage with ``rows`` rows whose
    group count is even (Q = groups / 2 bytes per row); rows padded to a multiple of RB with zeros."""
    packed = pack_2of4(coordinates, rows)  # [rows, Q]
    v = values.reshape(rows, -1).astype(np.float32)  # [rows, 4Q]
    nblk = (rows + RB - 1) // RB
    pad = nblk * RB - rows
    if pad:
        v = np.concatenate([v, np.zeros((pad, v.shape[1]), np.float32)])
        packed = np.concatenate([packed, np.zeros((pad, packed.shape[1]), np.uint8)])
    vt = np.ascontiguousarray(v.reshape(nblk, RB, -1).transpose(0, 2, 1))
    pt = np.ascontiguousarray(packed.reshape(nblk, RB, -1).transpose(0, 2, 1))
    return vt, pt


def pack_2of4(coordinates: np.ndarray, rows: int) -> np.ndarray:
    """2-bit in-block coordinates [rows * G * 2] -> [rows, ceil(G / 2)] bytes (4 bits per group)."""
    c = coordinates.reshape(rows, -1, 2).astype(np.uint8)
    nib = c[:, :, 0] | (c[:, :, 1] << 2)  # [rows, G]
    if nib.shape[1] % 2:
        nib = np.concatenate([nib, np.zeros((rows, 1), np.uint8)], axis=1)
    return np.ascontiguousarray(nib[:, 0::2] | (nib[:, 1::2] << 4))


@njit(parallel=True, cache=True)
def spmspm_csr(ap, ai, av, bp, bi, bv, out):
    """``out[r, :] = sum_{p in row r of A} av[p] * B[ai[p], :]`` over B's stored entries only
    (Gustavson, dense output rows)."""
    R, N = out.shape
    for r in prange(R):
        for n in range(N):
            out[r, n] = np.float32(0.0)
        for p in range(ap[r], ap[r + 1]):
            k = ai[p]
            v = av[p]
            for q in range(bp[k], bp[k + 1]):
                out[r, bi[q]] += v * bv[q]


@njit(cache=True)
def csr_transpose(indptr, indices, ncols):
    """(indptr, indices, permutation) of the transpose: ``values_t = values[perm]``.
    Counting sort: rows of the result come out ordered, as CSR wants."""
    nnz = indices.shape[0]
    R = indptr.shape[0] - 1
    tptr = np.zeros(ncols + 1, np.int32)
    for p in range(nnz):
        tptr[indices[p] + 1] += 1
    for c in range(ncols):
        tptr[c + 1] += tptr[c]
    fill = tptr[:-1].copy()
    tidx = np.empty(nnz, np.int32)
    perm = np.empty(nnz, np.int64)
    for r in range(R):
        for p in range(indptr[r], indptr[r + 1]):
            c = indices[p]
            q = fill[c]
            tidx[q] = r
            perm[q] = p
            fill[c] = q + 1
    return tptr, tidx, perm

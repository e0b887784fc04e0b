"""The compressed decode's steps in their AVX-512 form (:mod:`.decode`): int4
nibbles through one ``vpermps`` lookup per 16, 4 rows x 4 vectors of 16 live
accumulators, read from the stored bytes."""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (numba: configured first)
from graph_api.kernels.isa import ISA

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from graph_api.kernels.bf16dot import itemsize_of
from graph_api.kernels.bits import (_V16, f32x16, vbcast, vfma, vld_any, vload, vload_even, vload_odd, vmul,
                                    vsplat, vstore, vsub)
from graph_api.kernels.sdpa.operands import DT


#: the compile target has AVX-512 (the one ISA layer: also when the user set the CPU name
#: and features, or left Numba's environment alone with GRAPH_API_NUMBA_DEFAULTS=0)
HAS_AVX512 = ISA.avx512
_NIB_S = [float(i if i < 8 else i - 16) for i in range(16)]
_NIB_U = [float(i) for i in range(16)]


def _vnib_table(high: bool):
    @intrinsic
    def f(typingctx, arr, idx, signed):
        """The low/high nibbles of 16 bytes at byte offset ``idx`` of ``arr``'s buffer as
        f32x16, read as s4 (-8..7) when ``signed`` else u4 (0..15).  AVX-512: one
        ``vpermps`` table lookup per 16 nibbles (the index uses the low 4 bits)."""
        if not isinstance(arr, types.Array):
            return None
        sig = f32x16(arr, idx, signed)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            i8 = ir.IntType(8)
            i32v = ir.VectorType(ir.IntType(32), 16)
            base = builder.bitcast(ary.data, i8.as_pointer())
            p = builder.gep(base, [context.cast(builder, args[1], signature.args[1], types.intp)])
            v = builder.load(builder.bitcast(p, ir.VectorType(i8, 16).as_pointer()), align=1)
            v = builder.zext(v, i32v)
            if high:
                v = builder.lshr(v, ir.Constant(i32v, [4] * 16))
            sgn = builder.icmp_unsigned("!=", args[2], args[2].type(0))
            if HAS_AVX512:
                lut = builder.select(sgn, ir.Constant(_V16, _NIB_S), ir.Constant(_V16, _NIB_U))
                fn = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(_V16, [_V16, i32v]), "llvm.x86.avx512.permvar.sf.512")
                return builder.call(fn, [lut, v])
            v = builder.and_(v, ir.Constant(i32v, [15] * 16))
            vs = builder.sub(builder.xor(v, ir.Constant(i32v, [8] * 16)), ir.Constant(i32v, [8] * 16))
            return builder.sitofp(builder.select(sgn, vs, v), _V16)

        return sig, codegen

    return f


vnib_tlo = _vnib_table(False)
vnib_thi = _vnib_table(True)


@njit(inline="always", cache=True)
def _kvec4(buf, p, sgn):
    """The 4 vectors of 64 stored values from byte p: int4 (``buf`` a uint16 view): the
    low/high nibbles of bytes p..p+15, then of p+16..p+31; 8-bit: p, p+16, p+32, p+48."""
    if itemsize_of(buf) == 2:
        return (vnib_tlo(buf, p, sgn), vnib_thi(buf, p, sgn),
                vnib_tlo(buf, p + 16, sgn), vnib_thi(buf, p + 16, sgn))
    return (vld_any(buf, p, False), vld_any(buf, p + 16, False),
            vld_any(buf, p + 32, False), vld_any(buf, p + 48, False))


@njit(inline="always", cache=True)
def _kparam4(arr, i, four):
    """Scales / zero points of a 64-position K sub-block from flat index i, in the order
    of :func:`_kvec4` (int4: even positions then odd ones)."""
    if four:
        return (vload_even(arr, i), vload_odd(arr, i), vload_even(arr, i + 32), vload_odd(arr, i + 32))
    return (vload(arr, i), vload(arr, i + 16), vload(arr, i + 32), vload(arr, i + 48))


@njit(cache=True)
def scores_4rows(buf, k0, rs, sgn, scb, s0i, srs, zpb, zs, G, D, qb, qsum, r0, sc, c):
    """sc[r0..r0+3, 64c..64c+63] += scores of 4 rows against one 64-position K sub-block.

    ``k0``: byte offset of row d=0 of the tile, ``rs`` the row stride in bytes;
    ``s0i``: scale index of group 0 at the tile's first position, ``srs`` the group
    stride; zero points at ``s0i`` too, read only when ``zs`` = 1.
    """
    four = itemsize_of(buf) == 2
    ng = D // G
    z = vsplat(np.float32(0.0))
    sub = (32 if four else 64) * c
    o0 = r0 * DT + 64 * c
    for g in range(ng):
        a00 = z
        a01 = z
        a02 = z
        a03 = z
        a10 = z
        a11 = z
        a12 = z
        a13 = z
        a20 = z
        a21 = z
        a22 = z
        a23 = z
        a30 = z
        a31 = z
        a32 = z
        a33 = z
        for d in range(g * G, g * G + G):
            x0, x1, x2, x3 = _kvec4(buf, k0 + d * rs + sub, sgn)
            q = vbcast(qb, r0 * D + d)
            a00 = vfma(q, x0, a00)
            a01 = vfma(q, x1, a01)
            a02 = vfma(q, x2, a02)
            a03 = vfma(q, x3, a03)
            q = vbcast(qb, (r0 + 1) * D + d)
            a10 = vfma(q, x0, a10)
            a11 = vfma(q, x1, a11)
            a12 = vfma(q, x2, a12)
            a13 = vfma(q, x3, a13)
            q = vbcast(qb, (r0 + 2) * D + d)
            a20 = vfma(q, x0, a20)
            a21 = vfma(q, x1, a21)
            a22 = vfma(q, x2, a22)
            a23 = vfma(q, x3, a23)
            q = vbcast(qb, (r0 + 3) * D + d)
            a30 = vfma(q, x0, a30)
            a31 = vfma(q, x1, a31)
            a32 = vfma(q, x2, a32)
            a33 = vfma(q, x3, a33)
        si = s0i + g * srs + 64 * c
        s0, s1, s2, s3 = _kparam4(scb, si, four)
        if zs:
            z0, z1, z2, z3 = _kparam4(zpb, si, four)
            _add_group_scores4(sc, o0, s0, s1, s2, s3, z0, z1, z2, z3, -qsum[r0 * ng + g], a00, a01, a02, a03)
            _add_group_scores4(sc, o0 + DT, s0, s1, s2, s3, z0, z1, z2, z3, -qsum[(r0 + 1) * ng + g], a10, a11, a12, a13)
            _add_group_scores4(sc, o0 + 2 * DT, s0, s1, s2, s3, z0, z1, z2, z3, -qsum[(r0 + 2) * ng + g], a20, a21, a22, a23)
            _add_group_scores4(sc, o0 + 3 * DT, s0, s1, s2, s3, z0, z1, z2, z3, -qsum[(r0 + 3) * ng + g], a30, a31, a32, a33)
        else:  # no zero points: skip their loads and FMAs (~10% of the 1-row kernel)
            _add_group_scores4_nozp(sc, o0, s0, s1, s2, s3, a00, a01, a02, a03)
            _add_group_scores4_nozp(sc, o0 + DT, s0, s1, s2, s3, a10, a11, a12, a13)
            _add_group_scores4_nozp(sc, o0 + 2 * DT, s0, s1, s2, s3, a20, a21, a22, a23)
            _add_group_scores4_nozp(sc, o0 + 3 * DT, s0, s1, s2, s3, a30, a31, a32, a33)


@njit(inline="always", cache=True)
def _add_group_scores4(sc, o, s0, s1, s2, s3, z0, z1, z2, z3, nq, a0, a1, a2, a3):
    """sc[o + 16v ..] += s_v * (a_v - z_v * Q_g) for the 4 vectors of one row (nq = -Q_g)."""
    n = vsplat(nq)
    vstore(sc, o, vfma(s0, vfma(z0, n, a0), vload(sc, o)))
    vstore(sc, o + 16, vfma(s1, vfma(z1, n, a1), vload(sc, o + 16)))
    vstore(sc, o + 32, vfma(s2, vfma(z2, n, a2), vload(sc, o + 32)))
    vstore(sc, o + 48, vfma(s3, vfma(z3, n, a3), vload(sc, o + 48)))


@njit(inline="always", cache=True)
def _add_group_scores4_nozp(sc, o, s0, s1, s2, s3, a0, a1, a2, a3):
    """:func:`_add_group_scores4` without zero points: sc[o + 16v ..] += s_v * a_v."""
    vstore(sc, o, vfma(s0, a0, vload(sc, o)))
    vstore(sc, o + 16, vfma(s1, a1, vload(sc, o + 16)))
    vstore(sc, o + 32, vfma(s2, a2, vload(sc, o + 32)))
    vstore(sc, o + 48, vfma(s3, a3, vload(sc, o + 48)))


@njit(cache=True)
def scores_1row(buf, k0, rs, sgn, scb, s0i, srs, zpb, zs, G, D, qb, qsum, r0, sc, c):
    """One-row form of :func:`scores_4rows`."""
    four = itemsize_of(buf) == 2
    ng = D // G
    z = vsplat(np.float32(0.0))
    sub = (32 if four else 64) * c
    for g in range(ng):
        a0 = z
        a1 = z
        a2 = z
        a3 = z
        for d in range(g * G, g * G + G):
            x0, x1, x2, x3 = _kvec4(buf, k0 + d * rs + sub, sgn)
            q = vbcast(qb, r0 * D + d)
            a0 = vfma(q, x0, a0)
            a1 = vfma(q, x1, a1)
            a2 = vfma(q, x2, a2)
            a3 = vfma(q, x3, a3)
        si = s0i + g * srs + 64 * c
        s0, s1, s2, s3 = _kparam4(scb, si, four)
        if zs:
            z0, z1, z2, z3 = _kparam4(zpb, si, four)
            _add_group_scores4(sc, r0 * DT + 64 * c, s0, s1, s2, s3, z0, z1, z2, z3, -qsum[r0 * ng + g], a0, a1, a2, a3)
        else:
            _add_group_scores4_nozp(sc, r0 * DT + 64 * c, s0, s1, s2, s3, a0, a1, a2, a3)


@njit(inline="always", cache=True)
def _vgroups(four, G, d0):
    """Groups of the 4 vectors of V head dims d0..d0+63 (int4: even/odd d of a 32-d chunk)."""
    if four:
        return d0 // G, d0 // G, (d0 + 32) // G, (d0 + 32) // G
    return d0 // G, (d0 + 16) // G, (d0 + 32) // G, (d0 + 48) // G


@njit(inline="always", cache=True)
def _wfma(W, wo, ng, g0, g1, g2, g3, x0, x1, x2, x3, a0, a1, a2, a3):
    """a_v += W[g_v] * x_v (W[g] at W[wo + g * DT]) for one row."""
    return (vfma(vbcast(W, wo + g0 * DT), x0, a0), vfma(vbcast(W, wo + g1 * DT), x1, a1),
            vfma(vbcast(W, wo + g2 * DT), x2, a2), vfma(vbcast(W, wo + g3 * DT), x3, a3))


@njit(inline="always", cache=True)
def _acc_in(acc, o, al, zc, zo, g0, g1, g2, g3):
    """acc row vectors scaled by alpha, minus this tile's zero-point term (added back by
    the FMAs below: acc*alpha + sum W n - sum W z)."""
    l = vsplat(al)
    return (vsub(vmul(vload(acc, o), l), vsplat(zc[zo + g0])),
            vsub(vmul(vload(acc, o + 16), l), vsplat(zc[zo + g1])),
            vsub(vmul(vload(acc, o + 32), l), vsplat(zc[zo + g2])),
            vsub(vmul(vload(acc, o + 48), l), vsplat(zc[zo + g3])))


@njit(cache=True)
def pv_4rows(vb, v0, sgn, G, D, perm, nt, W, zc, acc, alpha, r0):
    """acc[r0..r0+3, :] = acc * alpha + sum_t W[r, g, t] * n[pos t, :] - zc[r, g] over one
    tile, W = p * scale (one FMA per stored value and row: the scale is in W).

    ``v0``: element index of the tile's row 0.  acc is in the int4 chunk order (32 d per
    chunk: even d then odd d) for int4.
    """
    four = itemsize_of(vb) == 2
    ng = D // G
    R = ng * DT
    for h in range(D // 64):
        g0, g1, g2, g3 = _vgroups(four, G, 64 * h)
        oa = r0 * D + 64 * h
        a00, a01, a02, a03 = _acc_in(acc, oa, alpha[r0], zc, r0 * ng, g0, g1, g2, g3)
        a10, a11, a12, a13 = _acc_in(acc, oa + D, alpha[r0 + 1], zc, (r0 + 1) * ng, g0, g1, g2, g3)
        a20, a21, a22, a23 = _acc_in(acc, oa + 2 * D, alpha[r0 + 2], zc, (r0 + 2) * ng, g0, g1, g2, g3)
        a30, a31, a32, a33 = _acc_in(acc, oa + 3 * D, alpha[r0 + 3], zc, (r0 + 3) * ng, g0, g1, g2, g3)
        for t in range(DT):
            s = perm[t]
            if s >= nt:
                continue
            e = v0 + s * D + 64 * h
            x0, x1, x2, x3 = _kvec4(vb, (e >> 1) if four else e, sgn)
            wo = r0 * R + t
            a00, a01, a02, a03 = _wfma(W, wo, ng, g0, g1, g2, g3, x0, x1, x2, x3, a00, a01, a02, a03)
            a10, a11, a12, a13 = _wfma(W, wo + R, ng, g0, g1, g2, g3, x0, x1, x2, x3, a10, a11, a12, a13)
            a20, a21, a22, a23 = _wfma(W, wo + 2 * R, ng, g0, g1, g2, g3, x0, x1, x2, x3, a20, a21, a22, a23)
            a30, a31, a32, a33 = _wfma(W, wo + 3 * R, ng, g0, g1, g2, g3, x0, x1, x2, x3, a30, a31, a32, a33)
        _vst4(acc, oa, a00, a01, a02, a03)
        _vst4(acc, oa + D, a10, a11, a12, a13)
        _vst4(acc, oa + 2 * D, a20, a21, a22, a23)
        _vst4(acc, oa + 3 * D, a30, a31, a32, a33)


@njit(inline="always", cache=True)
def _vst4(arr, o, a0, a1, a2, a3):
    vstore(arr, o, a0)
    vstore(arr, o + 16, a1)
    vstore(arr, o + 32, a2)
    vstore(arr, o + 48, a3)


@njit(cache=True)
def pv_1row(vb, v0, sgn, G, D, perm, nt, W, zc, acc, alpha, r0):
    """One-row form of :func:`pv_4rows`."""
    four = itemsize_of(vb) == 2
    ng = D // G
    for h in range(D // 64):
        g0, g1, g2, g3 = _vgroups(four, G, 64 * h)
        oa = r0 * D + 64 * h
        a0, a1, a2, a3 = _acc_in(acc, oa, alpha[r0], zc, r0 * ng, g0, g1, g2, g3)
        for t in range(DT):
            s = perm[t]
            if s >= nt:
                continue
            e = v0 + s * D + 64 * h
            x0, x1, x2, x3 = _kvec4(vb, (e >> 1) if four else e, sgn)
            a0, a1, a2, a3 = _wfma(W, r0 * ng * DT + t, ng, g0, g1, g2, g3, x0, x1, x2, x3,
                                   a0, a1, a2, a3)
        _vst4(acc, oa, a0, a1, a2, a3)

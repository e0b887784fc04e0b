"""int4 nibbles to f32 vectors by a 16-entry table lookup (one ``vpermps`` per 16 weights).

The weight-compressed decode kernels are compute-bound in strict f32: every
weight costs one FMA, so the unpack must be as cheap as possible.  A 512-bit
load holds 16 dwords of 8 nibbles each; nibble ``j`` of all 16 dwords becomes
16 f32 lanes with a right shift by ``4 j`` and ``vpermps`` on a 16-float table
(``vpermps`` reads only the low 4 bits of each index lane, so no mask is
needed): 2 vector operations per 16 weights (1 for ``j = 0``) instead of the
zero-extend, mask, shift and int-to-float convert of the byte-wise unpack.
The table holds the exact integer values (s4: ``u - 8`` for the stored biased
nibble ``u = q + 8``; u4: 0..15), so the lookup is exact.

Numba cannot express ``vpermps``; :func:`vlut4` emits the x86 intrinsic when
the compile target has AVX-512F, two 8-float AVX2 ``vpermps`` per 8 lanes and a
blend where it has AVX2 only, and elsewhere the same lookup lane by lane
(identical values, slower).  The AVX2 decode kernels do not look up: they
convert the nibble masked in place (:func:`vnibu`, :func:`vnib7`), which gives
``u * 16**j`` -- the biased nibble times a power of two -- in 2 vector operations
per 8 weights (see :mod:`graph_api.kernels.weight_compressed.wgemv4`).
"""
from __future__ import annotations

from graph_api.kernels.isa import ISA
from graph_api.kernels.numba_setup import numba  # noqa: F401  (configures numba first)

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from graph_api.kernels.bits import f32x16

_V16 = ir.VectorType(ir.FloatType(), 16)
_I32 = ir.IntType(32)
_I32V = ir.VectorType(_I32, 16)


#: 16-float ``vpermps`` lookups (AVX-512; the one ISA layer says so)
HAS_VPERMPS = ISA.avx512

#: AVX2 without AVX-512: the lookup as two 8-float ``vpermps`` per 8 lanes (the table's
#: halves) and a blend on the index's bit 3; the lane-by-lane form compiles to scalar
#: extracts (the int4 decode ran at ~1 ns per weight, 2% of the read bandwidth, on Zen 3)
HAS_VPERMPS8 = not HAS_VPERMPS and ISA.avx2
_V8 = ir.VectorType(ir.FloatType(), 8)
_I32V8 = ir.VectorType(_I32, 8)

#: lookup tables: stored nibble -> exact integer weight (s4 is stored biased, u = q + 8, so
#: that the AVX2 kernels' unsigned unpack needs no sign handling; ``-TABLE[0]`` is the bias)
TABLE_S4 = [float(u - 8) for u in range(16)]
TABLE_U4 = [float(i) for i in range(16)]


@intrinsic
def vlut4(typingctx, table, arr, idx, shift):
    """``table[(word[l] >> shift) & 15]`` for the 16 little-endian dwords ``word``
    at byte offset ``idx`` of ``arr``'s buffer (64 bytes, unchecked), as f32x16.

    ``shift`` is a multiple of 4 below 32 (a literal in practice; LLVM folds it).
    """
    if not isinstance(arr, types.Array):
        return None
    sig = f32x16(table, arr, idx, shift)

    def codegen(context, builder, signature, args):
        tab, ary_val, i_val, sh = args
        ary = context.make_array(signature.args[1])(context, builder, ary_val)
        base = builder.bitcast(ary.data, ir.IntType(8).as_pointer())
        i = context.cast(builder, i_val, signature.args[2], types.intp)
        p = builder.bitcast(builder.gep(base, [i]), _I32V.as_pointer())
        words = builder.load(p, align=1)
        sh = context.cast(builder, sh, signature.args[3], types.int32)
        shv = builder.insert_element(ir.Constant(_I32V, ir.Undefined), sh, _I32(0))
        shv = builder.shuffle_vector(shv, shv, ir.Constant(_I32V, [0] * 16))
        idxv = builder.lshr(words, shv)
        if HAS_VPERMPS:
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_V16, [_V16, _I32V]), "llvm.x86.avx512.permvar.sf.512")
            return builder.call(fn, [tab, idxv])
        if HAS_VPERMPS8:
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_V8, [_V8, _I32V8]), "llvm.x86.avx2.permps")
            lo_tab = builder.shuffle_vector(tab, tab, ir.Constant(_I32V8, list(range(8))))
            hi_tab = builder.shuffle_vector(tab, tab, ir.Constant(_I32V8, list(range(8, 16))))
            high = builder.icmp_unsigned("!=", builder.and_(idxv, ir.Constant(_I32V, [8] * 16)),
                                         ir.Constant(_I32V, [0] * 16))
            halves = []
            for h in range(2):
                part = builder.shuffle_vector(idxv, idxv, ir.Constant(_I32V8, list(range(8 * h, 8 * h + 8))))
                halves.append((builder.call(fn, [lo_tab, part]), builder.call(fn, [hi_tab, part])))
            lo = builder.shuffle_vector(halves[0][0], halves[1][0], ir.Constant(_I32V, list(range(16))))
            hi = builder.shuffle_vector(halves[0][1], halves[1][1], ir.Constant(_I32V, list(range(16))))
            return builder.select(high, hi, lo)
        idxv = builder.and_(idxv, ir.Constant(_I32V, [15] * 16))
        out = ir.Constant(_V16, ir.Undefined)
        for lane in range(16):
            e = builder.extract_element(tab, builder.extract_element(idxv, _I32(lane)))
            out = builder.insert_element(out, e, _I32(lane))
        return out

    return sig, codegen


@intrinsic
def nib_mask(typingctx, j):
    """The int32 mask ``15 << 4j`` of nibble ``j < 7``, hidden from LLVM's constant folding
    (an empty inline asm): :func:`vnibu` in a loop then keeps its masks in registers.  As
    constants, AVX2's code re-broadcast each splat mask from memory on every row (AVX2 has
    no broadcast memory operand) and the int4 decode loop ran ~10% slower."""
    sig = types.int32(j)

    def codegen(context, builder, signature, args):
        jj = context.cast(builder, args[0], signature.args[0], types.int32)
        mask = builder.shl(_I32(15), builder.mul(jj, _I32(4)))
        return builder.call(ir.InlineAsm(ir.FunctionType(_I32, [_I32]), "", "=r,0"), [mask])

    return sig, codegen


def _load_words(context, builder, signature, args):
    """The 16 little-endian dwords at byte offset ``args[1]`` of array ``args[0]`` (unchecked)."""
    ary = context.make_array(signature.args[0])(context, builder, args[0])
    base = builder.bitcast(ary.data, ir.IntType(8).as_pointer())
    i = context.cast(builder, args[1], signature.args[1], types.intp)
    return builder.load(builder.bitcast(builder.gep(base, [i]), _I32V.as_pointer()), align=1)


@intrinsic
def vnibu(typingctx, arr, idx, mask):
    """``u * 16**j`` for the unsigned nibble ``u`` under ``mask = nib_mask(j)`` (``j < 7``) of
    the 16 little-endian dwords at byte offset ``idx`` of ``arr``'s buffer (64 bytes,
    unchecked), as f32x16: the dwords masked in place and converted, one vector operation and
    a convert per 8 lanes (AVX2), against two shifts and a convert to move the nibble down
    first.  Exact: ``u * 16**j < 2**28`` has at most 4 significant bits.  Nibble 7 is
    :func:`vnib7` (masked in place it would read as a negative dword)."""
    if not isinstance(arr, types.Array):
        return None
    sig = f32x16(arr, idx, mask)

    def codegen(context, builder, signature, args):
        words = _load_words(context, builder, signature, args)
        m = context.cast(builder, args[2], signature.args[2], types.int32)
        mv = builder.insert_element(ir.Constant(_I32V, ir.Undefined), m, _I32(0))
        mv = builder.shuffle_vector(mv, mv, ir.Constant(_I32V, [0] * 16))
        return builder.sitofp(builder.and_(words, mv), _V16)

    return sig, codegen


@intrinsic
def vnib7(typingctx, arr, idx):
    """The unsigned nibble 7 (bits 28..31) of the 16 little-endian dwords at byte offset
    ``idx`` of ``arr``'s buffer, as f32x16 (one logical shift and a convert per 8 lanes)."""
    if not isinstance(arr, types.Array):
        return None
    sig = f32x16(arr, idx)

    def codegen(context, builder, signature, args):
        words = _load_words(context, builder, signature, args)
        return builder.sitofp(builder.lshr(words, ir.Constant(_I32V, [28] * 16)), _V16)

    return sig, codegen

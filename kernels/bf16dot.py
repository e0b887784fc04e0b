"""bf16 dot products on AVX512_BF16 for Numba kernels: ``vdpbf16ps`` and the int4/int8
to bf16-pair conversions that feed it, as LLVM intrinsics (Numba/LLVM never form
``vdpbf16ps`` from a loop, as ``igemm`` found for ``vpdpbusd``).

Values are ``f32x16`` (:mod:`graph_api.kernels.bits`) holding bit patterns: 16
lanes of f32, or 16 pairs of bf16 (the low half of a lane is the first of its
pair).  LLVM 22 declares the bf16 intrinsics on ``<32 x bfloat>``, which
llvmlite.ir cannot spell: :class:`_BFloat` is a type that prints ``bfloat``
(llvmlite's IR is text), and values are bitcast to it at the call.

int4 to bf16 in two or three vector operations.  A bf16 with exponent 2^4 and
the nibble in mantissa bits 3-6 is ``16 + n`` exactly (bits ``0x4180 | n << 3``);
with exponent 2^7 and the nibble in bits 0-3 it is ``128 + n`` (``0x4300 | n``:
no shift for a low nibble).  s4 flips the nibble's top bit first (``n ^ 8 = n +
8``).  A byte shuffle (``vpermt2b``) puts byte j of row A and of row B in lane j,
a shift moves the wanted nibble, one ``vpternlogd`` masks it and sets the
exponent (:data:`ENCODINGS`): the caller takes the offset out.  8-bit values go
through ``vcvtdq2ps`` (the top half of an f32 holding an 8-bit integer is its
bf16).

``HAVE_BF16`` says whether the compiled code may use these (the host's features,
as ``igemm.HAVE_VNNI``); kernels using them must not be compiled otherwise.
"""
from __future__ import annotations

from graph_api.kernels.isa import ISA
from graph_api.kernels.numba_setup import numba  # noqa: F401  (configures numba first)


import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from graph_api.kernels.bits import _V16, f32x16


#: whether the compiled code may use vdpbf16ps (AVX512_BF16)
HAVE_BF16 = ISA.avx512_bf16


# ------------------------------------------------------------------ intrinsics
class _BFloat(ir.types.Type):
    """LLVM's ``bfloat``: llvmlite.ir has no spelling for it, but its IR is text,
    so a type that prints ``bfloat`` is all the intrinsic declarations need."""

    def _to_string(self):
        return "bfloat"

    def __eq__(self, other):
        return isinstance(other, _BFloat)

    def __hash__(self):
        return hash("bfloat")


_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_I32V = ir.VectorType(_I32, 16)
_BF32 = ir.VectorType(_BFloat(), 32)


def _splat_i32(builder, x):
    v = builder.insert_element(ir.Constant(_I32V, ir.Undefined), x, _I32(0))
    return builder.shuffle_vector(v, v, ir.Constant(_I32V, [0] * 16))


@intrinsic
def vdpbf(typingctx, acc, a, b):
    """``acc[i] + a[2i] b[2i] + a[2i+1] b[2i+1]``: ``a``, ``b`` hold 32 bf16 (pairs per
    f32 lane, as bit patterns); ``llvm.x86.avx512bf16.dpbf16ps.512`` (products exact,
    f32 sums)."""
    sig = f32x16(f32x16, f32x16, f32x16)

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16, [_V16, _BF32, _BF32]),
                                            "llvm.x86.avx512bf16.dpbf16ps.512")
        return builder.call(fn, [args[0], builder.bitcast(args[1], _BF32), builder.bitcast(args[2], _BF32)])

    return sig, codegen


def _vec_bits(context, builder, aryty, ary_val, idx_val, idx_ty, elem):
    """16 x 32 bits (or 32 x 16 with ``elem`` 16) at ``arr.flat[idx]``."""
    ary = context.make_array(aryty)(context, builder, ary_val)
    p = builder.gep(ary.data, [context.cast(builder, idx_val, idx_ty, types.intp)])
    vt = _I32V if elem == 32 else ir.VectorType(_I16, 32)
    return builder.load(builder.bitcast(p, vt.as_pointer()), align=1)


@intrinsic
def vperm2(typingctx, a, b, idx, io):
    """Lane l = (a then b)[idx[io + l]] (32 lanes to choose from; ``idx`` int32;
    ``vpermt2ps``)."""
    if not (isinstance(idx, types.Array) and idx.dtype == types.int32):
        return None
    sig = f32x16(f32x16, f32x16, idx, io)

    def codegen(context, builder, signature, args):
        iv = _vec_bits(context, builder, signature.args[2], args[2], args[3], signature.args[3], 32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16, [_V16, _I32V, _V16]),
                                            "llvm.x86.avx512.vpermi2var.ps.512")
        return builder.call(fn, [args[0], iv, args[1]])

    return sig, codegen


@intrinsic
def vpack(typingctx, a, b, idx, io):
    """bf16(a then b) (32 values, round to nearest even: ``vcvtne2ps2bf16``), word w of
    the result taken from value ``idx[io + w]`` (``idx`` int16; ``vpermw``)."""
    if not (isinstance(idx, types.Array) and idx.dtype == types.int16):
        return None
    sig = f32x16(f32x16, f32x16, idx, io)

    def codegen(context, builder, signature, args):
        w16 = ir.VectorType(_I16, 32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_BF32, [_V16, _V16]),
                                            "llvm.x86.avx512bf16.cvtne2ps2bf16.512")
        w = builder.bitcast(builder.call(fn, [args[1], args[0]]), w16)  # words 0-15: a
        iv = _vec_bits(context, builder, signature.args[2], args[2], args[3], signature.args[3], 16)
        pf = cgutils.get_or_insert_function(builder.module, ir.FunctionType(w16, [w16, w16]),
                                            "llvm.x86.avx512.permvar.hi.512")
        return builder.bitcast(builder.call(pf, [w, iv]), _V16)

    return sig, codegen


@intrinsic
def vbits(typingctx, x):
    """16 copies of the 32-bit pattern ``x`` (an integer) as f32x16."""
    sig = f32x16(x)

    def codegen(context, builder, signature, args):
        c = args[0]
        c = builder.trunc(c, _I32) if c.type.width > 32 else c
        return builder.bitcast(_splat_i32(builder, c), _V16)

    return sig, codegen


def _byte_ptr(context, builder, aryty, ary_val, off_val, off_ty):
    ary = context.make_array(aryty)(context, builder, ary_val)
    base = builder.bitcast(ary.data, _I8.as_pointer())
    return builder.gep(base, [context.cast(builder, off_val, off_ty, types.intp)])


def _load16(builder, p):
    return builder.load(builder.bitcast(p, ir.VectorType(_I8, 16).as_pointer()), align=1)


#: int4 nibble -> bf16 encodings: (bit shift (+ left, - right), mask, bf16 bits of the
#: zero nibble in both halves, value of nibble 0).  The nibble lands in mantissa bits 3-6
#: at exponent 2^4 (16 + n) or bits 0-3 at 2^7 (128 + n, no shift for the low nibble).
ENCODINGS = {"lo16": (3, 0x00780078, 0x41804180, 16.0),
             "hi16": (-1, 0x00780078, 0x41804180, 16.0),
             "lo128": (0, 0x000F000F, 0x43004300, 128.0)}
#: s4: the nibble's top bit flipped (n ^ 8 = n + 8 for two's complement n): the xor bits
S4_FLIP = {"lo16": 0x00400040, "hi16": 0x00400040, "lo128": 0x00080008}


def encoding(name: str, signed: bool):
    """(xor constant, offset) of an int4 encoding: u = offset + n exactly in bf16."""
    shift, mask, base, zero = ENCODINGS[name]
    return (base ^ S4_FLIP[name]) if signed else base, zero + (8.0 if signed else 0.0)


def _vpair4(name: str):
    shift, mask = ENCODINGS[name][:2]

    @intrinsic
    def f(typingctx, arr, a, b, cst):
        """Lane j = (u(A[j]), u(B[j])) for the low (even) or high (odd) nibbles of the 16
        bytes A at byte offset ``a`` and B at ``b`` of ``arr``'s buffer, as bf16 pairs
        in the encoding ``name`` (``cst`` from :func:`encoding`).  One byte shuffle puts
        A[j] in bytes 0-1 and B[j] in bytes 2-3 of lane j (the mask keeps the
        nibble wanted), a shift, then one ``vpternlogd`` (and, xor)."""
        if not isinstance(arr, types.Array):
            return None
        sig = f32x16(arr, a, b, cst)

        def codegen(context, builder, signature, args):
            aty, ity, jty, _ = signature.args
            va = _load16(builder, _byte_ptr(context, builder, aty, args[0], args[1], ity))
            vb = _load16(builder, _byte_ptr(context, builder, aty, args[0], args[2], jty))
            idx = [x for j in range(16) for x in (j, j, 16 + j, 16 + j)]
            d = builder.bitcast(builder.shuffle_vector(va, vb, ir.Constant(ir.VectorType(_I32, 64), idx)), _I32V)
            if shift > 0:
                d = builder.shl(d, ir.Constant(_I32V, [shift] * 16))
            elif shift < 0:
                d = builder.lshr(d, ir.Constant(_I32V, [-shift] * 16))
            d = builder.and_(d, ir.Constant(_I32V, [mask] * 16))
            c = args[3]
            c = builder.trunc(c, _I32) if c.type.width > 32 else c
            return builder.bitcast(builder.xor(d, _splat_i32(builder, c)), _V16)

        return sig, codegen

    return f


vpair4_lo = _vpair4("lo16")
vpair4_hi = _vpair4("hi16")
vpair4_lo128 = _vpair4("lo128")


@intrinsic
def vpair8(typingctx, arr, a, b):
    """Lane j = (A[j], B[j]) as a bf16 pair for the 16 int8/uint8 elements A at element
    offset ``a`` and B at ``b`` (sign per dtype; exact: 8-bit integers have <= 8
    significant bits, so the low half of their f32 is zero).  (A uint16 view, int4 data,
    types as unsigned bytes: :func:`_vecs` never takes this branch for it.)"""
    if not (isinstance(arr, types.Array) and arr.dtype in (types.int8, types.uint8, types.uint16)):
        return None
    signed = arr.dtype == types.int8
    sig = f32x16(arr, a, b)

    def codegen(context, builder, signature, args):
        aty, ity, jty = signature.args
        ext = builder.sext if signed else builder.zext
        fa = builder.sitofp(ext(_load16(builder, _byte_ptr(context, builder, aty, args[0], args[1], ity)), _I32V), _V16)
        fb = builder.sitofp(ext(_load16(builder, _byte_ptr(context, builder, aty, args[0], args[2], jty)), _I32V), _V16)
        lo = builder.lshr(builder.bitcast(fa, _I32V), ir.Constant(_I32V, [16] * 16))
        return builder.bitcast(builder.or_(lo, builder.bitcast(fb, _I32V)), _V16)

    return sig, codegen


@intrinsic
def itemsize_of(typingctx, arr):
    """``arr.itemsize`` as a compile-time constant (int4 data arrive as a uint16 view)."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, signature, args):
        return context.get_constant(types.intp, arr.dtype.bitwidth // 8)

    return types.intp(arr), codegen


@intrinsic
def vbcast(typingctx, arr, idx):
    """16 copies of the 32 bits at float32 ``arr.flat[idx]`` (no wraparound; folds into
    ``vdpbf16ps``'s ``{1to16}`` broadcast operand)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], signature.args[1], types.intp)
        x = builder.load(builder.gep(ary.data, [i]), align=4)
        v = builder.insert_element(ir.Constant(_V16, ir.Undefined), x, _I32(0))
        return builder.shuffle_vector(v, v, ir.Constant(_I32V, [0] * 16))

    return f32x16(arr, idx), codegen



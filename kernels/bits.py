"""Shared njit helpers: float bit views, bf16/f16 <-> f32, fpmath roundings, nibbles.

Numba has no bf16/f16 on the CPU, so those arrive as ``uint16`` views and are
widened here in f32 registers.  Everything is branch-free so that the loops
calling these helpers vectorise (LLVM turns ``fpext half`` into ``vcvtph2ps``).

Rounding codes (``rnd`` parameter of the kernels, from :func:`rounding_code`):

====  ===============================================
code  f32 value is rounded to (round-to-nearest-even)
====  ===============================================
0     nothing (strict f32)
1     bf16
2     f16
3     tf32 (10 mantissa bits)
====  ===============================================

A few LLVM intrinsics are exposed because numba has no spelling for them:
``fma32`` (one rounding, what oneDNN's f32 kernels compute; explicit, so it
needs no fastmath flag and stays exact IEEE f32 arithmetic in strict mode),
``prefetch`` (software prefetch; ~1.7x for DRAM-resident weights) and the
f32/i32 bit casts.
"""
from __future__ import annotations

from kernels.numba_setup import numba  # noqa: F401  (configures numba first)

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

RND_NONE, RND_BF16, RND_F16, RND_TF32 = 0, 1, 2, 3


def rounding_code(fpmath=None, *, for_int_weights: bool = False, src_is_f32: bool = True) -> int:
    """Rounding code of an :class:`graph_api.fpmath.FPMath` for one kernel input.

    Only f32 inputs are rounded; dequantized integer weights only with
    ``apply_to_int``.  ``fpmath=None`` means strict.
    """
    if fpmath is None or not src_is_f32:
        return RND_NONE
    if for_int_weights and not fpmath.apply_to_int:
        return RND_NONE
    return {None: RND_NONE, "bf16": RND_BF16, "f16": RND_F16, "tf32": RND_TF32}[fpmath.rounding]


def fastmath_flags(fpmath=None) -> frozenset:
    """Numba fastmath flag set of an fpmath (empty for strict / None)."""
    return frozenset() if fpmath is None else frozenset(fpmath.fastmath)


# ------------------------------------------------------------------ intrinsics
@intrinsic
def fma32(typingctx, a, b, c):
    """a * b + c with one rounding (llvm.fma.f32)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.FloatType(), [ir.FloatType()] * 3), "llvm.fma.f32")
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def f32_from_bits(typingctx, u):
    """Reinterpret a uint32/int32 as float32."""
    sig = types.float32(u)

    def codegen(context, builder, signature, args):
        v = args[0]
        if v.type.width != 32:
            v = builder.trunc(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return sig, codegen


@intrinsic
def bits_from_f32(typingctx, f):
    """Reinterpret a float32 as uint32."""
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def f16_bits_to_f32(typingctx, h):
    """IEEE half (as uint16 bits) -> float32, exact (vcvtph2ps)."""
    sig = types.float32(h)

    def codegen(context, builder, signature, args):
        v = args[0]
        if not isinstance(v.type, ir.IntType):  # float source: not bits; unused branch
            return context.cast(builder, v, signature.args[0], types.float32)
        if v.type.width > 16:
            v = builder.trunc(v, ir.IntType(16))
        elif v.type.width < 16:
            v = builder.zext(v, ir.IntType(16))
        return builder.fpext(builder.bitcast(v, ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def f32_to_f16_bits(typingctx, f):
    """float32 -> IEEE half bits (round to nearest even, overflow to inf)."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


@intrinsic
def prefetch(typingctx, arr, idx):
    """Software prefetch of ``arr[idx]`` into all cache levels (read)."""
    if not isinstance(arr, types.Array):
        return None
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        base = builder.bitcast(ary.data, ir.IntType(8).as_pointer())
        itemsize = context.get_constant(types.intp, context.get_abi_sizeof(
            context.get_data_type(aryty.dtype)))
        off = builder.mul(context.cast(builder, args[1], signature.args[1], types.intp), itemsize)
        ptr = builder.gep(base, [off])
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32]),
            "llvm.prefetch.p0")
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


# ------------------------------------------------------------ conversions
@njit(inline="always", cache=True)
def bf16_to_f32(h):
    """bfloat16 bits (uint16) -> float32."""
    return f32_from_bits(np.uint32(h) << np.uint32(16))


@njit(inline="always", cache=True)
def f32_to_bf16(x):
    """float32 -> bfloat16 bits, round to nearest even, NaN kept quiet."""
    u = bits_from_f32(x)
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.uint16(((u >> np.uint32(16)) | np.uint32(0x40)) if nan else r)


@njit(inline="always", cache=True)
def round_bf16(x):
    u = bits_from_f32(x)
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return x if nan else f32_from_bits(r)


@njit(inline="always", cache=True)
def round_f16(x):
    return f16_bits_to_f32(f32_to_f16_bits(x))


@njit(inline="always", cache=True)
def round_tf32(x):
    u = bits_from_f32(x)
    r = (u + np.uint32(0xFFF) + ((u >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    special = (u & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    return x if special else f32_from_bits(r)


@njit(inline="always", cache=True)
def round_code(x, rnd):
    """Round an f32 value as rounding code ``rnd`` says (0 none, 1 bf16, 2 f16, 3 tf32)."""
    if rnd == 0:
        return x
    if rnd == 1:
        return round_bf16(x)
    if rnd == 2:
        return round_f16(x)
    return round_tf32(x)


# --------------------------------------------------------- activations / rows
@njit(cache=True)
def load_row_f32(src, kind, rnd, out):
    """Widen one activation row to f32 and apply the fpmath rounding.

    ``src`` is a 1-D float32 array (kind 0), uint16 bf16 bits (kind 1) or
    uint16 f16 bits (kind 2).  Rounding applies only to f32 sources.
    """
    n = out.shape[0]
    if kind == 0:
        if rnd == 0:
            for i in range(n):
                out[i] = src[i]
        else:
            for i in range(n):
                out[i] = round_code(np.float32(src[i]), rnd)
    elif kind == 1:
        for i in range(n):
            out[i] = bf16_to_f32(src[i])
    else:
        for i in range(n):
            out[i] = f16_bits_to_f32(src[i])


def act_kind(arr: np.ndarray) -> tuple[np.ndarray, int]:
    """(array view the kernels take, kind code): f32 -> 0, bf16 -> 1, f16 -> 2.

    bf16 (ml_dtypes) and float16 arrays are returned as uint16 views; a plain
    uint16 array is taken as bf16 bits.
    """
    dt = arr.dtype
    if dt == np.float32:
        return arr, 0
    if dt == np.float16:
        return arr.view(np.uint16), 2
    if dt.name == "bfloat16" or dt == np.uint16:
        return arr.view(np.uint16), 1
    return np.ascontiguousarray(arr, dtype=np.float32), 0


def to_bits_f16(arr) -> np.ndarray:
    """A float16 array as uint16 bits (for tests/benchmarks)."""
    return np.asarray(arr, dtype=np.float16).view(np.uint16)


# ------------------------------------------------------------------ nibbles
def _nibble_intrinsic(shift: bool, signed: bool):
    """uint8 byte -> one nibble as float32, computed in i32 lanes.

    numba would promote ``b & 15`` to int64 arithmetic, halving the vector
    width; this emits ``zext i8 -> i32; lshr; and; (xor 8; sub 8); sitofp``.
    """

    @intrinsic
    def nib(typingctx, b):
        sig = types.float32(b)

        def codegen(context, builder, signature, args):
            i32 = ir.IntType(32)
            v = args[0]
            if v.type.width > 8:
                v = builder.trunc(v, ir.IntType(8))
            v = builder.zext(v, i32)
            if shift:
                v = builder.lshr(v, i32(4))
            else:
                v = builder.and_(v, i32(15))
            if signed:
                v = builder.sub(builder.xor(v, i32(8)), i32(8))
            return builder.sitofp(v, ir.FloatType())

        return sig, codegen

    return nib


nib_lo_u = _nibble_intrinsic(False, False)
nib_hi_u = _nibble_intrinsic(True, False)
nib_lo_s = _nibble_intrinsic(False, True)
nib_hi_s = _nibble_intrinsic(True, True)


@intrinsic
def i8_to_f32(typingctx, b):
    """int8/uint8 -> float32 through i32 lanes (sign per the numba type)."""
    sig = types.float32(b)
    is_signed = getattr(b, "signed", True)

    def codegen(context, builder, signature, args):
        v = args[0]
        if not isinstance(v.type, ir.IntType):  # float source (unused branch)
            return context.cast(builder, v, signature.args[0], types.float32)
        if v.type.width > 32:
            v = builder.trunc(v, ir.IntType(32))
        elif v.type.width < 32:
            v = builder.sext(v, ir.IntType(32)) if is_signed else builder.zext(v, ir.IntType(32))
        return builder.sitofp(v, ir.FloatType())

    return sig, codegen


@intrinsic
def nib_x(typingctx, b, xm, hi):
    """Nibble of ``b ^ xm`` as float32 (``hi`` selects the high nibble), i32 lanes.

    ``xm = 0x88`` turns two's complement s4 nibbles into ``q + 8`` (0..15);
    ``xm = 0`` reads u4 as is.  ``hi`` must be a compile-time literal in
    practice (it is a plain bool here; LLVM folds it when constant).
    """
    sig = types.float32(b, xm, hi)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        v, m, h = args
        if not isinstance(v.type, ir.IntType):  # float source (unused branch)
            v = builder.fptoui(v, ir.IntType(8))
        v = builder.zext(builder.trunc(v, ir.IntType(8)) if v.type.width > 8 else v, i32)
        m = builder.zext(builder.trunc(m, ir.IntType(8)) if m.type.width > 8 else m, i32)
        v = builder.xor(v, m)
        sh = builder.select(builder.icmp_unsigned("!=", h, h.type(0)), i32(4), i32(0))
        v = builder.and_(builder.lshr(v, sh), i32(15))
        return builder.sitofp(v, ir.FloatType())

    return sig, codegen


@intrinsic
def pow2i(typingctx, n):
    """2**n for an integral-valued float32 n in [-126, 127] (exponent bits)."""
    sig = types.float32(types.float32)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        e = builder.add(builder.fptosi(args[0], i32), i32(127))
        return builder.bitcast(builder.shl(e, i32(23)), ir.FloatType())

    return sig, codegen


@njit(inline="always", cache=True)
def exp32(x):
    """exp(x) in f32 with branch-free range reduction (vectorises; <= 2 ulp).

    x = n ln2 + r (Cody-Waite, |r| <= ln2/2), exp(r) by a degree-6 polynomial,
    times 2**n from exponent bits.  Inputs below -87.3 give 0, above 88.7 inf.
    """
    xc = min(max(x, np.float32(-87.33654)), np.float32(88.72283))
    n = np.floor(xc * np.float32(1.4426950408889634) + np.float32(0.5))
    r = xc - n * np.float32(0.693359375)
    r = r - n * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)
    # 2**n in two steps so n = 128 (x near 88.7) does not overflow the exponent
    h = np.floor(n * np.float32(0.5))
    y = p * pow2i(h) * pow2i(n - h)
    if x < np.float32(-87.33654):
        y = np.float32(0.0)
    if x > np.float32(88.72283):
        y = np.float32(np.inf)
    return y if x == x else x

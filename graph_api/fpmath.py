"""The one fpmath table: what each mode does to the arithmetic.

oneDNN's fpmath mode names the implicit down-conversions of f32 data that a
computation may make.  This runtime applies them exactly, never "maybe":

=========  ==========================================
mode       f32 inputs of MatMul/Convolution/SDPA/MLP
=========  ==========================================
strict     kept f32
tf32       rounded to tf32 (10 mantissa bits, RNE)
bf16       rounded to bf16 (RNE)
f16        rounded to f16 (RNE)
any        rounded to bf16
=========  ==========================================

The numbers a mode gives do not depend on the CPU; which unit computes them does
(``kernels/isa.py``, ``docs/fpmath.md``): where both operands of a MatMul are bf16
values after the rounding and the host has AMX, the product runs on its tile unit
(exact bf16 products, f32 sums, in another order than the f32 BLAS path).

Accumulation is always f32 (s32 for integer products).  With ``apply_to_int``
integral weights (s8/u8/s4/u4) are up-converted to the mode's type using their
scales and zero points, so a DynamicDequantize feeding a MatMul computes in
that type; without it, dequantized weights stay f32 and the mode only affects
f32 data.  One refinement for bf16 with ``apply_to_int``: the constant int4
weights' decode kernel (M <= 8, ``kernels/weight_compressed/wgemv4_bf16.py``) converts the
integers ``q - z`` to bf16 exactly and multiplies each group's f32 sum by the
group's f32 scale, instead of rounding ``(q - z) * s`` to bf16 per weight:
every multiplication still takes bf16 (or exact) operands and the result is
closer to the unrounded weights, by up to ``2**-9 * sum |x w|``; the reference
and the other paths round the dequantized weights.  Element-wise ops, SoftMax and norms compute at their declared
precision in every mode, as in oneDNN.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import dtypes
from .dtypes import DataType
from .enums import FPMathMode, parse_enum

#: mode -> the type f32 MatMul/Convolution inputs are rounded through, or None
FPMATH_TABLE: dict[FPMathMode, str | None] = {
    FPMathMode.strict: None,
    FPMathMode.tf32: "tf32",
    FPMathMode.bf16: "bf16",
    FPMathMode.f16: "f16",
    FPMathMode.any: "bf16",
}


@dataclass(frozen=True)
class FPMath:
    """An fpmath setting: mode plus ``apply_to_int``."""

    mode: FPMathMode = FPMathMode.strict
    apply_to_int: bool = False

    @staticmethod
    def make(mode, apply_to_int=False) -> "FPMath":
        if isinstance(apply_to_int, str):
            apply_to_int = apply_to_int.lower() == "true"
        return FPMath(parse_enum(FPMathMode, mode, "fpmath mode"), bool(apply_to_int))

    @property
    def rounding(self) -> str | None:
        """'bf16', 'f16', 'tf32' or None: how f32 compute inputs are rounded."""
        return FPMATH_TABLE[self.mode]

    def round_input(self, values: np.ndarray, src_dtype: DataType) -> np.ndarray:
        """A MatMul/Conv input as f32, rounded as the mode allows.

        Only f32 data is down-converted; bf16/f16 inputs already are what they
        are.  ``src_dtype`` is the storage type the data came from.
        """
        x = dtypes.to_f32(values)
        if self.rounding is None or src_dtype != DataType.f32:
            return x
        if self.rounding == "tf32":
            return dtypes.round_to_tf32(x)
        return dtypes.round_through(x, DataType[self.rounding])

    def operand_type(self, src_dtype: DataType, dequantized: bool = False) -> DataType:
        """The type whose values a MatMul/Conv operand holds after this mode's rounding:
        ``src_dtype`` for bf16/f16 data (and for f32 data the mode keeps, or integral
        data without ``apply_to_int``), else the rounding type (``tf32`` counts as f32:
        it has no storage type).  A kernel that multiplies that type natively (bf16 on
        the matrix units) computes exactly the rounded operands."""
        if src_dtype != DataType.f32 or self.rounding in (None, "tf32") or (dequantized and not self.apply_to_int):
            return src_dtype
        return DataType[self.rounding]

    def round_dequantized_weight(self, values: np.ndarray) -> np.ndarray:
        """Weights decompressed from integers: rounded only with apply_to_int."""
        if not self.apply_to_int:
            return dtypes.to_f32(values)
        return self.round_input(values, DataType.f32)

    def __str__(self) -> str:
        return self.mode.name + (":apply_to_int" if self.apply_to_int else "")


STRICT = FPMath()

"""MatMul ``algorithm``: the StableHLO dot algorithm (RFC of seed 000) as an attribute.

An algorithm fixes how a dot is computed, whatever the fpmath mode says:

* ``lhs_type`` / ``rhs_type``: the precision each operand is rounded to;
* ``accum_type``: the accumulator;
* ``lhs_component_count`` / ``rhs_component_count``: each operand is split into
  that many parts of its type (``hi = t(x)``, ``mid = t(x - hi)``,
  ``lo = t(x - hi - mid)``), so several narrow dots emulate a wider one;
* ``num_primitive_ops``: how many part x part dots are summed.  Parts are
  paired most significant first: all pairs ``(i, j)`` with ``i + j <= t`` for
  the smallest ``t`` that gives that count (3 of 2x2: hi.hi, hi.lo, lo.hi;
  6 of 3x3: every pair but mid.lo, lo.mid, lo.lo);
* ``allow_imprecise_accum``: permission to accumulate some steps in lower
  precision (this runtime always accumulates in ``accum_type``, which honours it).

The attribute value is a preset name (:data:`PRESETS`) or a dict of the seven
fields (``lhs_type``, ``rhs_type`` and ``accum_type`` required, counts default
to 1, ``allow_imprecise_accum`` to false).  :func:`check_algorithm` runs at
``add_op``: the RFC's constraints C20-C22 and impossible combinations are
``InvalidGraphOp``; valid combinations this runtime does not compute are
``Unimplemented`` naming the algorithm, never a silent fallback.

Every primitive dot here multiplies parts whose significands have at most 11
bits (tf32, f16, bf16, f8), so each product is exact in f32 and an f32 GEMM of
the parts is a faithful primitive dot accumulated in f32.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from . import dtypes
from .dtypes import DataType
from .errors import InvalidGraphOp, Unimplemented, op_label

#: element type -> explicit mantissa bits (tf32 has no storage type: the RFC adds it)
MANTISSA_BITS = {"f64": 52, "f32": 23, "tf32": 10, "f16": 10, "bf16": 7,
                 "f8_e4m3": 3, "f8_e5m2": 2}
FIELDS = ("lhs_type", "rhs_type", "accum_type", "lhs_component_count",
          "rhs_component_count", "num_primitive_ops", "allow_imprecise_accum")
_COUNTS = {"lhs_component_count": "C20", "rhs_component_count": "C21", "num_primitive_ops": "C22"}
_DEFAULTS = {"lhs_component_count": 1, "rhs_component_count": 1, "num_primitive_ops": 1,
             "allow_imprecise_accum": False}
#: types a multi-component split is computed for (same exponent range as f32: no overflow)
_SPLIT_TYPES = ("bf16", "tf32")
#: single-component operand types this runtime rounds to
_ROUNDED_TYPES = ("f32", "tf32", "bf16", "f16", "f8_e4m3", "f8_e5m2")


@dataclass(frozen=True)
class DotAlgorithm:
    lhs_type: str
    rhs_type: str
    accum_type: str
    lhs_component_count: int = 1
    rhs_component_count: int = 1
    num_primitive_ops: int = 1
    allow_imprecise_accum: bool = False

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        return ("{" + ", ".join(f"{k}={v}" for k, v in self.as_dict().items()) + "}")

    def pairs(self) -> list[tuple[int, int]]:
        """The (lhs part, rhs part) index pairs summed, least significant first."""
        return primitive_pairs(self.lhs_component_count, self.rhs_component_count,
                               self.num_primitive_ops)


PRESETS: dict[str, DotAlgorithm] = {
    "f32": DotAlgorithm("f32", "f32", "f32"),
    "tf32": DotAlgorithm("tf32", "tf32", "f32"),
    "tf32_3x": DotAlgorithm("tf32", "tf32", "f32", 2, 2, 3),
    "bf16": DotAlgorithm("bf16", "bf16", "f32"),
    "bf16_3x": DotAlgorithm("bf16", "bf16", "f32", 2, 2, 3),
    "bf16_6x": DotAlgorithm("bf16", "bf16", "f32", 3, 3, 6),
    "f16": DotAlgorithm("f16", "f16", "f32"),
    "f8_e5m2": DotAlgorithm("f8_e5m2", "f8_e5m2", "f32", allow_imprecise_accum=True),
    "f8_e4m3": DotAlgorithm("f8_e4m3", "f8_e4m3", "f32", allow_imprecise_accum=True),
}


def _cut_pairs(lhs_count: int, rhs_count: int) -> list[list[tuple[int, int]]]:
    """Pairs grouped by significance ``i + j`` (anti-diagonals), most significant first."""
    return [[(i, s - i) for i in range(lhs_count) if 0 <= s - i < rhs_count]
            for s in range(lhs_count + rhs_count - 1)]


def primitive_pairs(lhs_count: int, rhs_count: int, num_ops: int) -> list[tuple[int, int]] | None:
    """The pairs of a whole number of anti-diagonals totalling ``num_ops``, least
    significant first (summing small terms first loses least); None if no cut fits."""
    chosen: list[tuple[int, int]] = []
    for diagonal in _cut_pairs(lhs_count, rhs_count):
        if len(chosen) == num_ops:
            break
        chosen += diagonal
    return chosen[::-1] if len(chosen) == num_ops else None


# ------------------------------------------------------------------ parsing
def _bad(op, message: str) -> InvalidGraphOp:
    return InvalidGraphOp(f"{op_label(op)}: attribute 'algorithm': {message}")


def _field_value(op, name: str, value):
    if name in ("lhs_type", "rhs_type", "accum_type"):
        if value not in MANTISSA_BITS:
            raise _bad(op, f"{name}={value!r} is not a floating element type; "
                           f"expected one of {', '.join(MANTISSA_BITS)}")
        return value
    if name == "allow_imprecise_accum":
        if not isinstance(value, bool) and value not in (0, 1):
            raise _bad(op, f"allow_imprecise_accum must be a bool, got {value!r}")
        return bool(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(op, f"{name} must be an integer, got {value!r}")
    if value < 1:
        raise _bad(op, f"({_COUNTS[name]}) {name} >= 1 is violated: got {value}")
    return value


def parse(op, value) -> DotAlgorithm:
    """The algorithm an attribute value names; ``InvalidGraphOp`` when it is malformed."""
    if isinstance(value, str):
        if value not in PRESETS:
            raise _bad(op, f"unknown preset {value!r}; presets: {', '.join(PRESETS)} "
                           f"(or a dict of {', '.join(FIELDS)})")
        return PRESETS[value]
    if not isinstance(value, dict):
        raise _bad(op, f"must be a preset name or a dict, got {value!r}")
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        raise _bad(op, f"unknown field(s) {unknown}; fields: {', '.join(FIELDS)}")
    missing = [f for f in FIELDS[:3] if f not in value]
    if missing:
        raise _bad(op, f"missing field(s) {missing}")
    fields = {name: _field_value(op, name, value.get(name, _DEFAULTS.get(name))) for name in FIELDS}
    return DotAlgorithm(**fields)


def _invalid_combination(algo: DotAlgorithm) -> str | None:
    """Why the fields cannot describe any dot (InvalidGraphOp), or None."""
    pairs = algo.lhs_component_count * algo.rhs_component_count
    if algo.num_primitive_ops > pairs:
        return (f"num_primitive_ops={algo.num_primitive_ops} exceeds the {pairs} part pairs of "
                f"{algo.lhs_component_count} x {algo.rhs_component_count} components")
    for side in ("lhs_type", "rhs_type"):
        if MANTISSA_BITS[algo.accum_type] < MANTISSA_BITS[getattr(algo, side)]:
            return (f"accum_type {algo.accum_type} is narrower than {side} "
                    f"{getattr(algo, side)}: the accumulator must hold the operands")
    return None


def _unimplemented_reason(algo: DotAlgorithm) -> str | None:
    """Why this runtime does not compute a valid algorithm, or None."""
    if algo.accum_type != "f32":
        return f"accum_type {algo.accum_type} (only f32 accumulation is implemented)"
    multi = algo.lhs_component_count > 1 or algo.rhs_component_count > 1
    if not multi:
        for side in ("lhs_type", "rhs_type"):
            if getattr(algo, side) not in _ROUNDED_TYPES:
                return f"{side} {getattr(algo, side)}"
        if algo.num_primitive_ops != 1:
            return "more than one primitive dot of single-component operands"
        return None
    if algo.lhs_type != algo.rhs_type or algo.lhs_type not in _SPLIT_TYPES:
        return (f"multi-component {algo.lhs_type} x {algo.rhs_type} (splits are implemented "
                f"for {' and '.join(_SPLIT_TYPES)} on both sides)")
    if algo.pairs() is None:
        return (f"{algo.num_primitive_ops} primitive dots of {algo.lhs_component_count} x "
                f"{algo.rhs_component_count} components is not a whole number of significance "
                f"levels (the implemented counts take all pairs with i + j <= t)")
    return None


def check_algorithm(op, value) -> object:
    """Validate an ``algorithm`` attribute value; returns the normalized value.

    A preset name stays a name; a dict gets every field written in.

    Raises:
        InvalidGraphOp: C20-C22, unknown types or fields, impossible combinations.
        Unimplemented: a valid algorithm this runtime does not compute.
    """
    algo = parse(op, value)
    reason = _invalid_combination(algo)
    if reason:
        raise _bad(op, reason)
    reason = _unimplemented_reason(algo)
    if reason:
        label = value if isinstance(value, str) else algo.describe()
        raise Unimplemented(f"{op_label(op)}: dot algorithm {label} is not implemented: {reason}")
    return value if isinstance(value, str) else algo.as_dict()


def algorithm_of(op) -> DotAlgorithm | None:
    """The op's algorithm (attrs already checked by add_op), or None."""
    value = op.attrs.get("algorithm")
    return None if value is None else parse(op, value)


# ------------------------------------------------------------------ numerics
def round_to(x: np.ndarray, type_name: str) -> np.ndarray:
    """f32 values rounded (nearest even) to ``type_name``, returned as f32."""
    x = dtypes.to_f32(x)
    if type_name == "f32":
        return x
    if type_name == "tf32":
        return dtypes.round_to_tf32(x)
    return dtypes.round_through(x, DataType[type_name])


def split(x: np.ndarray, type_name: str, count: int) -> list[np.ndarray]:
    """``count`` parts of ``type_name`` whose sum approximates x, most significant first.

    Each remainder ``x - hi - ...`` is exact in f32 (it has fewer significant
    bits than x), so the parts are the leading digits of x in base ``type_name``.
    """
    remainder = dtypes.to_f32(x)
    parts = []
    for _ in range(count):
        part = round_to(remainder, type_name)
        parts.append(part)
        remainder = remainder - part
    return parts

"""Every op case, as data: ``OP_CASES``.

Each :class:`~tests.cases.records.OpCase` is self-contained (seeded inputs via
``case.make_inputs()``, the op via ``case.make_op()``, output specs, fpmath,
an independent ``expected`` formula and a justified tolerance), so the same
list runs on the reference kernels, through the public API as single-op
partitions, and through fused kernels.  The records live in ``records.py``,
the cases by topic in the sibling modules.
"""
from __future__ import annotations

from .backward_cases import backward_cases
from .composite_cases import composite_cases
from .compute_cases import compute_cases
from .elementwise_cases import elementwise_cases
from .misc_cases import misc_cases
from .norm_cases import norm_cases
from .quant_cases import quant_cases
from .records import EXACT, TOLERANCE, In, OpCase, Out, Tol

OP_CASES: list[OpCase] = (elementwise_cases() + compute_cases() + norm_cases() + quant_cases()
                          + misc_cases() + backward_cases() + composite_cases())

assert len({c.name for c in OP_CASES}) == len(OP_CASES), "op case names must be unique"

__all__ = ["OP_CASES", "OpCase", "In", "Out", "Tol", "EXACT", "TOLERANCE"]

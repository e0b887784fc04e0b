"""Numpy reference kernels: the ground truth for every op (forward and backward).

``REFERENCE[OpKind.X](op, inputs, out_lts, ctx) -> list[np.ndarray]`` (the
contract is in DESIGN.md).  The dict is assembled explicitly from the
per-topic tables below; each kernel's docstring states its formula.
"""
from __future__ import annotations

from .backward import BACKWARD
from .backward_window import BACKWARD_WINDOW
from .binary import BINARY
from .composite import COMPOSITE
from .context import RefContext
from .conv import CONV
from .dropout import DROPOUT
from .eltwise import ELTWISE
from .matmul import MATMUL
from .misc import MISC
from .norm import NORM
from .pool import POOL
from .quant import QUANT
from .reduce import REDUCE
from .resample import RESAMPLE
from .softmax import SOFTMAX

#: the per-topic tables, in the order they are merged (no kind appears twice)
TABLES = (ELTWISE, BINARY, MATMUL, CONV, POOL, NORM, SOFTMAX, REDUCE, QUANT, MISC,
          RESAMPLE, DROPOUT, BACKWARD, BACKWARD_WINDOW, COMPOSITE)

REFERENCE: dict = {
    **ELTWISE, **BINARY, **MATMUL, **CONV, **POOL, **NORM, **SOFTMAX, **REDUCE, **QUANT,
    **MISC, **RESAMPLE, **DROPOUT, **BACKWARD, **BACKWARD_WINDOW, **COMPOSITE,
}

__all__ = ["REFERENCE", "RefContext", "TABLES"]

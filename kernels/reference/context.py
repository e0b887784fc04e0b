"""What a reference kernel may know besides its op and inputs."""
from __future__ import annotations

from dataclasses import dataclass

from graph_api.fpmath import STRICT, FPMath


@dataclass(frozen=True)
class RefContext:
    """Execution context of one reference op.

    Attributes:
        fpmath: the partition's fpmath setting; only MatMul, Convolution and
            ConvTranspose look at it (their inputs are rounded by it).
        int_inputs: input indices of this op whose data was dequantized from
            integers inside the same partition; those are rounded with
            ``fpmath.round_dequantized_weight`` (i.e. only with apply_to_int).
    """

    fpmath: FPMath = STRICT
    int_inputs: frozenset = frozenset()

"""Reductions over ``axes`` (attribute, or the optional s32 second input).

Evaluated in float64, rounded once to the output type; ``keep_dims`` only
changes the output shape, which comes from the output logical tensor.  Over
no elements: sum/L1/L2 0, prod 1, mean NaN, max/min the lowest/highest finite
value of the src type (oneDNN's accumulator start values, see ``EMPTY``)::

    ReduceL1 = sum|x|   ReduceL2 = sqrt(sum x^2)   ReduceMax/Min/Mean/Prod/Sum
"""
from __future__ import annotations

import numpy as np

from graph_api.enums import OpKind

from ._common import f64, finish, norm_axis


def reduce_axes(op, inputs, ndim: int) -> tuple[int, ...]:
    """The reduced axes: the ``axes`` attr when non-empty, else input 1."""
    axes = op.attrs.get("axes") or []
    if not axes and len(inputs) > 1:
        axes = np.asarray(inputs[1]).reshape(-1).tolist()
    return tuple(sorted({norm_axis(int(a), ndim) for a in axes}))


def _finite_max(dtype) -> float:
    """The largest finite value of a float storage dtype (ml_dtypes knows bf16 too)."""
    import ml_dtypes

    return float(ml_dtypes.finfo(dtype).max)


#: value of a reduction over no elements where numpy has none: oneDNN starts
#: max from the lowest finite value of the src type, min from the highest, and
#: divides the mean's 0 by the count 0
EMPTY = {"reduce_max": lambda dt: -_finite_max(dt), "reduce_min": _finite_max,
         "reduce_mean": lambda dt: np.nan}


def reduction(formula):
    """Adapt ``formula(x, axes)`` to the kernel contract."""

    def kernel(op, inputs, out_lts, ctx):
        x = f64(inputs[0])
        axes = reduce_axes(op, inputs, x.ndim)
        with np.errstate(all="ignore"):
            if formula.__name__ in EMPTY and any(x.shape[a] == 0 for a in axes):
                empty = EMPTY[formula.__name__](np.asarray(inputs[0]).dtype)
                y = np.full(np.sum(x, axis=axes).shape, empty)
            else:
                y = formula(x, axes)
        return [finish(y, out_lts[0])]

    kernel.__name__ = formula.__name__
    kernel.__doc__ = formula.__doc__
    kernel.formula = formula
    return kernel


def reduce_l1(x, axes):
    """dst = sum |x|"""
    return np.abs(x).sum(axis=axes)


def reduce_l2(x, axes):
    """dst = sqrt(sum x^2)"""
    return np.sqrt(np.square(x).sum(axis=axes))


def reduce_max(x, axes):
    """dst = max x"""
    return x.max(axis=axes)


def reduce_mean(x, axes):
    """dst = sum x / count"""
    return x.mean(axis=axes)


def reduce_min(x, axes):
    """dst = min x"""
    return x.min(axis=axes)


def reduce_prod(x, axes):
    """dst = prod x"""
    return x.prod(axis=axes)


def reduce_sum(x, axes):
    """dst = sum x"""
    return x.sum(axis=axes)


REDUCE = {
    OpKind.ReduceL1: reduction(reduce_l1),
    OpKind.ReduceL2: reduction(reduce_l2),
    OpKind.ReduceMax: reduction(reduce_max),
    OpKind.ReduceMean: reduction(reduce_mean),
    OpKind.ReduceMin: reduction(reduce_min),
    OpKind.ReduceProd: reduction(reduce_prod),
    OpKind.ReduceSum: reduction(reduce_sum),
}

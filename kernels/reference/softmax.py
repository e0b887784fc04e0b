"""SoftMax (with ``inf_as_zero`` mode and the optional stats output) and LogSoftmax.

Evaluated in float64 along ``axis`` (SoftMax default 1, LogSoftmax -1)::

    m = max(x);  s = sum(exp(x - m))
    softmax = exp(x - m) / s;  log_softmax = x - m - ln s;  stats = m + ln s

A slice whose inputs are all -inf gives NaN in mode ``none`` (as IEEE does:
-inf - -inf) and, with ``mode="inf_as_zero"``, an all-zero softmax and
``stats = -inf`` (oneDNN clamps the max to a finite value and the 1/sum of an
empty sum to 1).  ``stats`` keeps the softmax axis with size 1.  An empty
softmax axis gives an empty dst and ``stats = -inf`` (log of an empty sum).
"""
from __future__ import annotations

import numpy as np

from graph_api.enums import OpKind

from ._common import f64, finish, norm_axis


def _max_and_sum(x, axis):
    # initial -inf: over an empty axis max = -inf and sum = 0 (stats = -inf), and
    # the softmax itself is empty; elsewhere it changes nothing
    m = x.max(axis=axis, keepdims=True, initial=-np.inf)
    s = np.exp(x - m).sum(axis=axis, keepdims=True)
    return m, s


def softmax(op, inputs, out_lts, ctx):
    """dst = exp(x - max) / sum(exp(x - max)); stats = max + ln(sum)."""
    x = f64(inputs[0])
    axis = norm_axis(int(op.attrs.get("axis", 1)), x.ndim)
    with np.errstate(all="ignore"):
        m, s = _max_and_sum(x, axis)
        dst = np.exp(x - m) / s
        stats = m + np.log(s)
        if op.attrs.get("mode", "none") == "inf_as_zero":
            empty = m == -np.inf
            dst = np.where(empty, 0.0, dst)
            stats = np.where(empty, -np.inf, stats)
    outs = [finish(dst, out_lts[0])]
    if len(out_lts) > 1:
        outs.append(finish(stats, out_lts[1]))
    return outs


def log_softmax(op, inputs, out_lts, ctx):
    """dst = x - max - ln(sum(exp(x - max)))."""
    x = f64(inputs[0])
    axis = norm_axis(int(op.attrs.get("axis", -1)), x.ndim)
    with np.errstate(all="ignore"):
        m, s = _max_and_sum(x, axis)
        return [finish(x - m - np.log(s), out_lts[0])]


SOFTMAX = {OpKind.SoftMax: softmax, OpKind.LogSoftmax: log_softmax}

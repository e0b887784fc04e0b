"""The oneDNN benchdnn graph files the tests run, and which of them cannot pass yet.

The files live in ``tests/data/onednn-graphs/`` (a copy of
``../shared/conformance/onednn-graphs/``; source, commit and licence in
``tests/data/README.md``), so the suite runs on a fresh clone with nothing
beside it.  Every test module that walks the folder takes its file list and its
expected failures from here: one table, so a capability that lands removes its
rows once and every module sees it.

Two kinds of expected failure, each strict (a fix makes the test pass and
pytest then reports XPASS as a failure, so the row must go):

* ``NOT_LOADABLE``: the file does not load (an op kind or attribute value the
  opset does not have yet).  Every test that loads the file fails.
* ``NOT_ONE_PARTITION``: the file loads, runs and matches the reference, but
  oneDNN forms one partition where the pattern library forms several (the CNN
  fusions of issue 15).  Only the partition-count test fails.
"""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent / "data" / "onednn-graphs"
FILES = sorted(ROOT.rglob("*.json"))

_BACKWARD = "op kind {} is not in the opset yet (issue 15: backward op kinds)"

#: file (path under ``onednn-graphs/``) -> what is missing
NOT_LOADABLE: dict[str, str] = {
    "op/f32/abs_bwd.json": _BACKWARD.format("AbsBackward"),
    "op/f32/biasadd_bwd.json": _BACKWARD.format("BiasAddBackprop"),
    "op/f32/clamp_bwd.json": _BACKWARD.format("ClampBackward"),
    "op/f32/conv_bwd_d_2d.json": _BACKWARD.format("ConvolutionBackwardData"),
    "op/f32/conv_bwd_d_3d.json": _BACKWARD.format("ConvolutionBackwardData"),
    "op/f32/conv_bwd_w_2d.json": _BACKWARD.format("ConvolutionBackwardWeights"),
    "op/f32/deconv_bwd_d.json": _BACKWARD.format("ConvTransposeBackwardData"),
    "op/f32/deconv_bwd_w.json": _BACKWARD.format("ConvTransposeBackwardWeights"),
    "op/f32/hardsigmoid_bwd.json": _BACKWARD.format("HardSigmoidBackward"),
    "op/f32/interpolate_bwd.json": _BACKWARD.format("InterpolateBackward"),
    "op/f32/interpolate_bwd_2d.json": _BACKWARD.format("InterpolateBackward"),
    "op/f32/lnorm_3d_bwd.json": _BACKWARD.format("LayerNormBackward"),
    "op/f32/lnorm_bwd.json": _BACKWARD.format("LayerNormBackward"),
    "op/f32/logsoftmax_bwd.json": _BACKWARD.format("LogSoftmaxBackward"),
    "op/f32/prelu_bwd.json": _BACKWARD.format("PReLUBackward"),
    "op/f32/prelu_bwd_dw_5d.json": _BACKWARD.format("PReLUBackward"),
    "op/f32/relu_bwd.json": _BACKWARD.format("ReLUBackward"),
    "op/f32/softmax_bwd.json": _BACKWARD.format("SoftMaxBackward"),
    "op/f32/softmax_bwd_d_3d.json": _BACKWARD.format("SoftMaxBackward"),
    "pattern/f32/bn_bwd_relu_bwd_fusion.json": _BACKWARD.format("ReLUBackward"),
    "pattern/f32/avgpool_3d_chain_fusion.json":
        "AvgPool with a negative pads_end (oneDNN allows it) is rejected at add_op (issue 15)",
}

#: file -> why it does not give the one partition oneDNN gives
NOT_ONE_PARTITION: dict[str, str] = {
}


def rel(path: Path) -> str:
    """A file's name in the tables: its path under ``onednn-graphs/``."""
    return str(Path(path).relative_to(ROOT))


def params(paths=None, *, partitions: bool = False) -> list:
    """``pytest.param`` per file with a strict xfail mark where it cannot pass yet.

    Args:
        partitions: the test checks oneDNN's partition count, so the
            ``NOT_ONE_PARTITION`` files are expected to fail too.
    """
    out = []
    for path in FILES if paths is None else paths:
        name = rel(path)
        reason = NOT_LOADABLE.get(name) or (NOT_ONE_PARTITION.get(name) if partitions else None)
        marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
        out.append(pytest.param(path, id=name, marks=marks))
    return out

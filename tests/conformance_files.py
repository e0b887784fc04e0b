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

#: file (path under ``onednn-graphs/``) -> what is missing
NOT_LOADABLE: dict[str, str] = {
}

_CNN = "oneDNN forms one partition; the library has no {} pattern yet (issue 15), so it gives {}"

#: file -> why it does not give the one partition oneDNN gives
NOT_ONE_PARTITION: dict[str, str] = {
    "pattern/f32/bn_relu_fusion.json": _CNN.format("BatchNorm + ReLU", 2),
    "pattern/f32/conv_add_swish_relu_fusion.json": _CNN.format("Convolution post-op", 2),
    "pattern/f32/conv_bias_add_fusion.json": _CNN.format("Convolution post-op", 2),
    "pattern/f32/conv_bias_mul_mul_depthwise_bias_swish_fusion_cpu.json":
        _CNN.format("Convolution + depthwise Convolution", 4),
    "pattern/f32/conv_bias_post_ops_fusion.json": _CNN.format("Convolution post-op", 2),
    "pattern/f32/conv_bias_relu_depthwise_bias_relu_fusion_cpu.json":
        _CNN.format("Convolution + depthwise Convolution", 4),
    "pattern/f32/conv_bias_sum_fusion.json": _CNN.format("Convolution post-op", 2),
    "pattern/f32/conv_bias_swish_fusion.json": _CNN.format("Convolution post-op", 2),
    "pattern/f32/conv_depthwise_fusion_cpu.json": _CNN.format("Convolution + depthwise Convolution", 2),
    "pattern/f32/conv_post_ops_fusion.json": _CNN.format("Convolution post-op", 2),
    "pattern/f32/interpolate_post_ops_chain_fusion.json": _CNN.format("Interpolate post-op", 2),
    "pattern/f32/interpolate_post_ops_chain_fusion_2.json": _CNN.format("Interpolate post-op", 2),
    "pattern/f32/interpolate_post_ops_chain_fusion_3.json": _CNN.format("Interpolate post-op", 2),
    "pattern/f32/avgpool_3d_chain_fusion.json": _CNN.format("pooling post-op", 2),
    "pattern/f32/maxpool_chain_fusion.json": _CNN.format("pooling post-op", 2),
    "pattern/f32/maxpool_sum_relu_fusion.json": _CNN.format("pooling post-op", 2),
    "pattern/f32/shuffle_fusion.json": _CNN.format("shuffle (reshape-transpose-reshape)", 3),
    "pattern/f8/f8_conv_add_add_fusion.json": _CNN.format("f8 Convolution", 6),
    "pattern/f8/f8_conv_bias_relu_fusion.json": _CNN.format("f8 Convolution", 5),
    "pattern/f8/f8_conv_fwd.json": _CNN.format("f8 Convolution", 3),
    "pattern/f8/f8_conv_post_ops_int8_add_fusion.json": _CNN.format("f8 Convolution", 6),
    "pattern/int8/int8_avgpool_reshape_fusion.json": _CNN.format("int8 pooling", 4),
    "pattern/int8/int8_avgpool_transpose_fusion.json": _CNN.format("int8 pooling", 4),
    "pattern/int8/int8_bf16_conv_add_relu_mul.json": _CNN.format("int8 Convolution", 6),
    "pattern/int8/int8_bf16_conv_binary_add_fusion.json": _CNN.format("int8 Convolution", 7),
    "pattern/int8/int8_bf16_conv_binary_add_fusion_2.json": _CNN.format("int8 Convolution", 6),
    "pattern/int8/int8_bf16_gnorm_relu_fusion.json": _CNN.format("GroupNorm + Quantize", 3),
    "pattern/int8/int8_bnorm_relu_fusion.json": _CNN.format("int8 BatchNorm", 4),
    "pattern/int8/int8_concat_fusion.json": _CNN.format("int8 Concat", 4),
    "pattern/int8/int8_conv_2d_fusion.json": _CNN.format("int8 Convolution", 3),
    "pattern/int8/int8_conv_2d_fusion_2.json": _CNN.format("int8 Convolution", 4),
    "pattern/int8/int8_conv_2d_fwd_i_fusion.json": _CNN.format("int8 Convolution", 4),
    "pattern/int8/int8_conv_add_mul_fusion.json": _CNN.format("int8 Convolution", 6),
    "pattern/int8/int8_conv_bias_fusion.json": _CNN.format("int8 Convolution", 7),
    "pattern/int8/int8_conv_bias_mish_fusion.json": _CNN.format("int8 Convolution", 5),
    "pattern/int8/int8_conv_bias_relu_fusion_2.json": _CNN.format("int8 Convolution", 5),
    "pattern/int8/int8_conv_bias_relu_fusion_3.json": _CNN.format("int8 Convolution", 5),
    "pattern/int8/int8_conv_post_ops_fusion.json": _CNN.format("int8 Convolution", 6),
    "pattern/int8/int8_conv_relu_fusion.json": _CNN.format("int8 Convolution", 4),
    "pattern/int8/int8_convtranspose_post_ops_add_fusion.json": _CNN.format("int8 ConvTranspose", 6),
    "pattern/int8/int8_convtranspose_post_ops_chain_fusion.json": _CNN.format("int8 ConvTranspose", 6),
    "pattern/int8/int8_convtranspose_post_ops_square_fusion.json": _CNN.format("int8 ConvTranspose", 5),
    "pattern/int8/int8_convtranspose_post_ops_sum_fusion.json": _CNN.format("int8 ConvTranspose", 6),
    "pattern/int8/int8_convtranspose_post_ops_sum_fusion_2.json": _CNN.format("int8 ConvTranspose", 6),
    "pattern/int8/int8_lnorm_tc_multiply_quantize.json": _CNN.format("LayerNorm + TypeCast + Quantize", 3),
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

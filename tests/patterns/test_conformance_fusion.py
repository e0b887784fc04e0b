"""The oneDNN conformance graphs partition as benchdnn expects: one supported
partition per file, and for the fusion files the pattern oneDNN would use.

Partitioning only (no execution; ``tests/test_conformance.py`` runs them).
"""
import pytest

import graph_api as ga

from ..conformance_files import FILES, ROOT, params, rel

#: pattern expected for the multi-op files, by file name prefix (first match wins)
EXPECTED = [
    ("complex_fusion/bmb/", "binary_matmul_binary"),
    ("complex_fusion/mlp/", "gated_mlp"),
    ("complex_fusion/mha/sdpa-compressed-", "sdpa_compressed"),
    ("complex_fusion/mha/MHA-bert_large-inf-int8", "sdpa_quantized"),
    ("complex_fusion/mha/sdpa-fp8", "sdpa_quantized"),
    ("complex_fusion/mha/JAX-MHA", "sdpa_jax"),
    ("complex_fusion/mha/JAX-MQA", "mqa_jax"),
    ("complex_fusion/mha/gqa-plain-training-b", "sdpa_backward"),
    ("complex_fusion/mha/sdpa-plain-training-backward", "sdpa_backward"),
    ("complex_fusion/mha/hf-sdpa-bwd", "sdpa_backward"),
    ("complex_fusion/mha/timms-sdpa-bwd", "sdpa_backward"),
    ("complex_fusion/mha/torchbench-sdpa-bwd", "sdpa_backward"),
    ("complex_fusion/mha/", "sdpa"),
    ("pattern/f32/bn_bwd_relu_bwd", "batchnorm_bwd_relu_bwd"),
    ("pattern/f32/binary_", "binary_post_ops"),
    ("pattern/f32/matmul_dropout", "matmul_dropout"),
    ("pattern/f32/reciprocal", "reciprocal_multiply"),
    ("pattern/f32/softmax", "softmax_post_ops"),
    ("pattern/f32/lnorm", "layernorm_post_ops"),
    ("pattern/f32/reduction_", "reduction_post_ops"),
    ("pattern/f32/unary_", "eltwise_post_ops"),
    ("pattern/int8/int8_softmax", "softmax_post_ops"),
    ("pattern/int8/int8_lnorm", "layernorm_post_ops"),
    ("pattern/int8/int8_reorder", "x8_reorder"),
    ("pattern/f32/bn_relu", "bn_relu"),
    ("pattern/f32/conv_bias_mul_mul_depthwise", "conv_depthwise"),
    ("pattern/f32/conv_bias_relu_depthwise", "conv_depthwise"),
    ("pattern/f32/conv_depthwise", "conv_depthwise"),
    ("pattern/f32/conv_", "conv_post_ops"),
    ("pattern/f32/interpolate_", "interpolate_post_ops"),
    ("pattern/f32/maxpool_", "pool_post_ops"),
    ("pattern/f32/avgpool_", "pool_post_ops"),
    ("pattern/f32/shuffle", "shuffle"),
    ("pattern/f8/f8_conv", "conv_quantized"),
    ("pattern/int8/int8_avgpool", "pool_quantized"),
    ("pattern/int8/int8_bf16_conv", "conv_quantized"),
    ("pattern/int8/int8_bf16_gnorm", "groupnorm_post_ops"),
    ("pattern/int8/int8_bnorm", "bn_quantized"),
    ("pattern/int8/int8_concat", "concat_quantized"),
    ("pattern/int8/int8_conv", "conv_quantized"),
    ("pattern/int8/", "matmul_quantized"),
    ("pattern/f8/", "matmul_quantized"),
    ("pattern/", "matmul_post_ops"),
]


def _expected(rel: str) -> str:
    return next(pattern for prefix, pattern in EXPECTED if rel.startswith(prefix))


def _load(path):
    graph = ga.load(path)
    if not graph.is_finalized():
        graph.finalize()
    return graph


def test_the_conformance_folder_is_there():
    assert len(FILES) >= 100


@pytest.mark.parametrize("path", params(partitions=True))
def test_one_supported_partition_per_file(path):
    graph = _load(path)
    parts = graph.get_partitions()
    assert len(parts) == 1, [repr(p) for p in parts]
    assert parts[0].is_supported()
    if len(graph.ops) > 1:
        assert parts[0].get_kind() == _expected(rel(path))


@pytest.mark.parametrize("name", ["complex_fusion/mha/sdpa-compressed-kv-int4-gs32.json",
                                  "complex_fusion/mlp/gated-mlp-int4.json"])
def test_int4_files_bind_their_dequantizers(name):
    graph = _load(ROOT / name)
    bindings = graph.get_partitions()[0].fusion.bindings
    dequant = [v for k, v in bindings.items() if k.endswith("dequant")]
    assert dequant and all(graph.ops[v].kind == ga.OpKind.DynamicDequantize for v in dequant)


def test_debug_policy_on_a_fusion_file_gives_one_partition_per_op():
    graph = _load(ROOT / "complex_fusion/mha/sdpa-plain-simplified-f32.json")
    assert len(graph.get_partitions(ga.PartitionPolicy.debug)) == len(graph.ops) == 5

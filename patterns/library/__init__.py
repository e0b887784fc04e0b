"""The pattern library: ``PATTERNS``, every fusion pattern, highest priority first.

Priorities mirror oneDNN's dnnl-backend passes (facts §3.1); patterns that
oneDNN spreads over several passes are one pattern here with optional nodes.

=====  ======================  =============================================
prio   pattern                 oneDNN passes
=====  ======================  =============================================
30.0   composite               (extension: a Composite op with a fast kernel)
25.0   grouped_matmul          grouped_matmul (branch gmm-poc; a Group: the whole graph as
                               unconnected experts, extended to compressed and gated ones)
22.1   gated_mlp               quantized_gated_mlp(_v1), gated_mlp(_v1)
22.0   sdpa_quantized          x8_sdpa, int8_bf16_sdp, int8_*_gpt_sdp
22.0   sdpa_compressed         sdp_with_compressed_{k,v,kv}
21.1   sdpa_gqa                float_gqa
21.0   sdpa_backward           float_sdp_backward, float_gqa_backward
21.0   sdpa                    float_sdp, gemma, float/bf16 GPT sdp
21.0   sdpa_jax, mqa_jax       float_sdp_jax, float_mqa_jax
19.5   binary_matmul_binary    float_bmb
10.6   conv_quantized          x8x8x8_conv_add_post_ops_cpu, x8x8x_conv_post_ops,
                               x8s8x_tc_conv_(add_)post_ops, int8_convtranspose_post_ops (10.5)
10.5   matmul_quantized        x8x8x(8)_(tc_)matmul_(add_)post_ops
10.4   convtranspose_post_ops  convtranspose_post_ops_fusion
10.3   conv_depthwise          fp_conv_postops_depthwise_postops_cpu
10.3   matmul_compressed       (extension: weight-compressed MatMul)
10.1   pool_quantized          x8_pool_add_post_ops_cpu, x8_pool_post_ops (10.0), x8_pool_reshape_transpose (10.0)
10.0   x8_reorder              x8_reorder(_sum)
 9.9   pool_post_ops           fp_pool_post_ops
 9.8   conv_post_ops           fp_conv_post_ops
 9.0   bn_quantized            x8_bn
 9.1   matmul_transpose        fp_matmul_transpose_reorder, ..._reshape_transpose_reshape
 9.0   matmul_indexing_maps    (extension: transposes folded into MatMul maps, seed 001)
 8.9   matmul_dropout          fp_matmul_dropout
 8.8   matmul_post_ops         fp_matmul_post_ops
 8.8   sparse_matmul_post_ops  (extension: SpMM with a sparse operand + post-ops, seed 003)
 8.8   batchnorm_bwd_relu_bwd  fp_bnorm_bwd_relu_bwd
 8.8   bn_relu                 fp_bn_relu
 8.4   reduction_post_ops      fp_reduction_post_ops
 8.4   interpolate_post_ops, groupnorm_post_ops
 8.3   binary_post_ops         fp_binary_post_ops
 8.2   softmax_post_ops, layernorm_post_ops, reciprocal_multiply, eltwise_post_ops,
       shuffle, concat_quantized (int8_concat_fusion)
 8.1   typecast_quantize, reorder_sum
=====  ======================  =============================================

Ops no pattern takes are single-op partitions (oneDNN's priority-8 passes).
"""
from __future__ import annotations

from .cnn import (BN_QUANTIZED, BN_RELU, CONCAT_QUANTIZED, CONV_DEPTHWISE, CONV_POST_OPS,
                  CONV_QUANTIZED, CONVTRANSPOSE_POST_OPS, GROUPNORM_POST_OPS, INTERPOLATE_POST_OPS,
                  POOL_POST_OPS, POOL_QUANTIZED, SHUFFLE)
from .cnn_backward import BATCHNORM_BWD_RELU_BWD
from .composite import COMPOSITE
from .dot_maps import MATMUL_INDEXING_MAPS
from .matmul import (BINARY_MATMUL_BINARY, MATMUL_COMPRESSED, MATMUL_DROPOUT, MATMUL_POST_OPS,
                     MATMUL_QUANTIZED, MATMUL_TRANSPOSE)
from .misc import (BINARY_POST_OPS, ELTWISE_POST_OPS, LAYERNORM_POST_OPS, RECIPROCAL_MULTIPLY,
                   REDUCTION_POST_OPS, REORDER_SUM, SOFTMAX_POST_OPS, TYPECAST_QUANTIZE, X8_REORDER)
from .mlp import GATED_MLP
from .moe import GROUPED_MATMUL
from .sparse import SPARSE_MATMUL_POST_OPS
from .sdpa import (MQA_JAX, SDPA, SDPA_BACKWARD, SDPA_COMPRESSED, SDPA_GQA, SDPA_JAX,
                   SDPA_QUANTIZED)

#: every pattern, highest priority first (ties keep the order written here)
PATTERNS = [
    COMPOSITE,
    GROUPED_MATMUL,
    GATED_MLP,
    SDPA_QUANTIZED, SDPA_COMPRESSED,
    SDPA_GQA,
    SDPA_BACKWARD, SDPA, SDPA_JAX, MQA_JAX,
    BINARY_MATMUL_BINARY,
    CONV_QUANTIZED,
    MATMUL_QUANTIZED,
    CONVTRANSPOSE_POST_OPS,
    CONV_DEPTHWISE,
    MATMUL_COMPRESSED,
    POOL_QUANTIZED,
    X8_REORDER,
    POOL_POST_OPS,
    CONV_POST_OPS,
    MATMUL_TRANSPOSE,
    MATMUL_INDEXING_MAPS,
    BN_QUANTIZED,
    MATMUL_DROPOUT,
    MATMUL_POST_OPS, BATCHNORM_BWD_RELU_BWD, BN_RELU, SPARSE_MATMUL_POST_OPS,
    REDUCTION_POST_OPS, INTERPOLATE_POST_OPS, GROUPNORM_POST_OPS,
    BINARY_POST_OPS,
    SOFTMAX_POST_OPS, LAYERNORM_POST_OPS, RECIPROCAL_MULTIPLY, ELTWISE_POST_OPS, SHUFFLE,
    CONCAT_QUANTIZED,
    TYPECAST_QUANTIZE, REORDER_SUM,
]

assert all(a.priority >= b.priority for a, b in zip(PATTERNS, PATTERNS[1:])), \
    "PATTERNS must be sorted by priority"
assert len({p.name for p in PATTERNS}) == len(PATTERNS), "pattern names must be unique"

BY_NAME = {p.name: p for p in PATTERNS}

"""Every library pattern: matched on its canonical graph, not matched when a
condition breaks, and the fused run equals the single-op (debug) run."""
import pytest

import graph_api as ga
from graph_api.config import settings
from graph_api.patterns.library import BY_NAME, PATTERNS

from . import graphs as gr
from .builder import K, assert_same_as_debug, dt, kinds, the_fusion

#: (test id, pattern, factory); every op of the graph must land in that pattern
CANONICAL = [
    # ---- weight-compressed MatMul (extension) ----
    ("wc-s4-group-zp-relu", "matmul_compressed", lambda: gr.compressed_matmul()),
    ("wc-u4-group-no-zp", "matmul_compressed", lambda: gr.compressed_matmul(wdt=dt.u4, zps=False)),
    ("wc-s8-channel-transpose-bias", "matmul_compressed",
     lambda: gr.compressed_matmul(wdt=dt.s8, qtype="per_channel", transpose_b=True, bias=True)),
    ("wc-u8-tensor", "matmul_compressed", lambda: gr.compressed_matmul(wdt=dt.u8, qtype="per_tensor")),
    ("wc-post-ops", "matmul_compressed", lambda: gr.compressed_matmul(
        post=("add", "multiply", "divide", "subtract", "relu", "gelu", "swish", "tanh", "clamp"))),
    ("wc-rfc-int4-three-ops", "matmul_compressed",
     lambda: gr.compressed_matmul(post=(), quant_out="dynamic_s4")),
    ("wc-static-int8-weights", "matmul_compressed",
     lambda: gr.compressed_matmul(static=True, wdt=dt.s8, quant_out="static")),
    ("wc-dequantized-activation", "matmul_compressed",
     lambda: gr.compressed_matmul(src_dequant=True, quant_out="cast")),
    ("wc-typecast-to-bf16", "matmul_compressed",
     lambda: gr.compressed_matmul(wei_cast=dt.bf16, quant_out="dynamic_s4")),
    ("wc-f16-select", "matmul_compressed",
     lambda: gr.compressed_matmul(act_dtype=dt.f16, post=("select",), fpmath="f16", apply_to_int=True)),
    # ---- SDPA ----
    ("sdpa-f32-div-add", "sdpa", lambda: gr.sdpa()),
    ("sdpa-bf16-mul-host-scalar-stats", "sdpa",
     lambda: gr.sdpa(dtype=dt.bf16, scale="mul", scale_host=True, stats=True)),
    ("sdpa-f16-no-scale-no-mask", "sdpa", lambda: gr.sdpa(dtype=dt.f16, scale=None, mask=None)),
    ("sdpa-select-mask-transpose-reshape", "sdpa", lambda: gr.sdpa(mask="select", out="reshape")),
    ("sdpa-causal-top-left", "sdpa", lambda: gr.sdpa(mask="causal", scale="mul")),
    ("sdpa-causal-bottom-right", "sdpa", lambda: gr.sdpa(mask="causal_br")),
    ("sdpa-gemma-softcap", "sdpa",
     lambda: gr.sdpa(dtype=dt.bf16, scale="mul", softcap=True, mask="select")),
    ("sdpa-dropout-typecast", "sdpa", lambda: gr.sdpa(dtype=dt.bf16, dropout=True)),
    ("sdpa-gpt-select-before-scale", "sdpa", lambda: gr.sdpa(pre_select=True, out="reorder")),
    ("sdpa-training-forward-stats", "sdpa", lambda: gr.sdpa(dtype=dt.bf16, stats=True, dropout=True)),
    ("sdpa-compressed-k-s4", "sdpa_compressed", lambda: gr.sdpa(dtype=dt.f16, k_dequant=dt.s4)),
    ("sdpa-compressed-v-u8", "sdpa_compressed", lambda: gr.sdpa(dtype=dt.f16, v_dequant=dt.u8)),
    ("sdpa-compressed-kv-u4-s8-cast", "sdpa_compressed",
     lambda: gr.sdpa(dtype=dt.f16, k_dequant=dt.u4, v_dequant=dt.s8, kv_cast=True)),
    ("sdpa-int8", "sdpa_quantized", lambda: gr.sdpa_quantized()),
    ("sdpa-int8-bf16", "sdpa_quantized", lambda: gr.sdpa_quantized(bf16=True)),
    ("sdpa-fp8-gpt", "sdpa_quantized", lambda: gr.sdpa_quantized(gpt=True, q_dt=dt.f8_e4m3)),
    ("sdpa-int8-f32-out", "sdpa_quantized", lambda: gr.sdpa_quantized(final_quant=False)),
    ("sdpa-jax-mha", "sdpa_jax", lambda: gr.jax_mha()),
    ("sdpa-jax-mqa", "mqa_jax", lambda: gr.jax_mqa()),
    ("gqa-reshape", "sdpa_gqa", lambda: gr.gqa()),
    ("gqa-reshape-no-mask", "sdpa_gqa", lambda: gr.gqa(mask=False)),
    ("sdpa-backward-f32", "sdpa_backward", lambda: gr.backward()),
    ("sdpa-backward-bf16-gqa-dropout-dmask", "sdpa_backward",
     lambda: gr.backward(dtype=dt.bf16, gqa_=True, dropout=True, dmask=True)),
    # ---- Composite op with a fast kernel (extension) ----
    ("composite-rms-norm", "composite", lambda: gr.composite()),
    ("composite-tanh", "composite", lambda: gr.composite("tanh")),
    # ---- gated MLP ----
    ("mlp-swish-f32", "gated_mlp", lambda: gr.gated_mlp()),
    ("mlp-gelu-f16-cast", "gated_mlp", lambda: gr.gated_mlp(dtype=dt.f16, act="gelu")),
    ("mlp-int4-weights", "gated_mlp", lambda: gr.gated_mlp(dtype=dt.f16, weights=dt.u4)),
    ("mlp-int8-weights", "gated_mlp", lambda: gr.gated_mlp(weights=dt.s8)),
    ("mlp-no-activation", "gated_mlp", lambda: gr.gated_mlp(act=None)),
    # ---- MatMul ----
    ("mm-bias-20-post-ops-select-cast", "matmul_post_ops", lambda: gr.matmul_chain(
        bias="op", out_cast=dt.bf16,
        post=("relu", "add", "swish", "tanh", "clamp", "multiply", "sigmoid", "divide", "subtract",
              "maximum", "minimum", "exp", "abs", "elu", "gelu", "add", "relu", "multiply", "tanh",
              "select"))),
    ("mm-bias-input-relu", "matmul_post_ops", lambda: gr.matmul_chain(bias="input")),
    ("mm-transpose-reorder", "matmul_transpose", lambda: gr.matmul_chain(post=(), tail="transpose_reorder")),
    ("mm-reshape-transpose-reshape", "matmul_transpose",
     lambda: gr.matmul_chain(post=(), bias="op", tail="reshape_transpose_reshape")),
    ("mm-dropout", "matmul_dropout", lambda: gr.matmul_chain(post=(), tail="dropout")),
    ("sparse-mm-bias-relu-add", "sparse_matmul_post_ops", lambda: gr.sparse_matmul(post=("relu", "add"))),
    ("sparse-2of4-mm-bias-swish", "sparse_matmul_post_ops", lambda: gr.sparse_matmul("2:4", post=("swish",))),
    ("int8-mm-relu", "matmul_quantized", lambda: gr.quantized_matmul()),
    ("int8-mm-residual", "matmul_quantized", lambda: gr.quantized_matmul(residual=True, post=("multiply",))),
    ("int8-bf16-mm-residual-smoothquant", "matmul_quantized",
     lambda: gr.quantized_matmul(bf16=True, residual=True, smooth=True)),
    ("int8-mm-quantized-f32-weights", "matmul_quantized",
     lambda: gr.quantized_matmul(wei_quant=True, quant_out=False, bias=False)),
    ("mm-folded-transpose-relu", "matmul_indexing_maps", lambda: gr.folded_transpose()),
    ("mm-folded-reshape-transpose", "matmul_indexing_maps",
     lambda: gr.folded_transpose(reshape_a=True, post=("add",))),
    ("brmm-folded-transpose", "matmul_indexing_maps", lambda: gr.folded_transpose(batch_reduce=True)),
    ("bmb-f32", "binary_matmul_binary", lambda: gr.bmb()),
    ("bmb-bf16", "binary_matmul_binary", lambda: gr.bmb(bf16=True, n_pre=10, n_post=10)),
    # ---- small fusions ----
    ("binary-post-ops", "binary_post_ops", lambda: gr.small("add", ("relu", "multiply", "swish"))),
    ("binary-max-sum", "binary_post_ops", lambda: gr.small("maximum", ("add",))),
    ("eltwise-post-ops", "eltwise_post_ops", lambda: gr.small("relu", ("tanh", "add"))),
    ("reciprocal-multiply", "reciprocal_multiply", lambda: gr.small("reciprocal", ("multiply",))),
    ("softmax-post-ops-quantize", "softmax_post_ops",
     lambda: gr.small("softmax", ("add",), ("quantize",))),
    ("softmax-cast", "softmax_post_ops", lambda: gr.small("softmax", ("exp",), ("cast",))),
    ("layernorm-post-ops", "layernorm_post_ops", lambda: gr.small("layernorm", ("relu", "add"))),
    ("reduction-post-ops", "reduction_post_ops", lambda: gr.small("reduce", ("sigmoid",))),
    ("typecast-quantize", "typecast_quantize",
     lambda: gr.small("typecast", (), ("quantize",), dtype=dt.bf16)),
    ("x8-reorder", "x8_reorder", lambda: gr.small("x8_reorder", (), ("quantize",), dtype=dt.s8)),
    ("reorder-sum", "reorder_sum", lambda: gr.small("reorder", ("add",))),
    # ---- grouped MatMul / mixture of experts (a Group: the whole graph) ----
    ("moe-f32-experts", "grouped_matmul", lambda: gr.grouped_matmul()),
    ("moe-s4-experts", "grouped_matmul", lambda: gr.grouped_matmul(weights=dt.s4)),
    ("moe-u8-gated-experts", "grouped_matmul", lambda: gr.grouped_matmul("gated", weights=dt.u8)),
    ("moe-f32-gated-experts", "grouped_matmul", lambda: gr.grouped_matmul("gated", ms=(2, 4))),
    # ---- CNN training ----
    ("bn-bwd-relu-bwd-ncx", "batchnorm_bwd_relu_bwd", lambda: gr.bn_bwd_relu_bwd()),
    ("bn-bwd-relu-bwd-nxc-no-gamma", "batchnorm_bwd_relu_bwd",
     lambda: gr.bn_bwd_relu_bwd(data_format="NXC", gamma=False, use_dst=True)),
]


@pytest.mark.parametrize("pattern,factory", [pytest.param(p, f, id=i) for i, p, f in CANONICAL])
def test_canonical_graph_is_one_fused_partition(pattern, factory):
    graph = factory()
    part = the_fusion(graph)
    assert part.pattern_name == pattern
    assert part.get_ops_num() == len(graph.ops), graph.get_partitions()
    assert len(graph.get_partitions()) == 1


@pytest.fixture
def reference_plans_only(monkeypatch):
    """Every partition runs the composed reference plan (no fast kernels)."""
    from graph_api.config import settings

    monkeypatch.setattr(settings, "reference", True)


@pytest.mark.parametrize("factory", [pytest.param(f, id=i) for i, _, f in CANONICAL])
def test_fused_run_equals_the_debug_policy_bit_for_bit(factory, reference_plans_only):
    assert_same_as_debug(factory())


@pytest.mark.parametrize("factory", [pytest.param(f, id=i) for i, p, f in CANONICAL
                                     if p in ("matmul_compressed", "sdpa", "sdpa_compressed")])
def test_fused_run_with_the_registered_kernels_matches_the_debug_policy(factory):
    assert_same_as_debug(factory(), exact=False)


def test_every_pattern_has_a_canonical_graph_and_a_diagram():
    from .test_cnn_patterns import CNN_CANONICAL

    covered = {p for _, p, _ in CANONICAL} | {p for _, p, _ in CNN_CANONICAL}
    assert covered == set(BY_NAME)
    for pattern in PATTERNS:
        assert "Roles:" in pattern.doc and ("─" in pattern.doc or "->" in pattern.doc), pattern.name


# ------------------------------------------------------------------ broken conditions
#: (id, factory, pattern that must not form, the op (role name in the factory) and
#: a phrase of the explanation for it)
BROKEN = [
    ("sdpa-softmax-used-outside", lambda: gr.sdpa(leak="softmax"), "sdpa", "softmax", "outside the match"),
    ("sdpa-scores-used-outside", lambda: gr.sdpa(leak="qk"), "sdpa", "qk", "outside the match"),
    ("sdpa-softmax-not-last-axis", lambda: gr.sdpa(softmax_axis=2), "sdpa", "softmax", "axis is the last dim"),
    ("sdpa-causal-row-axis", lambda: gr.sdpa(mask="causal", causal_axis=-1), "sdpa", "row", None),
    ("sdpa-compressed-k-used-outside", lambda: gr.sdpa(dtype=dt.f16, k_dequant=dt.s4, leak="qk"),
     "sdpa_compressed", "qk", "outside the match"),
    ("sdpa-int8-softmax-used-outside", lambda: gr.sdpa_quantized(leak="softmax"), "sdpa_quantized",
     "softmax", "outside the match"),
    ("gqa-without-scale", lambda: gr.gqa(scale=False), "sdpa_gqa", "qk", None),
    ("gqa-scores-used-outside", lambda: gr.gqa(leak="qk"), "sdpa_gqa", "qk", "outside the match"),
    ("mlp-gate-used-outside", lambda: gr.gated_mlp(leak="gate"), "gated_mlp", "gate", "outside the match"),
    ("mlp-two-sources", lambda: gr.gated_mlp(src_shared=False), "gated_mlp", "up", "must be one tensor"),
    ("wc-weights-used-outside", lambda: gr.compressed_matmul(leak="wei_dequant"), "matmul_compressed",
     "wei_dequant", "outside the match"),
    ("int8-src-used-outside", lambda: gr.quantized_matmul(leak="src_dequant"), "matmul_quantized",
     "src_dequant", "outside the match"),
    ("jax-softmax-used-outside", lambda: gr.jax_mha(leak="softmax"), "sdpa_jax", "softmax",
     "outside the match"),
    ("jax-mqa-softmax-used-outside", lambda: gr.jax_mqa(leak="softmax"), "mqa_jax", "softmax",
     "outside the match"),
    ("bmb-bf16-binary-output", lambda: _bmb_bf16_out(), "binary_matmul_binary",
     "pre0", "output 0 is f32"),
    ("backward-dq-transposed", lambda: gr.backward(dq_transpose_a=True), "sdpa_backward",
     "dq", "transpose_a is False"),
    ("backward-exp-used-outside", lambda: gr.backward(leak="exp"), "sdpa_backward", "exp",
     "outside the match"),
    ("x8-reorder-f8", lambda: gr.small("x8_reorder", (), ("quantize",), dtype=dt.f8_e4m3), "x8_reorder",
     "first", "input 0 is s8/u8"),
    ("layernorm-used-outside", lambda: gr.small("layernorm", ("relu",), leak="first"),
     "layernorm_post_ops", "first", "outside the match"),
]


@pytest.mark.parametrize("factory,want", [
    pytest.param(lambda: gr.grouped_matmul(mismatch="k"), ["single op"] * 3, id="experts-differ-in-k"),
    pytest.param(lambda: gr.grouped_matmul(connect=True, n=16), ["single op"] * 3, id="experts-connected"),
    pytest.param(lambda: gr.grouped_matmul(extra=K.ReLU), ["matmul_post_ops", "single op", "single op"],
                 id="not-the-whole-graph"),
    pytest.param(lambda: gr.grouped_matmul(ms=(4,)), ["single op"], id="one-expert"),
    pytest.param(lambda: gr.grouped_matmul("gated", ms=(2,)), ["gated_mlp"], id="one-gated-expert"),
])
def test_grouped_matmul_forms_only_from_the_whole_graph_of_agreeing_experts(factory, want):
    assert sorted(kinds(factory())) == sorted(want)


def test_grouped_matmul_bindings_list_the_experts_in_order():
    graph = gr.grouped_matmul("gated", weights=dt.s4, ms=(1, 2))
    (part,) = graph.get_partitions()
    b = part.fusion.bindings
    assert b["template"] == "gated_mlp" and len(b["experts"]) == 2
    assert [e["down_matmul"] for e in b["experts"]] == sorted(e["down_matmul"] for e in b["experts"])
    assert all(e["gate_wei_dequant"] is not None for e in b["experts"])


def _bmb_bf16_out():
    """bmb with bf16-output binaries: oneDNN's float_bmb wants f32 binary outputs."""
    g = gr.G()
    shape = (1, 2, 4, 4)
    x = g.op(K.Multiply, g.input(shape, dt.bf16), g.input(shape, dt.bf16), name="pre0")
    y = g.op(K.MatMul, x, g.input(shape, dt.bf16), dtype=dt.f32, name="matmul")
    g.op(K.Add, y, g.input(shape))
    return g.done()


@pytest.mark.parametrize("factory,pattern,role,phrase",
                         [pytest.param(f, p, r, w, id=i) for i, f, p, r, w in BROKEN])
def test_broken_graph_does_not_form_the_pattern_and_explains_why(factory, pattern, role, phrase):
    graph = factory()
    assert pattern not in kinds(graph)
    op_id = next(i for i, op in graph.ops.items() if op.name == role)
    found = graph.explain_partitions()
    if phrase is not None:  # the op's own explanation, or any if a smaller fusion took it
        text = str(found[op_id]) if op_id in found else str(found)
        assert phrase in text, text


# ------------------------------------------------------------------ specific behaviour
def test_sdpa_bindings_name_the_roles():
    graph = gr.sdpa(mask="causal_br", out="reshape")
    b = the_fusion(graph).fusion.bindings
    assert graph.ops[b["qk_matmul"]].kind == K.MatMul and graph.ops[b["pv_matmul"]].kind == K.MatMul
    assert graph.ops[b["causal_select"]].kind == K.Select and b["mask_add"] is None
    assert graph.ops[b["causal_add"]].kind == K.Add and graph.ops[b["causal_sub"]].kind == K.Subtract
    assert graph.ops[b["out_reshape"]].kind == K.StaticReshape and b["dropout"] is None


def test_compressed_sdpa_bindings_and_float_sdpa_does_not_take_dequantizers():
    graph = gr.sdpa(dtype=dt.f16, k_dequant=dt.s4, v_dequant=dt.u4)
    b = the_fusion(graph).fusion.bindings
    assert graph.ops[b["k_dequant"]].kind == K.DynamicDequantize
    assert graph.ops[b["v_dequant"]].kind == K.DynamicDequantize
    assert b["k_cast"] is None and b["v_cast"] is None


def test_matmul_post_op_bindings_are_in_execution_order():
    graph = gr.matmul_chain(bias="op", post=("relu", "swish", "add"), out_cast=dt.bf16)
    b = the_fusion(graph).fusion.bindings
    post = [graph.ops[i].kind for i in b["post_ops"]]
    assert post == [K.ReLU, K.Sigmoid, K.Multiply, K.Add]
    assert graph.ops[b["bias"]].kind == K.BiasAdd and graph.ops[b["out_cast"]].kind == K.TypeCast


def test_more_than_20_post_ops_leave_the_rest_to_another_partition():
    graph = gr.matmul_chain(post=("relu",) * 23)
    assert kinds(graph) == ["matmul_post_ops", "eltwise_post_ops"]
    assert [p.get_ops_num() for p in graph.get_partitions()] == [21, 3]


def test_patterns_whose_required_ops_are_absent_are_not_searched(monkeypatch):
    # the conv_quantized search over a 20-op MatMul post-op chain backtracked for
    # ~100 s before failing; a pattern needing a Convolution must not even start
    from graph_api.patterns import partitioner

    searched = set()
    real = partitioner.iter_matches

    def spy(graph, pattern, anchor, *args, **kwargs):
        searched.add(pattern.name)
        return real(graph, pattern, anchor, *args, **kwargs)

    monkeypatch.setattr(partitioner, "iter_matches", spy)
    graph = gr.matmul_chain(post=("relu", "add", "swish") + ("tanh", "multiply", "abs") * 5)
    assert kinds(graph) == ["matmul_post_ops"]
    assert "matmul_post_ops" in searched
    assert not searched & {"conv_quantized", "conv_post_ops", "sdpa", "pool_post_ops"}


def test_mlp_bindings_tell_gate_from_up():
    graph = gr.gated_mlp(weights=dt.s4)
    b = the_fusion(graph).fusion.bindings
    gate, up = graph.ops[b["gate_matmul"]], graph.ops[b["up_matmul"]]
    assert [graph.ops[i].kind for i in b["gate_act"]] == [K.Sigmoid, K.Multiply]
    act_in = graph.ops[b["gate_act"][0]].inputs[0].id
    assert act_in == gate.outputs[0].id and up.outputs[0].id != act_in
    assert all(graph.ops[b[f"{r}_wei_dequant"]].kind == K.DynamicDequantize for r in ("gate", "up", "down"))


def test_int8_residual_is_the_sum_not_a_plain_binary_post_op():
    graph = gr.quantized_matmul(residual=True)
    b = the_fusion(graph).fusion.bindings
    assert graph.ops[b["res_add"]].kind == K.Add and graph.ops[b["res_dequant"]].kind == K.Dequantize
    assert [graph.ops[i].kind for i in b["post_ops"]] == [K.ReLU]


def test_dequantize_matmul_without_weights_dequant_is_plain_post_ops():
    graph = gr.matmul_chain(post=("relu",))
    assert kinds(graph) == ["matmul_post_ops"]


def test_a_lone_dynamic_dequantize_matmul_is_the_rfc_extension_not_onednn():
    graph = gr.compressed_matmul(post=())
    assert kinds(graph) == ["matmul_compressed"]


def test_two_compressed_layers_give_two_partitions():
    g = gr.G("bf16", True)
    x = g.input((4, 16))
    for layer in range(2):
        w = g.op(K.DynamicDequantize, g.input((16, 16), dt.u4), g.input((4, 16)), g.input((4, 16), dt.u4),
                 dtype=dt.f32, attrs={"qtype": "per_group", "group_shape": [4, 1], "axis": 0})
        x = g.op(K.GELU, g.op(K.MatMul, x, w))
    graph = g.done()
    parts = graph.get_partitions()
    assert [(p.get_kind(), p.get_ops_num()) for p in parts] == [("matmul_compressed", 3)] * 2
    assert all(p.get_fpmath_mode() == (ga.FPMathMode.bf16, True) for p in parts)
    assert_same_as_debug(graph, exact=False)


def test_explanation_names_the_nearest_pattern_and_failed_condition():
    graph = gr.sdpa(softmax_axis=2)
    found = graph.explain_partitions()
    softmax = next(i for i, op in graph.ops.items() if op.kind == K.SoftMax)
    assert found[softmax].pattern in ("sdpa", "sdpa_compressed")  # same chain, same miss
    assert "axis is the last dim" in found[softmax].reason
    assert "op" in str(found)


def test_explanation_for_an_op_no_pattern_knows():
    g = gr.G()
    g.op(K.LogSoftmax, g.input((2, 2)), attrs={"axis": -1})
    found = g.done().explain_partitions()
    assert "no pattern has a LogSoftmax op" in str(found[0])


def test_verbose_logs_one_line_per_partition(capfd):
    graph = gr.sdpa()
    old = settings.verbose
    settings.verbose = True
    try:
        graph.get_partitions()
    finally:
        settings.verbose = old
    err = capfd.readouterr().err
    assert "graph_api_verbose,partition,partition 0,sdpa,5 ops,MatMul#0;Divide#1" in err


def test_debug_policy_gives_single_op_partitions_only():
    graph = gr.sdpa()
    parts = graph.get_partitions(ga.PartitionPolicy.debug)
    assert [p.get_kind() for p in parts] == ["single op"] * len(graph.ops)

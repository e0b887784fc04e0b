"""The CNN patterns (``patterns/library/cnn.py``): each canonical graph is one
fused partition, the fused run equals the single-op (debug) run, broken
conditions stop the fusion and the explanation says why."""
import pytest

from . import cnn_graphs as cg
from .builder import K, assert_same_as_debug, dt, kinds, the_fusion

#: (test id, pattern, factory); every op of the graph must land in that pattern
CNN_CANONICAL = [
    # ---- float Convolution ----
    ("conv-bias-input-relu", "conv_post_ops", lambda: cg.conv()),
    ("conv-biasadd-bn-chain", "conv_post_ops",
     lambda: cg.conv(bias="op", bn=True, post=("relu", "add", "swish", "multiply", "clamp", "tanh"))),
    ("conv-nxc-xio-strided-dilated", "conv_post_ops",
     lambda: cg.conv(fmt="NXC", wfmt="XIO", stride=2, dilation=2, pad=2, post=("gelu", "maximum"))),
    ("conv-grouped-no-bias-elu", "conv_post_ops", lambda: cg.conv(bias=None, groups=2, post=("elu",))),
    ("conv-bf16-out-cast", "conv_post_ops",
     lambda: cg.conv(dtype=dt.bf16, post=("relu",), out_cast=True)),
    ("conv-bn-only", "conv_post_ops", lambda: cg.conv(bias=None, bn=True, post=())),
    ("conv-1x1-depthwise", "conv_depthwise", lambda: cg.conv_depthwise()),
    ("conv-1x1-depthwise-no-bias", "conv_depthwise",
     lambda: cg.conv_depthwise(bias=False, post=("multiply", "multiply"), dw_post=())),
    ("convtranspose-bias-post-ops", "convtranspose_post_ops", lambda: cg.convtranspose()),
    # ---- quantized Convolution / ConvTranspose ----
    ("int8-conv-per-channel-relu-quant", "conv_quantized", lambda: cg.quantized_conv()),
    ("int8-conv-residual-chain", "conv_quantized",
     lambda: cg.quantized_conv(src_dt=dt.s8, src_zp=0, residual=True, post=("relu", "multiply"))),
    ("int8-conv-nxc-grouped-f32-out", "conv_quantized",
     lambda: cg.quantized_conv(fmt="NXC", groups=2, quant_out=False, post=("mish",))),
    ("int8-conv-1x1-per-tensor", "conv_quantized",
     lambda: cg.quantized_conv(k=1, per_channel=False, bias=False)),
    ("int8-bf16-conv-residual", "conv_quantized",
     lambda: cg.quantized_conv(bf16=True, residual=True, post=("relu",))),
    ("int8-conv-weight-quantize", "conv_quantized", lambda: cg.quantized_conv(wei_quant=True)),
    ("f8-conv-residual", "conv_quantized",
     lambda: cg.quantized_conv(src_dt=dt.f8_e4m3, per_channel=False, residual=True)),
    ("int8-convtranspose-add", "conv_quantized",
     lambda: cg.quantized_conv(kind=K.ConvTranspose, src_dt=dt.s8, src_zp=0, residual=True)),
    # ---- pooling ----
    ("maxpool-post-ops", "pool_post_ops", lambda: cg.pool()),
    ("avgpool-post-ops", "pool_post_ops", lambda: cg.pool(K.AvgPool, post=("multiply", "minimum"))),
    ("int8-avgpool", "pool_quantized", lambda: cg.pool_quantized()),
    ("int8-avgpool-reshape", "pool_quantized", lambda: cg.pool_quantized(layout="reshape")),
    ("int8-maxpool-transpose", "pool_quantized",
     lambda: cg.pool_quantized(K.MaxPool, layout="transpose")),
    ("int8-maxpool-add-relu", "pool_quantized",
     lambda: cg.pool_quantized(K.MaxPool, residual=True, post=("relu",))),
    # ---- normalization ----
    ("bn-inference-relu", "bn_relu", lambda: cg.bn_relu()),
    ("bn-training-relu", "bn_relu", lambda: cg.bn_relu(training=True)),
    ("int8-bn-relu", "bn_quantized", lambda: cg.bn_quantized()),
    ("int8-bn", "bn_quantized", lambda: cg.bn_quantized(relu=False)),
    ("int8-bf16-groupnorm-relu", "groupnorm_post_ops", lambda: cg.groupnorm()),
    ("groupnorm-post-ops", "groupnorm_post_ops",
     lambda: cg.groupnorm(post=("relu", "add"), cast=False, quant=False)),
    # ---- misc ----
    ("interpolate-post-ops", "interpolate_post_ops", lambda: cg.interpolate()),
    ("shuffle", "shuffle", lambda: cg.shuffle()),
    ("int8-concat-3", "concat_quantized", lambda: cg.concat_quantized()),
    ("int8-concat-1", "concat_quantized", lambda: cg.concat_quantized(n=1)),
]

#: the fused partitions a registered fast plan runs (the others run the reference plan)
FAST = {"conv_post_ops", "conv_depthwise", "conv_quantized", "convtranspose_post_ops"}


@pytest.mark.parametrize("pattern,factory", [pytest.param(p, f, id=i) for i, p, f in CNN_CANONICAL])
def test_canonical_graph_is_one_fused_partition(pattern, factory):
    graph = factory()
    part = the_fusion(graph)
    assert part.pattern_name == pattern
    assert part.get_ops_num() == len(graph.ops), graph.get_partitions()
    assert len(graph.get_partitions()) == 1


@pytest.fixture
def reference_plans_only(monkeypatch):
    from graph_api.kernels import registry

    monkeypatch.setattr(registry, "KERNELS", {})


@pytest.mark.parametrize("factory", [pytest.param(f, id=i) for i, _, f in CNN_CANONICAL])
def test_fused_run_equals_the_debug_policy_bit_for_bit(factory, reference_plans_only):
    assert_same_as_debug(factory())


@pytest.mark.parametrize("factory", [pytest.param(f, id=i) for i, p, f in CNN_CANONICAL if p in FAST])
def test_fused_run_with_the_registered_kernels_matches_the_debug_policy(factory):
    # the fast plan sums the convolution in f32 BLAS order: the check rule's
    # scale-aware f32 tolerance (graph_api.check) covers it; int8 outputs may
    # differ by one where the reference lands on a rounding boundary.  The single
    # ops run the reference kernels: the debug policy's lone Convolution would
    # otherwise run the fast plan under test too
    assert_same_as_debug(factory(), exact=False, debug_on_reference=True)


#: patterns on the image-blocked plan: each op's reference kernel image by image
BLOCKED = {"pool_post_ops", "pool_quantized", "bn_relu", "bn_quantized", "groupnorm_post_ops",
           "interpolate_post_ops", "concat_quantized"}


@pytest.mark.parametrize("factory", [pytest.param(f, id=i) for i, p, f in CNN_CANONICAL if p in BLOCKED])
def test_image_blocked_plans_are_bit_identical_to_the_debug_policy(factory):
    import graph_api as ga
    from graph_api.fill import fill_inputs

    graph = factory()
    run = ga.run_graph(graph, fill_inputs(graph, 0))
    plan = run.partitions[0].compiled.plan.name
    # batch statistics (BatchNormForwardTraining) and layout changes that move the
    # batch dim (a flattening reshape, a reversing transpose) mix images: reference plan
    mixes = {K.BatchNormForwardTraining, K.StaticReshape, K.StaticTranspose}
    if any(op.kind in mixes for op in graph.ops.values()):
        # refused by the image-blocked plan: the unfused ops run (per-op fast plans,
        # or the reference where an op has none), never a plan that mixes images wrongly
        assert plan == "reference" or plan.startswith("per_op_fast"), plan
        # each op on its single-op plan, as the debug policy runs it
        assert_same_as_debug(graph, exact=True)
        return
    assert plan == "image_blocked"
    # the image-blocked plan runs the reference kernels image by image
    assert_same_as_debug(graph, exact=True, debug_on_reference=True)


def test_shuffle_is_one_strided_copy_identical_to_the_debug_policy():
    import graph_api as ga
    from graph_api.fill import fill_inputs

    graph = cg.shuffle()
    run = ga.run_graph(graph, fill_inputs(graph, 0))
    assert run.partitions[0].compiled.plan.name == "shuffle_copy"
    assert_same_as_debug(graph, exact=True)


def test_a_transpose_that_moves_the_batch_keeps_the_int8_pool_on_the_reference_plan():
    import graph_api as ga
    from graph_api.fill import fill_inputs

    graph = cg.pool_quantized(layout="transpose")
    run = ga.run_graph(graph, fill_inputs(graph, 0))
    plan = run.partitions[0].compiled.plan.name  # the unfused ops, not the image-blocked plan
    assert plan == "reference" or plan.startswith("per_op_fast"), plan


# ------------------------------------------------------------------ broken conditions
#: (id, factory, pattern that must not take the whole graph, role, explanation phrase)
BROKEN = [
    ("conv-output-used-outside", lambda: cg.conv(leak="conv"), "conv_post_ops", "conv", "outside the match"),
    ("depthwise-5x5", lambda: cg.conv_depthwise(dw_k=5), "conv_depthwise", "dw_conv", None),
    ("depthwise-not-depthwise", lambda: cg.conv_depthwise(dw_groups=2), "conv_depthwise", "dw_conv", None),
    ("f8-conv-with-scales", lambda: cg.quantized_conv(src_dt=dt.f8_e4m3, per_channel=False, f8_scaled=True),
     "conv_quantized", "conv", None),
    ("int8-src-used-outside", lambda: cg.quantized_conv(leak="src_dequant"), "conv_quantized",
     "src_dequant", "outside the match"),
    ("avgpool-ceil-counting-padding", lambda: cg.pool(K.AvgPool, ceil=True), "pool_post_ops", "pool",
     "ceil rounding"),
    ("int8-bn-u8", lambda: cg.bn_quantized(src_dt=dt.u8), "bn_quantized", "src_dequant", "input 0 is s8"),
    ("int8-bn-zero-point", lambda: cg.bn_quantized(zp=2), "bn_quantized", "src_dequant", "zero points are 0"),
    ("bn-output-used-outside", lambda: cg.bn_relu(leak="bn"), "bn_relu", "bn", "outside the match"),
    ("interpolate-align-corners", lambda: cg.interpolate(mode="align_corners"), "interpolate_post_ops",
     "interpolate", "half_pixel"),
]


@pytest.mark.parametrize("factory,pattern,role,phrase",
                         [pytest.param(f, p, r, w, id=i) for i, f, p, r, w in BROKEN])
def test_broken_graph_does_not_form_the_pattern_and_explains_why(factory, pattern, role, phrase):
    graph = factory()
    parts = graph.get_partitions()
    assert not any(p.get_kind() == pattern and p.get_ops_num() == len(graph.ops) for p in parts)
    op_id = next(i for i, op in graph.ops.items() if op.name == role)
    if phrase is None:  # every op went to smaller fusions: nothing left to explain
        return
    found = graph.explain_partitions()
    text = str(found[op_id]) if op_id in found else str(found)
    assert phrase in text, text


def test_a_conv_that_is_not_depthwise_splits_into_two_conv_post_ops():
    for graph in (cg.conv_depthwise(dw_k=5), cg.conv_depthwise(dw_groups=2)):
        assert [(p.get_kind(), p.get_ops_num()) for p in graph.get_partitions()] == \
            [("conv_post_ops", 2), ("conv_post_ops", 3)]


# ------------------------------------------------------------------ specific behaviour
def test_conv_bindings_name_bias_bn_and_post_ops_in_order():
    graph = cg.conv(bias="op", bn=True, post=("relu", "swish", "add"))
    b = the_fusion(graph).fusion.bindings
    assert graph.ops[b["bias"]].kind == K.BiasAdd and graph.ops[b["bn"]].kind == K.BatchNormInference
    assert [graph.ops[i].kind for i in b["post_ops"]] == [K.ReLU, K.Sigmoid, K.Multiply, K.Add]


def test_a_biasadd_after_a_conv_with_a_bias_input_is_a_post_op_not_the_bias():
    g2 = cg.G()
    x = g2.input(cg._shape("NCX", cg.C, cg.HW))
    y = g2.op(K.Convolution, x, cg._weights(g2, cg.C, cg.C, 3, "OIX"), g2.tensor((cg.C,), dt.f32, cg.CONST),
              attrs=cg.conv_attrs())
    g2.op(K.BiasAdd, y, g2.tensor((cg.C,), dt.f32, cg.CONST), attrs={"data_format": "NCX"})
    graph = g2.done()
    # oneDNN fuses a BiasAdd only into a conv without a bias input; both stay alone
    assert kinds(graph) == ["single op", "single op"]
    found = graph.explain_partitions()
    assert "bias only when 'conv' has two inputs" in str(found[1]), str(found)


def test_int8_residual_add_binds_its_dequantize_in_the_post_op_chain():
    graph = cg.quantized_conv(residual=True, post=("relu",))
    b = the_fusion(graph).fusion.bindings
    chain = [graph.ops[i].kind for i in b["post_ops"]]
    assert chain == [K.Dequantize, K.Add, K.ReLU]
    assert graph.ops[b["quant_out"]].kind == K.Quantize and b["wei_quant"] is None


def test_two_conv_blocks_give_two_partitions():
    g = cg.G()
    x = g.input(cg._shape("NCX", cg.C, cg.HW))
    for _ in range(2):
        x = g.op(K.ReLU, g.op(K.Convolution, x, cg._weights(g, cg.C, cg.C, 3, "OIX"),
                               g.tensor((cg.C,), dt.f32, cg.CONST), attrs=cg.conv_attrs()))
    graph = g.done()
    assert [(p.get_kind(), p.get_ops_num()) for p in graph.get_partitions()] == [("conv_post_ops", 2)] * 2
    assert_same_as_debug(graph, exact=False, debug_on_reference=True)  # a lone Convolution runs ConvPlan


def test_int8_concat_needs_one_quantization_for_inputs_and_output():
    from graph_api.patterns.library.cnn import CONCAT_QUANTIZED
    from graph_api.patterns.matcher import Trace
    from graph_api.patterns.partitioner import find_fusion

    graph = cg.concat_quantized(same=False)
    assert kinds(graph) == ["single op"] * 5
    trace = Trace()
    quant = next(i for i, op in graph.ops.items() if op.name == "quant_out")
    assert find_fusion(graph, CONCAT_QUANTIZED, quant, {}, {}, trace) is None
    assert any("scales and zero points" in note.reason for note in trace.notes)

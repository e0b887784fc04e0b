"""Matcher and partitioner mechanics on tiny graphs with tiny patterns, and the
search cost of long ambiguous post-op chains (also on the library's patterns)."""
import pytest

import graph_api as ga
from graph_api.patterns import matcher as matcher_module
from graph_api.patterns.library.common import post_ops
from graph_api.patterns.matcher import Trace, iter_matches
from graph_api.patterns.partitioner import partition_graph
from graph_api.patterns.pattern import (ENTRY, Body, Check, In, Input, Node, Pattern, Repeat, attr_is,
                              in_dtype)

from . import cnn_graphs as cg
from .builder import G, K, assert_same_as_debug, dt, fused

FUSION = ga.PartitionPolicy.fusion


def parts(graph, *patterns):
    """[(pattern name or None, op ids)] partitioning with only ``patterns``."""
    return [(f.pattern.name if f.pattern else None, f.op_ids)
            for f in partition_graph(graph, FUSION, list(patterns))]


def chain(*kinds_, dtype=dt.f32, shape=(4, 8)):
    """x -> kinds[0] -> kinds[1] ... (binary ops take a fresh second input)."""
    g = G()
    x = g.input(shape, dtype)
    for kind in kinds_:
        if kind in (K.Add, K.Multiply, K.Divide, K.Subtract):
            x = g.op(kind, x, g.input(shape, dtype))
        elif kind == K.MatMul:
            x = g.op(kind, x, g.input((shape[-1], shape[-1]), dtype))
        else:
            x = g.op(kind, x)
    return g


MM_RELU = Pattern("mm_relu", 9, [Node("mm", K.MatMul), Node("act", K.ReLU, [In("mm", 0)])])


def test_chain_match_binds_roles_and_covers_all_other_ops_as_singles():
    graph = chain(K.MatMul, K.ReLU, K.Exp).done()
    assert parts(graph, MM_RELU) == [("mm_relu", [0, 1]), (None, [2])]
    match = next(iter_matches(graph, MM_RELU, 1))
    assert match.bindings == {"mm": 0, "act": 1}


def test_debug_policy_gives_single_ops_only():
    graph = chain(K.MatMul, K.ReLU).done()
    fusions = partition_graph(graph, ga.PartitionPolicy.debug, [MM_RELU])
    assert [(f.pattern, f.op_ids) for f in fusions] == [(None, [0]), (None, [1])]


def test_optional_node_present_or_passed_through():
    pat = Pattern("p", 9, [Node("mm", K.MatMul),
                           Node("scale", {K.Multiply, K.Divide}, [In("mm", 0)], optional=True),
                           Node("act", K.ReLU, [In("scale", 0)])])
    assert parts(chain(K.MatMul, K.Divide, K.ReLU).done(), pat) == [("p", [0, 1, 2])]
    assert parts(chain(K.MatMul, K.Multiply, K.ReLU).done(), pat) == [("p", [0, 1, 2])]
    graph = chain(K.MatMul, K.ReLU).done()
    assert parts(graph, pat) == [("p", [0, 1])]
    assert next(iter_matches(graph, pat, 1)).bindings == {"mm": 0, "scale": None, "act": 1}
    # a kind outside the alternation stops the chain: Subtract is not a scale
    assert parts(chain(K.MatMul, K.Subtract, K.ReLU).done(), pat) == [
        (None, [0]), (None, [1]), (None, [2])]


def test_commutative_inputs_only_with_swap_and_only_for_commutative_kinds():
    def graph_with(kind, chain_port):
        g = G()
        y = g.op(K.ReLU, g.input((4, 8)))
        other = g.input((4, 8))
        g.op(kind, *((y, other) if chain_port == 0 else (other, y)))
        return g.done()

    strict = Pattern("p", 9, [Node("r", K.ReLU), Node("b", {K.Add, K.Subtract}, [In("r", 0)])])
    swap = Pattern("p", 9, [Node("r", K.ReLU), Node("b", {K.Add, K.Subtract}, [In("r", 0, swap=True)])])
    assert parts(graph_with(K.Add, 1), strict)[0][0] is None
    assert parts(graph_with(K.Add, 1), swap) == [("p", [0, 1])]
    assert parts(graph_with(K.Subtract, 1), swap)[0][0] is None  # x - y is not y - x
    assert parts(graph_with(K.Subtract, 0), swap) == [("p", [0, 1])]


def test_port_alternatives_select_1_or_2():
    pat = Pattern("p", 9, [Node("r", K.ReLU), Node("s", K.Select, [In("r", (1, 2))])])
    for port in (1, 2):
        g = G()
        y = g.op(K.ReLU, g.input((4, 8)))
        ins = [g.input((4, 8), dt.boolean), g.input((1,))]
        ins.insert(port, y)
        g.op(K.Select, *ins, dtype=dt.f32)
        assert parts(g.done(), pat) == [("p", [0, 1])]


POST = Repeat("post", (Body("unary", [Node("op", {K.ReLU, K.Exp, K.Tanh}, [In(ENTRY, 0)])]),
                       Body("binary", [Node("op", {K.Add, K.Multiply}, [In(ENTRY, 0, swap=True)])])),
              0, 20, via="mm")
MM_POST = Pattern("mm_post", 9, [Node("mm", K.MatMul), POST])


def test_repetition_is_greedy_and_lists_ops_in_execution_order():
    graph = chain(K.MatMul, K.ReLU, K.Add, K.Tanh, K.Multiply).done()
    assert parts(graph, MM_POST) == [("mm_post", [0, 1, 2, 3, 4])]
    assert next(iter_matches(graph, MM_POST, 4)).bindings == {"mm": 0, "post": [1, 2, 3, 4]}


def test_repetition_stops_at_max_20_and_the_rest_is_left():
    graph = chain(K.MatMul, *[K.ReLU] * 22).done()
    result = parts(graph, MM_POST)
    assert result[0] == ("mm_post", list(range(21)))
    assert result[1:] == [(None, [21]), (None, [22])]


def test_repetition_min_count():
    pat = Pattern("p", 9, [Node("mm", K.MatMul), Repeat("post", POST.bodies, 2, 3, via="mm")])
    assert parts(chain(K.MatMul, K.ReLU).done(), pat)[0][0] is None
    assert parts(chain(K.MatMul, K.ReLU, K.Exp).done(), pat) == [("p", [0, 1, 2])]


def test_repetition_of_a_subgraph_body_swish():
    swish = Body("swish", [Node("sig", K.Sigmoid, [In(ENTRY, 0)]),
                           Node("mul", K.Multiply, [In(ENTRY, 0, swap=True), In("sig", 1, swap=True)])])
    pat = Pattern("p", 9, [Node("mm", K.MatMul), Repeat("act", (swish,), 1, 1, via="mm")])
    g = G()
    y = g.op(K.MatMul, g.input((4, 8)), g.input((8, 8)))
    s = g.op(K.Sigmoid, y)
    g.op(K.Multiply, s, y)  # sigmoid(x) * x, operands swapped
    graph = g.done()
    assert parts(graph, pat) == [("p", [0, 1, 2])]
    assert next(iter_matches(graph, pat, 2)).roles == {0: "mm", 1: "act[0].sig", 2: "act[0].mul"}


def test_optional_group_all_or_nothing():
    pat = Pattern("p", 9, [Node("mm", K.MatMul),
                           Node("t", K.Tanh, [In("mm", 0)], optional="cap"),
                           Node("m", K.Multiply, [In("t", 0, swap=True)], optional="cap"),
                           Node("act", K.ReLU, [In("m", 0)])])
    assert parts(chain(K.MatMul, K.Tanh, K.Multiply, K.ReLU).done(), pat) == [("p", [0, 1, 2, 3])]
    assert parts(chain(K.MatMul, K.ReLU).done(), pat) == [("p", [0, 1])]
    # Multiply without its Tanh: the group cannot be half present
    assert parts(chain(K.MatMul, K.Multiply, K.ReLU).done(), pat)[0][0] is None


def test_dotted_subgroup_is_absent_when_its_parent_is():
    pat = Pattern("p", 9, [
        Node("r", K.ReLU),
        Node("e", K.Exp, [In("r", 0)], optional="a"),
        Node("x", K.Abs, [In("e", 0)], optional="a.b"),  # needs e, never hangs off r alone
        Node("t", K.Tanh, [In("r", 0)]),
    ])
    g = G()
    r = g.op(K.ReLU, g.input((4, 8)))
    g.op(K.Abs, r)
    g.op(K.Tanh, r)
    graph = g.done()
    match = next(iter_matches(graph, pat, 2))
    assert match.bindings == {"r": 0, "e": None, "x": None, "t": 2}


def test_input_node_requires_one_tensor():
    pat = Pattern("p", 9, [Input("src"), Node("a", K.MatMul, [In("src", 0)]),
                           Node("b", K.MatMul, [In("src", 0)]),
                           Node("add", K.Add, [In("a", 0, swap=True), In("b", 1, swap=True)])])
    for shared in (True, False):
        g = G()
        x = g.input((4, 8))
        x2 = x if shared else g.input((4, 8))
        a = g.op(K.MatMul, x, g.input((8, 8)))
        b = g.op(K.MatMul, x2, g.input((8, 8)))
        g.op(K.Add, a, b)
        assert (parts(g.done(), pat)[-1][0] == "p") == shared


def test_intermediate_used_outside_is_rejected_unless_the_node_allows_it():
    g = G()
    y = g.op(K.MatMul, g.input((4, 8)), g.input((8, 8)))
    g.op(K.ReLU, y)
    g.op(K.Exp, y)  # second user of the MatMul output
    graph = g.done()
    assert all(p is None for p, _ in parts(graph, MM_RELU))
    trace = Trace()
    from graph_api.patterns.partitioner import find_fusion
    assert find_fusion(graph, MM_RELU, 1, {}, {}, trace) is None
    assert "used by op 2 outside the match" in trace.reason
    allowed = Pattern("p", 9, [Node("mm", K.MatMul, escape=(0,)), Node("act", K.ReLU, [In("mm", 0)])])
    assert parts(graph, allowed)[0] == ("p", [0, 1])


def test_intermediate_graph_output_is_rejected():
    g = G()
    s = g.op(K.SoftMax, g.input((4, 8)), outputs=2, attrs={"axis": -1})  # stats unused: an output
    g.op(K.ReLU, s[0])
    graph = g.done()
    plain = Pattern("p", 9, [Node("sm", K.SoftMax), Node("act", K.ReLU, [In("sm", 0)])])
    stats = Pattern("p", 9, [Node("sm", K.SoftMax, escape=(1,)), Node("act", K.ReLU, [In("sm", 0)])])
    assert parts(graph, plain)[0][0] is None
    assert parts(graph, stats) == [("p", [0, 1])]


def test_a_match_that_would_close_a_cycle_through_another_partition_is_rejected():
    # m1 -> f, f2 -> m2, f -> s <- f2: {f, f2, s} is fused first; {m1, m2} would
    # then sit both before (m1 -> f) and after (f2 -> m2) that partition.
    g = G()
    m1 = g.op(K.ReLU, g.input((4, 8)))
    f = g.op(K.Exp, m1)
    f2 = g.op(K.Tanh, g.input((4, 8)))
    g.op(K.Add, f, f2)
    g.op(K.Add, m1, f2)
    graph = g.done()
    first = Pattern("first", 10, [Node("f", K.Exp), Node("f2", K.Tanh, escape=(0,)),
                                  Node("s", K.Add, [In("f", 0), In("f2", 1)])])
    second = Pattern("second", 9, [Node("m1", K.ReLU, escape=(0,)), Node("m2", K.Add, [In("m1", 0)])])
    assert ("second", [0, 4]) in parts(graph, second)
    assert parts(graph, first, second) == [(None, [0]), ("first", [1, 2, 3]), (None, [4])]
    from graph_api.patterns.partitioner import find_fusion
    trace = Trace()
    owner = {1: "f", 2: "f", 3: "f"}
    assert find_fusion(graph, second, 4, owner, {1: "first", 2: "first", 3: "first"}, trace) is None
    assert "cycle" in trace.reason


def test_priority_order_and_taken_ops():
    graph = chain(K.MatMul, K.ReLU, K.Exp).done()
    relu_exp = Pattern("relu_exp", 8, [Node("r", K.ReLU), Node("e", K.Exp, [In("r", 0)])])
    assert parts(graph, MM_RELU, relu_exp) == [("mm_relu", [0, 1]), (None, [2])]
    assert parts(graph, relu_exp, MM_RELU) == [(None, [0]), ("relu_exp", [1, 2])]


def test_predicates_on_attrs_and_dtypes():
    pat = Pattern("p", 9, [Node("mm", K.MatMul, when=[attr_is("transpose_b", True)]),
                           Node("act", K.ReLU, [In("mm", 0)])])
    g = G()
    g.op(K.ReLU, g.op(K.MatMul, g.input((4, 8)), g.input((5, 8)), attrs={"transpose_b": True}))
    assert parts(g.done(), pat)[0][0] == "p"
    graph = chain(K.MatMul, K.ReLU).done()
    assert parts(graph, pat)[0][0] is None
    trace = Trace()
    list(iter_matches(graph, pat, 1, trace=trace))
    assert "transpose_b is True" in trace.reason
    bf16 = Pattern("p", 9, [Node("mm", K.MatMul, when=[in_dtype(0, dt.bf16)]),
                            Node("act", K.ReLU, [In("mm", 0)])])
    assert parts(chain(K.MatMul, K.ReLU, dtype=dt.bf16).done(), bf16)[0][0] == "p"
    assert parts(graph, bf16)[0][0] is None


def test_nodes_below_a_matched_producer_are_found_among_its_consumers():
    # two outputs: the sink reaches 'mm'; 'side' hangs off it (an extra output)
    pat = Pattern("p", 9, [Node("mm", K.MatMul),
                           Node("side", K.Exp, [In("mm", 0)], escape=(0,)),
                           Node("extra", K.Abs, [In("side", 0)], optional=True, escape=(0,)),
                           Node("act", K.ReLU, [In("mm", 0)])])
    g = G()
    y = g.op(K.MatMul, g.input((4, 8)), g.input((8, 8)))
    e = g.op(K.Exp, y)
    g.op(K.ReLU, y)
    g.op(K.Abs, e)
    graph = g.done()
    assert parts(graph, pat) == [("p", [0, 1, 2, 3])]
    assert next(iter_matches(graph, pat, 2)).bindings == {"mm": 0, "side": 1, "extra": 3, "act": 2}


def test_whole_match_checks():
    pat = Pattern("p", 9, [Node("mm", K.MatMul),
                           Node("scale", K.Multiply, [In("mm", 0)], optional=True),
                           Node("act", K.ReLU, [In("scale", 0)])],
                  checks=[Check("has a scale", lambda b, g: b["scale"] is not None)])
    assert parts(chain(K.MatMul, K.ReLU).done(), pat)[0][0] is None
    assert parts(chain(K.MatMul, K.Multiply, K.ReLU).done(), pat)[0][0] == "p"


def test_a_single_op_match_is_not_a_fusion():
    pat = Pattern("p", 9, [Node("mm", K.MatMul), Node("act", K.ReLU, [In("mm", 0)], optional=True)])
    assert parts(chain(K.MatMul).done(), pat) == [(None, [0])]


def test_pattern_declarations_are_validated():
    with pytest.raises(ValueError, match="unknown"):
        Pattern("p", 1, [Node("a", K.ReLU, [In("nope", 0)])])
    with pytest.raises(ValueError, match="duplicate"):
        Pattern("p", 1, [Node("a", K.ReLU), Node("a", K.Exp)])
    with pytest.raises(ValueError, match="max"):
        Repeat("r", (), 0, 21)
    with pytest.raises(ValueError, match="body"):
        Pattern("p", 1, [Node("a", K.ReLU),
                         Repeat("r", (Body("b", [Node("x", K.Exp, [In("a", 0)])]),), via="a")])


def test_a_tensor_marked_by_an_end_op_of_the_match_may_leave():
    pat = Pattern("p", 9, [Node("e", K.Exp), Node("end", K.End, [In("e", 0)], optional=True),
                           Node("act", K.ReLU, [In("e", 0)])])
    g = G()
    e = g.op(K.Exp, g.input((4, 8)))
    g.op(K.End, e, outputs=0)
    g.op(K.ReLU, e)
    graph = g.done()
    graph.output_ids.append(e.id)  # as oneDNN declares it (End marks an output)
    from graph_api.patterns.partitioner import escaping
    match = next(iter_matches(graph, pat, 2))
    assert match.bindings == {"e": 0, "end": 1, "act": 2}
    assert escaping(graph, match) is None


# ---------------------------------------------------------------- search cost
# A swish x * sigmoid(x) on a post-op chain reads three ways: as a swish, as a
# binary Multiply with the Sigmoid left outside, or as Sigmoid (unary) then
# Multiply (binary).  Searched naively, k swishes cost 3^k walks of the chain
# below them.  The bounds below are matcher steps (graph_api.patterns.matcher.
# steps_taken), not time, so a slow machine cannot make them pass or fail.
def steps_of(fn):
    """(fn(), matcher steps it took)."""
    before = matcher_module.steps_taken
    result = fn()
    return result, matcher_module.steps_taken - before


def swish_chain(k):
    g = G()
    x = g.op(K.MatMul, g.input((4, 8)), g.input((8, 8)))
    for _ in range(k):
        x = g.op(K.Multiply, x, g.op(K.Sigmoid, x))
    return g.done()


def test_every_reading_of_ambiguous_swishes_is_still_enumerated_swish_first():
    pat = Pattern("p", 9, [Node("mm", K.MatMul), post_ops("mm")])
    matches = list(iter_matches(swish_chain(3), pat, 6))
    assert len(matches) == 3 ** 3  # swish | binary Multiply alone | Sigmoid then Multiply, per swish
    assert len({tuple(sorted(m.roles.items())) for m in matches}) == 27
    assert matches[0].bindings["post_ops"] == [1, 2, 3, 4, 5, 6]
    assert all(r.endswith((".sigmoid", ".multiply")) for r in matches[0].roles.values() if r != "mm")


def test_a_search_failing_below_ambiguous_swishes_grows_polynomially():
    # the chain matches, then the head is no Convolution: every reading of the chain fails
    pat = Pattern("p", 9, [Node("conv", K.Convolution), post_ops("conv")])
    (no4, steps4), (no8, steps8) = [steps_of(lambda k=k: list(iter_matches(swish_chain(k), pat, 2 * k)))
                                    for k in (4, 8)]
    assert no4 == [] and no8 == []
    # measured 162 and 542 steps (the search before dead-end memos: 2,556, then its
    # 200,000-step limit); 3^k growth would multiply by 81 from k=4 to k=8
    assert steps8 < 5 * steps4 and steps8 < 2_000


#: 12 post-ops, six of them swishes: 18 post-op ops, within oneDNN's 19
#: (x8x8x_conv_post_ops: [unary/binary]*[0, MAX_REPETITION = 20), a swish taking two)
INT8_CONV_12_POST_OPS = ("relu", "swish", "add", "swish", "tanh", "swish", "multiply", "swish", "abs",
                         "swish", "add", "swish")


def test_int8_conv_with_12_post_ops_six_swishes_is_one_partition():
    graph = cg.quantized_conv(post=INT8_CONV_12_POST_OPS)
    parts, steps = steps_of(lambda: fused(graph))
    # oneDNN forms one x8x8x_conv_post_ops partition (dequant, dequant, conv, 18 post-op ops, quantize);
    # the exponential search ran out of its budget and left 4 partitions (13 + 1 + 7 + 1 ops)
    assert parts == [("conv_quantized", sorted(graph.ops))]
    assert len(the_partition(graph).fusion.bindings["post_ops"]) == 18
    # measured 3,959: the 2^6 leak-free readings, 64 candidates (2,652 when the 64 included leaking
    # ones; before dead-end memos: the 200,000-step limit, hit at anchor after anchor)
    assert steps < 10_000
    # the fused plan runs the 18-op epilogue: it sums the convolution exactly (int8),
    # against the reference kernels' float64 sums of the dequantized values, which the
    # check rule's f32 tolerance covers (a u8 output may differ by one where the
    # reference lands on a rounding boundary); the single ops run the reference kernels,
    # as the debug policy's lone Convolution would otherwise run the plan under test
    assert_same_as_debug(graph, exact=False, debug_on_reference=True)


def test_float_conv_below_which_conv_quantized_fails_stays_cheap():
    # conv_quantized (tried first) walks the whole chain, then finds no Dequantize under the conv
    graph = cg.conv(post=INT8_CONV_12_POST_OPS)
    parts, steps = steps_of(lambda: fused(graph))
    assert parts == [("conv_post_ops", sorted(graph.ops))]
    assert steps < 20_000  # measured 6,320 (the search before dead-end memos: 362,561)


def test_int8_matmul_pattern_failing_below_eight_swishes_stays_cheap():
    # u8 data into an f32-weight MatMul: matmul_quantized and matmul_compressed walk the
    # chain, then find no weight Dequantize.  matmul_quantized has a node the upward walk
    # may skip (res_cast), which must not make every used op part of the dead-end key
    g = G()
    x = g.op(K.Dequantize, g.input((4, 8), dt.u8), dtype=dt.f32,
             attrs={"qtype": "per_tensor", "axis": 1, "scales": [0.5], "zps": [0]})
    x = g.op(K.MatMul, x, g.input((8, 8)))
    for _ in range(8):
        x = g.op(K.Multiply, x, g.op(K.Sigmoid, x))
    graph = g.done()
    parts, steps = steps_of(lambda: fused(graph))
    # as oneDNN: the Dequantize alone, fp_matmul_post_ops with 16 post-op ops
    assert parts == [("single op", [0]), ("matmul_post_ops", list(range(1, 18)))]
    assert steps < 75_000  # measured 19,152 (24,659 before leaks were pruned; 1,684,851 before memos)


#: 19 post-op ops with 4 swishes: within oneDNN's fp_matmul_post_ops repetition (at most 19 ops)
MATMUL_19_POST_OPS = ("relu", "swish", "add", "tanh", "swish", "multiply", "abs", "swish", "add", "relu",
                      "swish", "add", "tanh", "add", "relu")


def _matmul_chain(names):
    """MatMul followed by the post-ops ``names`` (a swish is Sigmoid and Multiply; binary
    operands alternate between per-column and full-shape)."""
    g = G()
    x = g.op(K.MatMul, g.input((4, 8)), g.input((8, 8)))
    for i, name in enumerate(names):
        if name == "swish":
            x = g.op(K.Multiply, x, g.op(K.Sigmoid, x))
        elif name in cg.BINARY:
            x = g.op(cg.BINARY[name], x, g.input((1, 8) if i % 2 else (4, 8)))
        else:
            x = g.op(cg.UNARY[name], x)
    return g.done()


def test_matmul_with_four_swishes_among_19_post_ops_is_one_partition():
    graph = _matmul_chain(MATMUL_19_POST_OPS)
    parts, steps = steps_of(lambda: fused(graph))
    assert parts == [("matmul_post_ops", sorted(graph.ops))]
    assert len(the_partition(graph).fusion.bindings["post_ops"]) == 19
    # measured 6,762 (15,861 before leaks were pruned, mostly matmul_indexing_maps' 64 rejected
    # candidates per anchor; 93,075 before memos)
    assert steps < 50_000
    assert_same_as_debug(graph, exact=False)  # f32 BLAS order: the check rule's f32 tolerance


def swish_graph(k, head="matmul", quant_out=True):
    """``head`` (matmul | int8_matmul | int8_conv) then k swishes [then Quantize for the int8 heads]."""
    if head == "int8_conv":
        return cg.quantized_conv(post=("swish",) * k, quant_out=quant_out)
    g = G()
    if head == "int8_matmul":
        q = {"qtype": "per_tensor", "axis": 1, "scales": [0.25], "zps": [3]}
        x = g.op(K.Dequantize, g.input((4, 8), dt.u8), dtype=dt.f32, attrs=q)
        w = g.op(K.Dequantize, g.tensor((8, 8), dt.s8, ga.PropertyType.constant), dtype=dt.f32,
                 attrs={**q, "scales": [0.5], "zps": [0]})
        x = g.op(K.MatMul, x, w)
    else:
        x = g.op(K.MatMul, g.input((4, 8)), g.input((8, 8)))
    for _ in range(k):
        x = g.op(K.Multiply, x, g.op(K.Sigmoid, x))
    if head != "matmul" and quant_out:
        g.op(K.Quantize, x, dtype=dt.u8, attrs={"qtype": "per_tensor", "axis": 1, "scales": [0.125],
                                                 "zps": [5]})
    return g.done()


def test_int8_matmul_with_eight_swishes_and_quantize_is_one_partition():
    # the SmoothQuant tail reads the last swish's Multiply as smooth_scale (its Sigmoid left
    # outside): every reading of the chain below that leaks, and the partitioner saw 64 of
    # them (its candidate limit) before the one that does not: 4 partitions (11 + 1 + 7 + 1
    # ops).  The partitioner's search now drops a leaking state as soon as it leaks for good
    graph = swish_graph(8, "int8_matmul")
    parts, steps = steps_of(lambda: fused(graph))
    # x8x8x_matmul_post_ops: dequant, dequant, matmul, 16 post-op ops, quantize
    assert parts == [("matmul_quantized", sorted(graph.ops))]
    # the greedy tail still comes first where it does not leak: the last Multiply as
    # smooth_scale, its Sigmoid as the last post-op
    bindings = the_partition(graph).fusion.bindings
    assert bindings["post_ops"] == list(range(3, 18)) and bindings["smooth_scale"] == 18
    assert steps < 10_000  # measured 2,415 (before: 18,567, the 64-candidate limit at 12 anchors)
    assert_same_as_debug(graph, exact=False, debug_on_reference=True)


def test_a_chain_of_residual_adds_fuses_as_far_as_the_repetition_allows():
    # Add(x, ReLU(x)) reads two ways: ReLU then Add (x from below, inside), or Add with ReLU
    # outside (it leaks); 8 of them are 16 post-op ops within the 20 repetitions
    g = G()
    x = g.op(K.MatMul, g.input((4, 8)), g.input((8, 8)))
    for _ in range(8):
        x = g.op(K.Add, x, g.op(K.ReLU, x))
    graph = g.done()
    parts, steps = steps_of(lambda: fused(graph))
    assert parts == [("matmul_post_ops", sorted(graph.ops))]  # was 13 + 1 + 3 ops
    assert steps < 5_000  # measured 1,239 (before: 16,037)


#: issue 33's MatMul chain: 20 post-ops, 4 of them swishes (a swish is one repetition of
#: the library's post_ops, so the 24 post-op ops are 20 repetitions)
MATMUL_20_POST_OPS = MATMUL_19_POST_OPS + ("abs", "add", "tanh", "multiply", "relu")


def test_matmul_with_four_swishes_among_20_post_ops_is_one_partition():
    graph = _matmul_chain(MATMUL_20_POST_OPS)
    parts, steps = steps_of(lambda: fused(graph))
    assert parts == [("matmul_post_ops", sorted(graph.ops))]
    assert len(the_partition(graph).fusion.bindings["post_ops"]) == 24
    assert steps < 30_000  # measured 9,737 (22,964 before leaks were pruned)


@pytest.mark.parametrize("head", ["matmul", "int8_matmul", "int8_conv"])
def test_partitioning_steps_grow_polynomially_with_the_swish_count(head):
    # n and 2n swishes (2n post-op ops each): every reading of every swish once would
    # multiply the steps by 3^n from n to 2n (81 from 4 to 8, 6,561 from 8 to 16)
    steps = {}
    for k in (4, 8, 16):
        graph = swish_graph(k, head)
        parts, steps[k] = steps_of(lambda: fused(graph))
        if k <= 8:  # 16 swishes are 32 post-op ops: beyond the 20 repetitions
            assert len(parts) == 1, parts
    # measured matmul 1,388 / 8,768 / 23,066; int8_matmul 980 / 2,415 / 2,534;
    # int8_conv 720 / 2,796 / 2,841
    assert steps[8] < 16 * steps[4] and steps[16] < 16 * steps[8], steps


def test_no_search_of_a_long_chain_comes_near_the_step_limit(monkeypatch):
    # STEP_LIMIT guards one (pattern, anchor) search; a legitimate match that hit it would
    # be lost (the int8 Convolution with 12 post-ops once was).  The largest single search
    # on 20-swish chains stays far below it
    from graph_api.patterns import partitioner
    real, largest = partitioner.iter_matches, []

    def counted(*args, **kwargs):
        before = matcher_module.steps_taken
        try:
            yield from real(*args, **kwargs)
        finally:
            largest.append(matcher_module.steps_taken - before)

    monkeypatch.setattr(partitioner, "iter_matches", counted)
    for head in ("matmul", "int8_matmul", "int8_conv"):
        largest.clear()
        fused(swish_graph(20, head))
        # measured 2,670 (matmul), 1,404 (int8_matmul), 1,891 (int8_conv)
        assert max(largest) < matcher_module.STEP_LIMIT // 20, (head, max(largest))


def the_partition(graph):
    (part,) = graph.get_partitions()
    return part

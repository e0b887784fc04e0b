"""Every partition on a fast plan, checked against the reference.

* Each pattern's canonical graph (tests/patterns/graphs.py) runs with check
  mode on: every partition that is not on the reference plan is re-run through
  the unfused reference and compared with the rule of ``graph_api.check``
  (a few ulps of the coarsest type in play, scale-aware).  The chosen plans
  must be fast ones, except the partitions listed in ``STILL_REFERENCE``.
* Every op case (tests/cases) compiles to a fast single-op plan except the
  kinds in ``SINGLE_OP_REFERENCE``; test_ops_public.py checks their numbers
  against the independent formulas.
* The strict-f32 BLAS MatMul plans are bounded against the float64 product by
  the accumulation bound ``K * eps * sum |a| |b|``.
"""
from __future__ import annotations

import numpy as np
import pytest

import graph_api as ga
from graph_api.config import settings
from graph_api.fill import fill_inputs
from tests.cases.op_cases import OP_CASES
from tests.patterns import graphs
from tests.patterns.builder import dt

#: op kinds whose single-op partitions still run the reference, and why
SINGLE_OP_REFERENCE = {
    ga.OpKind.End: "no kernel (unsupported, as in oneDNN)",
    ga.OpKind.Wildcard: "no kernel (unsupported, as in oneDNN)",
}

def _layernorm_two_axes():
    """LayerNorm over the last two axes then Add of a [W] operand (row kernel not usable)."""
    g = graphs.G()
    x = g.input((3, 4, 8))
    y = g.op(ga.OpKind.LayerNorm, x, g.input((4, 8)), g.input((4, 8)), outputs=1,
             attrs={"begin_norm_axis": -2, "keep_stats": False})
    g.op(ga.OpKind.Add, y, g.input((8,)))
    return g.done()


def _softmax_axis1_stats():
    g = graphs.G()
    g.op(ga.OpKind.SoftMax, g.input((2, 5, 3)), attrs={"axis": 1})
    return g.done()


#: canonical graphs: (id, factory)
CANONICAL = [
    ("matmul_relu", lambda: graphs.matmul_chain()),
    ("matmul_bias_swish_add_gelu", lambda: graphs.matmul_chain(post=("swish", "add", "gelu"), bias="op")),
    ("matmul_bias_cast_bf16", lambda: graphs.matmul_chain(bias="input", out_cast=dt.bf16)),
    ("matmul_bf16", lambda: graphs.matmul_chain(dtype=dt.bf16, post=("relu", "add"))),
    ("matmul_select", lambda: graphs.matmul_chain(post=("select",))),
    ("matmul_transpose_reorder", lambda: graphs.matmul_chain(post=(), tail="transpose_reorder")),
    ("matmul_reshape_transpose", lambda: graphs.matmul_chain(post=(), bias="op",
                                                             tail="reshape_transpose_reshape")),
    ("matmul_dropout", lambda: graphs.matmul_chain(post=(), tail="dropout")),
    ("matmul_quantized", lambda: graphs.quantized_matmul()),
    ("matmul_quantized_bf16_residual", lambda: graphs.quantized_matmul(bf16=True, residual=True)),
    ("matmul_quantized_smooth", lambda: graphs.quantized_matmul(smooth=True)),
    ("bmb", lambda: graphs.bmb()),
    ("bmb_bf16", lambda: graphs.bmb(bf16=True)),
    ("compressed_matmul", lambda: graphs.compressed_matmul()),
    ("gated_mlp", lambda: graphs.gated_mlp()),
    ("sdpa", lambda: graphs.sdpa()),
    ("gqa", lambda: graphs.gqa()),
    ("sdpa_causal", lambda: graphs.sdpa(mask="causal")),
    ("sdpa_stats", lambda: graphs.sdpa(stats=True)),
    ("sdpa_quantized", lambda: graphs.sdpa_quantized()),
    ("sdpa_quantized_bf16", lambda: graphs.sdpa_quantized(bf16=True)),
    ("sdpa_quantized_f8", lambda: graphs.sdpa_quantized(q_dt=dt.f8_e4m3)),
    ("sdpa_backward", lambda: graphs.backward()),
    ("sdpa_jax", lambda: graphs.jax_mha()),
    ("mqa_jax", lambda: graphs.jax_mqa()),
] + [(f"small_{first}", (lambda f=first: graphs.small(f, tail=("cast",))))
     for first in ("add", "maximum", "relu", "softmax", "layernorm", "reduce", "reciprocal", "reorder")] + [
    ("small_typecast", lambda: graphs.small("typecast", dtype=dt.bf16)),
    ("small_softmax_quantize", lambda: graphs.small("softmax", post=(), tail=("quantize",))),
    ("small_x8_reorder", lambda: graphs.small("x8_reorder", post=(), dtype=dt.s8, tail=("quantize",))),
    ("small_typecast_quantize", lambda: graphs.small("typecast", post=(), dtype=dt.bf16, tail=("quantize",))),
    ("small_reorder_add", lambda: graphs.small("reorder", post=("add",))),
    ("layernorm_two_axes_add", _layernorm_two_axes),
    ("softmax_axis1", _softmax_axis1_stats),
]

#: (canonical graph id, partition kind) without a fused kernel, and why: they run
#: each op on its single-op fast plan (kernels/fused/per_op.py)
UNFUSED = {
    ("mqa_jax", "mqa_jax"): "SoftMax normalises over one axis and pv_matmul contracts over the "
                            "other (test_sdpa_family.py): not the attention kernel's softmax(s) v",
}


def _run(graph):
    feeds = fill_inputs(graph, 0)
    parts = [p for p in graph.get_partitions() if p.is_supported()]
    return ga.run_graph(graph, feeds, partitions=parts)


@pytest.mark.parametrize("name,factory", CANONICAL, ids=[c[0] for c in CANONICAL])
def test_canonical_graph_runs_fast_plans(name, factory, check_mode):
    run = _run(factory())  # check mode raises if a fast plan differs from the reference
    plans = [(r.partition.get_kind(), r.compiled.plan.name) for r in run.partitions]
    assert not [p for p in plans if p[1] == "reference"], plans
    unfused = [p for p in plans if p[1].startswith("per_op")]
    assert [p for p in unfused if (name, p[0]) not in UNFUSED] == [], unfused
    assert [p for p in plans if (name, p[0]) in UNFUSED and not p[1].startswith("per_op")] == []


RUNNABLE = [c for c in OP_CASES if c.kind not in SINGLE_OP_REFERENCE]


@pytest.mark.parametrize("case", RUNNABLE, ids=lambda c: c.name)
def test_op_case_compiles_to_a_fast_plan(case):
    graph = ga.Graph(ga.EngineKind.cpu, case.fpmath)
    graph.add_op(case.make_op())
    graph.finalize()
    (part,) = graph.get_partitions()
    outs = [ga.LogicalTensor(lt.id, lt.dtype) for lt in case.output_lts()]
    compiled = part.compile(case.input_lts(), outs, ga.Engine())
    assert compiled.plan.name != "reference", getattr(compiled.plan, "fallback_reason", "")


def test_reference_switch_is_explicit():
    graph = graphs.matmul_chain()
    old = settings.reference
    try:
        settings.reference = True
        plans = [r.compiled.plan.name for r in _run(graph).partitions]
    finally:
        settings.reference = old
    assert plans == ["reference"]
    assert [r.compiled.plan.name for r in _run(graph).partitions] == ["blas_matmul_epilogue"]


def _bert_block(b, s, heads, d, bias_add):
    """x @ W + bias -> reshape [b, s, h, d] -> transpose [b, h, s, d] (matmul_transpose)."""
    g = graphs.G()
    hid = heads * d
    x = g.input((b, s, hid))
    w = g.tensor((hid, hid), prop=ga.PropertyType.constant)
    bias = g.tensor((hid,), prop=ga.PropertyType.constant)
    if bias_add:
        y = g.op(ga.OpKind.BiasAdd, g.op(ga.OpKind.MatMul, x, w), bias)
    else:
        y = g.op(ga.OpKind.MatMul, x, w, bias)
    y = g.op(ga.OpKind.StaticReshape, y, attrs={"shape": [b, s, heads, d], "special_zero": False})
    g.op(ga.OpKind.StaticTranspose, y, attrs={"order": [0, 2, 1, 3]})
    return g.done(), x.id, w.id, bias.id


@pytest.mark.parametrize("bias_add", [False, True])
def test_matmul_transpose_within_the_f32_accumulation_bound(bias_add):
    graph, x_id, w_id, b_id = _bert_block(2, 24, 4, 16, bias_add)
    (part,) = graph.get_partitions()
    assert part.get_kind() == "matmul_transpose"
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 24, 64)).astype(np.float32)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    bias = rng.standard_normal(64).astype(np.float32)
    run = ga.run_graph(graph, {x_id: x, w_id: w, b_id: bias})
    assert run.partitions[0].compiled.plan.name == "blas_matmul_epilogue"
    (out_id,) = graph.output_ids
    got = run.outputs[out_id]
    exact = (x.astype(np.float64) @ w.astype(np.float64)) + bias
    want = exact.reshape(2, 24, 4, 16).transpose(0, 2, 1, 3)
    # f32 sum of K products: |err| <= K * eps * sum_k |x w| (+ one rounding of the bias add)
    K, eps = 64, 2.0 ** -24
    bound = K * eps * (np.abs(x).astype(np.float64) @ np.abs(w)) + eps * np.abs(exact)
    bound = bound.reshape(2, 24, 4, 16).transpose(0, 2, 1, 3)
    assert got.shape == want.shape
    assert np.all(np.abs(got - want) <= bound)


def test_epilogue_operands_read_again_on_every_execute():
    """The BLAS plan keeps its epilogue program while the operands are the same memory;
    the values in that memory are read again each execute (a residual changed in place
    between executes, then a residual in other memory)."""
    g = graphs.G()
    x = g.input((2, 8, 16))
    w = g.tensor((16, 16), prop=ga.PropertyType.constant)
    bias = g.tensor((16,), prop=ga.PropertyType.constant)
    res = g.input((2, 8, 16))
    g.op(ga.OpKind.Add, g.op(ga.OpKind.MatMul, x, w, bias), res)
    graph = g.done()
    (part,) = graph.get_partitions()
    assert part.get_kind() == "matmul_post_ops"
    rng = np.random.default_rng(4)
    feeds = {x.id: rng.standard_normal((2, 8, 16)).astype(np.float32),
             w.id: rng.standard_normal((16, 16)).astype(np.float32),
             bias.id: rng.standard_normal(16).astype(np.float32),
             res.id: rng.standard_normal((2, 8, 16)).astype(np.float32)}
    compiled = ga.compile_graph(graph, feeds)
    assert compiled.steps[0][1].plan.name == "blas_matmul_epilogue"
    (out_id,) = graph.output_ids
    exact = feeds[x.id].astype(np.float64) @ feeds[w.id] + feeds[bias.id]
    # f32 sum of K = 16 products, then two rounded adds
    bound = 16 * 2.0 ** -24 * (np.abs(feeds[x.id]).astype(np.float64) @ np.abs(feeds[w.id])) + 1e-6
    for step in range(3):
        if step == 1:
            feeds[res.id][...] = rng.standard_normal((2, 8, 16))  # same memory, new values
        elif step == 2:
            feeds[res.id] = rng.standard_normal((2, 8, 16)).astype(np.float32)  # other memory
        got = compiled(feeds)[out_id]
        assert np.all(np.abs(got - (exact + feeds[res.id])) <= bound + 2.0 ** -23 * np.abs(exact + feeds[res.id]))

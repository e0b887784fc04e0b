"""The short f32 prefill attention kernel (kernels/sdpa/prefill.py) vs a float64 formula.

Kernel error: f32 dot products of D terms (<= D u |q||k|), exp32 (<= 2 ulp),
16-lane f32 sums of S terms and one division per output: with |scores| = O(1)
the result error is below (D + S + 4) * u relative to max |out| (~2e-5 at
S = 130 in the worst case, ~1e-6 typically); we assert 1e-5 relative as
tests/kernels/test_fast_sdpa.py does, far below any real bug (a wrong mask,
scale or row is an O(1) error).
"""
import numpy as np
import pytest

from graph_api.kernels import sdpa as SD
from graph_api.kernels.sdpa import prefill
from tests.kernels.test_fast_sdpa import ref

CASES = [  # B, Hq, Hkv, Sq, S, D
    (2, 4, 4, 64, 64, 32),    # the BERT shape (smaller batch)
    (1, 4, 2, 37, 70, 16),    # GQA, query block tail, S not a multiple of 32
    (1, 2, 1, 40, 130, 48),   # MQA, D = 16 (mod 32)
    (1, 2, 2, 100, 33, 64),   # more queries than keys
    (1, 2, 1, 72, 300, 32),   # several P V position blocks (PV_TB) and score column blocks
]


@pytest.fixture(params=[False, True], ids=["wide", "narrow"])
def blocks(request, monkeypatch):
    """Both register-block shapes of the score and P V products (4 x 32 lanes for
    AVX-512, 4 x 16 for AVX2), whatever this CPU has."""
    monkeypatch.setattr(prefill, "NARROW", request.param)
    return request.param


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mask_shape", [None, "b11s", "bhqs"])
@pytest.mark.parametrize("causal", [None, "top_left", "bottom_right"])
def test_prefill_matches_float64(case, mask_shape, causal, blocks):
    B, Hq, Hkv, Sq, S, D = case
    assert prefill.usable(0, 0, 0, 0, D, S, Sq, 0, 0)
    rng = np.random.default_rng(abs(hash(case + (mask_shape, causal))) % 2**32)
    q = rng.standard_normal((B, Hq, Sq, D)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    mask = {None: None, "b11s": (B, 1, 1, S), "bhqs": (B, Hq, Sq, S)}[mask_shape]
    if mask is not None:
        mask = rng.standard_normal(mask).astype(np.float32)
        mask[..., -S // 8:] = -1e4  # BERT's padding
    K, V = SD.KV(k, "f32", k.shape), SD.KV(v, "f32", v.shape)
    for scale, mode in ((0.125, "mul"), (np.sqrt(D), "div")):
        o = SD.sdpa(q, K, V, scale=scale, scale_mode=mode, mask=mask, causal=causal)
        r = ref(q, k, v, scale if mode == "mul" else 1 / scale, mask, causal)
        live = np.isfinite(r)  # bottom_right with Sq > S hides whole rows: NaN in both
        assert np.array_equal(live, np.isfinite(o)), (scale, mode)
        assert np.max(np.abs(o[live] - r[live])) <= 1e-5 * np.max(np.abs(r[live])), (scale, mode)


@pytest.mark.parametrize("case", CASES)
def test_block_shapes_give_equal_results(case, monkeypatch):
    """The 4 x 16 and 4 x 32 register blocks sum the same products in the same order."""
    B, Hq, Hkv, Sq, S, D = case
    rng = np.random.default_rng(sum(case))
    q = rng.standard_normal((B, Hq, Sq, D)).astype(np.float32)
    k, v = (rng.standard_normal((B, Hkv, S, D)).astype(np.float32) for _ in range(2))
    mask = rng.standard_normal((B, 1, 1, S)).astype(np.float32)
    outs = []
    for narrow in (False, True):
        monkeypatch.setattr(prefill, "NARROW", narrow)
        outs.append(SD.sdpa(q, SD.KV(k, "f32", k.shape), SD.KV(v, "f32", v.shape), mask=mask,
                            causal="top_left"))
    assert np.array_equal(outs[0], outs[1])


def test_fully_masked_row_is_nan_and_other_rows_unaffected(blocks):
    rng = np.random.default_rng(5)
    B, H, Sq, S, D = 1, 2, 16, 40, 32
    q, k, v = (rng.standard_normal((B, H, n, D)).astype(np.float32) for n in (Sq, S, S))
    mask = np.zeros((B, H, Sq, S), np.float32)
    mask[0, 1, 3] = -np.inf
    o = SD.sdpa(q, SD.KV(k, "f32", k.shape), SD.KV(v, "f32", v.shape), mask=mask)
    assert np.isnan(o[0, 1, 3]).all() and np.isfinite(np.delete(o[0, 1], 3, axis=0)).all()
    r = ref(q, k, v, 1 / np.sqrt(D), np.where(np.isinf(mask), 0, mask), None)
    ok = np.ones(o.shape, bool)
    ok[0, 1, 3] = False
    assert np.max(np.abs(o[ok] - r[ok])) <= 1e-5 * np.max(np.abs(r))


def test_usable_only_for_f32_prefill():
    assert not prefill.usable(0, 0, 0, 0, 32, 64, 8, 0, 0)     # decode: its own kernels
    assert not prefill.usable(0, 5, 0, 0, 32, 64, 64, 0, 0)    # int4 K
    assert not prefill.usable(0, 0, 0, 1, 32, 64, 64, 0, 0)    # K stored [D, S]
    assert not prefill.usable(0, 0, 0, 0, 32, 64, 64, 1, 0)    # bf16 fpmath rounding
    assert not prefill.usable(0, 0, 0, 0, 32, 64, 64, 0, 1)    # bf16 output
    assert not prefill.usable(0, 0, 0, 0, 24, 64, 64, 0, 0)    # D not a multiple of 16
    assert not prefill.usable(0, 0, 0, 0, 32, 8192, 64, 0, 0)  # long KV: the tiled kernel


@pytest.mark.parametrize("out_layout", ["bhsd", "bs(hd)"])  # (a lone transpose is its own partition)
def test_partition_writes_the_output_layout_directly(out_layout):
    """A BERT attention partition (scores / scale + mask, SoftMax, P V, then the output
    chain) computes straight into the output tensor through the chain's transpose and
    reshape (a strided view of the [B, S, H, D] rows); the numbers are those of the
    float64 formula laid out the same way (tolerance: the module docstring's)."""
    import graph_api as ga
    from tests.patterns.builder import G, K

    B, H, S, D = 2, 3, 40, 32
    g = G()
    q, k, v = (g.input((B, H, S, D)) for _ in range(3))
    scale, mask = g.input((1,)), g.input((B, 1, 1, S))
    s = g.op(K.MatMul, q, k, attrs={"transpose_b": True})
    p = g.op(K.SoftMax, g.op(K.Add, g.op(K.Divide, s, scale), mask), attrs={"axis": -1})
    c = g.op(K.MatMul, p, v)
    if out_layout != "bhsd":
        c = g.op(K.StaticTranspose, c, attrs={"order": [0, 2, 1, 3]})
    if out_layout == "bs(hd)":
        c = g.op(K.StaticReshape, c, attrs={"shape": [B, S, H * D], "special_zero": False})
    graph = g.done()
    rng = np.random.default_rng(11)
    feeds = {t.id: rng.standard_normal((B, H, S, D)).astype(np.float32) for t in (q, k, v)}
    feeds[scale.id] = np.array([np.sqrt(D)], np.float32)
    feeds[mask.id] = np.where(np.arange(S) >= S - 5, -1e4, 0).astype(np.float32).reshape(1, 1, 1, S) \
        * np.ones((B, 1, 1, 1), np.float32)
    compiled = ga.compile_graph(graph, feeds)
    assert [c_.plan.name for _, c_, _, _ in compiled.steps] == ["numba_sdpa"]
    (out_id,) = graph.output_ids
    got = compiled(feeds)[out_id]
    r = ref(feeds[q.id], feeds[k.id], feeds[v.id], 1 / np.sqrt(D), feeds[mask.id], None)
    if out_layout != "bhsd":
        r = r.transpose(0, 2, 1, 3)
    r = r.reshape(got.shape)
    assert np.max(np.abs(got - r)) <= 1e-5 * np.max(np.abs(r))


@pytest.mark.parametrize("case", CASES)
def test_one_pass_softmax_rows_equal_the_separate_steps(case, blocks):
    """Rows whose mask row is contiguous (or no mask) take ``_scaled_softmax_row`` (scale,
    mask and max in one pass, exponentials and sums in another; a causal row's hidden
    positions -inf); a mask broadcast along the keys (element stride 0) takes the
    separate row steps.  The same values through both: equal results (rows a
    bottom-right causal mask hides entirely are NaN in both)."""
    B, Hq, Hkv, Sq, S, D = case
    rng = np.random.default_rng(sum(case) + 1)
    q = rng.standard_normal((B, Hq, Sq, D)).astype(np.float32)
    k, v = (rng.standard_normal((B, Hkv, S, D)).astype(np.float32) for _ in range(2))
    K, V = SD.KV(k, "f32", k.shape), SD.KV(v, "f32", v.shape)
    per_row = rng.standard_normal((B, 1, Sq, 1)).astype(np.float32)
    for scale, mode, causal in ((0.125, "mul", None), (np.sqrt(D), "div", None), (0.125, "mul", "top_left"),
                                (0.125, "mul", "bottom_right")):
        fused = SD.sdpa(q, K, V, scale=scale, scale_mode=mode, mask=np.repeat(per_row, S, axis=-1), causal=causal)
        separate = SD.sdpa(q, K, V, scale=scale, scale_mode=mode, mask=per_row, causal=causal)
        assert np.array_equal(fused, separate, equal_nan=True), (scale, mode, causal)


def test_prefill_runner_reads_the_arrays_at_each_call(blocks):
    """``prefill_runner`` binds the kernel's arguments to the arrays' memory once: each
    call computes what :func:`sdpa` computes from their current values, into the given
    output view; arrays that would need a per-call copy give None."""
    B, Hq, Hkv, Sq, S, D = CASES[0]
    rng = np.random.default_rng(3)
    q = rng.standard_normal((B, Hq, Sq, D)).astype(np.float32)
    k, v = (rng.standard_normal((B, Hkv, S, D)).astype(np.float32) for _ in range(2))
    K, V = SD.KV(k, "f32", k.shape), SD.KV(v, "f32", v.shape)
    mask = np.zeros((B, 1, 1, S), np.float32)
    rows = np.empty((B, Sq, Hq, D), np.float32)  # the [B, S, H, D] layout BERT's output chain wants
    out = rows.transpose(0, 2, 1, 3)
    run = SD.prefill_runner(q, K, V, scale=0.125, mask=mask, out=out)
    for _ in range(2):
        run()
        assert np.array_equal(out, SD.sdpa(q, K, V, scale=0.125, mask=mask))
        q *= -1.5  # new values in the same memory
        k[:, :, ::3] += 1.0
        mask[..., -S // 4:] = -1e4
    assert SD.prefill_runner(np.asfortranarray(q), K, V, scale=0.125, mask=mask, out=out) is None
    assert SD.prefill_runner(q, K, V, scale=0.125, mask=mask.astype(np.float64), out=out) is None
    assert SD.prefill_runner(q, K, V, scale=0.125, mask=mask, out=out.astype(np.float16)) is None


@pytest.mark.parametrize("case", CASES)
def test_strided_rows_read_in_place(case, blocks):
    """Q, K and V as the heads of [B, S, H, D] buffers (strided views, rows contiguous,
    as a projection's output viewed through a transpose) give the results of their
    C-order copies, bit for bit: the kernel reads the rows where they are."""
    B, Hq, Hkv, Sq, S, D = case
    rng = np.random.default_rng(sum(case) + 2)
    q = rng.standard_normal((B, Sq, Hq, D)).astype(np.float32).transpose(0, 2, 1, 3)
    k, v = (rng.standard_normal((B, S, Hkv, D)).astype(np.float32).transpose(0, 2, 1, 3) for _ in range(2))
    mask = rng.standard_normal((B, 1, 1, S)).astype(np.float32)
    strided = SD.sdpa(q, SD.KV(k, "f32", k.shape), SD.KV(v, "f32", v.shape), mask=mask, causal="top_left")
    qc, kc, vc = (np.ascontiguousarray(a) for a in (q, k, v))
    dense = SD.sdpa(qc, SD.KV(kc, "f32", kc.shape), SD.KV(vc, "f32", vc.shape), mask=mask, causal="top_left")
    assert np.array_equal(strided, dense)

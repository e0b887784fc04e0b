"""The fpmath-bf16 int4 decode kernel (vdpbf16ps) vs a float64 formula.

Reference: ``y64 = bf16(x) @ ((q - z) * s)`` in float64, the activations
rounded to bf16 (RNE, ml_dtypes) and the weights' integers and scales exact:
what the kernel computes (see ``kernels/weight_compressed/wgemv4_bf16.py``: the scale multiplies
the group's sum).  Tolerance, from f32 accumulation of exact products: per
group at most G roundings of the partial sum (two per ``vdpbf16ps`` lane
step, one per product), one for ``z * xs`` and one for the subtraction, then
one per scaled group sum added (K/G) and one per K-split partial added, each
at most ``u = 2**-24`` relative to a sum bounded by
``B = |bf16(x)| @ ((|q| + |z|) |s|)``: ``|y - y64| <= (G + K/G + 4) u B``; the
inputs are normal numbers, so the flush-to-zero term of the bound is 0.
"""
import ml_dtypes
import numpy as np
import pytest

from graph_api.kernels.weight_compressed import wgemv4_bf16 as B4
from graph_api.kernels.weight_compressed import wmatmul as W
from graph_api.kernels.bits import RND_BF16

from .test_fast_wmatmul import U, make, ref

needs_bf16 = pytest.mark.skipif(not B4.HAVE_BF16, reason="the CPU has no AVX512_BF16")


def bf16(a):
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def ref_scaled(xb64, q, sc, z, G):
    """float64 ``xb @ ((q - z) s)`` and the bound ``|xb| @ ((|q| + |z|) |s|)``."""
    s = np.repeat(sc, G, 0).astype(np.float64)
    zz = 0 if z is None else np.repeat(z, G, 0)
    return xb64 @ ((q - zz) * s), np.abs(xb64) @ ((np.abs(q) + np.abs(zz)) * s)


def test_pair_layout_holds_every_weight_where_the_doc_says():
    rng = np.random.default_rng(1)
    K, Np = 6, 256
    q = rng.integers(-8, 8, (K, Np))
    stream = B4.pack_pairs(q)
    words = stream[:-64].view("<u2").reshape(Np // 128, K // 2, 2, 32)  # [b, kp, h, word]
    for k in range(K):
        for n in range(Np):
            b, c = divmod(n, 128)
            h, c = divmod(c, 64)
            j, i = divmod(c, 16)
            nib = (int(words[b, k // 2, h, 2 * i + k % 2]) >> (4 * j)) & 15
            assert nib == q[k, n] & 15


@pytest.mark.parametrize("signed", [True, False])
def test_lookup_table_is_the_nibble_value_in_bf16(signed):
    t = B4.lookup_table(signed).view(np.uint16).astype(np.uint32) << 16
    vals = t.view(np.float32)
    want = [(i & 15) - 16 if signed and (i & 15) >= 8 else i & 15 for i in range(32)]
    assert vals.tolist() == want


SHAPES = [(1, 256, 256, 32), (1, 128, 130, 64), (2, 96, 1, 32), (3, 128, 200, 128), (4, 256, 384, 64),
          (5, 64, 127, 32), (7, 192, 256, 64), (8, 256, 129, 128), (1, 4096, 256, 128), (1, 16, 130, 4),
          (6, 8, 20, 2)]


@needs_bf16
@pytest.mark.parametrize("kind,zp", [("s4", False), ("u4", True), ("u4", False), ("s4", True)])
@pytest.mark.parametrize("M,K,N,G", SHAPES)
def test_bf16_decode_matches_the_scaled_float64_formula(kind, zp, M, K, N, G):
    rng = np.random.default_rng(hash((kind, zp, M, K, N, G)) % 2**32)
    trans = M % 2 == 0  # both user orientations
    q, sc, z, w, scu, zu = make(kind, K, N, G, trans, zp, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    spec = W.WeightSpec(kind, K, N, G, trans)
    pw = W.prepare_bf16(w, spec, scu, zu)
    y = W.wmatmul(x, None, spec, prepared=pw, rnd_x=RND_BF16, rnd_w=RND_BF16)
    r, b = ref_scaled(bf16(x).astype(np.float64), q, sc, z, G)
    assert np.all(np.abs(y - r) <= (G + K // G + 4) * U * b), np.max(np.abs(y - r) / b)


@needs_bf16
def test_bf16_activation_data_takes_the_kernel_unrounded():
    rng = np.random.default_rng(2)
    M, K, N, G = 3, 256, 256, 32
    q, sc, z, w, scu, zu = make("u4", K, N, G, False, True, rng)
    x = rng.standard_normal((M, K)).astype(ml_dtypes.bfloat16)
    spec = W.WeightSpec("u4", K, N, G, False)
    y = W.wmatmul(x, None, spec, prepared=W.prepare_bf16(w, spec, scu, zu), rnd_w=RND_BF16)
    r, b = ref_scaled(x.astype(np.float64), q, sc, z, G)
    assert np.all(np.abs(y - r) <= (G + K // G + 4) * U * b)


@pytest.mark.parametrize("have_bf16", [True, False])
@pytest.mark.parametrize("M,act", [(1, "f32"), (4, "f32"), (12, "f32"), (2, "f16")])
def test_both_paths(monkeypatch, have_bf16, M, act):
    """With the kernel (decode, bf16 activations) the scaled formula; without it
    (no AVX512_BF16, prefill, f16 activations that bf16 fpmath leaves alone) the
    reference arithmetic: dequantized weights rounded to bf16, then f32 sums."""
    if have_bf16 and not B4.HAVE_BF16:
        pytest.skip("the CPU has no AVX512_BF16")
    monkeypatch.setattr(B4, "HAVE_BF16", have_bf16)
    rng = np.random.default_rng(3)
    K, N, G = 128, 256, 32
    q, sc, z, w, scu, zu = make("s4", K, N, G, True, False, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    xin = x if act == "f32" else x.astype(np.float16)
    spec = W.WeightSpec("s4", K, N, G, True)
    y = W.wmatmul(xin, None, spec, prepared=W.prepare_bf16(w, spec, scu, zu), rnd_x=RND_BF16 if act == "f32" else 0,
                  rnd_w=RND_BF16)
    x64 = (bf16(x) if act == "f32" else xin).astype(np.float64)
    if have_bf16 and M <= W.DECODE_MAX_M and act == "f32":
        r, b = ref_scaled(x64, q, sc, z, G)
        terms = G + K // G
    else:  # the prefill path: BLAS sums (any order) of the bf16-rounded dequantized weights
        r, b = ref(x64, q, sc, z, G, "s4", bf16)
        terms = K
    assert np.all(np.abs(y - r) <= (terms + 4) * U * b)


@needs_bf16
@pytest.mark.parametrize("m", [1, 5])
def test_partition_with_bf16_fpmath_and_apply_to_int_takes_the_kernel(m):
    """A constant int4 weight under fpmath bf16 + apply_to_int: the compiled
    partition's decode computes the scaled formula (within the f32 bound, which
    rounding each dequantized weight to bf16 would exceed)."""
    from graph_api import DataType as dt
    from graph_api import OpKind as K

    from .test_fused_wmatmul import Builder

    b = Builder("bf16", True)
    Kd, N, G = 256, 128, 32
    w = b.compressed_weight(dt.u4, Kd, N, True, group=G, zps=True)
    x = b.input(dt.f32, [m, Kd])
    b.op(K.MatMul, [x, w], dt.f32, [m, N], transpose_b=True)
    fused = b.run("numba_wmatmul")
    deq = next(op for op in b.g.get_ops() if op.kind == K.DynamicDequantize)
    q, sc, z = (np.asarray(b.feeds[t.id]).astype(np.float64) for t in deq.inputs)
    xb = bf16(b.feeds[x.id]).astype(np.float64)
    r, bound = ref_scaled(xb, q.T, sc.T, z.T, G)
    y = fused.outputs[b.g.output_ids[0]]
    assert np.all(np.abs(y - r) <= (G + Kd // G + 4) * U * bound)


def test_odd_groups_and_8_bit_weights_are_not_packed():
    for kind, G in (("s4", 3), ("s8", 32)):
        with pytest.raises(ValueError):
            W.prepare_bf16(None, W.WeightSpec(kind, 96, 16, G, False), None)
        assert not W.bf16_decode_applies(W.WeightSpec(kind, 96, 16, G, False))

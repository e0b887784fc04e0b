"""MatMul, Convolution, ConvTranspose, MaxPool and AvgPool cases.

The expected values are explicit index loops (``math.fsum`` for the
contractions), with the layouts and paddings re-derived from the attributes.
"""
from __future__ import annotations

import math

import numpy as np

from graph_api.enums import OpKind as K

from .records import (In, OpCase, Out, as_f64, bf16_rne, broadcast_index, each, f16_rne,
                      product_range, tf32_rne)

FLOATS = ("f32", "bf16", "f16")


# ------------------------------------------------------------------- MatMul
def matmul_loops(a, b) -> np.ndarray:
    """(..., M, K) x (..., K, N) with broadcast batch dims, exact sums."""
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m_size, k_size, n_size = a.shape[-2], a.shape[-1], b.shape[-1]
    out = np.zeros(batch + (m_size, n_size))
    for bi in np.ndindex(batch):
        ai, bj = broadcast_index(bi, a.shape[:-2]), broadcast_index(bi, b.shape[:-2])
        for m, n in product_range(m_size, n_size):
            out[bi + (m, n)] = math.fsum(a[ai + (m, k)] * b[bj + (k, n)] for k in range(k_size))
    return out


def matmul_expected(round_input=None, round_acc=None):
    def expected(inputs, attrs):
        a, b = as_f64(inputs[0]), as_f64(inputs[1])
        if round_input:
            a, b = each(round_input, a), each(round_input, b)
        if attrs.get("transpose_a") and a.ndim > 1:
            a = np.swapaxes(a, -1, -2)
        if attrs.get("transpose_b") and b.ndim > 1:
            b = np.swapaxes(b, -1, -2)
        out = matmul_loops(a.reshape(1, -1) if a.ndim == 1 else a,
                           b.reshape(-1, 1) if b.ndim == 1 else b)
        if a.ndim == 1:
            out = out.reshape(out.shape[:-2] + out.shape[-1:])
        if b.ndim == 1:
            out = out.reshape(out.shape[:-1])
        if round_acc:
            out = each(round_acc, out)
        if len(inputs) > 2:
            out = out + as_f64(inputs[2])
        return [out]

    return expected


MATMUL_SHAPES = (  # a, b, bias, out, attrs
    ((3, 4), (4, 5), None, (3, 5), {}),
    ((2, 1, 3, 4), (3, 4, 5), (5,), (2, 3, 3, 5), {}),
    ((2, 4, 3), (5, 4), (1, 5), (2, 3, 5), {"transpose_a": True, "transpose_b": True}),
    ((4,), (2, 4, 5), None, (2, 5), {}),
    ((2, 3, 4), (4,), None, (2, 3), {}),
    ((6,), (6,), None, (), {}),
)


def matmul_cases():
    cases = []
    for dt in FLOATS:
        for i, (sa, sb, sbias, so, attrs) in enumerate(MATMUL_SHAPES):
            ins = (In(sa, dt), In(sb, dt)) + ((In(sbias, dt),) if sbias else ())
            cases.append(OpCase(f"MatMul_{dt}_{i}", K.MatMul, ins, (Out(so, dt),),
                                matmul_expected(), attrs, seed=2000 + len(cases)))
    for dt in ("bf16", "f16"):  # low-precision inputs, f32 dst
        cases.append(OpCase(f"MatMul_{dt}_to_f32", K.MatMul, (In((3, 8), dt), In((8, 4), dt)),
                            (Out((3, 4), "f32"),), matmul_expected(), seed=2100 + len(cases)))
    for mode, rnd in (("bf16", bf16_rne), ("f16", f16_rne), ("tf32", tf32_rne)):
        cases.append(OpCase(f"MatMul_f32_fpmath_{mode}", K.MatMul, (In((4, 16)), In((16, 3))),
                            (Out((4, 3)),), matmul_expected(round_input=rnd),
                            seed=2200 + len(cases), fpmath=mode))
    cases.append(OpCase("MatMul_f32_acc_f16", K.MatMul, (In((4, 16)), In((16, 3))), (Out((4, 3)),),
                        matmul_expected(round_acc=f16_rne), {"accumulation_mode": "f16"},
                        seed=2300))
    for dt in ("f32", "bf16"):  # extension: the batch summed into one tile
        cases.append(OpCase(f"BatchReduceMatMul_{dt}", K.BatchReduceMatMul,
                            (In((3, 4, 5), dt), In((3, 5, 2), dt)), (Out((4, 2), dt),),
                            batch_reduce_expected, seed=2400 + len(cases)))
    return cases


def batch_reduce_expected(inputs, attrs):
    """out[m, n] = sum over b and k of A[b, m, k] B[b, k, n], one exact sum."""
    a, b = as_f64(inputs[0]), as_f64(inputs[1])
    out = np.zeros((a.shape[1], b.shape[2]))
    for m, n in product_range(a.shape[1], b.shape[2]):
        out[m, n] = math.fsum(a[i, m, k] * b[i, k, n]
                              for i in range(a.shape[0]) for k in range(a.shape[2]))
    return [out]


# -------------------------------------------------------------- conv layouts
def to_ncx(x, fmt):
    """NXC (N, X..., C) -> (N, C, X...) by an explicit permutation."""
    return x if fmt == "NCX" else np.transpose(x, (0, x.ndim - 1) + tuple(range(1, x.ndim - 1)))


def from_ncx(x, fmt):
    return x if fmt == "NCX" else np.transpose(x, (0,) + tuple(range(2, x.ndim)) + (1,))


def weights_oix(w, fmt):
    """XIO / XOI / IOX / OIX -> (first channel dim, second channel dim, X...)."""
    nsp = w.ndim - 2
    if fmt in ("XIO", "XOI"):
        perm = (nsp + 1, nsp) if fmt == "XIO" else (nsp, nsp + 1)
        return np.transpose(w, perm + tuple(range(nsp)))
    if fmt == "IOX":
        return np.transpose(w, (1, 0) + tuple(range(2, w.ndim)))
    return w


def same_pads(size, stride, eff, auto_pad, deconv=False):
    """SAME_* padding: total = (ceil(I/s) - 1) s + eff - I (conv/pool), eff - s (deconv)."""
    total = eff - stride if deconv else (-(-size // stride) - 1) * stride + eff - size
    total = max(total, 0)
    begin = (total + 1) // 2 if auto_pad == "SAME_LOWER" else total // 2
    return begin, total - begin


def geometry(attrs, in_sp, kernel, deconv=False):
    nsp = len(in_sp)
    strides = attrs.get("strides", [1] * nsp)
    dil = attrs.get("dilations") or [1] * nsp
    begin, end = list(attrs.get("pads_begin", [0] * nsp)), list(attrs.get("pads_end", [0] * nsp))
    auto = attrs.get("auto_pad", "None")
    for i in range(nsp):
        eff = (kernel[i] - 1) * dil[i] + 1
        if auto == "VALID":
            begin[i] = end[i] = 0
        elif auto in ("SAME_UPPER", "SAME_LOWER"):
            begin[i], end[i] = same_pads(in_sp[i], strides[i], eff, auto, deconv)
    return strides, dil[:nsp], begin, end


def _conv_expected(inputs, attrs):
    fmt = attrs.get("data_format", "NXC")
    x = to_ncx(as_f64(inputs[0]), fmt)
    w = weights_oix(as_f64(inputs[1]), attrs.get("weights_format", "XIO"))
    g = attrs.get("groups", 1)
    n_size, in_sp = x.shape[0], x.shape[2:]
    oc_size, icg, kernel = w.shape[0], w.shape[1], w.shape[2:]
    strides, dil, begin, end = geometry(attrs, in_sp, kernel)
    out_sp = [(i + b + e - (k - 1) * d - 1) // s + 1
              for i, b, e, k, d, s in zip(in_sp, begin, end, kernel, dil, strides)]
    ocg = oc_size // g
    out = np.zeros((n_size, oc_size) + tuple(out_sp))
    for n, oc in product_range(n_size, oc_size):
        grp = oc // ocg
        for o in product_range(*out_sp):
            terms = []
            for c in range(icg):
                for k in product_range(*kernel):
                    pos = [oo * s - b + kk * d for oo, s, b, kk, d in zip(o, strides, begin, k, dil)]
                    if all(0 <= p < size for p, size in zip(pos, in_sp)):
                        terms.append(x[(n, grp * icg + c) + tuple(pos)] * w[(oc, c) + k])
            out[(n, oc) + o] = math.fsum(terms)
    if len(inputs) > 2:
        out += as_f64(inputs[2]).reshape((1, -1) + (1,) * len(in_sp))
    return [from_ncx(out, fmt)]


def _deconv_expected(inputs, attrs):
    fmt = attrs.get("data_format", "NXC")
    x = to_ncx(as_f64(inputs[0]), fmt)
    w = weights_oix(as_f64(inputs[1]), attrs.get("weights_format", "XOI"))  # (OCg, IC, K)
    g = attrs.get("groups", 1)
    n_size, ic_size, in_sp = x.shape[0], x.shape[1], x.shape[2:]
    ocg, kernel = w.shape[0], w.shape[2:]
    icg = ic_size // g
    strides, dil, begin, end = geometry(attrs, in_sp, kernel, deconv=True)
    pad_out = attrs.get("output_padding") or [0] * len(in_sp)
    out_sp = [(i - 1) * s + (k - 1) * d + 1 - b - e + op
              for i, s, k, d, b, e, op in zip(in_sp, strides, kernel, dil, begin, end, pad_out)]
    out = np.zeros((n_size, ocg * g) + tuple(out_sp))
    for n, ic in product_range(n_size, ic_size):
        grp = ic // icg
        for xi in product_range(*in_sp):
            for oc, k in ((oc, k) for oc in range(ocg) for k in product_range(*kernel)):
                pos = [p * s + kk * d - b for p, s, kk, d, b in zip(xi, strides, k, dil, begin)]
                if all(0 <= p < size for p, size in zip(pos, out_sp)):
                    out[(n, grp * ocg + oc) + tuple(pos)] += x[(n, ic) + xi] * w[(oc, ic) + k]
    if len(inputs) > 2:
        out += as_f64(inputs[2]).reshape((1, -1) + (1,) * len(in_sp))
    return [from_ncx(out, fmt)]


CONV_CONFIGS = (  # src, weights, bias, out, attrs
    ((2, 3, 6, 6), (4, 3, 3, 3), (4,), (2, 4, 3, 3),
     dict(strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1],
          data_format="NCX", weights_format="OIX")),
    ((1, 7, 7, 4), (3, 3, 2, 6), None, (1, 3, 3, 6),
     dict(strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[2, 2], groups=2)),
    ((2, 2, 9), (3, 2, 3), (3,), (2, 3, 5),
     dict(strides=[2], pads_begin=[0], pads_end=[0], dilations=[1], auto_pad="SAME_UPPER",
          data_format="NCX", weights_format="OIX")),
)
DECONV_CONFIGS = (
    ((1, 4, 3, 3), (4, 2, 3, 3), (2,), (1, 2, 6, 6),
     dict(strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1],
          output_padding=[1, 1], data_format="NCX", weights_format="IOX")),
    ((2, 3, 3, 4), (2, 2, 3, 4), None, (2, 5, 5, 6),
     dict(strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[2, 2], groups=2)),
    ((1, 2, 4), (2, 3, 3), (3,), (1, 3, 8),
     dict(strides=[2], pads_begin=[0], pads_end=[0], dilations=[1], auto_pad="SAME_UPPER",
          data_format="NCX", weights_format="IOX")),
)


def rounded_inputs(expected, rnd, count=2):
    """``expected`` on the first ``count`` inputs rounded by ``rnd`` (fpmath)."""
    return lambda ins, attrs: expected([each(rnd, x) for x in ins[:count]] + list(ins[count:]), attrs)


def conv_cases():
    cases = []
    for kind, configs, expected in ((K.Convolution, CONV_CONFIGS, _conv_expected),
                                    (K.ConvTranspose, DECONV_CONFIGS, _deconv_expected)):
        for dt in FLOATS:
            for i, (sx, sw, sb, so, attrs) in enumerate(configs):
                ins = (In(sx, dt), In(sw, dt)) + ((In(sb, dt),) if sb else ())
                cases.append(OpCase(f"{kind.name}_{dt}_{i}", kind, ins, (Out(so, dt),), expected,
                                    attrs, seed=2400 + len(cases)))
        sx, sw, sb, so, attrs = configs[0]  # fpmath rounds f32 src and weights, not the bias
        for mode, rnd in (("bf16", bf16_rne), ("tf32", tf32_rne)):
            cases.append(OpCase(f"{kind.name}_f32_fpmath_{mode}", kind,
                                (In(sx), In(sw), In(sb)), (Out(so),), rounded_inputs(expected, rnd),
                                attrs, seed=2500 + len(cases), fpmath=mode))
    return cases


# ------------------------------------------------------------------ pooling
def _pool_expected(is_max):
    def expected(inputs, attrs):
        fmt = attrs.get("data_format", "NXC")
        x = to_ncx(as_f64(inputs[0]), fmt)
        kernel = attrs["kernel"]
        in_sp = x.shape[2:]
        strides, dil, begin, end = geometry(attrs, in_sp, kernel)
        if not is_max:
            dil = [1] * len(kernel)
        ceil = attrs.get("rounding_type") == "ceil"
        out_sp = []
        for i, b, e, k, d, s in zip(in_sp, begin, end, kernel, dil, strides):
            span = i + b + e - (k - 1) * d - 1
            out_sp.append((-(-span // s) if ceil else span // s) + 1)
        out = np.zeros(x.shape[:2] + tuple(out_sp))
        for n, c in product_range(*x.shape[:2]):
            for o in product_range(*out_sp):
                vals = []
                for k in product_range(*kernel):
                    pos = [oo * s - b + kk * d for oo, s, b, kk, d in zip(o, strides, begin, k, dil)]
                    if all(0 <= p < size for p, size in zip(pos, in_sp)):
                        vals.append(x[(n, c) + tuple(pos)])
                if is_max:
                    out[(n, c) + o] = max(vals)
                else:
                    exclude = attrs.get("exclude_pad") or ceil  # oneDNN's ceil-mode quirk
                    out[(n, c) + o] = math.fsum(vals) / (len(vals) if exclude else math.prod(kernel))
        return [from_ncx(out, fmt)]

    return expected


MAXPOOL_CONFIGS = (
    ((2, 3, 7, 7), (2, 3, 4, 4), dict(kernel=[3, 3], strides=[2, 2], pads_begin=[1, 1],
                                      pads_end=[1, 1], data_format="NCX")),
    ((2, 6, 6, 3), (2, 2, 2, 3), dict(kernel=[2, 2], strides=[2, 2], pads_begin=[0, 0],
                                      pads_end=[0, 0], dilations=[2, 2])),
    ((1, 2, 6, 6), (1, 2, 3, 3), dict(kernel=[3, 3], strides=[2, 2], pads_begin=[0, 0],
                                      pads_end=[0, 0], rounding_type="ceil", data_format="NCX")),
    ((1, 2, 5, 5), (1, 2, 3, 3), dict(kernel=[3, 3], strides=[2, 2], pads_begin=[0, 0],
                                      pads_end=[0, 0], auto_pad="SAME_UPPER", data_format="NCX")),
)
AVGPOOL_CONFIGS = (
    ((2, 3, 6, 6), (2, 3, 3, 3), dict(kernel=[3, 3], strides=[2, 2], pads_begin=[1, 1],
                                      pads_end=[1, 1], exclude_pad=False, data_format="NCX")),
    ((2, 3, 6, 6), (2, 3, 3, 3), dict(kernel=[3, 3], strides=[2, 2], pads_begin=[1, 1],
                                      pads_end=[1, 1], exclude_pad=True, data_format="NCX")),
    ((1, 5, 5, 2), (1, 3, 3, 2), dict(kernel=[2, 2], strides=[2, 2], pads_begin=[0, 0],
                                      pads_end=[0, 0], exclude_pad=False, rounding_type="ceil")),
)


def pool_cases():
    cases = []
    for kind, configs, is_max in ((K.MaxPool, MAXPOOL_CONFIGS, True),
                                  (K.AvgPool, AVGPOOL_CONFIGS, False)):
        for dt in FLOATS:
            for i, (sx, so, attrs) in enumerate(configs):
                cases.append(OpCase(f"{kind.name}_{dt}_{i}", kind, (In(sx, dt),), (Out(so, dt),),
                                    _pool_expected(is_max), attrs, seed=2600 + len(cases)))
    return cases


def compute_cases():
    return matmul_cases() + conv_cases() + pool_cases()

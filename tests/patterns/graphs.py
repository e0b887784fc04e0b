"""Small canonical graphs for every pattern, with knobs that break them.

Each factory returns a finalized graph.  ``leak=<role>`` adds an outside
consumer (an Abs) of that role's output, which must stop the fusion.
"""
from __future__ import annotations

import graph_api as ga

from .builder import G, K, dt

B, H, S, D = 1, 2, 8, 8  # batch, heads, sequence, head size
HS = ga.PropertyType.host_scalar


def _leak(g, leak, name, t):
    if leak == name:
        g.op(K.Abs, t, name="leak")
    return t


def sdpa(dtype=dt.f32, scale="div", mask="add", softcap=False, dropout=False, prob_cast=False,
         out=None, stats=False, pre_select=False, k_dequant=None, v_dequant=None, kv_cast=False,
         softmax_axis=-1, causal_axis=-2, leak=None, fpmath="strict", apply_to_int=False,
         scale_host=False, s=S):
    """Q K^T -> scale -> masks -> SoftMax -> [Dropout] -> [TypeCast] -> @V -> [transpose+reshape].

    ``k_dequant``/``v_dequant``: an int dtype makes K/V DynamicDequantize outputs
    (per-group over the head dim, with zero points).  ``mask``: None, 'add',
    'select', 'causal' (top-left) or 'causal_br' (bottom-right).
    """
    g = G(fpmath, apply_to_int)
    score_dt = dt.f32
    q = g.input((B, H, s, D), dtype)
    if k_dequant is not None:
        k = _dequant(g, (B, H, D, s), k_dequant, dtype, axis=2, name="k_dequant", cast=kv_cast)
        qk = g.op(K.MatMul, q, k, dtype=score_dt, name="qk")
    else:
        k = g.input((B, H, s, D), dtype)
        qk = g.op(K.MatMul, q, k, dtype=score_dt, attrs={"transpose_b": True}, name="qk")
    x = _leak(g, leak, "qk", qk)
    if pre_select:
        x = g.op(K.Select, g.input((1, 1, s, s), dt.boolean), x, g.input((1,)), dtype=score_dt,
                 name="pre_select")
    if scale:
        sc = g.scalar() if scale_host else g.input((1,))
        x = g.op(K.Divide if scale == "div" else K.Multiply, x, sc, name="scale")
        x = _leak(g, leak, "scale", x)
    if softcap:
        x = g.op(K.Multiply, g.op(K.Tanh, x, name="tanh"), g.input((1,)), name="softcap")
    if mask in ("causal", "causal_br"):
        row = g.op(K.GenIndex, x, dtype=dt.s32, attrs={"axis": causal_axis}, name="row")
        col = g.op(K.GenIndex, x, dtype=dt.s32, attrs={"axis": -1}, name="col")
        if mask == "causal_br":
            row = g.op(K.Subtract, g.op(K.Add, row, g.scalar(dt.s32)), g.scalar(dt.s32))
        cond = g.op(K.GreaterEqual, row, col, dtype=dt.boolean, name="ge")
        x = g.op(K.Select, cond, x, g.input((1,)), dtype=score_dt, name="causal_select")
    elif mask == "add":
        x = g.op(K.Add, x, g.input((1, 1, s, s)), name="mask")
    elif mask == "select":
        x = g.op(K.Select, g.input((1, 1, s, s), dt.boolean), g.input((1,)), x, dtype=score_dt,
                 name="mask")
    x = _leak(g, leak, "mask", x)
    sm_dt = dt.f32 if (dropout or prob_cast) else dtype
    outs = g.op(K.SoftMax, x, dtypes=[sm_dt, dt.f32] if stats else [sm_dt], outputs=2 if stats else 1,
                attrs={"axis": softmax_axis, "mode": "inf_as_zero"}, name="softmax")
    p = outs[0] if stats else outs
    p = _leak(g, leak, "softmax", p)
    if dropout:
        p = g.op(K.Dropout, p, g.scalar(dt.s64), g.scalar(dt.s64), g.scalar(dt.f32), name="dropout")
    if prob_cast or (dropout and dtype != dt.f32):
        p = g.op(K.TypeCast, p, dtype=dtype, name="prob_cast") if dtype != dt.f32 else p
    if v_dequant is not None:
        v = _dequant(g, (B, H, s, D), v_dequant, dtype, axis=3, name="v_dequant", cast=kv_cast)
    else:
        v = g.input((B, H, s, D), dtype)
    o = g.op(K.MatMul, p, v, dtype=dtype, name="pv")
    if out:
        o = g.op(K.StaticTranspose, o, attrs={"order": [0, 2, 1, 3]}, name="out_transpose")
        if out == "reshape":
            o = g.op(K.StaticReshape, o, attrs={"shape": [B, s, H * D], "special_zero": False})
        else:
            o = g.op(K.Reorder, o)
    return g.done()


def _dequant(g, shape, int_dt, dtype, axis, name, cast=False, group=4, zps=True):
    """DynamicDequantize of an int tensor, grouped by ``group`` along ``axis``."""
    scale_dt = dt.f32 if cast else dtype
    group_shape = [1] * len(shape)
    group_shape[axis] = group
    s_shape = tuple(d // g_ for d, g_ in zip(shape, group_shape))
    ins = [g.input(shape, int_dt), g.input(s_shape, scale_dt)]
    if zps:
        ins.append(g.input(s_shape, int_dt))
    x = g.op(K.DynamicDequantize, *ins, dtype=scale_dt, name=name,
             attrs={"qtype": "per_group", "group_shape": group_shape, "axis": axis})
    if cast:
        x = g.op(K.TypeCast, x, dtype=dtype, name=name + "_cast")
    return x


def sdpa_quantized(bf16=False, gpt=False, final_quant=True, leak=None, q_dt=dt.u8):
    """int8 / fp8 static-quant SDPA; ``bf16`` adds the int8-bf16 TypeCasts."""
    g = G()
    cdt = dt.bf16 if bf16 else dt.f32
    qa = {"qtype": "per_tensor", "axis": 1, "scales": [0.25], "zps": [0]}
    if q_dt in (dt.f8_e4m3, dt.f8_e5m2):
        del qa["zps"]

    def deq(shape, name):
        x = g.op(K.Dequantize, g.input(shape, q_dt), dtype=dt.f32, attrs=qa, name=name)
        return g.op(K.TypeCast, x, dtype=dt.bf16) if bf16 else x

    qk = g.op(K.MatMul, deq((B, H, S, D), "q"), deq((B, H, D, S), "k"), dtype=cdt, name="qk")
    x = qk
    if gpt:
        x = g.op(K.Select, g.input((1, 1, S, S), dt.boolean), x, g.input((1,), cdt), dtype=cdt,
                 name="pre_select")
    x = g.op(K.Divide, x, g.input((1,)), name="scale")
    x = g.op(K.Add, x, g.input((1, 1, 1, S), cdt), name="mask")
    sm = g.op(K.SoftMax, x, attrs={"axis": -1}, name="softmax")
    _leak(g, leak, "softmax", sm)
    if bf16:
        sm = g.op(K.TypeCast, sm, dtype=dt.f32)
    p = g.op(K.Quantize, sm, dtype=q_dt, attrs=qa, name="prob_quant")
    p = g.op(K.Dequantize, p, dtype=dt.f32, attrs=qa)
    if bf16:
        p = g.op(K.TypeCast, p, dtype=dt.bf16)
    o = g.op(K.MatMul, p, deq((B, H, S, D), "v"), dtype=cdt, name="pv")
    o = g.op(K.Reorder, g.op(K.StaticTranspose, o, attrs={"order": [0, 2, 1, 3]}))
    if bf16:
        o = g.op(K.TypeCast, o, dtype=dt.f32)
    if final_quant:
        g.op(K.Quantize, o, dtype=q_dt, attrs=qa, name="quant_out")
    return g.done()


def gqa(leak=None, mask=True, scale=True):
    """4-D GQA written with StaticReshape (Hq = 4, Hkv = 2)."""
    g = G()
    hq, hkv = 4, 2
    rep = hq // hkv
    q = g.op(K.StaticReshape, g.input((B, hq, S, D)),
             attrs={"shape": [B, hkv, rep, S, D], "special_zero": False})
    k = g.op(K.StaticReshape, g.input((B, hkv, S, D)),
             attrs={"shape": [B, hkv, 1, S, D], "special_zero": False})
    x = g.op(K.MatMul, q, k, attrs={"transpose_b": True}, name="qk")
    _leak(g, leak, "qk", x)
    if scale:
        x = g.op(K.Multiply, x, g.input((1,)), name="scale")
    if mask:
        m = g.op(K.StaticReshape, g.input((B, 1, S, S)),
                 attrs={"shape": [B, 1, 1, S, S], "special_zero": False})
        x = g.op(K.Add, x, m, name="mask")
    p = g.op(K.SoftMax, x, attrs={"axis": -1}, name="softmax")
    v = g.op(K.StaticReshape, g.input((B, hkv, S, D)),
             attrs={"shape": [B, hkv, 1, S, D], "special_zero": False})
    o = g.op(K.MatMul, p, v, name="pv")
    g.op(K.StaticReshape, o, attrs={"shape": [B, hq, S, D], "special_zero": False}, name="back")
    return g.done()


def jax_mha(leak=None):
    """JAX MHA: probabilities transposed and reordered into the 2nd MatMul's input 1."""
    g = G()
    x = g.op(K.MatMul, g.input((B, H, S, D)), g.input((B, H, D, S)), name="qk")
    x = g.op(K.Divide, x, g.input((1,)), name="scale")
    x = g.op(K.Add, x, g.input((B, 1, 1, S)), name="mask")
    p = g.op(K.SoftMax, x, attrs={"axis": 3}, name="softmax")
    _leak(g, leak, "softmax", p)
    p = g.op(K.Reorder, g.op(K.StaticTranspose, p, attrs={"order": [0, 1, 3, 2]}))
    o = g.op(K.MatMul, g.input((B, H, D, S)), p, name="pv")
    o = g.op(K.StaticTranspose, o, attrs={"order": [0, 3, 1, 2]})
    g.op(K.StaticReshape, o, attrs={"shape": [B, S, H, D], "special_zero": False})
    return g.done()


def jax_mqa(leak=None):
    """JAX MQA: one K/V head; scores reshaped/transposed to heads and back."""
    g = G()
    x = g.op(K.MatMul, g.input((B, S, D)), g.input((B, D, H * S)), name="qk")
    x = g.op(K.StaticReshape, x, attrs={"shape": [B, S, H, S], "special_zero": False})
    x = g.op(K.StaticTranspose, x, attrs={"order": [0, 2, 1, 3]})
    x = g.op(K.Add, x, g.input((B, H, S, S)), name="mask")
    p = g.op(K.SoftMax, x, attrs={"axis": 3}, name="softmax")
    _leak(g, leak, "softmax", p)
    p = g.op(K.StaticTranspose, p, attrs={"order": [0, 2, 1, 3]})
    p = g.op(K.StaticReshape, p, attrs={"shape": [B, S, H * S], "special_zero": False})
    g.op(K.MatMul, g.input((B, D, S)), p, name="pv")
    return g.done()


def gated_mlp(dtype=dt.f32, act="swish", weights=None, leak=None, src_shared=True, m=2, k=16, n=32):
    """MatMul(x, Wg) -> act, MatMul(x, Wu), Multiply, [TypeCast], MatMul(., Wd)."""
    g = G("f16" if weights else "strict", bool(weights))
    acc = dt.f32
    x = g.input((m, k), dtype)
    x2 = x if src_shared else g.input((m, k), dtype)

    def weight(shape, name):
        if weights is None:
            return g.input(shape, dtype)
        return _dequant(g, shape, weights, dtype, axis=1, name=name, group=8)

    gate = g.op(K.MatMul, x, weight((k, n), "gate_w"), dtype=acc, name="gate")
    _leak(g, leak, "gate", gate)
    if act == "swish":
        a = g.op(K.Multiply, gate, g.op(K.Sigmoid, gate, name="sigmoid"), name="swish")
    elif act == "gelu":
        a = g.op(K.GELU, gate, attrs={"mode": "gelu_erf"}, name="gelu")
    else:
        a = gate
    up = g.op(K.MatMul, x2, weight((k, n), "up_w"), dtype=acc, name="up")
    h = g.op(K.Multiply, a, up, name="gate_mul")
    _leak(g, leak, "gate_mul", h)
    if dtype != dt.f32:
        h = g.op(K.TypeCast, h, dtype=dtype, name="cast")
    g.op(K.MatMul, h, weight((n, k), "down_w"), dtype=dtype, name="down")
    return g.done()


def compressed_matmul(wdt=dt.s4, qtype="per_group", zps=True, transpose_b=False, bias=False,
                      post=("relu",), quant_out=None, src_dequant=False, static=False,
                      fpmath="strict", apply_to_int=False, act_dtype=dt.f32, leak=None,
                      wei_cast=None, m=4, k=16, n=8):
    """DynamicDequantize(W) [-> TypeCast] -> MatMul -> post-ops -> [Dynamic]Quantize."""
    g = G(fpmath, apply_to_int)
    wshape = (n, k) if transpose_b else (k, n)
    if static:
        w = g.op(K.Dequantize, g.input(wshape, wdt), dtype=dt.f32, name="wei_dequant",
                 attrs={"qtype": "per_tensor", "axis": 1, "scales": [0.5], "zps": [1]})
    else:
        if qtype == "per_group":
            gs = [1, 4] if transpose_b else [4, 1]
            s_shape = (wshape[0] // gs[0], wshape[1] // gs[1])
            attrs = {"qtype": "per_group", "group_shape": gs, "axis": 1 if transpose_b else 0}
        elif qtype == "per_channel":
            ax = 0 if transpose_b else 1
            s_shape = (n,)
            attrs = {"qtype": "per_channel", "axis": ax}
        else:
            s_shape, attrs = (1,), {"qtype": "per_tensor"}
        ins = [g.input(wshape, wdt), g.input(s_shape, act_dtype)]
        if zps:
            ins.append(g.input(s_shape, wdt if wdt in (dt.s4, dt.u4, dt.s8, dt.u8) else dt.s8))
        w = g.op(K.DynamicDequantize, *ins, dtype=act_dtype, attrs=attrs, name="wei_dequant")
    _leak(g, leak, "wei_dequant", w)
    if wei_cast:
        w = g.op(K.TypeCast, w, dtype=wei_cast, name="wei_cast")
        act_dtype = wei_cast
    if src_dequant:
        x = g.op(K.DynamicDequantize, g.input((m, k), dt.u8), g.input((1,), act_dtype),
                 dtype=act_dtype, attrs={"qtype": "per_tensor"}, name="src_dequant")
    else:
        x = g.input((m, k), act_dtype)
    ins = [x, w] + ([g.input((n,), act_dtype)] if bias else [])
    y = g.op(K.MatMul, *ins, dtype=dt.f32 if wei_cast else act_dtype, attrs={"transpose_b": transpose_b},
             name="matmul")
    y = _leak(g, leak, "matmul", y)
    for p in post:
        y = _post_op(g, p, y)
    if quant_out == "dynamic_s4":
        g.op(K.DynamicQuantize, y, g.input((m, n // 4), y.dtype), dtype=dt.s4, name="quant_out",
             attrs={"qtype": "per_group", "group_shape": [1, 4], "axis": 1})
    elif quant_out == "static":
        g.op(K.Quantize, y, dtype=dt.u8, attrs={"qtype": "per_tensor", "scales": [0.5], "zps": [3]},
             name="quant_out")
    elif quant_out == "cast":
        g.op(K.TypeCast, y, dtype=dt.bf16, name="quant_out")
    return g.done()


def _post_op(g, p, y):
    shape = (1,)
    if p in ("add", "multiply", "divide", "subtract", "maximum", "minimum"):
        kind = {"add": K.Add, "multiply": K.Multiply, "divide": K.Divide, "subtract": K.Subtract,
                "maximum": K.Maximum, "minimum": K.Minimum}[p]
        return g.op(kind, y, g.input(shape), name=p)
    if p == "swish":
        return g.op(K.Multiply, y, g.op(K.Sigmoid, y), name="swish")
    if p == "clamp":
        return g.op(K.Clamp, y, attrs={"min": -1.0, "max": 2.0}, name=p)
    if p == "gelu":
        return g.op(K.GELU, y, name=p)
    if p == "select":
        return g.op(K.Select, g.input((1, 1), dt.boolean), y, g.input((1,), y.dtype), dtype=y.dtype,
                    name=p)
    kind = {"relu": K.ReLU, "tanh": K.Tanh, "sigmoid": K.Sigmoid, "exp": K.Exp, "abs": K.Abs,
            "elu": K.Elu}[p]
    attrs = {"alpha": 0.5} if p == "elu" else {}
    return g.op(kind, y, attrs=attrs, name=p)


def matmul_chain(post=("relu",), bias=None, out_cast=None, dtype=dt.f32, leak=None, tail=None,
                 m=4, k=8, n=8):
    """MatMul [-> BiasAdd] -> post-ops -> [TypeCast]; ``tail`` adds layout ops."""
    g = G()
    ins = [g.input((m, k), dtype), g.input((k, n), dtype)]
    if bias == "input":
        ins.append(g.input((n,), dtype))
    acc = dt.f32 if out_cast else dtype
    y = g.op(K.MatMul, *ins, dtype=acc, name="matmul")
    y = _leak(g, leak, "matmul", y)
    if bias == "op":
        y = g.op(K.BiasAdd, y, g.input((n,), acc), name="bias")
    for p in post:
        y = _post_op(g, p, y)
    if out_cast:
        y = g.op(K.TypeCast, y, dtype=out_cast, name="out_cast")
    if tail == "transpose_reorder":
        y = g.op(K.Reorder, g.op(K.StaticTranspose, y, attrs={"order": [1, 0]}))
    elif tail == "reshape_transpose_reshape":
        y = g.op(K.StaticReshape, y, attrs={"shape": [m, 2, n // 2], "special_zero": False})
        y = g.op(K.StaticTranspose, y, attrs={"order": [1, 0, 2]})
        y = g.op(K.StaticReshape, y, attrs={"shape": [2, m * n // 2], "special_zero": False})
    elif tail == "dropout":
        g.op(K.Dropout, y, g.scalar(dt.s64), g.scalar(dt.s64), g.scalar(dt.f32), name="dropout")
    return g.done()


def sparse_matmul(encoding="CSR", post=("relu",), m=4, k=8, n=8):
    """x @ W with W sparse (seed 003) -> BiasAdd -> post-ops."""
    g = G()
    x = g.input((m, k))
    w = ga.LogicalTensor(g._tensor, dt.f32, (k, n), sparse_encoding=encoding)
    g._tensor += 1
    y = g.op(K.MatMul, x, w, name="matmul")
    y = g.op(K.BiasAdd, y, g.input((n,)), name="bias")
    for p in post:
        y = _post_op(g, p, y)
    return g.done()


def quantized_matmul(bf16=False, residual=False, smooth=False, post=("relu",), quant_out=True,
                     wei_quant=False, leak=None, bias=True, m=4, k=8, n=8):
    """int8 MatMul: Dequantize(src), Dequantize(W) [-> TypeCast bf16] -> MatMul -> ... -> Quantize."""
    g = G()
    qa = {"qtype": "per_tensor", "axis": 1, "scales": [0.5], "zps": [0]}

    def deq(x, name):
        x = g.op(K.Dequantize, x, dtype=dt.f32, attrs=qa, name=name)
        return g.op(K.TypeCast, x, dtype=dt.bf16) if bf16 else x

    src = deq(g.input((m, k), dt.u8), "src_dequant")
    _leak(g, leak, "src_dequant", src)
    if wei_quant:
        w = g.op(K.Quantize, g.input((k, n), dt.f32, ga.PropertyType.constant), dtype=dt.s8,
                 attrs=qa, name="wei_quant")
    else:
        w = g.input((k, n), dt.s8, ga.PropertyType.constant)
    w = deq(w, "wei_dequant")
    cdt = dt.bf16 if bf16 else dt.f32
    ins = [src, w] + ([g.input((1, n), cdt)] if bias else [])
    y = g.op(K.MatMul, *ins, name="matmul")
    y = _leak(g, leak, "matmul", y)
    if residual:
        y = g.op(K.Add, y, deq(g.input((m, n), dt.s8), "res_dequant"), name="res_add")
    for p in post:
        y = _post_op(g, p, y)
    if bf16:
        y = g.op(K.TypeCast, y, dtype=dt.f32, name="out_cast")
    if smooth:
        y = g.op(K.Multiply, y, g.input((1, n)), name="smooth")
    if quant_out:
        g.op(K.Quantize, y, dtype=dt.s8, attrs=qa, name="quant_out")
    return g.done()


def bmb(n_pre=3, n_post=2, bf16=False, leak=None):
    """binary chain -> MatMul -> binary chain (float_bmb)."""
    g = G()
    dtype = dt.bf16 if bf16 else dt.f32
    shape = (1, 2, 4, 4)
    x = g.input(shape, dtype)
    for i in range(n_pre):
        x = g.op(K.Multiply, x, g.input(shape, dtype), dtype=dt.f32, name=f"pre{i}")
    _leak(g, leak, "pre", x)
    if bf16:
        x = g.op(K.TypeCast, x, dtype=dt.bf16)
    y = g.op(K.MatMul, x, g.input(shape, dtype), dtype=dt.f32, name="matmul")
    for i in range(n_post):
        y = g.op(K.Add, y, g.input(shape, dtype), dtype=dt.f32, name=f"post{i}")
    if bf16:
        g.op(K.TypeCast, y, dtype=dt.bf16)
    return g.done()


def backward(dtype=dt.f32, gqa_=False, dropout=False, dmask=False, leak=None, dq_transpose_a=False):
    """SDPA training backward (dQ, dK, dV), optionally 5-D GQA with ReduceSum."""
    g = G()
    xf16 = dtype != dt.f32
    if gqa_:
        qs, ks = (B, 2, 2, S, D), (B, 2, 1, S, D)
    else:
        qs = ks = (B, H, S, D)
    q, k, v = g.input(qs, dtype), g.input(ks, dtype), g.input(ks, dtype)
    o, do = g.input(qs, dtype), g.input(qs, dtype)
    scale = g.input((1,), dtype)
    st = g.op(K.MatMul, q, k, dtype=dt.f32, attrs={"transpose_b": True}, name="qk")
    st = g.op(K.Multiply, st, scale, dtype=dt.f32, name="scale")
    st = g.op(K.Add, st, g.input(qs[:-1] + (S,), dtype), dtype=dt.f32, name="mask")
    red = qs[:-1] + (1,)
    p = g.op(K.Exp, g.op(K.Subtract, st, g.input(red), name="sub_stats"), name="exp")
    _leak(g, leak, "exp", p)
    pc = p
    if dropout:
        pc = g.op(K.Dropout, pc, g.scalar(dt.s64), g.scalar(dt.s64), g.scalar(dt.f32))
    if xf16:
        pc = g.op(K.TypeCast, pc, dtype=dtype)
    dv = g.op(K.MatMul, pc, do, dtype=dtype, attrs={"transpose_a": True}, name="dv")
    dp = g.op(K.MatMul, do, v, dtype=dt.f32, attrs={"transpose_b": True})
    if dropout:
        dp = g.op(K.Dropout, dp, g.scalar(dt.s64), g.scalar(dt.s64), g.scalar(dt.f32))
    corr = g.op(K.ReduceSum, g.op(K.Multiply, o, do, dtype=dt.f32), attrs={"axes": [-1], "keep_dims": True})
    ds = g.op(K.Multiply, p, g.op(K.Subtract, dp, corr), name="ds")
    if dmask:
        g.op(K.End, ds, outputs=0)
    ds = g.op(K.Multiply, ds, scale, dtype=dt.f32)
    if xf16:
        ds = g.op(K.TypeCast, ds, dtype=dtype)
    dk = g.op(K.MatMul, ds, q, dtype=dtype, attrs={"transpose_a": True}, name="dk")
    g.op(K.MatMul, ds, k, dtype=dtype, attrs={"transpose_a": dq_transpose_a}, name="dq")
    if gqa_:
        for t in (dk, dv):
            g.op(K.ReduceSum, t, attrs={"axes": [2], "keep_dims": True})
    return g.done()


def small(first, post=("relu",), tail=(), dtype=dt.f32, leak=None, shape=(4, 8)):
    """One op (``first``) followed by element-wise post-ops and a tail.

    first: 'add' 'maximum' 'relu' 'softmax' 'layernorm' 'reduce' 'reciprocal'
    'reorder' 'typecast' 'x8_reorder'.
    tail: 'cast' (TypeCast to bf16), 'cast_f32', 'quantize' (u8).
    """
    g = G()
    x = g.input(shape, dtype)
    if first in ("add", "maximum"):
        y = g.op(K.Add if first == "add" else K.Maximum, x, g.input(shape, dtype), name="first")
    elif first == "relu":
        y = g.op(K.ReLU, x, name="first")
    elif first == "softmax":
        y = g.op(K.SoftMax, x, dtype=dt.f32, attrs={"axis": -1}, name="first")
    elif first == "layernorm":
        y = g.op(K.LayerNorm, x, g.input(shape[-1:]), g.input(shape[-1:]), outputs=3,
                 dtypes=[dtype, dt.f32, dt.f32], name="first")[0]
    elif first == "reduce":
        y = g.op(K.ReduceMean, x, attrs={"axes": [-1], "keep_dims": True}, name="first")
    elif first == "reciprocal":
        y = g.op(K.Reciprocal, x, name="first")
    elif first == "reorder":
        y = g.op(K.Reorder, x, name="first")
    elif first == "typecast":
        y = g.op(K.TypeCast, x, dtype=dt.f32, name="first")
    elif first == "x8_reorder":
        qa = {"qtype": "per_tensor", "axis": 1, "scales": [0.5]}
        y = g.op(K.Dequantize, x, dtype=dt.f32, attrs=qa, name="first")
        y = g.op(K.Reorder, y)
    _leak(g, leak, "first", y)
    for p in post:
        y = _post_op(g, p, y)
    for t in tail:
        if t == "cast":
            y = g.op(K.TypeCast, y, dtype=dt.bf16, name="cast")
        elif t == "quantize":
            g.op(K.Quantize, y, dtype=dt.u8, name="quantize",
                 attrs={"qtype": "per_tensor", "axis": 1, "scales": [0.25], "zps": [3]})
    return g.done()


def bn_bwd_relu_bwd(data_format="NCX", gamma=True, use_dst=False):
    """ReLUBackward into BatchNormTrainingBackward's input 0 (oneDNN's edge)."""
    g = G()
    shape, c = ((2, 3, 4, 5), 3) if data_format == "NCX" else ((2, 4, 5, 3), 3)
    x = g.input(shape)
    y = g.op(K.ReLUBackward, x, g.input(shape), attrs={"use_dst": use_dst}, name="relu_bwd")
    stats = [g.input((c,)), g.input((c,))] + ([g.input((c,))] if gamma else [])
    g.op(K.BatchNormTrainingBackward, y, g.input(shape), *stats, outputs=3 if gamma else 1,
         attrs={"epsilon": 1e-3, "data_format": data_format}, name="bn_bwd")
    return g.done()


def folded_transpose(batch_reduce=False, reshape_a=False, post=("relu",)):
    """[StaticReshape (unit dim)](A) @ StaticTranspose(B) -> post-ops: transposes and
    unit reshapes fold into the MatMul's indexing maps (extension, seed 001)."""
    g = G()
    if reshape_a:
        a = g.op(K.StaticReshape, g.input((6, 8)), attrs={"shape": [1, 6, 8], "special_zero": False},
                 name="a_fold")
    else:
        a = g.input((2, 6, 8))
    b = g.op(K.StaticTranspose, g.input((2, 5, 8)), attrs={"order": [0, 2, 1]}, name="b_fold")
    y = g.op(K.BatchReduceMatMul if batch_reduce else K.MatMul, a, b, name="matmul")
    for p in post:
        y = _post_op(g, p, y)
    return g.done()


def composite(name="rms_norm"):
    """One Composite op (extension) calling a shipped decomposition: x [4, 16] (+ gamma [16])."""
    g = G()
    inputs = [g.input((4, 16))] + ([g.input((16,))] if name == "rms_norm" else [])
    g.op(K.Composite, *inputs, attrs={"name": name}, name="composite")
    return g.done()


def grouped_matmul(expert="matmul", ms=(3, 0, 5), k=16, n=32, weights=None, mismatch=None, connect=False,
                   extra=None):
    """Unconnected experts (the grouped_matmul Group): ``expert`` 'matmul' (src [m, k] @
    [dequant]W [k, n]) or 'gated' (a gated MLP per expert, hidden k, intermediate n).
    ``mismatch='k'``: the last expert has K 2k; ``connect``: expert 1 reads expert 0's
    output; ``extra``: an op kind added on expert 0's output (the group no longer is
    the whole graph)."""
    g = G("strict", bool(weights))
    outs = []
    for e, m in enumerate(ms):
        kk = 2 * k if mismatch == "k" and e == len(ms) - 1 else k

        def weight(shape, name):
            if weights is None:
                return g.input(shape)
            return _dequant(g, shape, weights, dt.f32, axis=0, name=name, group=8)

        x = outs[0] if connect and e == 1 else g.input((m, kk))
        if expert == "gated":
            gate = g.op(K.MatMul, x, weight((kk, n), f"gate_w{e}"), name=f"gate{e}")
            a = g.op(K.Multiply, gate, g.op(K.Sigmoid, gate, name=f"sigmoid{e}"), name=f"swish{e}")
            up = g.op(K.MatMul, x, weight((kk, n), f"up_w{e}"), name=f"up{e}")
            h = g.op(K.Multiply, a, up, name=f"gate_mul{e}")
            outs.append(g.op(K.MatMul, h, weight((n, kk), f"down_w{e}"), name=f"down{e}"))
        else:
            outs.append(g.op(K.MatMul, x, weight((kk, kk if connect else n), f"w{e}"), name=f"expert{e}"))
    if extra is not None:
        g.op(extra, outs[0], name="extra")
    return g.done()

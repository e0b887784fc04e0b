"""Small canonical graphs for the CNN patterns (``patterns/library/cnn.py``), with
knobs that break them.  Each factory returns a finalized graph; ``leak=<role>``
adds an outside consumer (an Abs) of that role's output.
"""
from __future__ import annotations

import graph_api as ga

from .builder import G, K, dt

N, C, HW = 2, 8, 6  # batch, channels, spatial size
CONST = ga.PropertyType.constant
UNARY = {"relu": K.ReLU, "tanh": K.Tanh, "sigmoid": K.Sigmoid, "gelu": K.GELU, "elu": K.Elu,
         "clamp": K.Clamp, "mish": K.Mish, "square": K.Square, "abs": K.Abs, "leaky_relu": K.LeakyReLU,
         "hardswish": K.HardSwish, "softplus": K.SoftPlus, "exp": K.Exp}
ATTRS = {"elu": {"alpha": 0.5}, "clamp": {"min": -1.0, "max": 2.0}, "leaky_relu": {"alpha": 0.1}}
BINARY = {"add": K.Add, "multiply": K.Multiply, "subtract": K.Subtract, "divide": K.Divide,
          "maximum": K.Maximum, "minimum": K.Minimum}


def _leak(g, leak, name, t):
    if leak == name:
        g.op(K.Abs, t, name="leak")
    return t


def _shape(fmt, c, hw, n=N):
    return (n, c, hw, hw) if fmt == "NCX" else (n, hw, hw, c)


def _chain(g, x, post, fmt, c, hw, n=N):
    """Apply post-ops named in ``post``; binary operands vary along channels or fully."""
    for i, name in enumerate(post):
        if name == "swish":
            x = g.op(K.Multiply, x, g.op(K.Sigmoid, x))
        elif name in BINARY:
            shape = (1, c, 1, 1) if fmt == "NCX" else (1, 1, 1, c)
            other = g.input(shape if i % 2 == 0 else _shape(fmt, c, hw, n))
            x = g.op(BINARY[name], x, other, name=f"post{i}")
        else:
            x = g.op(UNARY[name], x, attrs=ATTRS.get(name, {}), name=f"post{i}")
    return x


def conv_attrs(fmt="NCX", groups=1, stride=1, pad=1, wfmt="OIX", dilation=1):
    return {"strides": [stride, stride], "pads_begin": [pad, pad], "pads_end": [pad, pad],
            "dilations": [dilation, dilation], "groups": groups, "data_format": fmt,
            "weights_format": wfmt}


def _weights(g, oc, icg, k, wfmt, dtype=dt.f32, prop=CONST):
    shape = (oc, icg, k, k) if wfmt == "OIX" else (k, k, icg, oc)
    return g.tensor(shape, dtype, prop)


def conv(bias="input", bn=False, post=("relu",), fmt="NCX", wfmt="OIX", k=3, stride=1, pad=1,
         groups=1, dilation=1, out_cast=False, dtype=dt.f32, fpmath="strict", leak=None, oc=C):
    """Convolution [+bias input | BiasAdd] [+BatchNormInference] + post-ops [+TypeCast]."""
    g = G(fpmath)
    x = g.input(_shape(fmt, C, HW), dtype)
    ins = [x, _weights(g, oc, C // groups, k, wfmt, dtype)]
    if bias == "input":
        ins.append(g.tensor((oc,), dtype, CONST))
    y = g.op(K.Convolution, *ins, name="conv",
             attrs=conv_attrs(fmt, groups, stride, pad, wfmt, dilation))
    _leak(g, leak, "conv", y)
    if bias == "op":
        y = g.op(K.BiasAdd, y, g.tensor((oc,), dtype, CONST), attrs={"data_format": fmt}, name="bias")
    if bn:
        params = [g.tensor((oc,), dt.f32, CONST) for _ in range(4)]
        y = g.op(K.BatchNormInference, y, *params, attrs={"epsilon": 1e-3, "data_format": fmt},
                 name="bn")
    out_hw = (HW + 2 * pad - ((k - 1) * dilation + 1)) // stride + 1
    y = _chain(g, y, post, fmt, oc, out_hw)
    if out_cast:
        g.op(K.TypeCast, y, dtype=dt.f32, name="out_cast")
    return g.done()


def conv_depthwise(post=("relu",), dw_post=("swish",), bias=True, dw_k=3, dw_groups=None):
    """1x1 Convolution + post-ops -> 3x3 depthwise Convolution + post-ops (NCX)."""
    g = G()
    x = g.input(_shape("NCX", C, HW))
    ins = [x, _weights(g, C, C, 1, "OIX")] + ([g.tensor((C,), dt.f32, CONST)] if bias else [])
    y = g.op(K.Convolution, *ins, attrs=conv_attrs(pad=0), name="conv")
    y = _chain(g, y, post, "NCX", C, HW)
    groups = C if dw_groups is None else dw_groups
    ins = [y, _weights(g, C, C // groups, dw_k, "OIX")] + ([g.tensor((C,), dt.f32, CONST)] if bias else [])
    y = g.op(K.Convolution, *ins, attrs=conv_attrs(groups=groups, stride=2, pad=dw_k // 2), name="dw_conv")
    _chain(g, y, dw_post, "NCX", C, (HW + 2 * (dw_k // 2) - dw_k) // 2 + 1)
    return g.done()


def convtranspose(post=("relu", "add"), bias=True, groups=1):
    g = G()
    x = g.input(_shape("NCX", C, HW))
    ins = [x, g.tensor((C, C // groups, 3, 3), dt.f32, CONST)] + \
        ([g.tensor((C,), dt.f32, CONST)] if bias else [])
    y = g.op(K.ConvTranspose, *ins, attrs=conv_attrs(groups=groups, wfmt="IOX"), name="conv")
    _chain(g, y, post, "NCX", C, HW)
    return g.done()


def _qattrs(scales=(0.5,), zps=(0,), qtype="per_tensor", axis=1, f8=False):
    attrs = {"qtype": qtype, "axis": axis, "scales": list(scales)}
    if not f8:
        attrs["zps"] = list(zps)
    return attrs


def quantized_conv(kind=K.Convolution, src_dt=dt.u8, src_zp=3, per_channel=True, bias=True,
                   residual=False, post=("relu",), quant_out=True, bf16=False, fmt="NCX", k=3,
                   groups=1, leak=None, wei_quant=False, fpmath="strict", f8_scaled=False):
    """Dequantize(src8), Dequantize(s8 weights) [TypeCast bf16] -> Convolution|ConvTranspose
    [+bias] [+Add(Dequantize(other8))] + post-ops [TypeCast f32] [-> Quantize]."""
    g = G(fpmath)
    f8 = src_dt in (dt.f8_e4m3, dt.f8_e5m2)
    wdt = src_dt if f8 else dt.s8
    cdt = dt.bf16 if bf16 else dt.f32
    x8 = g.input(_shape(fmt, C, HW), src_dt)
    # oneDNN fuses f8 convolutions only with unscaled f8 inputs
    x_scale = 1.0 if f8 and not f8_scaled else 0.25
    x = g.op(K.Dequantize, x8, dtype=dt.f32, name="src_dequant",
             attrs=_qattrs((x_scale,), (0 if f8 else src_zp,), f8=f8))
    _leak(g, leak, "src_dequant", x)
    if bf16:
        x = g.op(K.TypeCast, x, dtype=dt.bf16, name="src_cast")
    deconv = kind == K.ConvTranspose
    wshape = ((C, C // groups, k, k) if fmt == "NCX" else (k, k, C // groups, C)) if not deconv \
        else (C, C // groups, k, k)
    wfmt = ("OIX" if fmt == "NCX" else "XIO") if not deconv else "IOX"
    o_axis = (0 if wfmt == "OIX" else 3) if not deconv else 1
    if wei_quant:
        w = g.op(K.Quantize, g.tensor(wshape, dt.f32, CONST), dtype=dt.s8, name="wei_quant",
                 attrs=_qattrs((0.5,)))
        w = g.op(K.Dequantize, w, dtype=dt.f32, name="wei_dequant", attrs=_qattrs((0.5,)))
    else:
        scales = [0.5 * (1 + i % 3) for i in range(C)] if per_channel else [0.75]
        if f8 and not f8_scaled:
            scales = [1.0] * len(scales)
        w = g.op(K.Dequantize, g.tensor(wshape, wdt, CONST), dtype=dt.f32, name="wei_dequant",
                 attrs=_qattrs(scales, [0] * len(scales), "per_channel" if per_channel else "per_tensor",
                               o_axis, f8=f8))
    if bf16:
        w = g.op(K.TypeCast, w, dtype=dt.bf16, name="wei_cast")
    ins = [x, w] + ([g.tensor((C,), cdt, CONST)] if bias else [])
    attrs = conv_attrs(fmt, groups, 1, k // 2, wfmt)
    y = g.op(kind, *ins, attrs=attrs, dtype=cdt, name="conv")
    _leak(g, leak, "conv", y)
    if residual:
        other = g.op(K.Dequantize, g.input(_shape(fmt, C, HW), src_dt), dtype=dt.f32,
                     attrs=_qattrs((0.5,), (0 if f8 else 1,), f8=f8), name="res_dequant")
        if bf16:
            other = g.op(K.TypeCast, other, dtype=dt.bf16, name="res_cast")
        y = g.op(K.Add, y, other, name="res_add")
    y = _chain(g, y, post, fmt, C, HW)
    if bf16 and quant_out:
        y = g.op(K.TypeCast, y, dtype=dt.f32, name="out_cast")
    if quant_out:
        g.op(K.Quantize, y, dtype=src_dt, attrs=_qattrs((0.125,), (0 if f8 else 5,), f8=f8),
             name="quant_out")
    return g.done()


def _pool_attrs(kind, fmt="NCX", ceil=False, exclude_pad=False):
    attrs = {"strides": [2, 2], "pads_begin": [1, 1], "pads_end": [1, 1], "kernel": [3, 3],
             "data_format": fmt, "rounding_type": "ceil" if ceil else "floor"}
    if kind == K.AvgPool:
        attrs["exclude_pad"] = exclude_pad
    return attrs


def pool(kind=K.MaxPool, post=("add", "relu"), ceil=False, exclude_pad=False):
    g = G()
    y = g.op(kind, g.input(_shape("NCX", C, HW)), attrs=_pool_attrs(kind, ceil=ceil,
                                                                   exclude_pad=exclude_pad), name="pool")
    _chain(g, y, post, "NCX", C, 3)
    return g.done()


def pool_quantized(kind=K.AvgPool, layout=None, residual=False, post=()):
    g = G()
    x = g.op(K.Dequantize, g.input(_shape("NCX", C, HW), dt.s8), dtype=dt.f32,
             attrs=_qattrs((0.1,), (-4,)), name="src_dequant")
    y = g.op(kind, x, attrs=_pool_attrs(kind, exclude_pad=True), name="pool")
    if layout == "reshape":
        y = g.op(K.StaticReshape, y, attrs={"shape": [-1], "special_zero": False}, name="layout")
    elif layout == "transpose":
        y = g.op(K.StaticTranspose, y, attrs={"order": [3, 2, 1, 0]}, name="layout")
    if residual:
        other = g.op(K.Dequantize, g.input((N, C, 3, 3), dt.s8), dtype=dt.f32,
                     attrs=_qattrs((0.2,), (1,)), name="res_dequant")
        y = g.op(K.Add, y, other, name="res_add")
    y = _chain(g, y, post, "NCX", C, 3)
    g.op(K.Quantize, y, dtype=dt.s8, attrs=_qattrs((0.2,), (-4,)), name="quant_out")
    return g.done()


def bn_relu(training=False, leak=None):
    g = G()
    x = g.input(_shape("NCX", C, HW))
    if training:
        ins = [x] + [g.tensor((C,)) for _ in range(4)]
        outs = g.op(K.BatchNormForwardTraining, *ins, outputs=5, name="bn",
                    attrs={"epsilon": 1e-3, "momentum": 0.1, "data_format": "NCX"})
        y = outs[0]
    else:
        ins = [x] + [g.tensor((C,), dt.f32, CONST) for _ in range(4)]
        y = g.op(K.BatchNormInference, *ins, attrs={"epsilon": 1e-3, "data_format": "NCX"}, name="bn")
    _leak(g, leak, "bn", y)
    g.op(K.ReLU, y, name="relu")
    return g.done()


def bn_quantized(relu=True, src_dt=dt.s8, zp=0):
    g = G()
    x = g.op(K.Dequantize, g.input(_shape("NXC", C, HW), src_dt), dtype=dt.f32,
             attrs=_qattrs((0.6,), (zp,), axis=-1), name="src_dequant")
    ins = [x] + [g.tensor((C,), dt.f32, CONST) for _ in range(4)]
    y = g.op(K.BatchNormInference, *ins, attrs={"epsilon": 1e-3, "data_format": "NXC"}, name="bn")
    if relu:
        y = g.op(K.ReLU, y, name="relu")
    g.op(K.Quantize, y, dtype=dt.s8, attrs=_qattrs((1.7,), (0,), axis=-1), name="quant_out")
    return g.done()


def groupnorm(post=("relu",), cast=True, quant=True):
    g = G()
    src_dt = dt.bf16 if cast else dt.f32
    x = g.input(_shape("NCX", C, HW), src_dt)
    y = g.op(K.GroupNorm, x, g.tensor((C,), dt.f32, CONST), g.tensor((C,), dt.f32, CONST),
             attrs={"groups": 4, "data_format": "NCX", "keep_stats": False}, name="groupnorm")
    y = _chain(g, y, post, "NCX", C, HW)
    if cast:
        y = g.op(K.TypeCast, y, dtype=dt.f32, name="cast")
    if quant:
        g.op(K.Quantize, y, dtype=dt.u8, attrs=_qattrs((0.25,), (19,)), name="quant_out")
    return g.done()


def interpolate(post=("multiply", "relu"), mode="half_pixel"):
    g = G()
    y = g.op(K.Interpolate, g.input((N, C, HW, HW)), name="interpolate",
             attrs={"mode": "nearest", "sizes": [4, 4], "data_format": "NCX",
                    "coordinate_transformation_mode": mode})
    _chain(g, y, post, "NCX", C, 4)
    return g.done()


def shuffle(groups=2):
    g = G()
    x = g.input((N, C, HW, HW))
    y = g.op(K.StaticReshape, x, attrs={"shape": [N, groups, C // groups, HW, HW], "special_zero": False},
             name="reshape")
    y = g.op(K.StaticTranspose, y, attrs={"order": [0, 2, 1, 3, 4]}, name="transpose")
    g.op(K.StaticReshape, y, attrs={"shape": [N, C, HW, HW], "special_zero": False}, name="back_reshape")
    return g.done()


def concat_quantized(n=3, same=True):
    g = G()
    ins = [g.op(K.Dequantize, g.input((N, C, HW, HW), dt.u8), dtype=dt.f32, name=f"dequant{i}",
                attrs=_qattrs((0.5 if same or i == 0 else 0.25,), (2,))) for i in range(n)]
    y = g.op(K.Concat, *ins, attrs={"axis": 1}, name="concat")
    g.op(K.Quantize, y, dtype=dt.u8, attrs=_qattrs((0.5,), (2,)), name="quant_out")
    return g.done()

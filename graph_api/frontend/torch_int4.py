"""int4 weight-only linear layers for the PyTorch front door.

:func:`quantize_linear_weights_int4` replaces every ``nn.Linear`` of a model by an
:class:`Int4Linear`: its weight ``[N, K]`` is kept as packed 4-bit values (two per
byte, low nibble first: graph_api's s4/u4 storage), one f32 scale per ``group_size``
consecutive K values of a row, and for ``symmetric=False`` a u4 zero point per
group::

    symmetric:   w ~= q * scale,          q in [-8, 7]   (s4)
    asymmetric:  w ~= (u - zp) * scale,   u, zp in [0, 15] (u4)

Its forward calls the custom op ``graph_api::dequantize_int4`` (registered here
with ``torch.library``; eager torch runs its reference dequantization) and then
``F.linear``.  The backend lowers that op to ``DynamicDequantize`` (per_group,
``group_shape [1, group]``) feeding the MatMul with ``transpose_b``: the
``matmul_compressed`` pattern, the weight-compressed kernel.
"""
from __future__ import annotations

import ml_dtypes
import torch
import torch.nn.functional as F

from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api.errors import InvalidArguments

from . import torch_lower as tl
from .torch_lower import meta

LIB = torch.library.Library("graph_api", "FRAGMENT")
LIB.define("dequantize_int4(Tensor packed, Tensor scales, Tensor? zps, int group_size, bool signed) -> Tensor")


def unpack(packed: torch.Tensor, signed: bool) -> torch.Tensor:
    """uint8 [N, K/2] -> int16 [N, K] nibble values (s4: -8..7, u4: 0..15)."""
    low = (packed & 15).to(torch.int16)
    high = (packed >> 4).to(torch.int16)
    values = torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)
    return torch.where(values > 7, values - 16, values) if signed else values


def _dequantize(packed, scales, zps, group_size: int, signed: bool):
    q = unpack(packed, signed).to(torch.float32)
    n, k = q.shape
    q = q.reshape(n, k // group_size, group_size)
    if zps is not None:
        q = q - zps.to(torch.float32)[..., None]
    return (q * scales[..., None]).reshape(n, k)


@torch.library.impl(LIB, "dequantize_int4", "CPU")
def _dequantize_cpu(packed, scales, zps, group_size, signed):
    return _dequantize(packed, scales, zps, group_size, signed)


@torch.library.register_fake("graph_api::dequantize_int4")
def _dequantize_fake(packed, scales, zps, group_size, signed):
    return packed.new_empty((packed.shape[0], packed.shape[1] * 2), dtype=scales.dtype)


class Int4Linear(torch.nn.Module):
    """A linear layer whose weight is stored as packed int4 with group scales."""

    def __init__(self, packed, scales, zps, bias, group_size: int, signed: bool):
        super().__init__()
        self.register_buffer("packed", packed)
        self.register_buffer("scales", scales)
        self.register_buffer("zps", zps)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
        self.group_size, self.signed = group_size, signed
        self.in_features, self.out_features = packed.shape[1] * 2, packed.shape[0]

    def weight(self) -> torch.Tensor:
        """The dequantized f32 weight [N, K] (what eager torch multiplies with)."""
        return torch.ops.graph_api.dequantize_int4(self.packed, self.scales, self.zps, self.group_size, self.signed)

    def forward(self, x):
        return F.linear(x, self.weight(), self.bias)

    def extra_repr(self) -> str:
        kind = "s4" if self.signed else "u4 + zero points"
        return f"in={self.in_features}, out={self.out_features}, {kind}, group={self.group_size}"


def quantize(weight: torch.Tensor, group_size: int, symmetric: bool = True):
    """(packed uint8 [N, K/2], f32 scales [N, K/G], uint8 zero points [N, K/G] or None)."""
    w = weight.detach().to(torch.float32)
    n, k = w.shape
    if group_size < 1 or k % group_size or k % 2:
        raise InvalidArguments(f"int4 weights: group_size {group_size} must divide K = {k} (and K be even)")
    g = w.reshape(n, k // group_size, group_size)
    if symmetric:
        scale = g.abs().amax(-1) / 7
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        q = torch.clamp(torch.round(g / scale[..., None]), -8, 7).to(torch.int16)
        nibbles, zps = q & 15, None
    else:
        lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
        scale = (hi - lo) / 15
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        zp = torch.clamp(torch.round(-lo / scale), 0, 15)
        nibbles = torch.clamp(torch.round(g / scale[..., None]) + zp[..., None], 0, 15).to(torch.int16)
        zps = zp.to(torch.uint8)
    nibbles = nibbles.reshape(n, k // 2, 2).to(torch.uint8)
    packed = (nibbles[..., 0] | (nibbles[..., 1] << 4)).contiguous()
    return packed, scale.to(torch.float32).contiguous(), zps


def quantize_linear_weights_int4(model: torch.nn.Module, group_size: int = 32, symmetric: bool = True,
                                 skip=()) -> torch.nn.Module:
    """Replace (in place) every ``nn.Linear`` of ``model`` whose name is not in ``skip``
    by an :class:`Int4Linear` with the same bias; returns the model."""
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, torch.nn.Linear) and full not in skip:
                packed, scales, zps = quantize(child.weight, group_size, symmetric)
                bias = None if child.bias is None else child.bias.detach().clone()
                setattr(module, child_name, Int4Linear(packed, scales, zps, bias, group_size, symmetric))
    return model


# ---------------------------------------------------------------- the lowering rule
def dequantize_int4_rule(L, node):
    """graph_api::dequantize_int4 -> DynamicDequantize(s4/u4 [N, K], scales [N, K/G], [zps u4])."""
    packed, scales, zps, group, signed = node.args[:5]
    n, k = meta(node).shape
    weight = L.packed_source(packed, dt.s4 if signed else dt.u4, (n, k))
    ins = [weight, L.float_val(scales)]
    if zps is not None:
        value = L.constant_value(zps)
        ins.append(L.literal(value.numpy().astype(ml_dtypes.uint4), dt.u4))
    attrs = {"qtype": "per_group", "group_shape": [1, int(group)]}
    return L.emit(K.DynamicDequantize, ins, attrs)


tl.RULES[torch.ops.graph_api.dequantize_int4.default] = dequantize_int4_rule
tl.CATEGORY[dequantize_int4_rule] = "quant"

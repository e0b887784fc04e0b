"""The SDPA operand bundle: one K or V operand (:class:`KV`) and the flat forms the
kernels take (:func:`kv_args`, :func:`flat_mask`); the storage kinds and causal
modes as the kernels number them."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


KINDS = {"f32": 0, "bf16": 1, "f16": 2, "s8": 3, "u8": 4, "s4": 5, "u4": 6}
CAUSAL = {None: 0, "none": 0, "top_left": 1, "bottom_right": 2}
NEG_INF = np.float32(-np.inf)
DT = 128  #: KV positions per tile of the compressed decode (:mod:`.decode` and its two forms)


@dataclass
class KV:
    """One K or V operand.

    ``data``: the storage (packed uint8 for s4/u4 flat or any shape, int8,
    uint8, float32, uint16 bits for bf16/f16 or np.float16/bfloat16);
    ``kind`` a key of :data:`KINDS`; ``shape`` the logical ``(B, H, S, D)``;
    ``transposed``: stored ``[B, H, D, S]`` (K only); ``group``: G along D;
    ``scales``/``zps``: shaped like the storage with D replaced by D/G.
    """

    data: np.ndarray
    kind: str
    shape: tuple
    transposed: bool = False
    group: int = 0
    scales: np.ndarray | None = None
    zps: np.ndarray | None = None


def kv_args(kv: KV):
    B, H, S, D = kv.shape
    kind = KINDS[kv.kind]
    # the stored bytes whatever the element type: the tiled kernels read them by ``kind``
    # (:func:`ld_kind`, :func:`vld_kind`), so one signature serves every K/V dtype pair
    buf = np.asarray(kv.data).reshape(-1).view(np.uint8)
    G = kv.group if kind >= 3 else D
    if kind >= 3 and kv.scales is not None:
        sc = np.ascontiguousarray(np.asarray(kv.scales), dtype=np.float32).reshape(-1)
    else:
        sc = np.ones(1, np.float32)
    has_sc = kind >= 3 and kv.scales is not None
    if kind >= 3 and kv.zps is not None:
        zp = np.ascontiguousarray(np.asarray(kv.zps), dtype=np.float32).reshape(-1)
        has_zp = True
    else:
        zp = np.zeros(1, np.float32)
        has_zp = False
    return buf, kind, int(kv.transposed), G, sc, has_sc, zp, has_zp


def flat_mask(m):
    """A 4-D f32 mask as a flat buffer + element strides (0 on broadcast dims): one type
    (one compiled signature) whatever the mask's shape and strides; no mask: placeholders."""
    if m is None:
        return np.zeros(1, np.float32), np.zeros(4, np.int64)
    mc = np.ascontiguousarray(m)
    return mc.reshape(-1), np.array([0 if mc.shape[i] == 1 else mc.strides[i] // 4 for i in range(4)], np.int64)

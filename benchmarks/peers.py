"""Peer implementations measured in the same process (numpy always; PyTorch and
ONNX Runtime when the ``bench`` extra is installed).  Each ``make_*`` returns a
callable ``fn(i)`` running on the i-th weight/KV copy, or None if unavailable.
"""
from __future__ import annotations

import numpy as np

try:  # optional peers
    import torch
except Exception:  # pragma: no cover
    torch = None
try:
    import onnxruntime as ort
    from onnx import TensorProto, helper
except Exception:  # pragma: no cover
    ort = None


def have_torch() -> bool:
    return torch is not None


def have_ort() -> bool:
    return ort is not None


# ------------------------------------------------------------ weight copies
def unpack_nk(wbuf, N, K):
    """Packed [N, K] nibbles -> uint8 values [N, K] (0..15)."""
    b = wbuf.reshape(N, K // 2)
    u = np.empty((N, K), np.uint8)
    u[:, 0::2] = b & 15
    u[:, 1::2] = b >> 4
    return u


def dequant_nk(u, signed, scales, zps, G):
    """numpy: raw nibbles [N, K] (s4 two's complement) -> f32 [N, K]."""
    q = (u ^ 8).astype(np.float32) - 8.0 if signed else u.astype(np.float32)
    if zps is not None:
        q = q - np.repeat(zps.astype(np.float32), G, axis=1)
    return q * np.repeat(scales, G, axis=1)


# ---------------------------------------------------------------- numpy peers
def make_numpy_dequant_matmul(x, copies, G, signed):
    """numpy: dequantize the packed weight then ``x @ W^T`` (per call)."""
    def fn(i):
        w, sc, zp, N, K = copies[i]
        return x @ dequant_nk(unpack_nk(w, N, K), signed, sc, zp, G).T
    return fn


def make_numpy_dense(x, dense):
    """numpy f32 GEMM/GEMV on pre-dequantized weights [K, N]."""
    return lambda i: x @ dense[i]


# ---------------------------------------------------------------- torch peers
def make_torch_int4(x, copies, G, signed):
    """PyTorch int4 weight-only kernel with bf16 activations."""
    if torch is None:
        return None
    xt = torch.from_numpy(x).to(torch.bfloat16)
    packs = []
    for w, sc, zp, N, K in copies:
        raw = unpack_nk(w, N, K)
        u = torch.from_numpy(((raw ^ 8) if signed else raw).astype(np.int32))  # torch: w = (u-8)*s + z
        pk = torch.ops.aten._convert_weight_to_int4pack_for_cpu(u, 2)
        scz = np.zeros((K // G, N, 2), np.float32)
        scz[..., 0] = sc.T
        if not signed:
            z = np.zeros_like(sc) if zp is None else zp.astype(np.float32)
            scz[..., 1] = ((8.0 - z) * sc).T
        packs.append((pk, torch.from_numpy(scz).to(torch.bfloat16)))

    def fn(i):
        pk, scz = packs[i]
        return torch.ops.aten._weight_int4pack_mm_for_cpu(xt, pk, G, scz)
    return fn


def make_torch_dense(x, dense, dtype="bf16"):
    """PyTorch dense matmul on pre-dequantized weights (bf16 runs on AMX where the CPU has it)."""
    if torch is None:
        return None
    td = torch.bfloat16 if dtype == "bf16" else torch.float32
    xt = torch.from_numpy(x).to(td)
    ws = [torch.from_numpy(d).to(td) for d in dense]
    return lambda i: xt @ ws[i]


def make_torch_sdpa(q, ks, vs, dtype="bf16", causal=False):
    """torch scaled_dot_product_attention on dense K/V ([B, H, S, D] each copy)."""
    if torch is None:
        return None
    td = torch.bfloat16 if dtype == "bf16" else torch.float32
    qt = torch.from_numpy(q).to(td)
    kt = [torch.from_numpy(k).to(td) for k in ks]
    vt = [torch.from_numpy(v).to(td) for v in vs]
    gqa = q.shape[1] != ks[0].shape[1]
    F = torch.nn.functional

    def fn(i):
        return F.scaled_dot_product_attention(qt, kt[i], vt[i], is_causal=causal, enable_gqa=gqa)
    return fn


# ------------------------------------------------------------------ ORT peer
def make_ort_matmulnbits(x, copies, G, signed, accuracy_level):
    """ONNX Runtime com.microsoft MatMulNBits (one session per weight copy)."""
    if ort is None:
        return None
    M, K = x.shape
    sessions = []
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    for w, sc, zp, N, _ in copies:
        nb = K // G
        b = np.ascontiguousarray(w.reshape(N, nb, G // 2))  # u = q + 8 for s4
        if signed:
            b = b ^ np.uint8(0x88)
        inits = [helper.make_tensor("B", TensorProto.UINT8, b.shape, b.tobytes(), raw=True),
                 helper.make_tensor("S", TensorProto.FLOAT, (N * nb,), sc.reshape(-1).tobytes(), raw=True)]
        ins = ["A", "B", "S"]
        if zp is not None:
            z = zp.astype(np.uint8).reshape(N, nb)
            if nb % 2:
                z = np.pad(z, ((0, 0), (0, 1)))
            zb = (z[:, 0::2] | (z[:, 1::2] << 4)).astype(np.uint8)
            inits.append(helper.make_tensor("Z", TensorProto.UINT8, (zb.size,), zb.tobytes(), raw=True))
            ins.append("Z")
        node = helper.make_node("MatMulNBits", ins, ["Y"], domain="com.microsoft", K=K, N=N,
                                bits=4, block_size=G, accuracy_level=accuracy_level)
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [M, K])],
                                  [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [M, N])], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        model.ir_version = 10
        sessions.append(ort.InferenceSession(model.SerializeToString(), so,
                                             providers=["CPUExecutionProvider"]))

    def fn(i):
        return sessions[i].run(None, {"A": x})[0]
    return fn

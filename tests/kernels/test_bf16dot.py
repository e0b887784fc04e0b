"""The bf16 conversions of ``graph_api.kernels.bf16dot``: exact for every byte."""
import numpy as np
import pytest

from graph_api.kernels import bf16dot

needs_bf16 = pytest.mark.skipif(not bf16dot.HAVE_BF16, reason="CPU without AVX512_BF16")


@needs_bf16
@pytest.mark.parametrize("signed", [False, True])
def test_int4_encodings_are_exact(signed):
    """Every byte: each encoding gives offset + nibble (s4: two's complement) exactly."""
    from numba import njit

    from graph_api.kernels.bits import vstore

    @njit
    def run(buf, out, cl, c128, ch):
        for j in range(0, 256, 16):
            vstore(out, 3 * j, bf16dot.vpair4_lo(buf, j, 256 + j, cl))
            vstore(out, 3 * j + 16, bf16dot.vpair4_lo128(buf, j, 256 + j, c128))
            vstore(out, 3 * j + 32, bf16dot.vpair4_hi(buf, j, 256 + j, ch))

    buf = np.concatenate([np.arange(256), np.arange(256)[::-1]]).astype(np.uint8)
    out = np.zeros(3 * 256, np.float32)
    enc = {name: bf16dot.encoding(name, signed) for name in ("lo16", "lo128", "hi16")}
    run(buf.view(np.uint16), out, np.uint32(enc["lo16"][0]), np.uint32(enc["lo128"][0]),
        np.uint32(enc["hi16"][0]))
    words = out.view(np.uint32).reshape(16, 3, 16)
    nib = lambda b, hi: ((b.astype(np.int64) >> 4) if hi else b.astype(np.int64)) & 15  # noqa: E731
    val = lambda n: (n ^ 8) - 8 if signed else n  # noqa: E731
    for e, (name, hi) in enumerate((("lo16", False), ("lo128", False), ("hi16", True))):
        first = (words[:, e] & 0xFFFF) << 16
        second = words[:, e] & 0xFFFF0000
        got_a = first.astype(np.uint32).view(np.float32).reshape(-1)
        got_b = second.astype(np.uint32).view(np.float32).reshape(-1)
        off = enc[name][1]
        assert np.array_equal(got_a, off + val(nib(buf[:256], hi)).astype(np.float32)), name
        assert np.array_equal(got_b, off + val(nib(buf[256:], hi)).astype(np.float32)), name

"""bits helpers, exp32, grouped (de)quantization, norms/softmax, the epilogue program."""

import os

import ml_dtypes
import numpy as np
import pytest

from graph_api.kernels import numba_setup  # noqa: F401  (configures Numba before numba is imported)
from numba import njit  # noqa: E402

from graph_api.kernels import bits, norm, quantize
from graph_api.kernels.weight_compressed import wmatmul as W
from graph_api.dtypes import round_to_tf32

SPECIAL = np.array([0.0, -0.0, 1.0, -1.5, 3.1415927, 1e-40, -1e-45, 65504.0, 65520.0, 1e38,
                    3.4e38, np.inf, -np.inf, np.nan, 1.00390625, 1.01171875, 2.0 ** -14,
                    2.0 ** -24 * 1.5], np.float32)


@njit(cache=True)
def _apply(x, which):
    out = np.empty_like(x)
    for i in range(x.size):
        if which == 0:
            out[i] = bits.round_bf16(x[i])
        elif which == 1:
            out[i] = bits.round_f16(x[i])
        elif which == 2:
            out[i] = bits.round_tf32(x[i])
        elif which == 3:
            out[i] = bits.bf16_to_f32(bits.f32_to_bf16(x[i]))
        elif which == 4:
            out[i] = bits.f16_bits_to_f32(bits.f32_to_f16_bits(x[i]))
        elif which == 5:
            out[i] = bits.exp32(x[i])
        elif which == 8:
            out[i] = bits.gelu_erf32(x[i])
        elif which == 9:
            out[i] = bits.gelu_tanh32(x[i])
        else:
            out[i] = bits.tanh32(x[i])
    return out


def _same(a, b):
    return np.array_equal(a.view(np.uint32), b.view(np.uint32)) or \
        np.all((a == b) | (np.isnan(a) & np.isnan(b)))


def test_roundings_match_ml_dtypes():
    rng = np.random.default_rng(0)
    x = np.concatenate([SPECIAL, rng.standard_normal(1000).astype(np.float32) * 100,
                        (rng.integers(0, 2**32, 1000, dtype=np.uint64).astype(np.uint32)).view(np.float32)])
    with np.errstate(over="ignore", invalid="ignore"):
        bf = x.astype(ml_dtypes.bfloat16).astype(np.float32)
        f16 = x.astype(np.float16).astype(np.float32)
    assert _same(_apply(x, 0), bf) and _same(_apply(x, 3), bf)
    if True:
        assert _same(_apply(x, 1), f16) and _same(_apply(x, 4), f16)
    assert _same(_apply(x, 2), round_to_tf32(x))


def test_exp32_ulp():
    x = np.concatenate([np.linspace(-87, 88.5, 20001, dtype=np.float32),
                        np.array([-100, -87.5, 0, 89, 1000, -np.inf, np.inf, np.nan], np.float32)])
    y = _apply(x, 5)
    with np.errstate(over="ignore"):
        r = np.exp(x.astype(np.float64))
    fin = (r > 1.2e-38) & (r < 3e38)
    ulp = np.abs(y[fin] - r[fin]) / np.spacing(r[fin].astype(np.float32)).astype(np.float64)
    assert ulp.max() <= 2.0
    tail = y[-8:]
    assert tail[0] == 0 and tail[2] == 1 and np.isinf(tail[3]) and np.isinf(tail[4])
    assert tail[5] == 0 and np.isinf(tail[6]) and np.isnan(tail[7])


@pytest.mark.parametrize("mode,which,lim", [("gelu_erf", 8, 5.9), ("gelu_tanh", 9, 5.5)])
def test_gelu32_within_4u_of_x(mode, which, lim):
    """gelu_erf32 / gelu_tanh32 against the float64 reference on every 97th f32 of
    [-8, 8] (every exponent, ~22 M values), a dense grid and random bit patterns:
    |error| <= 4 u |x| (u = 2**-24; the a priori bound in bits.gelu_erf32 is 7.9 u |x|,
    measured 3.3 u).  Above the clamp the result is x itself, below it -0 (as the
    reference's 0.5 x (1 + -1)); inf, -inf and NaN as the reference."""
    from graph_api.kernels.reference.eltwise import gelu

    hi = np.float32(8.0).view(np.uint32)
    pos = np.arange(0, hi, 97, dtype=np.uint32).view(np.float32)
    rng = np.random.default_rng(5)
    x = np.concatenate([pos, -pos, np.linspace(-8, 8, 200001, dtype=np.float32),
                        rng.integers(0, 2**32, 200000, dtype=np.int64).astype(np.uint32).view(np.float32)])
    x = x[np.isfinite(x)]
    y = _apply(x, which).astype(np.float64)
    r = gelu(x.astype(np.float64), mode)
    # results in f32's subnormal range round to a step of 2**-149 (0.5 x exactly halfway
    # between two steps rounds to even): that step as absolute slack
    err = np.abs(y - r)
    assert np.all(err <= 4 * 2.0 ** -24 * np.abs(x) + 2.0 ** -149)
    big = np.array([lim + 0.01, 30.0, 1e30, 3.4e38], np.float32)
    assert np.array_equal(_apply(big, which), big)
    neg = _apply(-big, which)
    assert np.array_equal(neg, np.zeros(4, np.float32)) and np.all(np.signbit(neg))
    special = _apply(np.array([0.0, -0.0, np.inf, -np.inf, np.nan], np.float32), which)
    with np.errstate(invalid="ignore"):
        want = gelu(np.array([0.0, -0.0, np.inf, -np.inf, np.nan]), mode).astype(np.float32)
    assert _same(special, want)

def test_tanh32_ulp():
    rng = np.random.default_rng(4)
    x = np.concatenate([np.linspace(0, 10, 400001, dtype=np.float32),
                        np.float32(2.0) ** -np.arange(1, 126, dtype=np.float32),
                        np.nextafter(np.float32(0.55), np.float32([0, 1])),  # both sides of the switch
                        rng.integers(0, 2**31, 100000, dtype=np.int64).astype(np.uint32).view(np.float32)])
    x = x[np.isfinite(x)]
    x = np.concatenate([x, -x])
    y = _apply(x, 7)
    r = np.tanh(x.astype(np.float64))
    fin = np.abs(r) > 1.2e-38  # f32 normals
    ulp = np.abs(y[fin] - r[fin]) / np.spacing(np.abs(r[fin]).astype(np.float32)).astype(np.float64)
    # measured 1.39 (at 0.58: 1 - 2/(e + 1) loses up to one bit near the switch); the
    # series' truncation is below 2**-27 relative
    assert ulp.max() <= 2.0
    special = _apply(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 9.1, 50.0, -50.0], np.float32), 7)
    assert _same(special[:2], np.array([0.0, -0.0], np.float32))
    assert list(special[2:4]) == [1.0, -1.0] and np.isnan(special[4]) and list(special[5:]) == [1.0, 1.0, -1.0]


@pytest.mark.parametrize("dtype", ["s8", "u8", "s4", "u4"])
@pytest.mark.parametrize("shape,G", [((3, 64), 32), ((2, 5, 33), 33), ((1, 1), 1), ((4, 96), 96)])
@pytest.mark.parametrize("src", ["f32", "bf16", "f16"])
def test_quantize_dequantize(dtype, shape, G, src):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    xin = {"f32": x, "bf16": x.astype(ml_dtypes.bfloat16), "f16": x.astype(np.float16)}[src]
    xf = xin.astype(np.float32)
    gshape = shape[:-1] + (shape[-1] // G,)
    sc = (rng.random(gshape) + 0.1).astype(np.float32)
    zp = rng.integers(0, 8, gshape) if dtype[0] == "u" else None
    lo, hi = quantize._RANGES[dtype]
    s_ = np.repeat(sc, G, -1)
    z_ = np.float32(0) if zp is None else np.repeat(zp, G, -1).astype(np.float32)
    # oneDNN adds the zero point before rounding (in f32): rne(x / s + z)
    expect = np.clip(np.rint(xf / s_ + z_), lo, hi).astype(np.int64)
    q = quantize.quantize(xin, sc, zp, dtype=dtype, group=G)
    if dtype in ("s4", "u4"):
        b = q.reshape(-1)
        nib = np.empty(b.size * 2, np.int64)
        nib[0::2], nib[1::2] = b & 15, b >> 4
        nib = nib[:x.size]
        if dtype == "s4":
            nib = np.where(nib >= 8, nib - 16, nib)
        got = nib.reshape(shape)
    else:
        got = q.astype(np.int64)
    np.testing.assert_array_equal(got, expect)
    d = quantize.dequantize(q, shape, sc, zp, dtype=dtype, group=G)
    np.testing.assert_array_equal(d, ((expect - z_) * s_.astype(np.float32)).astype(np.float32))


@pytest.mark.parametrize("dtype", ["s8", "u8"])
def test_dequantize_every_byte_through_one_signature(dtype):
    """The kernels read int8 as the bytes' uint8 view (two's complement) and write f32
    and bf16/f16 outputs through one uint16 view: every byte value against numpy's own
    int8/uint8 reading, exactly ((q - z) * s in f32, then rounded to nearest even for a
    half output, as ml_dtypes rounds); one compiled signature for all of them."""
    npd = np.int8 if dtype == "s8" else np.uint8
    q = np.arange(256, dtype=np.uint8).view(npd).reshape(8, 32)
    sc = np.array([0.37, 1.0, 3.0e-3, 7.5], np.float32).repeat(2).reshape(8, 1)
    zp = np.arange(8, dtype=np.float32).reshape(8, 1) - 3
    want = (q.astype(np.float32) - zp) * sc
    got = quantize.dequantize(q, q.shape, sc, zp, dtype=dtype, group=32)
    np.testing.assert_array_equal(got, want)
    for out, half in (("bf16", ml_dtypes.bfloat16), ("f16", np.float16)):
        got = quantize.dequantize(q, q.shape, sc, zp, dtype=dtype, group=32, out_dtype=out)
        np.testing.assert_array_equal(got, want.astype(half).view(np.uint16))
    assert len(quantize._dequant.signatures) == 1


@pytest.mark.parametrize("R,C", [(1, 1), (3, 37), (5, 256)])
@pytest.mark.parametrize("src", ["f32", "bf16"])
def test_norms_and_softmax(R, C, src):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((R, C)) * 3 + 1).astype(np.float32)
    xin = x if src == "f32" else x.astype(ml_dtypes.bfloat16)
    x64 = xin.astype(np.float64)
    g = rng.standard_normal(C).astype(np.float32)
    b = rng.standard_normal(C).astype(np.float32)
    mu = x64.mean(-1, keepdims=True)
    ln = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(norm.layer_norm(xin, g, b, 1e-5), ln, rtol=1e-5, atol=1e-5)
    rms = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * g
    np.testing.assert_allclose(norm.rms_norm(xin, g, 1e-6, post_ops=[("relu", None)]),
                               np.maximum(rms, 0), rtol=1e-5, atol=1e-5)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    np.testing.assert_allclose(norm.softmax(xin), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("affine", ["gamma", "beta", "none"])
def test_layer_norm_with_one_or_no_affine_operand(affine):
    """Each of the normalize loops (scale and shift, scale only, shift only, neither) vs
    float64; tolerance as test_norms_and_softmax (f64 statistics, a few f32 roundings)."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((6, 45)) * 3 + 1).astype(np.float32)
    g = rng.standard_normal(45).astype(np.float32) if affine == "gamma" else None
    b = rng.standard_normal(45).astype(np.float32) if affine == "beta" else None
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    want = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    if g is not None:
        want = want * g
    if b is not None:
        want = want + b
    np.testing.assert_allclose(norm.layer_norm(x, g, b, 1e-5), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("R,C", [(3, 37), (4, 96)])
def test_norm_rows_take_every_type_pair_through_one_signature(R, C):
    """``norm._rows`` takes its input and output as uint16 views whatever they hold
    (one compiled signature instead of one per type pair).  Each pair must give the
    values of the f32 row the others give: a bf16/f16 output is that f32 row rounded
    (ml_dtypes' round-to-nearest-even), and a half input is the f32 computation on
    the widened values.  Exact equality: the same f32 operations in the same order.
    ``R * C`` odd (3 x 37): a half buffer of odd length has no f32 view."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((R, C)) * 3 + 1).astype(np.float32)
    g = rng.standard_normal(C).astype(np.float32)
    for half in (ml_dtypes.bfloat16, np.float16):
        xh = x.astype(half)
        ref = norm.layer_norm(xh.astype(np.float32), g, g, post_ops=[("relu", None)])
        got = norm.layer_norm(xh, g, g, post_ops=[("relu", None)])
        np.testing.assert_array_equal(got, ref)
        for out in ("bf16", "f16"):
            odt = ml_dtypes.bfloat16 if out == "bf16" else np.float16
            for src in (xh, xh.astype(np.float32)):
                y = norm.layer_norm(src, g, g, post_ops=[("relu", None)], out_dtype=out)
                assert y.dtype == np.uint16
                np.testing.assert_array_equal(y, ref.astype(odt).view(np.uint16))
    assert len(norm._rows.signatures) == 1


def test_epilogue_program_layout():
    ep = W.make_epilogue([("add", np.ones(5, np.float32)), ("relu", None), ("mul", np.ones((3, 1))),
                          ("clamp", (0.0, 1.0))], 3, 5)
    assert list(ep.ops) == [W.EP_ADD, W.EP_RELU, W.EP_MUL, W.EP_CLAMP]
    assert tuple(ep.ipar[0]) == (0, 0, 1) and tuple(ep.ipar[2]) == (5, 1, 0)
    assert tuple(ep.fpar[3]) == (0.0, 1.0)


def test_numba_cache_folder_follows_every_kernel_source(monkeypatch):
    """Numba re-checks only a kernel's own file, so a change in a module it calls
    (the shared epilogue) once left stale machine code that skipped a post-op
    (SoftMax -> Log returned the SoftMax).  The cache folder is named by a hash
    of every source the compiled kernels depend on: a change there gives a fresh
    folder; a change in a runtime-only module (batch, cli, a fused plan, a
    pattern) keeps the folder, so the kernels are not compiled again."""
    import os
    from pathlib import Path

    from graph_api.kernels import numba_setup

    if "NUMBA_CACHE_DIR" not in numba_setup.APPLIED:
        pytest.skip("NUMBA_CACHE_DIR was set by the user")
    assert os.environ["NUMBA_CACHE_DIR"] == numba_setup._cache_dir()
    before = numba_setup._source_hash()
    real = Path.read_bytes
    edited_names = set()

    def edited(path):
        data = real(path)
        return data + b"\n# edited" if path.name in edited_names else data

    monkeypatch.setattr(Path, "read_bytes", edited)
    for runtime_only in ("batch.py", "cli.py", "wmatmul_plan.py", "matcher.py", "registry.py"):
        edited_names.add(runtime_only)
        assert numba_setup._source_hash() == before, runtime_only
    for compiled in ("wmatmul.py", "postops.py", "bits.py", "enums.py"):
        edited_names.add(compiled)
        changed = numba_setup._source_hash()
        assert changed != before, compiled
        before = changed


def test_compiled_sources_hold_every_project_import():
    """The hashed file list is closed under imports: every project module a
    hashed file imports (read here with ``ast``, independently of the regular
    expression numba_setup uses), at any depth of its code, is hashed too."""
    import ast

    from graph_api.kernels import numba_setup

    here, core = numba_setup._layout()
    hashed = set(numba_setup.compiled_sources())
    assert here / "weight_compressed" / "wmatmul.py" in hashed and here / "sdpa" / "prefill.py" in hashed
    assert here / "sdpa" / "decode.py" in hashed and here / "sdpa" / "operands.py" in hashed
    assert core / "postops.py" in hashed and core / "batch.py" not in hashed
    for path in here.rglob("*.py"):  # every module that compiles with Numba, subfolders too
        if b"from graph_api.kernels.numba_setup import" in path.read_bytes() and not path.name.endswith("_plan.py"):
            assert path in hashed, path.name
    for path in hashed:
        package = numba_setup._label(path, here, core)[1]
        for node in ast.walk(ast.parse(path.read_bytes())):
            if isinstance(node, ast.ImportFrom):
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + [node.module or ""]).strip(".") \
                    if node.level else node.module
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                found = numba_setup._module_file(name, here, core)
                if found is not None and found.name != "__init__.py":
                    assert found in hashed, (path.name, name)


def test_compiled_sources_reach_kernel_modules_in_subfolders(tmp_path, monkeypatch):
    """A kernel module in a folder below ``kernels/`` (a family package such as
    ``kernels/sdpa/``) is hashed with what it imports (relative imports too); a
    plan (``*_plan.py``) there is runtime-only; editing the module gives a new hash."""
    from graph_api.kernels import numba_setup

    here, core = tmp_path / "kernels", tmp_path / "graph_api"
    (here / "fam").mkdir(parents=True)
    core.mkdir()
    (here / "numba_setup.py").write_text("")
    (here / "fam" / "__init__.py").write_text("from .tiled import attend\n")
    (here / "fam" / "tiled.py").write_text(
        "from graph_api.kernels.numba_setup import numba\nfrom .steps import step\n"
        "from graph_api.postops import ADD\n")
    (here / "fam" / "steps.py").write_text("def step(): pass\n")
    (here / "fam" / "fam_plan.py").write_text(
        "from graph_api.kernels.numba_setup import numba\nfrom graph_api.batch import x\n")
    (core / "postops.py").write_text("ADD = 1\n")
    (core / "batch.py").write_text("x = 1\n")
    monkeypatch.setattr(numba_setup, "_layout", lambda: (here, core))
    assert set(numba_setup.compiled_sources()) == {
        here / "numba_setup.py", here / "fam" / "tiled.py", here / "fam" / "steps.py", core / "postops.py"}
    before = numba_setup._source_hash()
    (here / "fam" / "steps.py").write_text("def step(): return 1\n")
    assert numba_setup._source_hash() != before


def test_kernel_cache_location_is_the_hash_folder():
    """Kernel functions cache in KERNEL_CACHE_DIR itself (no per-path subfolder),
    so every checkout and virtual environment with the same sources shares it."""
    from graph_api.kernels import numba_setup, store

    assert os.path.basename(numba_setup.KERNEL_CACHE_DIR) == f"numba-{numba_setup._source_hash()}"
    cache = store._store_block._cache
    assert cache.cache_path == numba_setup.KERNEL_CACHE_DIR
    assert _apply._cache.cache_path != numba_setup.KERNEL_CACHE_DIR  # a test file: Numba's own locator



def test_kernel_in_a_subfolder_caches_in_the_hash_folder():
    """A kernel of a family package (``kernels/sdpa/``) caches in KERNEL_CACHE_DIR too,
    its cache files named with its folder (no clash with a module of the same name
    directly in ``kernels/``)."""
    from graph_api.kernels import numba_setup
    from graph_api.kernels.sdpa import decode

    impl = decode.decode_items._cache._impl
    assert decode.decode_items._cache.cache_path == numba_setup.KERNEL_CACHE_DIR
    assert impl.locator.get_disambiguator().startswith("sdpa_")

_CACHE_CHILD = """
import numpy as np
from graph_api.kernels import bits, numba_setup
out = np.empty(8, np.float32)
bits.load_row_f32(np.arange(8, dtype=np.float32), 0, 0, out)
assert out.tolist() == list(range(8)), out
stats = bits.load_row_f32.stats
print(numba_setup.KERNEL_CACHE_DIR, stats.cache_hits.total(), stats.cache_misses.total())
"""


def test_kernel_cache_shared_by_two_source_copies(tmp_path):
    """Two copies of the sources in different folders (two checkouts, or one
    ``pip install`` per virtual environment) with one cache base: the second
    copy loads the first one's compiled kernel instead of compiling it."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "GRAPH_API_NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("NUMBA_CACHE_DIR", None)
    lines = []
    for copy in ("a", "b"):
        for folder in ("graph_api", "kernels", "patterns"):
            shutil.copytree(root / folder, tmp_path / copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
        p = subprocess.run([sys.executable, "-c", _CACHE_CHILD], cwd=tmp_path / copy, capture_output=True, text=True,
                           env={**env, "PYTHONPATH": str(tmp_path / copy)}, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        lines.append(p.stdout.split())
    (dir_a, hits_a, misses_a), (dir_b, hits_b, misses_b) = lines
    assert dir_a == dir_b and dir_a.startswith(str(tmp_path / "cache"))
    assert (int(hits_a), int(misses_a)) == (0, 1)  # compiled in copy a
    assert (int(hits_b), int(misses_b)) == (1, 0)  # loaded from the cache in copy b


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 33, 1000])
def test_abs_max_one_read(n):
    from graph_api.kernels.store import abs_max

    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 10).astype(np.float32)
    want = float(np.abs(x).max()) if n else 0.0
    assert abs_max(x) == want and abs_max(-x) == want
    if n > 2:
        for bad in (np.nan, np.inf, -np.inf):  # anywhere, also in the scalar tail
            for i in (0, n - 1):
                y = x.copy()
                y[i] = bad
                assert np.isnan(abs_max(y))
        y = np.stack([x, x])[:, ::2]  # a strided view: numpy's two reads
        assert abs_max(y) == float(np.abs(y).max())


@njit(cache=True)
def _sums(x, shift):
    out = np.empty((x.shape[0], 2))
    for r in range(x.shape[0]):
        out[r, 0] = norm._sum64(x[r], shift, False)
        out[r, 1] = norm._sum64(x[r], shift, True)
    return out


@pytest.mark.parametrize("C", [1, 7, 8, 37, 384])
def test_layer_norm_f64_sums_in_lane_order(C):
    """The f64x8 sums of norm._sum64 add element j into lane j % 8 (the tail into lane 0)
    and the lanes as ((0+1)+(2+3))+((4+5)+(6+7)): exactly that order in f64."""
    rng = np.random.default_rng(C)
    x = (rng.standard_normal((3, C)) * 5 + 2).astype(np.float32)
    shift = 0.37
    got = _sums(x, shift)
    for r in range(3):
        d = x[r].astype(np.float64) - shift
        for col, v in ((0, d), (1, d * d)):
            c8 = C - C % 8
            lanes = [0.0] * 8
            for c in range(c8):
                lanes[c % 8] += v[c]
            for c in range(c8, C):
                lanes[0] += v[c]
            want = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
            assert got[r, col] == want


def test_vexp_is_exp32_lane_by_lane():
    """The 16-lane exp runs exp32's operations: the same values, specials included."""
    from numba import njit

    from graph_api.kernels.bits import exp32, vexp, vload, vstore

    @njit
    def run(x, a, b):
        for i in range(0, x.size, 16):
            vstore(a, i, vexp(vload(x, i)))
        for i in range(x.size):
            b[i] = exp32(x[i])

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-100, 100, 4000), [-np.inf, np.inf, np.nan, 0.0, -87.34, 88.73, -87.3, 88.7],
                        rng.standard_normal(88)]).astype(np.float32)
    a, b = np.empty_like(x), np.empty_like(x)
    run(x, a, b)
    assert np.array_equal(a, b, equal_nan=True)


def test_kind_loads_from_byte_buffers_widen_exactly():
    """ld_kind / vld_kind read f32, bf16, f16, int8 and uint8 values from the stored bytes
    (a uint8 view) as the exact f32 numpy/ml_dtypes widen them to, specials included, at
    unaligned element offsets; an unknown kind gives zeros."""
    from graph_api.kernels.bits import ld_kind, vld_kind, vstore

    @njit
    def run(buf, kind, n, one, sixteen):
        for i in range(n):
            one[i] = ld_kind(buf, i, kind)
        for i in range(0, n - 15, 5):
            vstore(sixteen, i * 16 // 5, vld_kind(buf, i, kind))

    rng = np.random.default_rng(1)
    f = np.concatenate([SPECIAL, rng.standard_normal(62).astype(np.float32)])
    stored = {0: f, 1: f.astype(ml_dtypes.bfloat16), 2: f.astype(np.float16),
              3: rng.integers(-128, 128, 80).astype(np.int8), 4: rng.integers(0, 256, 80).astype(np.uint8)}
    for kind, x in list(stored.items()) + [(7, stored[0])]:
        n = x.size
        one, sixteen = np.empty(n, np.float32), np.full(16 * n // 5 + 16, -1.0, np.float32)
        run(x.view(np.uint8), kind, n, one, sixteen)
        want = x.astype(np.float32) if kind < 5 else np.zeros(n, np.float32)
        assert np.array_equal(one, want, equal_nan=True), kind
        for i in range(0, n - 15, 5):
            assert np.array_equal(sixteen[i * 16 // 5:i * 16 // 5 + 16], want[i:i + 16], equal_nan=True), kind

"""The workloads.  Every figure is a median wall time of the call as a user
makes it (entry-point overhead included), hot = one buffer reused (L3/L2
resident), cold = rotating through distinct copies totalling more than the L3.
"""
from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
import tempfile
import time

from graph_api.kernels.numba_setup import numba

import numpy as np
from numba import njit, prange

from benchmarks import peers
from graph_api.kernels import sdpa as SD
from graph_api.kernels.weight_compressed import wmatmul as WM
from graph_api.kernels.bits import RND_BF16, prefetch

COLD_BYTES = 1 << 30  # rotation working set for "cold" (quick: 640 MiB)


@functools.cache
def host_cpu() -> tuple[str, frozenset]:
    """(CPU model name, its /proc/cpuinfo flags); ("unknown", {}) where that file is missing."""
    model, flags = platform.processor() or "unknown", frozenset()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = frozenset(value.split())
                    break
    except OSError:
        pass
    return model, flags


def bf16_unit() -> str | None:
    """The unit the kernels' bf16 products run on (kernels/isa.py), or None."""
    from graph_api.kernels.isa import ISA

    return ISA.bf16_unit


def bf16_hardware() -> bool:
    """The CPU multiplies bf16 natively (avx512_bf16 or AMX), as PyTorch's bf16 peers assume."""
    return bool(host_cpu()[1] & {"avx512_bf16", "amx_bf16"})


def timeit(fn, ncopies, reps, warm=2):
    for i in range(warm):
        fn(i % ncopies)
    ts = []
    for i in range(reps):
        t = time.perf_counter()
        fn(i % ncopies)
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


#: untimed pause before each timed call of an interleaved round (seconds)
SETTLE_S = 1e-3


def _settle():
    """Let the previous implementation's thread pool go idle before the next call
    is timed: without it, threads still spinning after a peer's call (OpenMP
    teams, OpenBLAS workers) share the 2 cores with the next implementation's
    threads and inflate its time (measured: the int4 decode kernel 0.26 ms alone,
    ~0.5 ms right after PyTorch's int4pack_mm).  The main thread busy-waits, so it
    does not go idle itself."""
    end = time.perf_counter() + SETTLE_S
    while time.perf_counter() < end:
        pass


def timeit_interleaved(jobs, warm=2, rewarm=False):
    """Medians of ``{name: (fn, ncopies, reps)}`` measured in rounds (each job
    once per round, until its reps are done), so that load swings on a shared
    machine hit every implementation alike instead of whichever ran then.

    ``rewarm``: each timed call of a one-copy job follows an untimed call of the
    same job, so its data is in the caches ("hot").  Without it the other jobs of
    the round (each streaming its own ~9 MB of weights) evict it from the 32 MiB
    L3 and a "hot" row reads DRAM."""
    for fn, nc, _ in jobs.values():
        for i in range(warm):
            fn(i % nc)
    ts = {name: [] for name in jobs}
    for r in range(max(reps for _, _, reps in jobs.values())):
        for name, (fn, nc, reps) in jobs.items():
            if r < reps:
                if rewarm and nc == 1:
                    fn(0)
                _settle()
                t = time.perf_counter()
                fn(r % nc)
                ts[name].append(time.perf_counter() - t)
    return {name: float(np.median(v)) for name, v in ts.items()}


# --------------------------------------------------------------- bandwidth
@njit(parallel=True, fastmath=True, cache=True)
def _read(a, nch):
    n = a.size // nch
    s = np.zeros(nch, np.float32)
    for c in prange(nch):
        acc = np.zeros(64, np.float32)
        for i0 in range(c * n, (c + 1) * n - 63, 64):
            prefetch(a, i0 + 512)
            prefetch(a, i0 + 528)
            prefetch(a, i0 + 544)
            prefetch(a, i0 + 560)
            for j in range(64):
                acc[j] += a[i0 + j]
        s[c] = acc.sum()
    return s.sum()


def l3_bytes() -> int:
    """The last-level cache's size from sysfs (its largest ``cache/index*``), or 32 MiB."""
    best = 0
    for index in range(8):
        try:
            with open(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size") as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        best = max(best, int(text.rstrip("KMG") or 0) * scale)
    return best or 32 << 20


def l3_probe_mib() -> int:
    """MiB read for the L3-resident bandwidth: half the L3, at most 32."""
    return max(1, min(32, l3_bytes() // 2 >> 20))


def measure_bandwidth(quick):
    """(cold GB/s, L3 GB/s): best of a prefetching Numba read and, if present,
    torch.sum, over 512 MiB (cold) and half the L3, at most 32 MiB (L3-resident:
    a buffer the size of a 32 MiB L3 does not stay in it, and reads DRAM)."""
    out = []
    for mib in (512 if not quick else 384, l3_probe_mib()):
        a = np.ones(mib * (1 << 20) // 4, np.float32)
        nch = numba.get_num_threads()
        _read(a, nch)
        t = min(timeit(lambda i: _read(a, nch), 1, 5, 1) for _ in range(3))
        best = a.nbytes / t / 1e9
        if peers.have_torch():
            ta = peers.torch.from_numpy(a)
            t2 = min(timeit(lambda i: ta.sum(), 1, 5, 1) for _ in range(3))
            best = max(best, a.nbytes / t2 / 1e9)
        out.append(best)
    return tuple(out)


# ---------------------------------------------------------- int4 matmul
def _weights(K, N, G, signed, zp, ncopies, rng):
    base = rng.integers(0, 256, K * N // 2, dtype=np.uint8)
    copies = []
    for c in range(ncopies):
        w = base ^ np.uint8((c * 37 + 1) & 255)  # distinct bytes per copy
        sc = (rng.random((N, K // G), dtype=np.float32) * 0.02 + 0.001)
        z = rng.integers(0, 16, (N, K // G)).astype(np.uint8) if zp else None
        copies.append((w, sc, z, N, K))
    return copies


def bench_int4(rows, bw, K, N, G, kind, M, quick, rng, peers_on=True):
    signed = kind == "s4"
    zp = kind == "u4"
    wbytes = K * N // 2 + (K // G) * N * 4 + ((K // G) * N // 2 if zp else 0)
    decode = M <= WM.DECODE_MAX_M  # M = 2..8: speculative decoding / small batches, weights read once
    ncold = max(2, int((COLD_BYTES if not quick else 400 << 20) // wbytes)) if decode else 1
    copies = _weights(K, N, G, signed, zp, ncold, rng)
    spec = WM.WeightSpec(kind, K, N, G, True)
    prepared = [WM.prepare(w, spec, sc, z) for (w, sc, z, _, _) in copies]
    x = rng.standard_normal((M, K)).astype(np.float32)
    out = np.empty((M, N), np.float32)
    ours = lambda i: WM.wmatmul(x, None, spec, prepared=prepared[i], out=out)
    direct = lambda i: WM.wmatmul(x, copies[i][0], spec, copies[i][1], copies[i][2], out=out)
    # fpmath bf16 + apply_to_int (oneDNN set_fpmath_mode(bf16, true)): the vdpbf16ps decode kernel
    bf16_on = decode and WM.bf16_decode_applies(spec)
    pairs = [WM.prepare_bf16(w, spec, sc, z) for (w, sc, z, _, _) in copies] if bf16_on else []
    ours_bf16 = lambda i: WM.wmatmul(x, None, spec, prepared=pairs[i], out=out, rnd_x=RND_BF16, rnd_w=RND_BF16)
    # the same prepared weights: the AMX prefill keeps its bf16 tiles on them
    ours_bf16_prefill = lambda i: WM.wmatmul(x, None, spec, prepared=prepared[i], out=out, rnd_x=RND_BF16,
                                             rnd_w=RND_BF16)
    reps = 60 if decode else (5 if quick else 10)
    label = f"int4 {'decode' if decode else 'prefill'} M={M} K={K} N={N} g{G} {kind}{'+zp' if zp else ''}"
    flops = 2.0 * M * K * N
    modes = [("cold", ncold), ("hot", 1)] if decode else [("hot", 1)]
    for mode, nc in modes:
        jobs = {"project (blocked, prepared)": (ours, nc, reps)}
        if bf16_on:
            jobs["project fpmath bf16 (vdpbf16ps)"] = (ours_bf16, nc, reps)
        if not decode and bf16_unit():  # bf16 + apply_to_int prefill: the host's bf16 unit
            jobs[f"project fpmath bf16 ({bf16_unit()})"] = (ours_bf16_prefill, nc, reps)
        if decode and mode == "hot":
            jobs["project direct [N,K]"] = (direct, 1, 10)
        if peers_on:
            pl = copies[:nc]
            if decode and (not quick or mode == "hot"):
                jobs["numpy dequant+matmul"] = (peers.make_numpy_dequant_matmul(x, pl, G, signed), nc, 3)
            dense_n = min(nc, 2 if not decode else nc)
            if not decode or not quick:
                dense = [peers.dequant_nk(peers.unpack_nk(w, N, K), signed, sc, z, G).T.copy()
                         for (w, sc, z, _, _) in pl[:dense_n]] if (not decode or mode == "hot") else None
                if dense is not None:
                    jobs["numpy f32 BLAS (pre-dequantized)"] = (peers.make_numpy_dense(x, dense), len(dense), reps)
                    # without bf16 hardware PyTorch emulates bf16 GEMMs: about a minute per
                    # call at M = 512 on an AVX2 host, and no peer a bf16 user would pick
                    f = peers.make_torch_dense(x, dense, "bf16") if decode or bf16_hardware() else None
                    if f:
                        jobs[f"torch bf16 dense{' (AMX)' if 'amx_bf16' in host_cpu()[1] else ''}"] = \
                            (f, len(dense), reps)
            f = peers.make_torch_int4(x, pl, G, signed)
            if f:
                jobs["torch int4pack_mm (bf16 act)"] = (f, nc, reps)
            for acc in (0, 4):
                f = peers.make_ort_matmulnbits(x, pl, G, signed, acc)
                if f:
                    jobs[f"ORT MatMulNBits acc{acc}"] = (f, nc, reps)
        res = timeit_interleaved(jobs, rewarm=decode and mode == "hot")
        ref = res["project (blocked, prepared)"]
        for name, t in res.items():
            gbs = wbytes / t / 1e9
            pct = 100 * gbs / (bw[0] if mode == "cold" else bw[1])
            rows.append((label, mode, name, t * 1e3, t / ref, f"{gbs:.1f} GB/s ({pct:.0f}%)"
                         if decode else f"{flops / t / 1e9:.0f} GFLOP/s"))
    return rows


# ------------------------------------------------------------ SDPA decode
def _kv_copies(Hkv, S, D, G, kind, ncopies, rng):
    n = Hkv * S * D
    bits4 = kind in ("s4", "u4")
    base = (rng.integers(0, 256, n // 2, dtype=np.uint8) if bits4 else rng.integers(-128, 128, n).astype(np.int8))
    out = []
    for c in range(ncopies):
        data = base ^ (base.dtype.type((c * 29 + 3) & 127))
        k = SD.KV(data, kind, (1, Hkv, S, D), True, G,
                  (rng.random((1, Hkv, D // G, S), dtype=np.float32) * 0.05), None)
        v = SD.KV(data[::-1].copy(), kind, (1, Hkv, S, D), False, G,
                  (rng.random((1, Hkv, S, D // G), dtype=np.float32) * 0.05), None)
        out.append((k, v))
    return out


def _kv_dense(kv):
    """Dequantized logical [B, H, S, D] f32 of a KV operand (numpy, peers only)."""
    B, H, S, D = kv.shape
    from graph_api.kernels.quantize import dequantize
    if kv.transposed:
        x = dequantize(kv.data, (B, H, D, S), np.repeat(kv.scales, kv.group, axis=2),
                       dtype=kv.kind, group=1)
        return np.ascontiguousarray(x.swapaxes(2, 3))
    return dequantize(kv.data, (B, H, S, D), kv.scales, dtype=kv.kind, group=kv.group)


def numpy_sdpa(q, k, v, causal=False):
    B, Hq, Sq, D = q.shape
    rep = Hq // k.shape[1]
    k = np.repeat(k, rep, 1)
    v = np.repeat(v, rep, 1)
    s = q @ k.swapaxes(2, 3) / np.float32(np.sqrt(D))
    if causal:
        S = k.shape[2]
        s = np.where(np.arange(S)[None] > np.arange(Sq)[:, None] + (S - Sq), -np.inf, s)
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def bench_sdpa_decode(rows, bw, Hkv, S, kind, quick, rng, peers_on=True, modes=("cold", "hot"),
                      fpmath="strict"):
    """``fpmath="bf16"``: the partition's mode is bf16 with apply_to_int (Q.K and P.V on
    vdpbf16ps where the CPU has AVX512_BF16)."""
    Hq, D, G = 32, 128, 32
    kw = dict(rnd=1, bf16_dot=True) if fpmath == "bf16" else {}
    bits = 4 if kind in ("s4", "u4") else 8
    kvbytes = 2 * Hkv * S * D * bits // 8 + 2 * Hkv * S * (D // G) * 4
    ncold = max(2, int((COLD_BYTES if not quick else 400 << 20) // kvbytes))
    copies = _kv_copies(Hkv, S, D, G, kind, ncold, rng)
    q = rng.standard_normal((1, Hq, 1, D)).astype(np.float32)
    out = np.empty((1, Hq, 1, D), np.float32)
    label = f"SDPA decode Hq=32 Hkv={Hkv} D=128 L={S} {kind} K/V g32" + (" fpmath bf16" if kw else "")
    for mode in modes:
        nc = ncold if mode == "cold" else 1
        res = {"project (decode kernel: GQA, split-KV)": timeit(
            lambda i: SD.sdpa(q, copies[i][0], copies[i][1], out=out, **kw), nc, 30)}
        if peers_on:
            nd = min(nc, max(2, int((COLD_BYTES if not quick else 400 << 20) // (2 * Hkv * S * D * 2))))
            dense = [(_kv_dense(k), _kv_dense(v)) for k, v in copies[:nd]]
            if mode == "hot" or not quick:
                res["numpy (dequantized f32)"] = timeit(
                    lambda i: numpy_sdpa(q, dense[i][0], dense[i][1]), 1, 3, 1)
            for dt in ("bf16", "f32"):
                f = peers.make_torch_sdpa(q, [d[0] for d in dense], [d[1] for d in dense], dt)
                if f:
                    res[f"torch SDPA {dt} dense"] = timeit(f, len(dense), 30)
        ref = res["project (decode kernel: GQA, split-KV)"]
        for name, t in res.items():
            extra = ""
            if name.startswith("project"):
                gbs = kvbytes / t / 1e9
                extra = f"{gbs:.1f} GB/s ({100 * gbs / (bw[0] if mode == 'cold' else bw[1]):.0f}%)"
            rows.append((label, mode, name, t * 1e3, t / ref, extra))
    return rows


def bench_sdpa_prefill(rows, quick, rng, peers_on=True, lengths=(512, 2048)):
    """Causal self-attention, H=32, D=128: f32, bf16 and int4 K/V (s4, groups of 32, K
    stored [D, S]) against PyTorch on the (dequantized) values.  f32 runs the f32 prefill
    kernel, and beside it fpmath bf16 (Q, K, V and the probabilities rounded to bf16, both
    products on the bf16 unit where the host has one); bf16 (a bf16 graph: bf16
    probabilities) runs both products on the bf16 unit, else the f32 kernel on widened
    values; int4 K/V are widened to f32 once per call (``kernels/sdpa/``)."""
    from graph_api.kernels.bits import RND_BF16
    from graph_api.kernels.sdpa import prefill_bf16

    B, H, D = 1, 32, 128
    import ml_dtypes
    unit = "vdpbf16ps" if prefill_bf16.AVAILABLE else "f32 kernel"
    for S in lengths:
        q = rng.standard_normal((B, H, S, D)).astype(np.float32)
        k = rng.standard_normal((B, H, S, D)).astype(np.float32)
        v = rng.standard_normal((B, H, S, D)).astype(np.float32)
        kinds = ("f32", "bf16", "s4")
        for dt in kinds:
            qq = q
            if dt == "f32":
                K, V, kd, vd = SD.KV(k, "f32", k.shape), SD.KV(v, "f32", v.shape), k, v
            elif dt == "bf16":
                K = SD.KV(k.astype(ml_dtypes.bfloat16).view(np.uint16), "bf16", k.shape)
                V = SD.KV(v.astype(ml_dtypes.bfloat16).view(np.uint16), "bf16", v.shape)
                qq, kd, vd = q.astype(ml_dtypes.bfloat16), k, v
            else:
                K, V = _kv_copies(H, S, D, 32, "s4", 1, rng)[0]
                kd, vd = _kv_dense(K), _kv_dense(V)
            label = f"SDPA prefill {S}x{S} causal H=32 D=128 {dt}" + (" K/V g32" if dt == "s4" else "") + \
                (f" (both products on {unit})" if dt == "bf16" else "")
            reps = 3 if S <= 512 else 2
            res = {"project": timeit(lambda i: SD.sdpa(qq, K, V, causal="top_left", bf16_probs=dt == "bf16"),
                                     1, reps, 1)}
            if dt == "f32" and prefill_bf16.AVAILABLE:  # a relaxed mode is worth a row where a unit runs it
                res[f"project fpmath bf16 ({unit})"] = timeit(
                    lambda i: SD.sdpa(q, K, V, causal="top_left", rnd=RND_BF16, bf16_probs=True), 1, reps, 1)
            if peers_on:
                if dt == "f32" and S <= 512:
                    res["numpy reference"] = timeit(lambda i: numpy_sdpa(q, k, v, True), 1, 3, 1)
                for pdt in (("f32", "bf16") if dt == "f32" and prefill_bf16.AVAILABLE else
                            ("f32",) if dt != "bf16" else ("bf16",)):
                    f = peers.make_torch_sdpa(q, [kd], [vd], pdt, causal=True)
                    if f:
                        res[f"torch SDPA {pdt}" + (" dense" if dt == "s4" else "")] = timeit(f, 1, 5)
            ref = res["project"]
            for name, t in res.items():
                rows.append((label, "hot", name, t * 1e3, t / ref, ""))
    return rows


# ------------------------------------------------------------ compile cost
_COMPILE_SNIPPET = r"""
import time, sys
t0 = time.process_time()
sys.path.insert(0, {root!r})
import numpy as np
from graph_api.kernels import sdpa as SD
from graph_api.kernels.weight_compressed import wmatmul as WM
from graph_api.kernels.sdpa import blocked, decode, tiled
t1 = time.process_time()
K = N = 256; G = 32
w = np.zeros(K * N // 2, np.uint8); sc = np.ones((N, K // G), np.float32)
spec = WM.WeightSpec("s4", K, N, G, True)
pw = WM.prepare(w, spec, sc)
x = np.ones((1, K), np.float32)
WM.wmatmul(x, None, spec, prepared=pw)
t2 = time.process_time()
q = np.ones((1, 4, 1, 64), np.float32)
def kv(S, tr):
    sh = (1, 1, 64 // 32, S) if tr else (1, 1, S, 64 // 32)
    return SD.KV(np.zeros(S * 64 // 2, np.uint8), "s4", (1, 1, S, 64), tr, 32, np.ones(sh, np.float32))
SD.sdpa(q, kv(100, True), kv(100, False))
t3 = time.process_time()
nsig = lambda: sum(len(f.signatures) for f in (tiled.attend_tiles, blocked.attend_blocked, decode.decode_items))
n0 = nsig()
SD.sdpa(q, kv(332, True), kv(332, False))
t4 = time.process_time()
qp = np.ones((1, 4, 256, 64), np.float32)
kp = SD.KV(np.ones((1, 4, 64, 256), np.float32), "f32", (1, 4, 256, 64), True)
SD.sdpa(qp, kp, SD.KV(np.ones((1, 4, 256, 64), np.float32), "f32", (1, 4, 256, 64)), causal="top_left")
t5 = time.process_time()
from graph_api.kernels import igemm
igemm.gemm(np.ones((64, 256), np.uint8), igemm.PackedB(np.ones((256, 128), np.int8), np.uint8), 1)
t6 = time.process_time()
print(t1 - t0, t2 - t1, t3 - t2, t4 - t3, nsig() - n0, t5 - t4, t6 - t5)
"""


def bench_compile(rows, quick=False):
    """Cold = empty NUMBA_CACHE_DIR (full mode only), warm = a new process on
    the populated cache (quick mode: the project's normal cache).  Times are the
    child's CPU time (compiling is single-threaded; CPU time stays meaningful on
    a loaded machine, where wall time does not)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ) if quick else dict(os.environ, NUMBA_CACHE_DIR=cache)
        snippet = _COMPILE_SNIPPET.format(root=root)
        res = []
        for _ in range(2):
            p = subprocess.run([sys.executable, "-c", snippet], env=env, capture_output=True, text=True)
            if p.returncode:
                rows.append(("compile", "-", "error: " + p.stderr[-200:], float("nan"), 1.0, ""))
                return rows
            res.append([float(v) for v in p.stdout.split()])
    cold, warm = res
    rows.append(("compile: import kernels", "-", "project", warm[0] * 1e3, 1.0, ""))
    if not quick:
        rows.append(("compile: wmatmul decode, first call", "cold (empty cache)", "project", cold[1] * 1e3, 1.0, ""))
    rows.append(("compile: wmatmul decode, first call", "warm (disk cache, new process)", "project", warm[1] * 1e3, 1.0, ""))
    if not quick:
        rows.append(("compile: sdpa decode, first call", "cold (empty cache)", "project", cold[2] * 1e3, 1.0, ""))
    rows.append(("compile: sdpa decode, first call", "warm (disk cache, new process)", "project", warm[2] * 1e3, 1.0, ""))
    rows.append(("compile: sdpa new KV length (in-process)", "warm", "project", warm[3] * 1e3, 1.0,
                 f"new signatures: {int(warm[4])}"))
    for label, i in (("compile: sdpa f32 prefill (K stored [D, S]), first call", 5),
                     (f"compile: int8 GEMM ({'VNNI' if 'avx512_vnni' in host_cpu()[1] else 'AVX2'}), first call", 6)):
        if not quick:
            rows.append((label, "cold (empty cache)", "project", cold[i] * 1e3, 1.0, ""))
        rows.append((label, "warm (disk cache, new process)", "project", warm[i] * 1e3, 1.0, ""))
    return rows


def bench_overhead(rows):
    K = N = 128
    G = 32
    spec = WM.WeightSpec("s4", K, N, G, True)
    pw = WM.prepare(np.zeros(K * N // 2, np.uint8), spec, np.ones((N, K // G), np.float32))
    x = np.ones((1, K), np.float32)
    out = np.empty((1, N), np.float32)
    t = timeit(lambda i: WM.wmatmul(x, None, spec, prepared=pw, out=out), 1, 2000, 50)
    rows.append(("per-execute overhead: wmatmul M=1 K=N=128", "hot", "project", t * 1e3, 1.0,
                 f"{t * 1e6:.1f} us"))
    return rows


def bench_partition_overhead(rows):
    """``CompiledPartition.execute`` on a 4-element ReLU: the runtime's own cost."""
    import graph_api as ga

    a = ga.LogicalTensor(0, ga.DataType.f32, [4])
    b = ga.LogicalTensor(1, ga.DataType.f32, [4])
    g = ga.Graph()
    g.add_op(ga.Op(0, ga.OpKind.ReLU, [a], [b]))
    g.finalize()
    (part,) = g.get_partitions()
    engine = ga.Engine()
    stream = ga.Stream(engine)
    cp = part.compile([a], [b], engine)
    ins, outs = [ga.Tensor(a, engine, np.ones(4, np.float32))], [ga.Tensor(b, engine)]
    t = timeit(lambda i: cp.execute(stream, ins, outs), 1, 5000, 200)
    rows.append(("per-execute overhead: CompiledPartition.execute, 4-elem ReLU", "hot", "project",
                 t * 1e3, 1.0, f"{t * 1e6:.1f} us"))
    return rows


def bench_decoder_layer(rows, quick=False):
    """One decode step of the LLM sample's decoder layer (samples/02): int4
    weights (~20 MB, L3-resident: hot), int4 KV cache of 2048 positions, GQA,
    gated MLP, run through the graph API (partitions compiled once)."""
    import importlib

    import graph_api as ga

    sample = importlib.import_module("samples.02_int4_decoder_layer")
    cfg = sample.CONFIGS["full"]
    graph, ins, out = sample.build(cfg, sample.Ids())
    weights = sample.make_weights(cfg, np.random.default_rng(0))
    engine = ga.Engine()
    feeds = {lt.id: weights[name] if lt.property == ga.PropertyType.host_scalar
             else ga.Tensor(lt, engine, np.asarray(weights[name]).reshape(lt.shape))
             for name, lt in ins.items()}
    first = ga.run_graph(graph, feeds)
    parts = [r.partition for r in first.partitions]
    t = timeit(lambda i: ga.run_graph(graph, feeds, partitions=parts), 1, 5 if quick else 20, 2)
    kernels = ",".join(sorted({r.compiled.plan.name for r in first.partitions}))
    rows.append(("decoder-layer decode step (hidden 2048, 16/4 heads, KV 2048, int4)", "hot",
                 "project", t * 1e3, 1.0, f"{1 / t:.1f} tokens/s; kernels {kernels}"))
    return rows


def bench_graph_overhead(rows):
    """A 20-partition chain of tiny element-wise ops (4x4 f32, debug policy: one
    op per partition) through ``CompiledGraph``: the runtime's cost per partition
    (the issue's goal: < 20 us)."""
    import graph_api as ga

    g = ga.Graph()
    kinds = [ga.OpKind.ReLU, ga.OpKind.Abs, ga.OpKind.Tanh, ga.OpKind.Sigmoid, ga.OpKind.Exp]
    x = ga.LogicalTensor(0, ga.DataType.f32, [4, 4])
    for i in range(20):
        y = ga.LogicalTensor(i + 1, ga.DataType.f32, [4, 4])
        g.add_op(ga.Op(i, kinds[i % len(kinds)], [x], [y]))
        x = y
    g.finalize()
    feeds = {0: np.ones((4, 4), np.float32)}
    compiled = ga.compile_graph(g, feeds, policy=ga.PartitionPolicy.debug)
    t = timeit(lambda i: compiled(feeds), 1, 2000, 50) / len(compiled.steps)
    rows.append(("per-partition overhead: 20-partition graph of 4x4 element-wise ops", "hot", "project",
                 t * 1e3, 1.0, f"{t * 1e6:.1f} us per partition"))
    return rows


def bench_int8_decode(rows, bw, K, N, G, kind, M, rng):
    """s8/u8 weight decode ([N, K] int8 with f32 group scales): the project's
    kernel cold/hot, and numpy f32 GEMV on pre-dequantized weights (hot)."""
    wbytes = K * N + (K // G) * N * 4
    ncold = max(2, int(COLD_BYTES // wbytes))
    base = rng.integers(-128, 128, K * N).astype(np.int8 if kind == "s8" else np.uint8)
    spec = WM.WeightSpec(kind, K, N, G, True)
    sc = rng.random((N, K // G), dtype=np.float32) * 0.02 + 0.001
    prepared = [WM.prepare(base ^ base.dtype.type(c % 97), spec, sc) for c in range(ncold)]
    x = rng.standard_normal((M, K)).astype(np.float32)
    out = np.empty((M, N), np.float32)
    label = f"int8 decode M={M} K={K} N={N} g{G} {kind}"
    dense = (base.astype(np.float32).reshape(N, K) * np.repeat(sc, G, axis=1)).T.copy()
    for mode, nc in (("cold", ncold), ("hot", 1)):
        jobs = {"project (blocked, prepared)": (
            lambda i: WM.wmatmul(x, None, spec, prepared=prepared[i], out=out), nc, 60)}
        if mode == "hot":
            jobs["numpy f32 BLAS (pre-dequantized)"] = (lambda i: x @ dense, 1, 20)
        res = timeit_interleaved(jobs, rewarm=mode == "hot")
        ref = res["project (blocked, prepared)"]
        for name, t in res.items():
            gbs = wbytes / t / 1e9
            pct = 100 * gbs / (bw[0] if mode == "cold" else bw[1])
            rows.append((label, mode, name, t * 1e3, t / ref, f"{gbs:.1f} GB/s ({pct:.0f}%)"))
    return rows

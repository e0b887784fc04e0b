"""Run the benchmark suite: ``python -m benchmarks [--quick] [--out FILE] [--no-peers]``.

Prints one table (workload, hot/cold, implementation, ms, time / project time,
bandwidth or throughput) and writes it as markdown to ``benchmarks/results.md``
or ``--out``.  Peers (PyTorch, ONNX Runtime) are used when installed (the
``bench`` extra).  ``--quick`` runs a representative subset in < 2 minutes.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

from graph_api.kernels.numba_setup import numba

import numpy as np

from benchmarks import peers, suite


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks")
    ap.add_argument("--quick", action="store_true", help="subset, < 2 minutes")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results.md"))
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--only", default="", help="comma list: int4,prefill,matmul,sdpa,sdpa_bf16,prefill_sdpa,compile,overhead,decoder,bert,qmatmul,moe,cnn,sparse,sdpa_quantized,sdpa_backward,onnx,torch_frontend")
    args = ap.parse_args(argv)
    only = set(filter(None, args.only.split(",")))
    want = lambda k: not only or k in only
    rng = np.random.default_rng(0)
    t_start = time.perf_counter()
    rows = []
    peers_on = not args.no_peers
    bw = suite.measure_bandwidth(args.quick)
    head = [f"# graph_api benchmark ({'quick' if args.quick else 'full'})", "",
            f"python {platform.python_version()}, numba {numba.__version__} "
            f"({numba.config.THREADING_LAYER} layer, {numba.get_num_threads()} threads), "
            f"torch {'yes' if peers.have_torch() else 'no'}, onnxruntime {'yes' if peers.have_ort() else 'no'}",
            _cpu_line(), _units_line(), _openblas_line(),
            f"measured read bandwidth: cold (> L3) {bw[0]:.1f} GB/s, "
            f"L3-resident ({suite.l3_probe_mib()} MiB) {bw[1]:.1f} GB/s", ""]
    print("\n".join(head), flush=True)

    def flush():
        _print(rows[-1:])

    if want("int4"):
        shapes = [(4096, 4096, 128, "s4")] if args.quick else \
            [(K, N, G, kd) for (K, N) in ((4096, 4096), (4096, 11008)) for G in (32, 128) for kd in ("s4", "u4")]
        for K, N, G, kd in shapes:
            n0 = len(rows)
            suite.bench_int4(rows, bw, K, N, G, kd, 1, args.quick, rng, peers_on)
            _print(rows[n0:])
        for M in (() if args.quick else (4, 8)):  # weights read once for all rows
            n0 = len(rows)
            suite.bench_int4(rows, bw, 4096, 4096, 128, "s4", M, args.quick, rng, peers_on)
            _print(rows[n0:])
        for K, N, G, kd in (() if args.quick else ((4096, 4096, 128, "s8"), (4096, 11008, 32, "s8"))):
            n0 = len(rows)
            suite.bench_int8_decode(rows, bw, K, N, G, kd, 1, rng)
            _print(rows[n0:])
    if want("prefill"):
        for M in ((128,) if args.quick else (32, 128, 512)):
            n0 = len(rows)
            suite.bench_int4(rows, bw, 4096, 4096, 128, "s4", M, args.quick, rng, peers_on)
            _print(rows[n0:])
    if want("matmul"):  # dense f32 MatMul, strict and fpmath bf16
        from benchmarks import matmul

        n0 = len(rows)
        matmul.bench_matmul(rows, args.quick, peers_on)
        _print(rows[n0:])
    if want("sdpa"):
        cases = [(8, 4096, "s4")] if args.quick else \
            [(h, L, kd) for h in (8, 32) for L in (1024, 4096, 16384) for kd in ("s4", "s8")]
        for h, L, kd in cases:
            n0 = len(rows)
            suite.bench_sdpa_decode(rows, bw, h, L, kd, args.quick, rng, peers_on)
            _print(rows[n0:])
    if want("sdpa_bf16"):  # the same rows under fpmath bf16 (apply_to_int)
        cases = [(8, 4096, "s4")] if args.quick else \
            [(h, L, kd) for h in (8, 32) for L in (1024, 4096, 16384) for kd in ("s4", "s8")]
        for h, L, kd in cases:
            n0 = len(rows)
            suite.bench_sdpa_decode(rows, bw, h, L, kd, args.quick, rng, peers_on, fpmath="bf16")
            _print(rows[n0:])
    if want("prefill_sdpa") and not args.quick:
        n0 = len(rows)
        suite.bench_sdpa_prefill(rows, args.quick, rng, peers_on)
        _print(rows[n0:])
    if want("compile"):
        n0 = len(rows)
        suite.bench_compile(rows, args.quick)
        _print(rows[n0:])
    if want("overhead"):
        n0 = len(rows)
        suite.bench_overhead(rows)
        suite.bench_partition_overhead(rows)
        suite.bench_graph_overhead(rows)
        _print(rows[n0:])
        n0 = len(rows)
    if want("decoder"):
        n0 = len(rows)
        suite.bench_decoder_layer(rows, args.quick)
        _print(rows[n0:])
    if want("bert"):
        from benchmarks import bert

        n0 = len(rows)
        bert.bench_bert(rows, args.quick, peers_on,
                        ((8, 64),) if args.quick else ((8, 64), (32, 128)))
        _print(rows[n0:])
    if want("cnn"):
        from benchmarks import cnn

        n0 = len(rows)
        cnn.bench_cnn(rows, args.quick, peers_on, (1,) if args.quick else (1, 8))
        _print(rows[n0:])
    if want("qmatmul"):
        from benchmarks import qmatmul

        n0 = len(rows)
        qmatmul.bench_qmatmul(rows, args.quick, peers_on)
        _print(rows[n0:])
    if want("moe"):
        from benchmarks import moe

        n0 = len(rows)
        moe.bench_moe(rows, args.quick, peers_on)
        _print(rows[n0:])
    if want("onnx"):
        from benchmarks import onnx_frontend

        n0 = len(rows)
        onnx_frontend.bench_onnx(rows, args.quick, peers_on)
        _print(rows[n0:])
    if want("torch_frontend"):
        from benchmarks import torch_frontend

        n0 = len(rows)
        torch_frontend.bench_torch_frontend(rows, args.quick)
        _print(rows[n0:])
    if want("sparse"):
        from benchmarks import sparse

        n0 = len(rows)
        sparse.bench_sparse(rows, args.quick, peers_on)
        _print(rows[n0:])
    if want("sdpa_quantized"):
        from benchmarks import sdpa_quantized

        n0 = len(rows)
        sdpa_quantized.bench_sdpa_quantized(rows, peers_on)
        _print(rows[n0:])
    if want("sdpa_backward"):
        from benchmarks import sdpa_backward

        n0 = len(rows)
        sdpa_backward.bench_sdpa_backward(rows, args.quick, peers_on)
        _print(rows[n0:])
    table = _markdown(rows)
    with open(args.out, "w") as f:
        f.write("\n".join(head) + "\n" + table + f"\n\ntotal suite time {time.perf_counter() - t_start:.0f} s\n")
    print(f"\nwritten to {args.out} ({time.perf_counter() - t_start:.0f} s)")


#: the instruction sets the kernels and the peers depend on (PyTorch uses AMX where it exists; Numba cannot)
_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512fp16",
          "amx_tile", "amx_bf16", "amx_int8")


def _cpu_line() -> str:
    """CPU model, core count and which of the flags that matter it has (from /proc/cpuinfo)."""
    model, flags = suite.host_cpu()
    have = [f for f in _FLAGS if f in flags]
    missing = [f for f in _FLAGS if f not in flags]
    return (f"cpu: {model}, {os.cpu_count()} logical cores; has {' '.join(have) or '-'}; "
            f"lacks {' '.join(missing) or '-'}")


def _units_line() -> str:
    """The units this process's kernels use (kernels/isa.py): what a relaxed fpmath mode runs on."""
    from graph_api.kernels.isa import ISA

    return (f"kernel units: {ISA.describe()}; fpmath bf16 products on {ISA.bf16_unit or 'none (f32 FMA)'}, "
            f"int8 products on {ISA.int8_unit}")


def _openblas_line() -> str:
    """The OpenBLAS tuning variables this machine kind sets; benchmarks should run with both unset."""
    found = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    if not found:
        return "OpenBLAS variables: none set"
    return ("OpenBLAS variables: " + ", ".join(f"{k}={v}" for k, v in found.items()) +
            " (numpy BLAS slowed: run with env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)")


def _fmt(r):
    w, mode, name, ms, ratio, extra = r
    return f"| {w} | {mode} | {name} | {ms:.3f} | {ratio:.2f} | {extra} |"


def _print(rs):
    for r in rs:
        print(_fmt(r), flush=True)


def _markdown(rows):
    out = ["| workload | cache | implementation | ms | time / project | effective |",
           "|---|---|---|---:|---:|---|"]
    out += [_fmt(r) for r in rows]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())

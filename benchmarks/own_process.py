"""PyTorch peers timed in a process of their own, with PyTorch's default thread settings.

In ``python -m benchmarks`` every library shares one process, so the thread
settings the project needs (``OMP_WAIT_POLICY=PASSIVE`` from
``graph_api.kernels.numba_setup``, ``GOMP_SPINCOUNT=1000`` from this package:
Numba's OpenMP team must not spin into the next OpenBLAS GEMM) also govern
PyTorch's OpenMP team, which runs best spinning.  The rows labelled "own
process" run the same model with the same weights (same seeds, same builders)
in a child started with the environment ``python -m benchmarks`` was started
with, as a PyTorch user would run it; the child saves its output so the parent
checks it agrees with the project's.

    python -m benchmarks.own_process bert BATCH SEQ REPS OUT.npy
    python -m benchmarks.own_process cnn BLOCK_INDEX BATCHES BATCH HW INT8 REPS OUT.npy

print the best time in ms.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np


def run(kind: str, *args) -> tuple[float, np.ndarray] | None:
    """(best ms, output) of the peer ``kind`` in a child process, or None when it fails."""
    from benchmarks import ORIGINAL_ENV

    env = dict(ORIGINAL_ENV, GRAPH_API_NUMBA_DEFAULTS="0", GRAPH_API_BENCH_OWN_PROCESS="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.npy")
        proc = subprocess.run([sys.executable, "-m", "benchmarks.own_process", kind, *map(str, args), out],
                              env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            print(f"own-process peer {kind} {args} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
            return None
        return float(proc.stdout.strip().splitlines()[-1]), np.load(out)


def _bert(batch, seq, reps, out):
    from benchmarks import bert

    info = bert.build_encoder(int(batch), int(seq), **bert.MINILM)
    feeds = bert.make_feeds(info, np.random.default_rng(0))  # bench_bert's first draw
    fn = bert.torch_encoder(info, feeds)
    np.save(out, fn())
    return bert._best(fn, int(reps))


def _cnn(block, batches, batch, hw, int8, reps, out):
    from benchmarks import cnn

    c_in, layers = list(cnn.BLOCKS.values())[int(block)]
    batches = tuple(int(b) for b in batches.split(","))
    x, params = cnn.block_input(c_in, layers, batches, int(batch), int(hw), int8 == "1")
    fn = cnn.torch_block(layers, params, x, int8 == "1")
    np.save(out, fn())
    return cnn._best(fn, int(reps))


if __name__ == "__main__":
    kind, *rest = sys.argv[1:]
    best = {"bert": _bert, "cnn": _cnn}[kind](*rest)
    print(f"{best * 1e3:.6f}")

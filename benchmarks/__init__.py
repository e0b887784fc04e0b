"""Benchmark suite: ``python -m benchmarks [--quick] [--out FILE]``.

Importing this package first sets thread-pool waiting policies so that the
several pools in one process (Numba's OpenMP team, numpy's OpenBLAS, PyTorch's
OpenMP, ONNX Runtime's) do not spin on the 2 cores while another one runs
(measured: spinning pools made alternating calls up to 10x slower):
``OPENBLAS_THREAD_TIMEOUT=4`` (OpenBLAS workers sleep after ~2**4 cycles of
idling instead of 2**28) and ``GOMP_SPINCOUNT=1000`` (GNU OpenMP teams spin briefly, then sleep; at
20000 spins, ~0.5 ms on a CPU whose ``pause`` is slow, Numba's team kept
spinning into the next OpenBLAS GEMM and made it 0.3-0.45 ms slower).  ONNX Runtime sessions are created with
``session.intra_op.allow_spinning=0``.  Existing values are kept.
"""
import os as _os

#: the environment before this package changed it: ``benchmarks.own_process``
#: starts peer processes with it (a PyTorch user's defaults)
ORIGINAL_ENV = dict(_os.environ)

#: thread settings of the benchmark process (none in an ``own_process`` peer)
SETTINGS = () if _os.environ.get("GRAPH_API_BENCH_OWN_PROCESS") else (
    ("OPENBLAS_THREAD_TIMEOUT", "4"), ("GOMP_SPINCOUNT", "1000"))
for _k, _v in SETTINGS:
    _os.environ.setdefault(_k, _v)

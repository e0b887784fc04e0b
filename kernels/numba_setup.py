"""The one place that configures Numba; import it before ``numba`` anywhere.

Every fast kernel module does ``from kernels.numba_setup import numba`` (or
imports this module first).  It sets Numba's environment switches only when
the user has not set them, then imports numba:

``NUMBA_THREADING_LAYER=omp``
    The default ``workqueue`` layer aborts when two Python threads launch
    parallel kernels at the same time.  ``omp`` (GNU OpenMP, shipped with
    numba's wheels) is safe for concurrent launches from several Python
    threads (each launching thread gets its own team); ``tbb`` would be too but
    is not installed.  ``omp`` is not fork-safe after a parallel region has
    run: use the ``spawn`` start method for multiprocessing.
``OMP_WAIT_POLICY=PASSIVE``
    Numba's OpenMP team and numpy's OpenBLAS pool otherwise both spin after
    each call; alternating them (the prefill path does) costs up to +65% on 2
    cores.  Passive waiting costs a few microseconds per launch instead.  With
    PASSIVE and no ``GOMP_SPINCOUNT`` the team does not spin at all; a spin count
    is deliberately not set here: ``GOMP_SPINCOUNT=1000`` (the benchmarks' setting)
    made the BERT 8x64 encoder take 183 instead of 177 ms of CPU per call on 2
    threads (the team spinning beside OpenBLAS); wall time was not measurable on the
    loaded machine that day: re-measure before changing this.
``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES``
    LLVM tunes this CPU (AVX-512) to prefer 256-bit vectors; the nibble
    unpack + FMA loops run ~1.6x faster with 512-bit vectors.  We pass the
    host CPU name and host features plus ``-prefer-256-bit``.  Both strings
    are part of Numba's on-disk cache key, so the cache stays valid on this
    machine and is (correctly) not reused on a different CPU.
``NUMBA_CACHE_DIR``
    Numba invalidates a cached kernel only when *its own* source file changes,
    not when a function it calls from another module (the shared epilogue in
    ``wmatmul.py``, the post-op codes in ``graph_api/postops.py``) changes: a
    stale cache then runs old machine code and returns wrong numbers.  So the
    cache lives in a folder named by a hash of every kernel and graph_api
    source file and of the Numba version: ``kernels/__pycache__/numba-<hash>``,
    or ``$GRAPH_API_NUMBA_CACHE_DIR/numba-<hash>`` (for read-only installs).
    A ``NUMBA_CACHE_DIR`` the user sets is used as it is.

LLVM option ``-runtime-memory-check-threshold=64`` (set once per process,
affects only code compiled here): see the comment below.

Set ``GRAPH_API_NUMBA_DEFAULTS=0`` to leave the environment untouched.
"""
from __future__ import annotations

import os
import sys
import threading
import time

from graph_api.config import log, progress


def _host_cpu() -> tuple[str, str]:
    import llvmlite.binding as llvm

    name = llvm.get_host_cpu_name()
    features = llvm.get_host_cpu_features().flatten()
    return name, features


def _source_hash() -> str:
    """A hash of the sources compiled kernels depend on, and of the Numba version."""
    import hashlib
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    here = Path(__file__).resolve().parent
    digest = hashlib.sha1()
    try:
        digest.update(version("numba").encode())
    except PackageNotFoundError:  # pragma: no cover
        pass
    # a source tree has graph_api/ beside kernels/; an install has kernels/ inside graph_api/
    core = here.parent / "graph_api" if (here.parent / "graph_api").is_dir() else here.parent
    for root in (here, core):
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _cache_dir() -> str:
    from pathlib import Path

    base = os.environ.get("GRAPH_API_NUMBA_CACHE_DIR") or str(Path(__file__).resolve().parent / "__pycache__")
    return os.path.join(base, f"numba-{_source_hash()}")


def configure() -> dict[str, str]:
    """Set Numba/OpenMP env defaults (only the unset ones); return what was set."""
    if "numba" in sys.modules:
        return {}  # too late; numba reads its config at import
    if os.environ.get("GRAPH_API_NUMBA_DEFAULTS", "1") == "0":
        return {}
    # PASSIVE: see the module docstring; measured on the decoder-layer sample
    # (numpy/OpenBLAS reference ops between Numba kernels): 74 ms -> 10 ms a step.
    wanted = {"NUMBA_THREADING_LAYER": "omp", "OMP_WAIT_POLICY": "PASSIVE"}
    wanted["NUMBA_CACHE_DIR"] = _cache_dir()
    if "NUMBA_CPU_NAME" not in os.environ and "NUMBA_CPU_FEATURES" not in os.environ:
        try:
            name, features = _host_cpu()
        except Exception:  # pragma: no cover - llvmlite always present with numba
            name, features = "", ""
        if name and "+avx512f" in features:
            wanted["NUMBA_CPU_NAME"] = name
            wanted["NUMBA_CPU_FEATURES"] = features + ",-prefer-256-bit"
    applied = {}
    for key, value in wanted.items():
        if key not in os.environ:
            os.environ[key] = value
            applied[key] = value
    return applied


APPLIED = configure()

import numba  # noqa: E402  (must come after configure)
from numba.core import event as _numba_event  # noqa: E402

if numba.config.THREADING_LAYER == "default" and os.environ.get("GRAPH_API_NUMBA_DEFAULTS", "1") != "0":
    # numba was imported before us (so the env var came too late); the layer is
    # chosen at the first parallel launch, so setting the config still works.
    numba.config.THREADING_LAYER = "omp"

# LLVM vectorises a loop whose arrays may alias only behind runtime overlap
# checks, and gives up above 8 checks (numba has no ``restrict``).  The fused
# kernels read 4-6 arrays per loop; allow more checks so they vectorise.
if os.environ.get("GRAPH_API_NUMBA_DEFAULTS", "1") != "0":
    import llvmlite.binding as _llvm

    _llvm.set_option("", "-runtime-memory-check-threshold=64")


# ---------------------------------------------------------------- compile progress
#: the kernel family of each kernel module, as the first-compile line names it
KERNEL_FAMILIES = {
    "sdpa": "SDPA", "wmatmul": "MatMul (epilogue and weight-compressed)", "store": "epilogue store",
    "bits": "bit-unpacking", "quantize": "quantize", "norm": "normalization", "conv": "convolution",
    "wgemv4": "MatMul (epilogue and weight-compressed)", "wgemv8": "MatMul (epilogue and weight-compressed)",
    "igemm": "int8 GEMM (VNNI)", "sdpa_prefill": "SDPA",
}
_announced: set[str] = set()
_compiling = threading.local()


class _CompileProgress(_numba_event.Listener):
    """Numba fires ``numba:compile`` only when it really compiles (not on a cache
    hit): the first time per process a kernel family compiles, say so before the
    wait; in verbose mode, log every compiled function with its time."""

    def on_start(self, event):
        depth = getattr(_compiling, "depth", 0)
        _compiling.depth = depth + 1
        _compiling.__dict__.setdefault("starts", []).append(time.perf_counter())
        module = event.data["dispatcher"].py_func.__module__.rsplit(".", 1)[-1]
        family = KERNEL_FAMILIES.get(module, module)
        if depth == 0 and family not in _announced:
            _announced.add(family)
            progress(f"compiling the {family} kernel (first run only, cached on disk)")

    def on_end(self, event):
        _compiling.depth -= 1
        seconds = time.perf_counter() - _compiling.starts.pop()
        func = event.data["dispatcher"].py_func
        log(f"numba,compiled {func.__module__}.{func.__qualname__},{seconds * 1e3:.1f} ms")


_numba_event.register("numba:compile", _CompileProgress())

__all__ = ["numba", "APPLIED", "configure", "KERNEL_FAMILIES"]

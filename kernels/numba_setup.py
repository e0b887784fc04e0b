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
    kernels cache in a folder named by a hash of the sources compiled code
    depends on (:func:`compiled_sources`: the kernel modules and the project
    modules they import, not runtime-only ones such as ``batch.py``) and of the
    Numba version: ``<base>/numba-<hash>``, where the base is a
    ``NUMBA_CACHE_DIR`` the user set, else ``$GRAPH_API_NUMBA_CACHE_DIR``, else
    the user-wide ``~/.cache/graph_api`` (``$XDG_CACHE_HOME``), else (not
    writable) ``kernels/__pycache__``.  The kernel modules' functions are cached
    in that folder itself, not in a subfolder named by their path
    (:class:`_KernelCacheLocator`): every checkout, install and virtual
    environment with the same kernel sources shares one cache.

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
from graph_api.kernels import isa


def _host_cpu() -> tuple[str, str]:
    import llvmlite.binding as llvm

    name = llvm.get_host_cpu_name()
    features = llvm.get_host_cpu_features().flatten()
    return name, features


def _layout() -> tuple["Path", "Path"]:
    """(the kernels folder, the graph_api folder): a source tree has graph_api/ beside
    kernels/, an install has kernels/ inside graph_api/."""
    from pathlib import Path

    here = Path(__file__).resolve().parent
    core = here.parent / "graph_api" if (here.parent / "graph_api").is_dir() else here.parent
    return here, core


def _module_file(name: str, here, core):
    """The file of project module ``name`` (``graph_api.kernels.x``, ``graph_api.x``), or None."""
    parts = name.split(".")
    if parts[0] != "graph_api":
        return None
    root, rest = (here, parts[2:]) if parts[1:2] == ["kernels"] else (core, parts[1:])
    base = root.joinpath(*rest) if rest else root
    for path in (base.with_suffix(".py") if rest else None, base / "__init__.py"):
        if path is not None and path.is_file():
            return path
    return None


_FROM_IMPORT = r"^[ \t]*from[ \t]+([.\w]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)"
_IMPORT = r"^[ \t]*import[ \t]+([^\n]*)"


def _imported_modules(path, package: str) -> set[str]:
    """Every module ``path`` imports, at any depth of its code (a function-level
    import too), as absolute names; ``from a import b`` gives both ``a`` and
    ``a.b``.  A regular expression, not ``ast`` (6x faster; this runs at every
    import): a match inside a string only adds a file to the hash."""
    import re

    text = path.read_bytes().decode()
    names = set()
    for line in re.findall(_IMPORT, text, re.M):
        names.update(part.split()[0] for part in line.split("#")[0].split(",") if part.strip())
    for base, listed in re.findall(_FROM_IMPORT, text, re.M):
        if base.startswith("."):  # relative to the module's package
            level = len(base) - len(base.lstrip("."))
            anchor = package.split(".")[:len(package.split(".")) - level + 1]
            base = ".".join(anchor + ([base.lstrip(".")] if base.lstrip(".") else []))
        names.add(base)
        listed = "\n".join(line.split("#")[0] for line in listed.strip("()").splitlines())
        names.update(f"{base}.{part.split()[0]}" for part in listed.split(",") if part.strip())
    return names


def compiled_sources() -> list:
    """The source files Numba-compiled code can depend on: every kernel module
    (in ``kernels/`` or a folder below it) that imports ``numba_setup`` (so defines
    njit functions) and every project module those import, transitively.
    Runtime-only modules (batch, cli, the plans ``*_plan.py``, which call kernels but
    compile none, patterns) are not among them, so editing those keeps the cache."""
    here, core = _layout()
    todo = [path for path in sorted(here.rglob("*.py"))
            if not path.name.endswith("_plan.py") and b"numba_setup" in path.read_bytes()]
    seen = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        _, package = _label(path, here, core)
        for name in _imported_modules(path, package):
            found = _module_file(name, here, core)
            if found is not None and found.name != "__init__.py":
                todo.append(found)
    return sorted(seen)


def _source_hash() -> str:
    """A hash of the sources compiled kernels depend on (:func:`compiled_sources`),
    by content and name (not by location: every checkout, install and virtual
    environment with the same kernel sources shares one cache folder), and of the
    Numba version."""
    import hashlib
    from importlib.metadata import PackageNotFoundError, version

    here, core = _layout()
    digest = hashlib.sha1()
    try:
        digest.update(version("numba").encode())
    except PackageNotFoundError:  # pragma: no cover
        pass
    for path in compiled_sources():
        digest.update(_label(path, here, core)[0].encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _label(path, here, core) -> tuple[str, str]:
    """(a location-free name of the source file, the package its module is in)."""
    if path.is_relative_to(here):
        rel, package = path.relative_to(here), "graph_api.kernels"
    else:
        rel, package = path.relative_to(core), "graph_api"
    return f"{package}/{rel.as_posix()}", ".".join([package, *rel.parent.parts])


#: NUMBA_CACHE_DIR as the user (or a parent process) set it, before configure()
_GIVEN_NUMBA_CACHE_DIR = os.environ.get("NUMBA_CACHE_DIR", "")


def _writable(folder: str) -> bool:
    import tempfile

    try:
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
        return True
    except OSError:
        return False


def _cache_base() -> str:
    """Where the ``numba-<hash>`` folders live: a NUMBA_CACHE_DIR set by the user (or
    a parent process), ``$GRAPH_API_NUMBA_CACHE_DIR``, or the user-wide cache
    (``$XDG_CACHE_HOME`` or ``~/.cache``, then ``graph_api``: shared by every
    checkout and virtual environment), or ``kernels/__pycache__`` when that is not
    writable."""
    from pathlib import Path

    given = _GIVEN_NUMBA_CACHE_DIR or os.environ.get("GRAPH_API_NUMBA_CACHE_DIR")
    if given:
        return given
    user = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "graph_api")
    return user if _writable(user) else str(Path(__file__).resolve().parent / "__pycache__")


def _cache_dir() -> str:
    """The folder Numba caches the kernels in: ``<base>/numba-<source hash>``
    (a NUMBA_CACHE_DIR that already is that folder, e.g. inherited from the
    parent process, is used as it is)."""
    name = f"numba-{_source_hash()}"
    base = _cache_base()
    return base if os.path.basename(os.path.normpath(base)) == name else os.path.join(base, name)


def configure() -> dict[str, str]:
    """Set Numba/OpenMP env defaults (only the unset ones); return what was set."""
    if "numba" in sys.modules:
        return {}  # too late; numba reads its config at import
    if os.environ.get("GRAPH_API_NUMBA_DEFAULTS", "1") == "0":
        return {}
    # PASSIVE: see the module docstring; measured on the decoder-layer sample
    # (numpy/OpenBLAS reference ops between Numba kernels): 74 ms -> 10 ms a step.
    wanted = {"NUMBA_THREADING_LAYER": "omp", "OMP_WAIT_POLICY": "PASSIVE"}
    wanted["NUMBA_CACHE_DIR"] = KERNEL_CACHE_DIR
    if "NUMBA_CPU_NAME" not in os.environ and "NUMBA_CPU_FEATURES" not in os.environ:
        forced = isa.forced_target()  # GRAPH_API_ISA: a lower ISA for the tests
        if forced is not None:
            wanted["NUMBA_CPU_NAME"], wanted["NUMBA_CPU_FEATURES"] = forced
        else:
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


def target_features() -> str:
    """The CPU features Numba compiles for, as ``+name`` items (``kernels.isa`` reads
    them; kernels ask ``isa.ISA``, not this)."""
    return ",".join(f"+{f}" for f in sorted(isa.target()[1]))


KERNEL_CACHE_DIR = _cache_dir()
APPLIED = configure()

import numba  # noqa: E402  (must come after configure)
from numba.core import caching as _caching  # noqa: E402
from numba.core import event as _numba_event  # noqa: E402


class _KernelCacheLocator(_caching._SourceFileBackedLocatorMixin, _caching._CacheLocator):
    """Numba's cache location for the functions of the kernel modules:
    ``KERNEL_CACHE_DIR``, one flat folder named by the content hash of the
    sources.  Numba's own locators add a hash of the source file's absolute path,
    so a second checkout, a ``pip install`` or a new virtual environment with the
    same kernel sources compiled everything again; with this one they share the
    cache.  Numba still checks each file's content stamp and, per entry, the
    function's bytecode, the signature and the target CPU."""

    _kernels = os.path.dirname(os.path.abspath(__file__))

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        # Numba names a cache file by the module file's base name, the function's
        # qualified name and this disambiguator: a module in a subfolder
        # (``kernels/sdpa/tiled.py``) adds its folder, so two modules of one name
        # in different folders never share a file of the one flat cache folder.
        folder = os.path.relpath(os.path.dirname(os.path.abspath(py_file)), self._kernels)
        self._folder = "" if folder == "." else folder.replace(os.sep, "_") + "_"

    def get_cache_path(self):
        return KERNEL_CACHE_DIR

    def get_disambiguator(self):
        return f"{self._folder}{self._lineno}"

    @classmethod
    def from_function(cls, py_func, py_file):
        path = os.path.abspath(py_file)
        if os.path.commonpath([path, cls._kernels]) != cls._kernels:
            return None  # not ours: Numba's usual locators decide
        return super().from_function(py_func, py_file)


_caching.CacheImpl._locator_classes.insert(0, _KernelCacheLocator)

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
    "sdpa": "SDPA", "weight_compressed": "MatMul (epilogue and weight-compressed)", "store": "epilogue store",
    "bits": "bit-unpacking", "quantize": "quantize", "norm": "normalization", "convolution": "convolution",
    "igemm": "int8 GEMM (VNNI)",
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
        parts = event.data["dispatcher"].py_func.__module__.split(".")
        # a module of a family package (graph_api.kernels.sdpa.tiled) names its folder
        module = parts[2] if parts[:2] == ["graph_api", "kernels"] and len(parts) > 3 else parts[-1]
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

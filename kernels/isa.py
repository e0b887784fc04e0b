"""The one ISA layer: which vector and matrix units this process's kernels may use.

Every kernel module asks :data:`ISA` (never the CPU, never the environment) which
form to compile and which unit to run:

* ``avx2`` (with FMA): 8-lane f32 vectors; the AVX2 forms of the decode kernels.
* ``avx512``: AVX-512 F/BW/VL, 16-lane f32 vectors and ``vpermps`` lookups.
* ``avx512_bf16``: ``vdpbf16ps`` (bf16 pairs multiplied exactly, summed in f32).
* ``avx512_vnni``: ``vpdpbusd`` (u8 x s8 quadruples into s32).
* ``amx_bf16`` / ``amx_int8``: the AMX tile units (``tdpbf16ps``, ``tdpbusd``),
  true only when the CPU has them, the compile target includes them *and* Linux
  granted this process the tile state (:func:`amx_ready`).

What the kernels compile for is Numba's target: the host CPU (``kernels.numba_setup``
passes its name and features to LLVM), or a lower ISA forced before Numba loads, so
the tests run the paths of another machine kind on this one:

* ``GRAPH_API_ISA=avx2`` compiles for ``haswell`` (AVX2 + FMA: AMD Zen 3's level),
* ``GRAPH_API_ISA=avx512`` for ``skylake-avx512`` (AVX-512 without VNNI or BF16),
* ``GRAPH_API_ISA=avx512_bf16`` for ``cooperlake`` (AVX-512 + VNNI + BF16, no AMX:
  AMD Zen 4/5's level),
* ``GRAPH_API_ISA=native`` (or unset): the host.

A user's own ``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` win over both; a named CPU's
features come from :data:`CPU_FEATURES` (LLVM applies them implicitly; llvmlite cannot
list them), plus or minus the features the user names.  A name not in the table is
taken at the AVX2 level only if the user's features say so: unknown means baseline.
Importing this module does not import Numba (``numba_setup`` calls it before Numba
loads); reading :data:`ISA` does, so the target is the one Numba compiles for.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
from dataclasses import dataclass

#: the environment switch that forces a lower ISA (read before Numba loads)
FORCE_ENV = "GRAPH_API_ISA"
#: GRAPH_API_ISA value -> the LLVM CPU name Numba compiles for
FORCED_CPU = {"avx2": "haswell", "avx512": "skylake-avx512", "avx512_bf16": "cooperlake"}

_AVX2 = frozenset({"avx", "avx2", "fma", "f16c", "bmi", "bmi2", "popcnt", "sse4.2"})
_AVX512 = _AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}
_VNNI = _AVX512 | {"avx512vnni"}
_ICL = _VNNI | {"avx512vbmi", "avx512vbmi2", "avx512bitalg", "avx512vpopcntdq", "avx512ifma"}
_SPR = _ICL | {"avx512bf16", "avx512fp16", "avxvnni", "amx-tile", "amx-bf16", "amx-int8"}
#: LLVM CPU name -> the features it implies (only those the kernels ask about)
CPU_FEATURES: dict[str, frozenset] = {
    **dict.fromkeys(("haswell", "broadwell", "skylake", "znver1", "znver2", "znver3", "x86-64-v3"), _AVX2),
    "alderlake": _AVX2 | {"avxvnni"},
    **dict.fromkeys(("skylake-avx512", "x86-64-v4"), _AVX512),
    "cascadelake": _VNNI,
    "cooperlake": _VNNI | {"avx512bf16"},
    **dict.fromkeys(("icelake-client", "icelake-server", "tigerlake", "rocketlake"), _ICL),
    **dict.fromkeys(("znver4", "znver5"), _ICL | {"avx512bf16"}),
    **dict.fromkeys(("sapphirerapids", "emeraldrapids", "graniterapids"), _SPR),
}


def _host() -> tuple[str, frozenset]:
    import llvmlite.binding as llvm

    return llvm.get_host_cpu_name(), _parse(llvm.get_host_cpu_features().flatten())


def _parse(features: str) -> frozenset:
    return frozenset(f[1:] for f in features.split(",") if f.startswith("+"))


def _removed(features: str) -> frozenset:
    return frozenset(f[1:] for f in features.split(",") if f.startswith("-"))


def forced_target() -> tuple[str, str] | None:
    """(NUMBA_CPU_NAME, NUMBA_CPU_FEATURES) for ``GRAPH_API_ISA``, or None when it is
    unset or ``native``.  An unknown value is an error: a test run that meant to force
    a lower ISA must not silently run the host's."""
    level = os.environ.get(FORCE_ENV, "native").strip().lower()
    if level in ("", "native", "host"):
        return None
    if level not in FORCED_CPU:
        raise ValueError(f"{FORCE_ENV}={level!r}: expected one of native, {', '.join(FORCED_CPU)}")
    # 512-bit vectors where the level has them (LLVM's tuning of these CPUs prefers 256)
    return FORCED_CPU[level], "-prefer-256-bit" if level != "avx2" else ""


def target() -> tuple[str, frozenset]:
    """(CPU name, features) Numba compiles for, from the environment as Numba reads it."""
    name = os.environ.get("NUMBA_CPU_NAME", "")
    given = os.environ.get("NUMBA_CPU_FEATURES")
    if name in ("", "host"):
        host_name, host_features = _host()
        if given:  # features given for the host CPU: they are the whole list
            return host_name, _parse(given)
        return host_name, host_features
    implied = CPU_FEATURES.get(name, frozenset())
    if given:
        implied = (implied - _removed(given)) | _parse(given)
    return name, frozenset(implied)


_AMX_LOCK = threading.Lock()
_AMX_GRANTED: bool | None = None


def _request_tile_state() -> bool:
    """Ask Linux for the AMX tile data state (``arch_prctl(ARCH_REQ_XCOMP_PERM,
    XFEATURE_XTILEDATA)``): without it the first tile instruction kills the process."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
        return libc.syscall(sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0
    except (OSError, AttributeError):  # pragma: no cover - no libc symbol
        return False


def amx_ready() -> bool:
    """The compile target has AMX and this process may use it: the tile state is
    granted (asked once per process) and LLVM's assembler parser is initialised (the
    AMX kernels are inline assembly; without the parser LLVM aborts the process)."""
    global _AMX_GRANTED
    with _AMX_LOCK:
        if _AMX_GRANTED is None:
            _AMX_GRANTED = False
            features = target()[1]
            if {"amx-tile", "amx-bf16", "amx-int8"} & features and _request_tile_state():
                import llvmlite.binding as llvm

                llvm.initialize_native_asmparser()
                _AMX_GRANTED = True
        return _AMX_GRANTED


@dataclass(frozen=True)
class HostISA:
    """What the kernels of this process may use (see the module docstring)."""
    cpu: str
    features: frozenset
    forced: str

    @property
    def avx2(self) -> bool:
        return {"avx2", "fma"} <= self.features

    @property
    def avx512(self) -> bool:
        return {"avx512f", "avx512bw", "avx512vl"} <= self.features

    @property
    def avx512_bf16(self) -> bool:
        return self.avx512 and "avx512bf16" in self.features

    @property
    def avx512_vnni(self) -> bool:
        return self.avx512 and "avx512vnni" in self.features

    @property
    def amx_bf16(self) -> bool:
        return {"amx-tile", "amx-bf16"} <= self.features and amx_ready()

    @property
    def amx_int8(self) -> bool:
        return {"amx-tile", "amx-int8"} <= self.features and amx_ready()

    @property
    def bf16_unit(self) -> str | None:
        """The unit a bf16 x bf16 -> f32 product runs on, or None (no unit makes bf16
        faster than f32 FMA: a relaxed mode then runs the strict kernel)."""
        return "amx_bf16" if self.amx_bf16 else "avx512_bf16" if self.avx512_bf16 else None

    @property
    def int8_unit(self) -> str:
        """The unit an exact u8 x s8 -> s32 product runs on."""
        if self.amx_int8:
            return "amx"
        if self.avx512_vnni:
            return "avx512_vnni"
        return "avx2" if self.avx2 else "scalar"

    def units(self) -> list[str]:
        """The units the kernels use on this target, most capable first (the benchmark
        header and verbose mode print them)."""
        named = [("AMX-BF16", self.amx_bf16), ("AMX-INT8", self.amx_int8), ("AVX512_BF16", self.avx512_bf16),
                 ("AVX512_VNNI", self.avx512_vnni), ("AVX-512", self.avx512), ("AVX2+FMA", self.avx2)]
        return [name for name, present in named if present]

    def describe(self) -> str:
        forced = f", forced by {FORCE_ENV}={self.forced}" if self.forced else ""
        return f"{self.cpu} ({' '.join(self.units()) or 'baseline x86-64'}{forced})"


_DETECTED: list = []


def get() -> HostISA:
    """The compile target of this process, read once, after ``kernels.numba_setup``
    has set the environment Numba reads (so the two agree)."""
    if not _DETECTED:
        from graph_api.kernels import numba_setup  # noqa: F401  (sets Numba's target first)

        name, features = target()
        forced = os.environ.get(FORCE_ENV, "").strip().lower()
        _DETECTED.append(HostISA(name, features, "" if forced in ("", "native", "host") else forced))
    return _DETECTED[0]


def __getattr__(name):  # ``from graph_api.kernels.isa import ISA``: detected on first use
    if name == "ISA":
        return get()
    raise AttributeError(name)

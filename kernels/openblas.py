"""numpy's OpenBLAS from Numba kernels: its ``cblas_sgemm`` called through a
function pointer, and its thread count held at one while several Python
threads each run their own GEMMs.

Thread count.  OpenBLAS (pthreads build, as in numpy's wheels) has one global
thread count; ``openblas_set_num_threads_local`` exists but sets the same
global in that build (measured: a thread that set it to 1 made every thread's
GEMM single-threaded).  Multi-threaded GEMMs from two callers serialise on
OpenBLAS's level-3 lock; single-threaded ones run side by side with their own
buffers.  :func:`single_threaded` sets the global count to 1 while at least
one caller is inside it and restores it when the last one leaves; another
numpy GEMM that runs meanwhile is single-threaded too (same results: the
thread count splits rows and columns, not the sums over K).

``sgemm``.  :func:`sgemm_address` is the address of the 64-bit-integer
``cblas_sgemm`` (numpy >= 1.22 wheels); a kernel passes it as an ``int64``
argument to :func:`sgemm`, so the compiled code holds no address and stays
cacheable across processes.

The library is the one numpy loaded (found in ``/proc/self/maps``); symbol
names depend on the build (``scipy_openblas_*64_`` in numpy 2's wheels,
``openblas_*64_`` before).  :func:`available` is False when they are not
found (another BLAS, a 32-bit-integer build, or no ``/proc``); callers then
use numpy's ``matmul`` with BLAS's own threads.
"""
from __future__ import annotations

from graph_api.kernels.numba_setup import numba  # noqa: F401  (configures numba first)

import ctypes
import threading
from contextlib import contextmanager

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

#: (prefix of the thread-count functions, cblas_sgemm) per build
_NAMES = (("scipy_openblas_{}_num_threads64_", "scipy_cblas_sgemm64_"),
          ("openblas_{}_num_threads64_", "cblas_sgemm64_"))

_lock = threading.Lock()
_users = 0
_saved = 0
_funcs: tuple | None = None  # (get, set, sgemm address)
_looked = False


def _find() -> tuple | None:
    import numpy as np  # noqa: F401  (loads the BLAS library)

    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for threads, gemm in _NAMES:
            get = getattr(lib, threads.format("get"), None)
            put = getattr(lib, threads.format("set"), None)
            sg = getattr(lib, gemm, None)
            if get is not None and put is not None and sg is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                put.restype, put.argtypes = None, [ctypes.c_int]
                return get, put, ctypes.cast(sg, ctypes.c_void_p).value
    return None


def available() -> bool:
    global _funcs, _looked
    if not _looked:
        with _lock:
            if not _looked:
                _funcs = _find()
                _looked = True
    return _funcs is not None


def sgemm_address() -> int:
    """Address of ``cblas_sgemm`` (64-bit integers); requires :func:`available`."""
    available()
    return _funcs[2]


@contextmanager
def single_threaded():
    """numpy's OpenBLAS runs one thread per call inside this block (reference
    counted across threads; requires :func:`available`)."""
    global _users, _saved
    available()
    get, put, _ = _funcs
    with _lock:
        if _users == 0:
            _saved = get()
            put(1)
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                put(_saved)


_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


def _sgemm_codegen(trans: bool):
    """Code calling ``cblas_sgemm``: arguments ``fn, [ta, tb,] m, n, k, a, a_off, lda,
    b, b_off, ldb, beta, c, c_off, ldc`` (``ta``/``tb`` integers, non-zero: transposed)."""
    first = 3 if trans else 1  # index of m

    def codegen(context, builder, signature, args):
        i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
        fptr = f32.as_pointer()
        tys = signature.args

        def integer(i):
            return context.cast(builder, args[i], tys[i], types.int64)

        def pointer(i):
            data = context.make_array(tys[i])(context, builder, args[i]).data
            return builder.gep(builder.bitcast(data, fptr), [integer(i + 1)])

        def flag(i):
            if not trans:
                return ir.Constant(i32, _NO_TRANS)
            on = builder.icmp_signed("!=", integer(i), ir.Constant(i64, 0))
            return builder.select(on, ir.Constant(i32, _TRANS), ir.Constant(i32, _NO_TRANS))

        m = first
        fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, i64, i64, i64, f32, fptr, i64, fptr, i64, f32,
                                               fptr, i64])
        target = builder.inttoptr(integer(0), fnty.as_pointer())
        beta_v = context.cast(builder, args[m + 9], tys[m + 9], types.float32)
        builder.call(target, [ir.Constant(i32, _ROW_MAJOR), flag(1), flag(2),
                              integer(m), integer(m + 1), integer(m + 2), ir.Constant(f32, 1.0),
                              pointer(m + 3), integer(m + 5), pointer(m + 6), integer(m + 8), beta_v,
                              pointer(m + 10), integer(m + 12)])
        return context.get_dummy_value()

    return codegen


def _f32_arrays(*arrays) -> bool:
    return all(isinstance(t, types.Array) and t.dtype == types.float32 for t in arrays)


@intrinsic
def sgemm(typingctx, fn, m, n, k, a, a_off, lda, b, b_off, ldb, beta, c, c_off, ldc):
    """``C = A @ B + beta * C`` by ``cblas_sgemm`` at address ``fn`` (row-major,
    no transposes, alpha 1): ``A`` is ``m x k`` at ``a.flat[a_off]`` with row
    stride ``lda`` (elements), ``B`` and ``C`` likewise; f32 arrays, unchecked."""
    if not _f32_arrays(a, b, c):
        return None
    sig = types.void(fn, m, n, k, a, a_off, lda, b, b_off, ldb, beta, c, c_off, ldc)
    return sig, _sgemm_codegen(False)


@intrinsic
def sgemm_t(typingctx, fn, ta, tb, m, n, k, a, a_off, lda, b, b_off, ldb, beta, c, c_off, ldc):
    """:func:`sgemm` with transposes: ``C = op(A) @ op(B) + beta * C``, ``op(X)`` = X^T
    when its flag (``ta``, ``tb``: integers) is non-zero; ``op(A)`` is ``m x k`` and
    ``lda`` the row stride of A as stored (``k`` columns, or ``m`` when transposed)."""
    if not _f32_arrays(a, b, c):
        return None
    sig = types.void(fn, ta, tb, m, n, k, a, a_off, lda, b, b_off, ldb, beta, c, c_off, ldc)
    return sig, _sgemm_codegen(True)

"""graph_api: the oneDNN Graph API on the CPU, in Python.

Build a graph of ops over logical tensors, cut it into (fused) partitions,
compile them for concrete shapes and execute them on tensors::

    import graph_api as ga
    g = ga.Graph(ga.EngineKind.cpu)
    ...
    g.finalize()
    for p in g.get_partitions():
        cp = p.compile(inputs, outputs, ga.Engine())
        cp.execute(ga.Stream(engine), in_tensors, out_tensors)
"""
import os as _os
import sys as _sys

# The kernels and patterns layers live beside this folder in the repository (kernels/, patterns/)
# and are installed under this package as graph_api.kernels and graph_api.patterns (pyproject's
# package-dir).  In a source tree nothing is installed there, so the repository root joins this
# package's search path: graph_api.kernels then resolves to <root>/kernels in both cases, and no
# second top-level name (kernels, patterns) is ever imported.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if (not _os.path.isdir(_os.path.join(__path__[0], "kernels"))
        and _os.path.isfile(_os.path.join(_root, "kernels", "__init__.py"))):
    __path__.append(_root)

# numpy's OpenBLAS threads spin for a long while after each call; a Numba kernel
# run right after a GEMM (every fused epilogue) then fights them for the 2 cores:
# a ResNet bottleneck block took 9.4 ms on average, 4.7 ms with a short timeout.
# OpenBLAS reads the variable once, when numpy loads it, so it only helps when
# graph_api is imported before numpy; a value the user set is kept.
# GRAPH_API_NUMBA_DEFAULTS=0 leaves the environment alone (as for numba_setup).
if "numpy" not in _sys.modules and _os.environ.get("GRAPH_API_NUMBA_DEFAULTS", "1") != "0":
    _os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

from .config import get_deterministic, get_memory_budget, set_deterministic, set_memory_budget
from .constant_cache import (get_constant_tensor_cache, get_constant_tensor_cache_capacity,
                             set_constant_tensor_cache, set_constant_tensor_cache_capacity)
from .dtypes import DataType
from .engine import Allocator, Engine, Stream, make_engine_with_allocator
from .dump import get_dump_mode, set_dump_mode
from .enums import EngineKind, FPMathMode, GraphDumpMode, LayoutType, OpAttr, OpKind, PartitionPolicy, PropertyType
from .errors import (ExecutionError, GraphError, InvalidArguments, InvalidDataType, InvalidGraph,
                     InvalidGraphOp, InvalidShape, OutOfMemory, Status, Unimplemented)
from .fpmath import FPMath
from .graph import Graph
from .json_io import load, save
from .logical_tensor import LogicalTensor
from .op import Op
from .partition import CompiledPartition, Partition
from .partition_cache import (get_compiled_partition_cache_bytes, get_compiled_partition_cache_capacity,
                              set_compiled_partition_cache_bytes, set_compiled_partition_cache_capacity)
from .runner import CompiledGraph, compile_graph, run_graph
from .tensor import Tensor, make_scalar_tensor
from .builder import CompiledModel, GraphBuilder



def from_onnx(source, **kwargs):
    """An ONNX model (path, bytes or ``onnx.ModelProto``) as a ``Graph`` carrying its
    constants (``graph.constants``) when every node maps, else an ``OnnxModel``;
    see :mod:`graph_api.frontend.onnx_import` (needs ``pip install '.[onnx]'``)."""
    from .frontend import onnx_import

    return onnx_import.from_onnx(source, **kwargs)


def import_onnx(source, **kwargs):
    """An ONNX model as an ``OnnxModel`` (graph_api segments and host steps; ``.run(feeds)``)."""
    from .frontend import onnx_import

    return onnx_import.import_onnx(source, **kwargs)


__version__ = "0.1.0"

__all__ = [
    "CompiledModel", "CompiledPartition", "DataType", "GraphBuilder", "Engine", "EngineKind", "ExecutionError", "FPMath",
    "FPMathMode", "Graph", "GraphError", "InvalidArguments", "InvalidDataType", "InvalidGraph",
    "InvalidGraphOp", "InvalidShape", "LayoutType", "LogicalTensor", "Op", "OpKind",
    "OutOfMemory", "Partition", "PartitionPolicy", "PropertyType", "Status", "Stream", "Tensor",
    "Unimplemented", "load", "make_scalar_tensor", "run_graph", "save",
    "get_memory_budget", "set_memory_budget",
    "CompiledGraph", "compile_graph",
    "get_compiled_partition_cache_capacity", "set_compiled_partition_cache_capacity",
    "get_compiled_partition_cache_bytes", "set_compiled_partition_cache_bytes",
    "get_constant_tensor_cache", "set_constant_tensor_cache",
    "get_constant_tensor_cache_capacity", "set_constant_tensor_cache_capacity",
    "Allocator", "make_engine_with_allocator", "OpAttr",
    "from_onnx", "import_onnx",
    "GraphDumpMode", "get_dump_mode", "set_dump_mode", "get_deterministic", "set_deterministic",
]

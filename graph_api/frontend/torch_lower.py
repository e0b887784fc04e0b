"""ATen nodes -> oneDNN Graph ops: the lowering table of the PyTorch front door.

One rule per ATen overload (``RULES``), each a small function ``rule(L, node)``
that reads the node's arguments, asks :class:`Lowering` for the logical tensors
of its inputs and emits ops with the project's schema (``graph_api/opset.py``:
ports and attribute names exactly as there).  A rule that cannot express a
node raises :class:`NotLowered` with the reason; the node then stays a torch
call and the reason goes into the explain report.

Shapes and data types of every output come from the node's ``meta["val"]``
(the fake tensor AOTAutograd traced), so the graph carries concrete shapes and
``Graph.finalize`` checks them against the schema's shape inference.

Imports torch (a front door module; ``import graph_api`` never loads it).
"""
from __future__ import annotations

import abc

import math
import operator

import ml_dtypes
import numpy as np
import torch

from graph_api import DataType as dt
from graph_api import LogicalTensor, Op, OpKind as K, PropertyType

aten = torch.ops.aten


class NotLowered(Exception):
    """This node stays a torch call (the message says why)."""


#: torch dtype -> graph_api DataType (tensors of other dtypes are never lowered)
DTYPES = {torch.float32: dt.f32, torch.bfloat16: dt.bf16, torch.float16: dt.f16,
          torch.bool: dt.boolean, torch.int32: dt.s32, torch.int8: dt.s8, torch.uint8: dt.u8}
FLOAT = (dt.f32, dt.bf16, dt.f16)
NUMPY = {dt.f32: np.float32, dt.bf16: ml_dtypes.bfloat16, dt.f16: np.float16}


def meta(node):
    """The traced value of an FX node (a fake tensor, a tuple of them, or a number)."""
    return node.meta.get("val") if hasattr(node, "meta") else None


def is_tensor_node(arg) -> bool:
    return hasattr(arg, "op") and isinstance(meta(arg), torch.Tensor)


class Lowering(abc.ABC):
    """State of one lowering: the ops emitted so far, logical tensors of FX values.

    An abstract base: the backend's subclass (``torch_graph._Lowerer``) owns the graph
    inputs (placeholders, parameters, torch-computed values) through
    :meth:`source`; this class knows ops and rules only.
    """

    def __init__(self):
        self.ops: list[tuple[Op, object]] = []  # (op, FX node it lowers)
        self.lt_of: dict = {}  # FX node -> LogicalTensor, or list of them (tuple outputs)
        self.next_id = 1  # tensor ids; 0 is the scratchpad's id in graph_api
        self.next_op = 0
        self.node = None  # the node being lowered (ops are named after it)
        self.sources: dict[int, tuple] = {}
        self.prepared: dict = {}  # constant weight id -> its transposed contiguous copy

    # ------------------------------------------------------------ tensors
    def new_lt(self, dtype, shape, prop=PropertyType.variable) -> LogicalTensor:
        lt = LogicalTensor(self.next_id, dtype, [int(d) for d in shape], property=prop)
        self.next_id += 1
        return lt

    def out_lt(self, node=None, index=None) -> LogicalTensor:
        """A logical tensor for the node's output (its meta shape and dtype)."""
        value = meta(node or self.node)
        if index is not None:
            value = value[index]
        return self.new_lt(to_dtype(value.dtype), value.shape)

    def val(self, arg, like=None) -> LogicalTensor:
        """The logical tensor of an argument: a lowered node's output, a graph input
        (:meth:`source`), or a Python number as a constant of ``like``'s dtype."""
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            dtype = like.dtype if like is not None else dt.f32
            return self.literal(np.array([arg], NUMPY.get(dtype, np.float32)), dtype)
        if not is_tensor_node(arg):
            raise NotLowered(f"argument {arg!r} is not a tensor")
        lowered = self.lt_of.get(arg)
        if isinstance(lowered, LogicalTensor):
            return lowered
        if lowered is not None:
            raise NotLowered(f"{arg.name} has several outputs; only getitem reads them")
        return self.source(arg)

    def float_val(self, arg, like=None) -> LogicalTensor:
        lt = self.val(arg, like)
        if lt.dtype not in FLOAT:
            raise NotLowered(f"{getattr(arg, 'name', arg)} is {lt.dtype.name}; this op takes f32/bf16/f16")
        return lt

    # graph inputs: the backend's lowering (torch_graph._Lowerer) knows the module's
    # placeholders, parameters and their values; ``self.sources`` maps each graph input
    # id to ("node", FX node) or ("literal", numpy array)
    @abc.abstractmethod
    def source(self, node) -> LogicalTensor:
        """A graph input for a torch value (placeholder, parameter, torch-computed)."""

    @abc.abstractmethod
    def literal(self, array: np.ndarray, dtype) -> LogicalTensor:
        """A constant graph input holding ``array`` (made while lowering)."""

    @abc.abstractmethod
    def constant_value(self, node) -> torch.Tensor:
        """The value of a parameter or buffer; NotLowered for anything else."""

    @abc.abstractmethod
    def packed_source(self, node, dtype, shape) -> LogicalTensor:
        """An s4/u4 constant over a module's packed uint8 buffer."""

    # ------------------------------------------------------------ ops
    def emit(self, kind, inputs, attrs=None, out=None) -> LogicalTensor:
        """Add one op (named after the node being lowered); returns its output."""
        out = self.out_lt() if out is None else out
        op = Op(self.next_op, kind, list(inputs), [out], name=self.node.name, attrs=dict(attrs or {}))
        self.next_op += 1
        self.ops.append((op, self.node))
        return out

    def operand(self, arg):
        """(logical tensor, transposed?) of a MatMul operand, looking through a
        transpose of its last two dims (aten.t, transpose, permute) so that the
        MatMul reads the original with ``transpose_a/b`` instead."""
        if is_tensor_node(arg) and self._is_swap(arg) and is_tensor_node(arg.args[0]):
            return self.float_val(arg.args[0]), True
        return self.float_val(arg), False

    @staticmethod
    def _is_swap(node) -> bool:
        """Is this node a transpose of the last two dims (and nothing else)?"""
        if node.op != "call_function":
            return False
        if node.target == aten.t.default:
            return meta(node.args[0]).dim() == 2
        rank = meta(node).dim() if isinstance(meta(node), torch.Tensor) else 0
        if node.target == aten.transpose.int and rank >= 2:
            a, b = sorted(d % rank for d in node.args[1:3])
            return (a, b) == (rank - 2, rank - 1)
        if node.target == aten.permute.default and rank >= 2:
            order = [d % rank for d in node.args[1]]
            return order == list(range(rank - 2)) + [rank - 1, rank - 2]
        return False


def to_dtype(torch_dtype) -> "dt":
    if torch_dtype not in DTYPES:
        raise NotLowered(f"dtype {torch_dtype} has no graph_api data type here")
    return DTYPES[torch_dtype]


def _rank(node) -> int:
    return meta(node).dim()


def _axis(dim, rank) -> int:
    return int(dim) % rank if rank else 0


# ---------------------------------------------------------------- matmul family
_RESHAPES: set = set()  # the reshape-family targets (filled below the table)


def _folded_rows(L, a):
    """The N-D source of a 2-D MatMul operand that is only its rows flattened
    (``view([B*S, K])`` of ``[B, S, K]``), when every user of the MatMul views the
    result back to ``[B, S, N]``: the MatMul then reads and writes the N-D tensors
    and the two views disappear (so residual adds and activations after the linear
    layer fuse with it, as written in the model).  Else None."""
    node = L.node
    if not (is_tensor_node(a) and a.op == "call_function" and a.target in _RESHAPES):
        return None
    base = a.args[0]
    if not is_tensor_node(base) or meta(base).dim() < 3:
        return None
    rows, k = meta(a).shape
    if meta(base).shape[-1] != k or math.prod(meta(base).shape[:-1]) != rows:
        return None
    want = tuple(meta(base).shape[:-1]) + (meta(node).shape[-1],)
    users = list(node.users)
    if not users or any(u.target not in _RESHAPES or tuple(meta(u).shape) != want for u in users):
        return None
    return base, want


def _prepared_weight(L, w):
    """A constant 2-D weight read transposed (``nn.Linear``'s [N, K]) as a contiguous
    [K, N] copy made once here, as oneDNN prepares constant weights: the MatMul plans
    run their fused GEMM + epilogue on contiguous operands (a transposed view takes a
    slower path).  (logical tensor, transpose_b)."""
    kind, node = L.sources.get(w.id, (None, None))
    if kind != "node" or len(w.shape) != 2:
        return w, True
    try:
        value = L.constant_value(node)
    except NotLowered:
        return w, True
    done = L.prepared.get(w.id)
    if done is None:
        t = value.detach().t().contiguous()
        array = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else t.numpy()
        done = L.prepared[w.id] = L.literal(array, w.dtype)
    return done, False


def _matmul(L, a, b, bias=None):
    folded = _folded_rows(L, a) if meta(a).dim() == 2 else None
    if folded is not None:
        x, ta = L.float_val(folded[0]), False
        out = L.new_lt(to_dtype(meta(L.node).dtype), folded[1])
    else:
        (x, ta), out = L.operand(a), None
    w, tb = L.operand(b)
    if tb:
        w, tb = _prepared_weight(L, w)
    ins = [x, w]
    attrs = {"transpose_a": ta, "transpose_b": tb}
    if bias is not None:
        bias_lt = L.float_val(bias)
        n = meta(L.node).shape[-1]
        if tuple(bias_lt.shape) in ((n,), (1, n)):
            return L.emit(K.MatMul, ins + [bias_lt], attrs, out=out)
        y = L.emit(K.MatMul, ins, attrs, out=None if out is None else L.new_lt(out.dtype, out.shape))
        return L.emit(K.Add, [y, bias_lt], out=out)
    return L.emit(K.MatMul, ins, attrs, out=out)


def mm(L, node):
    return _matmul(L, node.args[0], node.args[1])


def addmm(L, node):
    beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
    if beta != 1 or alpha != 1:
        raise NotLowered(f"addmm with beta={beta}, alpha={alpha}")
    return _matmul(L, node.args[1], node.args[2], node.args[0])


def linear(L, node):
    x, w = node.args[0], node.args[1]
    bias = node.args[2] if len(node.args) > 2 else None
    ins = [L.float_val(x), L.float_val(w)] + ([L.float_val(bias)] if bias is not None else [])
    return L.emit(K.MatMul, ins, {"transpose_b": True})


# ---------------------------------------------------------------- element-wise
UNARY = {
    aten.relu.default: (K.ReLU, {}), aten.sigmoid.default: (K.Sigmoid, {}),
    aten.tanh.default: (K.Tanh, {}), aten.exp.default: (K.Exp, {}), aten.log.default: (K.Log, {}),
    aten.sqrt.default: (K.Sqrt, {}), aten.abs.default: (K.Abs, {}),
    aten.reciprocal.default: (K.Reciprocal, {}), aten.hardswish.default: (K.HardSwish, {}),
    aten.mish.default: (K.Mish, {}),
    aten.hardsigmoid.default: (K.HardSigmoid, {"alpha": 1.0 / 6.0, "beta": 0.5}),
}


def unary(L, node):
    kind, attrs = UNARY[node.target]
    return L.emit(kind, [L.float_val(node.args[0])], attrs)


def gelu(L, node):
    approx = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    mode = {"none": "gelu_erf", "tanh": "gelu_tanh"}[approx]
    return L.emit(K.GELU, [L.float_val(node.args[0])], {"mode": mode})


def silu(L, node):
    x = L.float_val(node.args[0])
    return L.emit(K.Multiply, [x, L.emit(K.Sigmoid, [x], out=L.out_lt())])


def leaky_relu(L, node):
    slope = node.args[1] if len(node.args) > 1 else 0.01
    return L.emit(K.LeakyReLU, [L.float_val(node.args[0])], {"alpha": float(slope)})


def elu(L, node):
    alpha, scale, input_scale = (list(node.args[1:]) + [1.0, 1.0, 1.0])[:3]
    if scale != 1 or input_scale != 1:
        raise NotLowered(f"elu with scale={scale}, input_scale={input_scale}")
    return L.emit(K.Elu, [L.float_val(node.args[0])], {"alpha": float(alpha)})


def clamp(L, node):
    if node.target == aten.hardtanh.default:
        lo, hi = (list(node.args[1:]) + [-1.0, 1.0])[:2]
    else:
        lo, hi = (list(node.args[1:]) + [None, None])[:2]
    big = float(np.finfo(np.float32).max)
    if any(isinstance(v, torch.fx.Node) for v in (lo, hi)):
        raise NotLowered("clamp bounds given as tensors")
    lo = -big if lo is None else float(lo)
    hi = big if hi is None else float(hi)
    return L.emit(K.Clamp, [L.float_val(node.args[0])], {"min": lo, "max": hi})


def softplus(L, node):
    beta = node.args[1] if len(node.args) > 1 else 1.0
    threshold = node.args[2] if len(node.args) > 2 else 20.0
    if threshold < 20:  # above beta*x = threshold torch returns x; ln(1+e^20) - 20 = 2e-9
        raise NotLowered(f"softplus threshold {threshold} < 20 changes the result")
    return L.emit(K.SoftPlus, [L.float_val(node.args[0])], {"beta": float(beta)})


def rsqrt(L, node):
    x = L.float_val(node.args[0])
    return L.emit(K.Reciprocal, [L.emit(K.Sqrt, [x], out=L.out_lt())])


def neg(L, node):
    x = L.float_val(node.args[0])
    return L.emit(K.Multiply, [x, L.val(-1.0, like=x)])


def pow_scalar(L, node):
    x, p = L.float_val(node.args[0]), node.args[1]
    if isinstance(p, torch.fx.Node):
        raise NotLowered("pow with a tensor exponent")
    if p == 2:
        return L.emit(K.Square, [x])
    if p == 0.5:
        return L.emit(K.Sqrt, [x])
    return L.emit(K.Pow, [x], {"beta": float(p)})


BINARY = {
    aten.add.Tensor: K.Add, aten.add.Scalar: K.Add, aten.sub.Tensor: K.Subtract,
    aten.sub.Scalar: K.Subtract, aten.mul.Tensor: K.Multiply, aten.mul.Scalar: K.Multiply,
    aten.div.Tensor: K.Divide, aten.div.Scalar: K.Divide, aten.maximum.default: K.Maximum,
    aten.minimum.default: K.Minimum,
}


def binary(L, node):
    a, b = node.args[0], node.args[1]
    like = None
    for arg in (a, b):
        if is_tensor_node(arg):
            like = L.float_val(arg)
            break
    if like is None:
        raise NotLowered("no tensor operand")
    x, y = L.float_val(a, like), L.float_val(b, like)
    alpha = node.kwargs.get("alpha", 1)
    if alpha != 1:
        if node.target not in (aten.add.Tensor, aten.sub.Tensor):
            raise NotLowered(f"alpha={alpha}")
        y = L.emit(K.Multiply, [y, L.val(float(alpha), like)], out=L.new_lt(y.dtype, y.shape))
    out_dtype = to_dtype(meta(L.node).dtype)
    if x.dtype != y.dtype or x.dtype != out_dtype:
        raise NotLowered(f"mixed data types {x.dtype.name}, {y.dtype.name} -> {out_dtype.name}")
    return L.emit(BINARY[node.target], [x, y])


def rsub(L, node):
    x = L.float_val(node.args[0])
    alpha = node.kwargs.get("alpha", 1)
    if alpha != 1:
        raise NotLowered(f"rsub with alpha={alpha}")
    return L.emit(K.Subtract, [L.float_val(node.args[1], x), x])


def where(L, node):
    cond = L.val(node.args[0])
    if cond.dtype != dt.boolean:
        raise NotLowered(f"where condition is {cond.dtype.name}")
    like = next((L.float_val(a) for a in node.args[1:] if is_tensor_node(a)), None)
    a, b = L.float_val(node.args[1], like), L.float_val(node.args[2], like)
    shape = tuple(meta(node).shape)
    if tuple(np.broadcast_shapes(tuple(a.shape), tuple(b.shape))) != shape:
        # Select broadcasts cond one-way into the values' shape: a scalar value is spelled out
        kind, value = L.sources.get(a.id, (None, None))
        if kind != "literal":
            raise NotLowered("where whose condition alone has the output shape")
        a = L.literal(np.broadcast_to(value, shape).copy(), a.dtype)
    return L.emit(K.Select, [cond, a, b])


def greater_equal(L, node):
    x = L.val(node.args[0])
    if x.dtype not in FLOAT + (dt.s32,):
        raise NotLowered(f"ge on {x.dtype.name}")
    return L.emit(K.GreaterEqual, [x, L.val(node.args[1], x)])


# ---------------------------------------------------------------- softmax and norms
def softmax(L, node):
    x = L.float_val(node.args[0])
    if len(node.args) > 2 and node.args[2] and x.dtype != dt.f32:
        raise NotLowered("half_to_float softmax")
    kind = K.SoftMax if node.target == aten._softmax.default else K.LogSoftmax
    return L.emit(kind, [x], {"axis": _axis(node.args[1], len(x.shape))})


def _single_output_users(node, allowed=(0,)):
    """A tuple-output node lowers only when nothing reads its other outputs."""
    for user in node.users:
        if user.target is not operator.getitem:
            raise NotLowered(f"{user.name} reads the whole tuple")
        if user.args[1] not in allowed and user.users:
            raise NotLowered(f"output {user.args[1]} (statistics) is used by {next(iter(user.users)).name}")


def native_layer_norm(L, node):
    _single_output_users(node)
    x, shape, weight, bias, eps = node.args[:5]
    src = L.float_val(x)
    if (weight is None) != (bias is None):
        raise NotLowered("layer_norm with only one of weight and bias")
    ins = [src] + ([L.float_val(weight), L.float_val(bias)] if weight is not None else [])
    attrs = {"begin_norm_axis": len(src.shape) - len(shape), "epsilon": float(eps),
             "keep_stats": False, "use_affine": weight is not None}
    return [L.emit(K.LayerNorm, ins, attrs, out=L.out_lt(index=0)), None, None]


def rms_norm(L, node):
    x, shape = node.args[0], node.args[1]
    weight = node.args[2] if len(node.args) > 2 else node.kwargs.get("weight")
    eps = node.args[3] if len(node.args) > 3 else node.kwargs.get("eps")
    src = L.float_val(x)
    if eps is None:
        eps = float(torch.finfo(meta(x).dtype).eps)
    ins = [src] + ([L.float_val(weight)] if weight is not None else [])
    out = L.out_lt(index=0) if isinstance(meta(node), (tuple, list)) else None
    y = L.emit(K.RMSNorm, ins, {"begin_norm_axis": len(src.shape) - len(shape), "epsilon": float(eps)}, out=out)
    if isinstance(meta(node), (tuple, list)):
        _single_output_users(node)
        return [y, None]
    return y


def batch_norm(L, node):
    _single_output_users(node)
    x, weight, bias, mean, var = node.args[:5]
    eps = node.args[6]
    if weight is None or bias is None:
        raise NotLowered("batch_norm without affine weight and bias")
    ins = [L.float_val(a) for a in (x, weight, bias, mean, var)]
    y = L.emit(K.BatchNormInference, ins, {"epsilon": float(eps), "data_format": "NCX"},
               out=L.out_lt(index=0))
    return [y, None, None]


# ---------------------------------------------------------------- convolution and pooling
def convolution(L, node):
    x, w, b, stride, padding, dilation, transposed, _, groups = node.args[:9]
    if transposed:
        raise NotLowered("transposed convolution")
    if isinstance(padding, str):
        raise NotLowered(f"padding='{padding}'")
    ins = [L.float_val(x), L.float_val(w)] + ([L.float_val(b)] if b is not None else [])
    attrs = {"strides": list(stride), "pads_begin": list(padding), "pads_end": list(padding),
             "dilations": list(dilation), "groups": int(groups), "data_format": "NCX",
             "weights_format": "OIX"}
    return L.emit(K.Convolution, ins, attrs)


def _pool_geometry(node, kernel, stride, padding):
    spatial = _rank(node.args[0]) - 2
    kernel = list(kernel) * (spatial if len(kernel) == 1 else 1)
    stride = list(stride) if stride else kernel
    stride = stride * (spatial if len(stride) == 1 else 1)
    padding = list(padding) * (spatial if len(padding) == 1 else 1)
    return kernel, stride, padding


def max_pool(L, node):
    if node.target == aten.max_pool2d_with_indices.default:
        _single_output_users(node)
    args = list(node.args) + [None] * 6
    kernel, stride, padding = _pool_geometry(node, args[1], args[2] or [], args[3] or [0])
    dilation = list(args[4] or [1]) * (len(kernel) if len(args[4] or [1]) == 1 else 1)
    attrs = {"kernel": kernel, "strides": stride, "pads_begin": padding, "pads_end": padding,
             "dilations": dilation, "rounding_type": "ceil" if args[5] else "floor", "data_format": "NCX"}
    multi = node.target == aten.max_pool2d_with_indices.default
    y = L.emit(K.MaxPool, [L.float_val(node.args[0])], attrs, out=L.out_lt(index=0 if multi else None))
    return [y, None] if multi else y


def avg_pool(L, node):
    args = list(node.args) + [None] * 7
    if args[6] is not None:
        raise NotLowered(f"divisor_override={args[6]}")
    kernel, stride, padding = _pool_geometry(node, args[1], args[2] or [], args[3] or [0])
    include_pad = True if args[5] is None else bool(args[5])
    attrs = {"kernel": kernel, "strides": stride, "pads_begin": padding, "pads_end": padding,
             "exclude_pad": not include_pad, "rounding_type": "ceil" if args[4] else "floor",
             "data_format": "NCX"}
    return L.emit(K.AvgPool, [L.float_val(node.args[0])], attrs)


def adaptive_avg_pool(L, node):
    x = L.float_val(node.args[0])
    out = list(node.args[1])
    spatial = list(x.shape[2:])
    if out == spatial:
        return x
    if all(o == 1 for o in out):
        return L.emit(K.ReduceMean, [x], {"axes": list(range(2, len(x.shape))), "keep_dims": True})
    raise NotLowered(f"adaptive average pooling to {out} (only 1x1 or identity)")


# ---------------------------------------------------------------- reductions
REDUCE = {aten.mean.dim: K.ReduceMean, aten.sum.dim_IntList: K.ReduceSum, aten.amax.default: K.ReduceMax,
          aten.amin.default: K.ReduceMin}


def reduce(L, node):
    if node.kwargs.get("dtype") is not None:
        raise NotLowered("reduction with a dtype")
    x = L.float_val(node.args[0])
    dims = node.args[1] if len(node.args) > 1 else None
    keep = bool(node.args[2]) if len(node.args) > 2 else bool(node.kwargs.get("keepdim", False))
    rank = len(x.shape)
    axes = list(range(rank)) if not dims else sorted(_axis(d, rank) for d in dims)
    return L.emit(REDUCE[node.target], [x], {"axes": axes, "keep_dims": keep})


# ---------------------------------------------------------------- layout
def reshape(L, node):
    x = L.float_val(node.args[0])
    shape = [int(d) for d in meta(node).shape]
    if list(x.shape) == shape:
        return x
    return L.emit(K.StaticReshape, [x], {"shape": shape, "special_zero": False})


def permute(L, node):
    x = L.float_val(node.args[0])
    rank = len(x.shape)
    if node.target == aten.t.default:
        order = [1, 0] if rank == 2 else list(range(rank))
    elif node.target == aten.transpose.int:
        a, b = _axis(node.args[1], rank), _axis(node.args[2], rank)
        order = list(range(rank))
        order[a], order[b] = order[b], order[a]
    else:
        order = [_axis(d, rank) for d in node.args[1]]
    if order == list(range(rank)):
        return x
    return L.emit(K.StaticTranspose, [x], {"order": order})


def expand(L, node):
    x = L.val(node.args[0])
    if list(x.shape) == [int(d) for d in meta(node).shape]:
        return x
    raise NotLowered("expand (no broadcast op in the opset; binary ops broadcast their inputs)")


def _not_an_output(node):
    """A copy that is the graph's output stays a torch copy (an output must not be its input)."""
    if any(u.op == "output" for u in node.users):
        raise NotLowered("a copy returned as the graph's output")


def alias(L, node):
    if node.target in (aten.clone.default, aten.lift_fresh_copy.default):
        _not_an_output(node)
    return L.val(node.args[0])


def to_copy(L, node):
    x = L.val(node.args[0])
    want = to_dtype(meta(node).dtype)
    if want == x.dtype:
        _not_an_output(node)
        return x
    if x.dtype not in FLOAT or want not in FLOAT or {x.dtype, want} == {dt.bf16, dt.f16}:
        raise NotLowered(f"cast {x.dtype.name} -> {want.name}")
    return L.emit(K.TypeCast, [x])


def cat(L, node):
    tensors = node.args[0]
    ins = [L.float_val(t) for t in tensors if meta(t).numel() > 0 or meta(t).dim() > 1]
    if len(ins) == 1:
        return ins[0]
    return L.emit(K.Concat, ins, {"axis": _axis(node.args[1] if len(node.args) > 1 else 0, len(ins[0].shape))})


def getitem(L, node):
    outs = L.lt_of.get(node.args[0])
    if not isinstance(outs, list):
        raise NotLowered(f"{node.args[0].name} is not lowered")
    lt = outs[node.args[1]]
    if lt is None:
        raise NotLowered(f"output {node.args[1]} of {node.args[0].name} is not computed by graph_api")
    return lt


# ---------------------------------------------------------------- attention
def sdpa(L, node):
    """scaled_dot_product_attention -> the SDPA pattern's chain::

        MatMul(Q, K^T) -> Multiply(scale) -> [causal: GenIndex x2, GreaterEqual, Select]
          -> [Add(float mask) | Select(bool mask, s, -inf)] -> SoftMax(-1, inf_as_zero) -> MatMul(., V)
    """
    q, k, v = node.args[:3]
    kw = dict(node.kwargs)
    if node.target == aten.scaled_dot_product_attention.default:
        names = ["attn_mask", "dropout_p", "is_causal"]
    else:  # _scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, *, attn_mask, scale)
        names = ["dropout_p", "is_causal"]
        _single_output_users(node)
    for name, value in zip(names, node.args[3:]):
        kw[name] = value
    if kw.get("dropout_p", 0.0):
        raise NotLowered(f"dropout_p={kw['dropout_p']}")
    if kw.get("enable_gqa"):
        raise NotLowered("enable_gqa")
    ql, kl, vl = L.float_val(q), L.float_val(k), L.float_val(v)
    if not (ql.dtype == kl.dtype == vl.dtype) or len(ql.shape) != 4:
        raise NotLowered("SDPA needs 4-D q/k/v of one dtype")
    if ql.shape[1] != kl.shape[1]:
        raise NotLowered(f"{ql.shape[1]} query heads over {kl.shape[1]} KV heads (GQA)")
    B, H, S, D = ql.shape
    Skv = kl.shape[2]
    scale = kw.get("scale")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    score_shape = (B, H, S, Skv)
    lt = lambda: L.new_lt(ql.dtype, score_shape)  # noqa: E731
    s = L.emit(K.MatMul, [ql, kl], {"transpose_b": True}, out=lt())
    s = L.emit(K.Multiply, [s, L.val(scale, ql)], out=lt())
    if kw.get("is_causal"):
        row = L.emit(K.GenIndex, [s], {"axis": -2}, out=L.new_lt(dt.s32, score_shape))
        col = L.emit(K.GenIndex, [s], {"axis": -1}, out=L.new_lt(dt.s32, score_shape))
        keep = L.emit(K.GreaterEqual, [row, col], out=L.new_lt(dt.boolean, score_shape))
        s = L.emit(K.Select, [keep, s, L.val(float("-inf"), ql)], out=lt())
    mask = kw.get("attn_mask")
    if mask is not None:
        m = L.val(mask)
        if m.dtype == dt.boolean:
            s = L.emit(K.Select, [m, s, L.val(float("-inf"), ql)], out=lt())
        elif m.dtype == ql.dtype:
            s = L.emit(K.Add, [s, m], out=lt())
        else:
            raise NotLowered(f"attention mask of {m.dtype.name}")
    # PyTorch's SDPA gives a row that every mask hides zeros (its _safe_softmax), not NaN
    p = L.emit(K.SoftMax, [s], {"axis": -1, "mode": "inf_as_zero"}, out=lt())
    single = node.target == aten.scaled_dot_product_attention.default
    out = L.emit(K.MatMul, [p, vl], out=L.out_lt(index=None if single else 0))
    return out if single else [out, None]


# ---------------------------------------------------------------- the table
RULES = {
    aten.mm.default: mm, aten.bmm.default: mm, aten.matmul.default: mm, aten.addmm.default: addmm,
    aten.linear.default: linear,
    aten.gelu.default: gelu, aten.silu.default: silu, aten.leaky_relu.default: leaky_relu,
    aten.elu.default: elu, aten.hardtanh.default: clamp, aten.clamp.default: clamp,
    aten.softplus.default: softplus, aten.rsqrt.default: rsqrt, aten.neg.default: neg,
    aten.pow.Tensor_Scalar: pow_scalar, aten.rsub.Scalar: rsub,
    aten.where.self: where, aten.ge.Scalar: greater_equal, aten.ge.Tensor: greater_equal,
    aten._softmax.default: softmax, aten._log_softmax.default: softmax,
    aten.native_layer_norm.default: native_layer_norm,
    aten._native_batch_norm_legit_no_training.default: batch_norm,
    aten.convolution.default: convolution,
    aten.max_pool2d_with_indices.default: max_pool, aten.max_pool2d.default: max_pool,
    aten.avg_pool2d.default: avg_pool, aten._adaptive_avg_pool2d.default: adaptive_avg_pool,
    aten.view.default: reshape, aten._unsafe_view.default: reshape, aten.reshape.default: reshape,
    aten.unsqueeze.default: reshape, aten.squeeze.dim: reshape, aten.squeeze.dims: reshape,
    aten.squeeze.default: reshape, aten.flatten.using_ints: reshape,
    aten.permute.default: permute, aten.transpose.int: permute, aten.t.default: permute,
    aten.expand.default: expand, aten.clone.default: alias, aten.alias.default: alias,
    aten.detach.default: alias, aten.lift_fresh_copy.default: alias,
    aten._to_copy.default: to_copy, aten.cat.default: cat,
    aten.scaled_dot_product_attention.default: sdpa,
    aten._scaled_dot_product_flash_attention_for_cpu.default: sdpa,
    operator.getitem: getitem,
}
_RESHAPES = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
RULES.update({target: unary for target in UNARY})
RULES.update({target: binary for target in BINARY})
RULES.update({target: reduce for target in REDUCE})
for _name in ("rms_norm", "_fused_rms_norm"):
    _packet = getattr(aten, _name, None)
    if _packet is not None and hasattr(_packet, "default"):
        RULES[_packet.default] = rms_norm

#: what each rule computes, for the coverage report (layout rules move no numbers)
CATEGORY = {mm: "matmul", addmm: "matmul", linear: "matmul", sdpa: "attention", convolution: "conv",
            native_layer_norm: "norm", rms_norm: "norm", batch_norm: "norm", softmax: "softmax",
            max_pool: "pool", avg_pool: "pool", adaptive_avg_pool: "pool", reduce: "reduce",
            reshape: "layout", permute: "layout", expand: "layout", alias: "layout", getitem: "layout",
            cat: "layout", to_copy: "cast"}

#: ATen targets that only describe memory or make constants: never counted as compute
NOT_COMPUTE = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
               aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.permute.default,
               aten.transpose.int, aten.t.default, aten.expand.default, aten.clone.default,
               aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default, aten.slice.Tensor,
               aten.select.int, aten.arange.default, aten.arange.start, aten.full.default,
               aten.scalar_tensor.default, aten.zeros.default, aten.ones.default, aten.new_ones.default,
               aten.new_zeros.default, aten.empty.memory_format, aten.flatten.using_ints,
               aten.contiguous.default if hasattr(aten, "contiguous") else aten.clone.default,
               operator.getitem}


def category(node) -> str:
    """'matmul', 'attention', ..., 'layout' or 'other' (what the report counts)."""
    rule = RULES.get(node.target)
    if rule is None:
        return "layout" if node.target in NOT_COMPUTE else "other"
    return CATEGORY.get(rule, "eltwise")


def is_compute(node) -> bool:
    """A node that computes floating-point values (what coverage counts): not a view,
    a constant, or integer/boolean bookkeeping (masks, positions)."""
    if node.op != "call_function" or node.target in NOT_COMPUTE or category(node) == "layout":
        return False
    value = meta(node)
    values = value if isinstance(value, (tuple, list)) else [value]
    return any(isinstance(v, torch.Tensor) and v.dtype.is_floating_point for v in values)

"""Convolution partitions (conv_post_ops, conv_depthwise, conv_quantized) on
im2col + f32 BLAS, image by image, with the post-op chain run on each image's
L2-resident output block.

Per image ``n`` the plan computes the first Convolution's output block
``[OC, P]`` (channels first whatever the data format) with
:mod:`graph_api.kernels.convolution.conv`, then every later op of the partition (post-ops, a fused
depthwise Convolution, TypeCast, Quantize) on blocks, and writes the blocks of
the partition outputs into place.  Chain ops run through their own reference
kernels on the block, so each one computes and rounds exactly as the unfused
op does; only the convolution's summation order differs from the reference
(f32 BLAS instead of an f64 sum: a few f32 ulps of the terms' magnitude).

Folded into the convolution: its bias (input or a BiasAdd right after) and a
BatchNormInference right after that (``w' = w a``, ``b' = (b - mean) a + beta``
with ``a = gamma / sqrt(var + eps)``, in f64), when the conv output is f32.

int8 (s8/u8 data and s8 weights, no TypeCasts, per-tensor data and per-tensor
or per-output-channel weight scales, weight zero points 0): the products
``(x - zp_x) * w`` are integers and are summed exactly (:func:`graph_api.kernels.convolution.conv.int_gemm`),
then scaled once by ``scale_x * scale_w[oc]``.  Other quantized forms (f8,
TypeCasts to bf16, a weight Quantize) dequantize through the reference ops
first and run the float path on the dequantized values, as the reference does.

Ops before the convolution (dequantization of data, weights, and binary
operands) run as reference steps on whole tensors before the image loop.

The fast 2-D path (:class:`FastSegment`, kernels in :mod:`graph_api.kernels.convolution.conv_fast`)
takes every partition whose convolutions are 2-D, ungrouped or depthwise, f32
(or the exact int8 form above), and whose post-ops are ReLU, Clamp, binary ops
with a scalar, per-channel or full-shape operand, BiasAdd, and a final Quantize
(strict fpmath, one output).  Per image and convolution whose sums are one f32
BLAS GEMM (float, or int8 exact in any order, see ``_exact_reduction``): one
parallel Numba kernel, :func:`graph_api.kernels.convolution.conv_fast.conv_bands`, whose
tasks are bands of output rows (batch 1 keeps both cores busy), each gathering
its columns (zero padding, zero point and conversion to f32 in one pass; a float
1x1 reads the image in place; stride 1 gathers ``kw`` shifted copies of the rows
and runs one GEMM per kernel row), multiplying them by single-threaded sgemm and
running the epilogue (the int8 scale, the bias and the whole post-op program)
on the band's L2-resident result, stored into the output tensor (or into the
next fused convolution's input).  Depthwise convolutions run the Numba
depthwise kernel, then one epilogue pass.  A full-shape operand that is
a per-tensor Dequantize of an int8 partition input (the int8 residual) is
read and dequantized inside the epilogue.  int8 convolutions whose sums fit
int32 (all of ResNet's and MobileNet's) skip the f32 columns: the 8-bit columns
are gathered straight into the packed B of the exact VNNI int8 GEMM
(:mod:`graph_api.kernels.igemm`, A = the packed s8 weights, kept across
executions), whose int32 sums the epilogue scales in f64 as it does the f32
ones; the zero point comes out through igemm's row-sum term, exactly.  CPUs
without VNNI (AVX2) gather the columns less the zero point as int16 into the
panels of :mod:`graph_api.kernels.convolution.igemm16` (``vpmaddwd``, exact, about twice
the f32 GEMM's rate); a stride-1 kxk convolution there gathers the image rows
shifted by each kernel column (``kw`` copies instead of ``kh*kw``) and the GEMM
reads them once per kernel row.  Every other partition runs the block path above.

The fast path's kernel calls are one list built per execution (:meth:`ConvPlan._fast_calls`);
:meth:`ConvPlan.bind` builds it once for a compiled graph's tensors (constant weights,
no per-call operands), so its calls run the same kernels on the same arguments.

Known slow spot: NXC data runs the same channels-first kernels through strided
views (correct, not blocked for channels last).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from graph_api import constant_cache, dtypes
from graph_api.dtypes import DataType
from graph_api.enums import OpKind as K
from graph_api.enums import PropertyType
from graph_api.logical_tensor import LogicalTensor
from graph_api.postops import FUSABLE_BINARY, POST_OPS
from graph_api.kernels import igemm, openblas, scratch, store
from graph_api.kernels.threads import split_threads
from graph_api.kernels.convolution import conv as cv
from graph_api.kernels.convolution import conv_fast as cf
from graph_api.kernels.convolution import igemm16
from graph_api.kernels.numba_setup import numba
from graph_api.kernels.plan import CompileRequest, dequantized_inputs
from graph_api.kernels.reference import REFERENCE, RefContext
from graph_api.kernels.reference._common import pads, spatial_list, to_ncx
from graph_api.kernels.reference.conv import weights_to_oix
from graph_api.kernels.reference.eltwise import ELTWISE, clamp

_BINARY = FUSABLE_BINARY
_INT8 = {DataType.s8: (-128, 127), DataType.u8: (0, 255)}
F32 = DataType.f32


@dataclass
class ConvStage:
    """One Convolution of the flow (the first, or a fused depthwise one)."""

    op: object
    geo: cv.Geometry
    x_id: int
    out_id: int
    w_id: int
    bias_id: int | None
    bn: object | None  # BatchNormInference op folded in
    int8: dict | None  # exact integer path: x/w scales and zero points
    round_x: object
    round_w: object
    absorbed: list = field(default_factory=list)  # BiasAdd/BatchNorm op ids folded in

    def param_ids(self) -> list:
        ids = [self.w_id] + ([self.bias_id] if self.bias_id is not None else [])
        return ids + ([lt.id for lt in self.bn.inputs[1:5]] if self.bn is not None else [])

    def weights(self, arrays, key=None):
        """``(w2 [G, OCg, J] or [C, K] for depthwise, bias [OC, 1] or None)``, f32.

        ``key`` (the constant parameters' buffers) keeps the result in the constant
        tensor cache: a constant tensor's data does not change (oneDNN's rule)."""
        if key is not None:
            return constant_cache.CACHE.get(self, "weights", list(key), lambda: self.weights(arrays))
        fmt = self.op.attrs["weights_format"]
        w = weights_to_oix(self.round_w(arrays[self.w_id]), fmt).astype(np.float64)
        bias = None if self.bias_id is None else dtypes.to_f32(arrays[self.bias_id]).astype(np.float64)
        if self.bn is not None:
            gamma, beta, mean, var = (dtypes.to_f32(arrays[lt.id]).astype(np.float64)
                                      for lt in self.bn.inputs[1:5])
            a = gamma / np.sqrt(var + float(np.float32(self.bn.attrs["epsilon"])))
            w = w * a.reshape((-1,) + (1,) * (w.ndim - 1))
            bias = (0.0 if bias is None else bias) - mean
            bias = bias * a + beta
        geo = self.geo
        if geo.deconv:
            w2 = cv.deconv_weights(w, geo.groups)
        elif self.direct_depthwise:
            w2 = w.reshape(geo.out_channels, -1)
        else:
            w2 = w.reshape(geo.groups, geo.out_channels // geo.groups, -1)
        return (np.ascontiguousarray(w2, np.float32),
                None if bias is None else bias.astype(np.float32).reshape(-1, 1))

    @property
    def direct_depthwise(self) -> bool:
        """Depthwise on the tap-by-tap kernel: always in float; in int8 when every
        partial sum of the prod(K) integer products is exact in f32 (<= chunk terms)."""
        if not self.geo.depthwise:
            return False
        return self.int8 is None or int(np.prod(self.geo.kernel)) <= self.int8["chunk"]

    def _columns(self, xp, buf: dict):
        """im2col into this stage's buffer, reused from image to image."""
        cols = cv.im2col(xp, self.geo, buf.get(id(self)))
        if not self.geo.pointwise:  # pointwise columns are a view of the image itself
            buf[id(self)] = cols
        return cols

    def run(self, x_img, w2, bias, buf):
        """The ``[OC, P]`` f32 block of one image ``x_img`` [IC, spatial...]."""
        geo = self.geo
        if geo.deconv:
            exact = None
            if self.int8 is not None:
                x_img, exact = x_img.astype(np.float32) - np.float32(self.int8["x_zp"]), self.int8["chunk"]
            y = cv.deconv_col2im(self.round_x(x_img) if exact is None else x_img, w2, geo, exact)
            y = y.astype(np.float32) if exact is None else (y * self.int8["scale"]).astype(np.float32)
        elif self.int8 is not None:
            xs = x_img.astype(np.float32) - np.float32(self.int8["x_zp"])
            if self.direct_depthwise:  # exact: integer partial sums below 2^24
                y = cv.conv_depthwise(cv.pad_image(xs, geo), w2, geo).astype(np.float64)
            else:
                y = cv.int_gemm(self._columns(cv.pad_image(xs, geo), buf), w2, self.int8["chunk"])
            y = (y * self.int8["scale"]).astype(np.float32)
        else:
            xp = cv.pad_image(self.round_x(x_img), geo)
            if geo.depthwise:
                y = cv.conv_depthwise(xp, w2, geo)
            else:
                y = cv.conv_gemm(self._columns(xp, buf), w2)
        if bias is not None:
            y += bias
        return y


def _geometry(op, x_lt, w_lt, out_lt) -> cv.Geometry:
    deconv = op.kind == K.ConvTranspose
    fmt = op.attrs["data_format"]
    x_shape = (x_lt.shape[0], x_lt.shape[-1]) + tuple(x_lt.shape[1:-1]) if fmt == "NXC" else x_lt.shape
    out_shape = (out_lt.shape[0], out_lt.shape[-1]) + tuple(out_lt.shape[1:-1]) if fmt == "NXC" \
        else out_lt.shape
    w_oix = weights_to_oix(np.empty(w_lt.shape, np.uint8), op.attrs["weights_format"]).shape
    nsp = len(x_shape) - 2
    strides = spatial_list(op, "strides", nsp, 1)
    dilations = spatial_list(op, "dilations", nsp, 1)
    kernel = list(w_oix[2:])
    begin, end = pads(op, list(x_shape[2:]), strides, kernel, dilations, deconv)
    out_sp = tuple(out_shape[2:])
    if not deconv:  # the end padding that makes the last window fit exactly
        end = [(o - 1) * s + (k - 1) * d + 1 - i - b
               for o, s, k, d, i, b in zip(out_sp, strides, kernel, dilations, x_shape[2:], begin)]
    return cv.Geometry(x_shape[1], out_shape[1], int(op.attrs["groups"]), tuple(x_shape[2:]), out_sp,
                       tuple(kernel), tuple(strides), tuple(dilations), tuple(begin), tuple(end), deconv)


def _int8_params(request, conv, ops_by_out):
    """Integer-path parameters, or None when the float path must run."""
    if request.fpmath.rounding is not None and request.fpmath.apply_to_int:
        return None
    deqs = [ops_by_out.get(lt.id) for lt in conv.inputs[:2]]
    if any(d is None or d.kind != K.Dequantize for d in deqs):
        return None
    xd, wd = deqs
    lts = request.lts
    x_dt, w_dt = lts[xd.inputs[0].id].dtype, lts[wd.inputs[0].id].dtype
    if x_dt not in _INT8 or w_dt != DataType.s8 or ops_by_out.get(wd.inputs[0].id) is not None:
        return None
    if xd.attrs["qtype"] != "per_tensor" or len(xd.attrs["scales"]) != 1:
        return None
    if any(z != 0 for z in wd.attrs.get("zps") or [0]):
        return None
    oc = lts[conv.outputs[0].id].shape
    oc = oc[1] if conv.attrs["data_format"] == "NCX" else oc[-1]
    w_scales = np.asarray(wd.attrs["scales"], np.float64)
    if wd.attrs["qtype"] == "per_channel":
        if conv.kind == K.ConvTranspose:  # (OCg, IC, K) weights: scales per group slot
            return None
        fmt, ndim = conv.attrs["weights_format"], len(lts[wd.inputs[0].id].shape)
        o_axis = 0 if fmt == "OIX" else ndim - 1
        if wd.attrs["axis"] % ndim != o_axis or w_scales.size != oc:
            return None
    elif wd.attrs["qtype"] != "per_tensor":
        return None
    zp = int((xd.attrs.get("zps") or [0])[0])
    lo, hi = _INT8[x_dt]
    scale = np.float64(np.float32(xd.attrs["scales"][0])) * w_scales.astype(np.float32).astype(np.float64)
    return {"x_id": xd.inputs[0].id, "w_id": wd.inputs[0].id, "x_zp": zp,
            "scale": np.broadcast_to(scale, (oc,)).reshape(-1, 1),
            "scale_vec": _read_only(np.array(np.broadcast_to(scale, (oc,)), np.float64)),
            "chunk": cv.exact_chunk(max(abs(lo - zp), abs(hi - zp)), 128), "skip": {xd.id, wd.id},
            "x_range": max(abs(lo - zp), abs(hi - zp))}


# ---------------------------------------------------------------- the chain on blocks
def _block_lt(lt, shape) -> LogicalTensor:
    return LogicalTensor(lt.id, lt.dtype, list(shape))


def _run_block_op(op, in_blocks, out_lt, ctx):
    """One chain op on ``[C, P]`` blocks (channels first), rounded as the op rounds."""
    shape = in_blocks[0].shape
    out = _block_lt(out_lt, shape)
    if op.kind == K.BiasAdd:
        y = dtypes.to_f32(in_blocks[0]) + dtypes.to_f32(in_blocks[1]).reshape(-1, 1)
        return dtypes.convert(y, out_lt.dtype)
    if op.kind == K.Quantize and op.attrs["qtype"] == "per_channel":
        scales = np.asarray(op.attrs["scales"], np.float32).reshape(-1, 1)
        zps = np.asarray(op.attrs.get("zps") or [0], np.float32).reshape(-1, 1)
        with np.errstate(all="ignore"):
            return dtypes.convert(dtypes.to_f32(in_blocks[0]) / scales + zps, out_lt.dtype)
    if op.kind == K.ReLU and in_blocks[0].dtype == np.float32 and out_lt.dtype == F32:
        x = in_blocks[0]  # relu is exact: the f32 form equals the reference's f64 formula
        return np.where(x > 0, x, x * np.float32(0))
    if op.kind == K.Clamp and in_blocks[0].dtype == np.float32 and out_lt.dtype == F32:
        # clamp only selects x, min or max (f32 values): the f32 form equals the f64 reference
        return clamp(in_blocks[0], np.float32(op.attrs["min"]), np.float32(op.attrs["max"]))
    if op.kind == K.BatchNormInference:
        x = in_blocks[0].astype(np.float64)
        gamma, beta, mean, var = (b.astype(np.float64).reshape(-1, 1) for b in in_blocks[1:5])
        eps = float(np.float32(op.attrs["epsilon"]))
        return dtypes.convert(gamma * (x - mean) / np.sqrt(var + eps) + beta, out_lt.dtype)
    return REFERENCE[op.kind](op, in_blocks, [out], ctx)[0]


def _chain_reason(op, lts, fmt, flow_ids) -> str | None:
    """Why ``op`` cannot run on blocks, or None."""
    if op.kind in ELTWISE or op.kind in _BINARY or op.kind in (K.TypeCast, K.BiasAdd):
        pass
    elif op.kind == K.Quantize:
        rank = len(lts[op.inputs[0].id].shape)
        channel = 1 if fmt == "NCX" else rank - 1
        if op.attrs["qtype"] == "per_channel" and op.attrs["axis"] % rank != channel:
            return f"Quantize (op {op.id}) is per channel along a non-channel axis"
        if op.attrs["qtype"] not in ("per_tensor", "per_channel"):
            return f"Quantize (op {op.id}) is {op.attrs['qtype']}"
    elif op.kind == K.BatchNormInference:
        if op.attrs["data_format"] != fmt:
            return f"BatchNormInference (op {op.id}) data format differs from the conv's"
    else:
        return f"{op.kind.name} (op {op.id}) has no block form"
    if op.kind == K.BiasAdd and op.attrs["data_format"] != fmt:
        return f"BiasAdd (op {op.id}) data format differs from the conv's"
    flow_in = next(lt for lt in op.inputs if lt.id in flow_ids)
    if tuple(lts[op.outputs[0].id].shape) != tuple(lts[flow_in.id].shape):
        return f"{op.kind.name} (op {op.id}) broadcasts the running value"
    return None


# ---------------------------------------------------------------- the fast 2-D path
#: binary op kind -> (program code with the running value at input 0, at input 1)
_FAST_BINARY = {k: (POST_OPS[k].code, POST_OPS[k].rcode) for k in FUSABLE_BINARY}
_EMPTY = np.zeros(0, np.float32)


def _read_only(a: np.ndarray) -> np.ndarray:
    """``a``, made read-only: the epilogue's scale operand always has this one Numba type."""
    a.flags.writeable = False
    return a


#: no requantization scale: float64 and read-only as the int8 convolutions' ``scale_vec``,
#: so the epilogue kernels compile one scale type (not one more per float convolution)
_NO_SCALE = _read_only(np.zeros(0, np.float64))


@dataclass
class FastSegment:
    """One 2-D convolution and the post-op program of its epilogue (conv_fast codes)."""

    stage: ConvStage
    codes: np.ndarray  # int32 [S]
    srcs: np.ndarray  # int32 [S]: operand source of binary steps
    fpar: np.ndarray  # f32 [S, 2]: scalars, clamp bounds, quantize zero point
    chan: np.ndarray  # f32 [S, OC]: per-channel operands and quantize scales
    bind: list  # (step, tensor id, SCALAR | CHANNEL): operands read from the arrays per execute
    full_id: int | None  # the full-shape operand (an integer array when its Dequantize is fused)
    fscale: float
    fzp: float
    out_id: int


def _view2d(a: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """``a`` seen as [rows, cols] without a copy (setting ``shape`` raises if a copy were needed)."""
    v = a.view()
    v.shape = (rows, cols)
    return v


def _int_gemm_into(cols, w2, chunk, y) -> None:
    """``y[...]`` = the exact integer sums of :func:`graph_api.kernels.convolution.conv.int_gemm` (f64)."""
    y[...] = cv.int_gemm(cols[None], w2, chunk)


def _band_call(args: tuple, w: np.ndarray):
    """A call of :func:`graph_api.kernels.convolution.conv_fast.conv_bands` on ``args``: OpenBLAS held at
    one thread while the bands' single-threaded GEMMs run side by side, then any band
    whose sums hold an inf or a NaN redone (:func:`_redo_bands`; ``w`` the [OC, K] weights)."""
    bad = args[-1]

    def run() -> None:
        with openblas.single_threaded():
            cf.conv_bands(*args)
        if bad.any():
            _redo_bands(args, w)

    return run


def _redo_bands(args: tuple, w: np.ndarray) -> None:
    """The bands :func:`graph_api.kernels.convolution.conv_fast.conv_bands` left (an inf or a NaN in
    their f32 sums): float64 sums rounded once, as the reference (sgemm gives inf - inf
    = NaN where the reference has a finite value or an infinity), then the epilogue."""
    (_, mode, x, xflat, zp, _, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow, rows, _, _, _,
     scale, bias, codes, srcs, fpar, chan, full, fscale, fzp, out, is_int, lo, hi, bad) = args
    OC, K = w.shape
    P = oh * ow
    if mode == cf.IN_PLACE:
        cols = xflat.reshape(K, P)
    else:  # the whole image's columns: a rare path
        cols = np.empty((K, P), np.float32)
        cf.im2col_2d(x, zp, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow, cols)
    for b in np.flatnonzero(bad):
        y0 = b * rows
        n = (min(oh, y0 + rows) - y0) * ow
        p0 = y0 * ow
        with np.errstate(all="ignore"):
            y = (w.astype(np.float64) @ cols[:, p0:p0 + n].astype(np.float64)).astype(np.float32)
        f = np.ascontiguousarray(full[:, p0:p0 + n]) if full.shape == (OC, P) else full
        dest = np.empty((OC, n), out.dtype)
        cf.epilogue(y, scale, bias, codes, srcs, fpar, chan, f, fscale, fzp, dest, is_int, lo, hi)
        out[:, p0:p0 + n] = dest


def _shifted_weights(stage: ConvStage, w: np.ndarray, key) -> np.ndarray:
    """``w`` [OC, C*kh*kw] as conv_bands' ``SHIFTED`` operand [kh*OC, C*kw] (kernel row by
    kernel row), cached with the weights under the same constant buffers (``key``)."""
    geo = stage.geo
    kh, kw = geo.kernel
    oc = geo.out_channels

    def build():
        return np.ascontiguousarray(w.reshape(oc, -1, kh, kw).transpose(2, 0, 1, 3).reshape(kh * oc, -1))

    return build() if key is None else constant_cache.CACHE.get(stage, "shifted", list(key), build)


def _exact_reduction(w2: np.ndarray, int8: dict) -> int:
    """The longest exact f32 reduction for these integer weights: every partial sum
    of ``(x - zp) * w`` over output channel ``o`` is bounded by ``x_range * sum|w[o]|``,
    so when that is below 2^24 the whole reduction is exact in f32 in any order
    (one GEMM, no chunks); else the bound of the worst weight, ``int8["chunk"]``."""
    worst = float(np.abs(w2).sum(axis=-1).max()) if w2.size else 0.0
    if int8["x_range"] * worst < cv.F32_EXACT:
        return w2.shape[-1]
    return int8["chunk"]


@dataclass
class Int8Weights:
    """A convolution's s8 weights [OC, K] packed as igemm's A, for 8-bit data of one dtype."""

    ap: np.ndarray  # the packed weights (igemm._pack_a), kept across executions
    k4: int  # K / 4 rounded up
    shift: int  # added to the data bytes: 128 for s8 (vpdpbusd's unsigned operand), 0 for u8
    pad: np.uint8  # the byte of a padded position: the zero point plus shift
    rowsum: np.ndarray  # int32 [OC]: sum_j w[o, j]
    colterm: np.ndarray  # int32 [P]: zeros (igemm's per-column term; no weight zero point)
    cb: np.ndarray  # int32 [P]: zp + shift in every column; igemm subtracts cb[p] * rowsum[o]


@dataclass
class PairWeights:
    """A convolution's s8 weights [OC, K] as the int16 pairs of the AVX2 int8 GEMM
    (:mod:`graph_api.kernels.convolution.igemm16`); the data's zero point leaves with the columns."""

    ap: np.ndarray  # igemm16.pack_a of the weights (of each kernel row when shifted), kept across executions
    k2: int  # K / 2 rounded up (K of one kernel row when shifted)
    taps: int = 1  # kernel rows summed by the GEMM (the shifted form), else 1
    wp: int = 0  # the shifted form's row width (a multiple of igemm16.NR); 0: im2col columns


def _shifted_pairs_pay(geo: cv.Geometry) -> bool:
    """Whether a stride-1 kxk convolution runs on the int16-pair GEMM's shifted rows: the
    gather writes ``kw`` copies of the image instead of im2col's ``kh*kw`` (for ResNet's
    3x3 at 56x56, 1.4 MB of pairs instead of 3.6 MB); the GEMM computes whole panels of
    each output row, ``ceil(ow / NR) * NR`` columns for ``ow``: taken while that is at most
    8/7 of the work (ow = 14, 28, 56 exactly; not 7)."""
    oh, ow = geo.out_spatial
    return (geo.strides == (1, 1) and geo.kernel[0] > 1 and ow * oh > 0
            and -(-ow // igemm16.NR) * igemm16.NR * 7 <= ow * 8)


def _int8_gemm_weights(stage: ConvStage, w2: np.ndarray, key, x_dtype) -> Int8Weights | PairWeights | None:
    """The int8 GEMM form of ``stage``'s weights, or None where no int8 GEMM applies.

    With AVX-512 VNNI, igemm's packed s8 weights: the sums must fit int32
    (:func:`igemm.exact_in_int32`: |w| <= 128, |x - zp| <= x_range) and the zero point
    must be a value of the data's dtype (padded positions hold it).  Else, on AVX2,
    igemm16's int16 pairs (:func:`igemm16.exact`; any zero point whose ``x - zp`` fits
    int16).  Cached with the weights under the same constant-buffer key."""
    geo, int8 = stage.geo, stage.int8
    if geo.groups != 1 or len(geo.kernel) != 2 or x_dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
        return None
    lo, hi = (0, 255) if x_dtype == np.uint8 else (-128, 127)
    zp = int8["x_zp"]
    vnni = igemm.HAVE_VNNI and lo <= zp <= hi and igemm.exact_in_int32(geo.reduction, 128, int8["x_range"])
    pairs = not vnni and igemm16.HAVE_AVX2 and igemm16.exact(geo.reduction, 128, int8["x_range"])
    if not (vnni or pairs):
        # no int8 GEMM: the exact f32 BLAS products (whole or in chunks); igemm's portable
        # tile compiles to scalar code on AVX2 (the ResNet-50 int8 block took 74 ms on a
        # Zen 3 core pair against 8 ms for the f32 one)
        return None
    if key is not None:
        return constant_cache.CACHE.get(stage, ("int8_gemm", x_dtype.str, vnni), list(key),
                                        lambda: _int8_gemm_weights(stage, w2, None, x_dtype))
    w8 = w2[0].astype(np.int8)  # s8 weights held in f32: exact
    if pairs and _shifted_pairs_pay(geo):
        kh, kw = geo.kernel
        oc, ow = geo.out_channels, geo.out_spatial[1]
        rows = _shifted_weights(stage, w2[0], key).astype(np.int8)  # [kh*OC, C*kw], kernel row by row
        ap = np.concatenate([igemm16.pack_a(rows[i * oc:(i + 1) * oc]) for i in range(kh)])
        wp = -(-(ow + (kw - 1) * geo.dilations[1]) // igemm16.NR) * igemm16.NR
        out = PairWeights(ap, -(-rows.shape[1] // 2), kh, wp)
    elif pairs:
        out = PairWeights(igemm16.pack_a(w8), -(-w8.shape[1] // 2))
    else:
        k4 = -(-w8.shape[1] // 4)
        rowsum = np.zeros(w8.shape[0], np.int32)
        ap = np.array(igemm._pack_a(w8, k4, rowsum, True))  # a copy: _pack_a returns scratch memory
        shift = 128 if x_dtype == np.int8 else 0
        # sum_j w (x + shift - (zp + shift)): the products of the shifted bytes minus
        # (zp + shift) * rowsum(w), igemm's row term; int32 wrapping is exact because the
        # final sums fit (the guard above)
        P = geo.positions
        out = Int8Weights(ap, k4, shift, np.uint8(zp + shift), rowsum, np.zeros(P, np.int32),
                          np.full(P, zp + shift, np.int32))
    return out


def _gemm_path(stage: ConvStage, chunk: int, int_w) -> str:
    """The name of the kernel a fast segment's convolution runs on (``int_w``: its int8 GEMM weights or None)."""
    if stage.direct_depthwise:
        return "depthwise"
    if isinstance(int_w, PairWeights):
        return "int8_pairs_gemm_shifted" if int_w.wp else "int8_pairs_gemm"
    if int_w is not None:
        return "int8_vnni_gemm"
    if stage.int8 is not None:
        return "f32_blas_exact" if stage.geo.reduction <= chunk else "f32_blas_exact_chunks"
    return "f32_blas"


def _fast_stage_reason(stage: ConvStage, lts) -> str | None:
    geo = stage.geo
    if geo.deconv or len(geo.kernel) != 2:
        return "not a 2-D Convolution"
    if geo.groups != 1 and not stage.direct_depthwise:
        return "grouped"
    if stage.int8 is None and lts[stage.x_id].dtype != F32:
        return "float data that is not f32"
    if lts[stage.out_id].dtype != F32:
        return "the convolution's output is not f32"
    return None


def _operand_source(lt_shape, out_shape, channel_axis) -> int | None:
    """SCALAR, CHANNEL or FULL for an operand of shape ``lt_shape`` against the output, else None."""
    if tuple(lt_shape) == tuple(out_shape):
        return cf.FULL
    if int(np.prod(lt_shape)) == 1:
        return cf.SCALAR
    shape = (1,) * (len(out_shape) - len(lt_shape)) + tuple(lt_shape)
    if len(shape) == len(out_shape) and all(d == 1 for i, d in enumerate(shape) if i != channel_axis) \
            and shape[channel_axis] == out_shape[channel_axis]:
        return cf.CHANNEL
    return None


def _fast_segments(request, flow, pre, fmt, flow_ids):
    """``(segments, dropped pre-step op ids)`` of the fast 2-D path, or None when
    some op of the partition needs the general block path."""
    if request.fpmath.rounding is not None or len(request.output_ids) != 1:
        return None
    lts = request.lts
    pre_by_out = {out_lts[0].id: op for _, op, out_lts, _ in pre}
    used = {}  # tensor id -> number of consumers in the partition
    for op in request.ops:
        for lt in op.inputs:
            used[lt.id] = used.get(lt.id, 0) + 1
    segments, dropped, i = [], set(), 0
    while i < len(flow):
        stage = flow[i]
        if not isinstance(stage, ConvStage) or _fast_stage_reason(stage, lts):
            return None
        if segments and stage.x_id != segments[-1].out_id:
            return None
        value, codes, srcs, fpar, chan_rows, bind = stage.out_id, [], [], [], [], []
        full = None
        oc = stage.geo.out_channels
        i += 1
        while i < len(flow) and not isinstance(flow[i], ConvStage):
            op, out_lt, _ = flow[i]
            ins = [lt.id for lt in op.inputs]
            if value not in ins or (value in request.output_ids):
                return None
            out_shape = lts[out_lt.id].shape
            rank = len(out_shape)
            channel = 1 if fmt == "NCX" else rank - 1
            row = np.zeros(oc, np.float32)
            a = b = 0.0
            src = cf.SCALAR
            if op.kind == K.Quantize:
                if out_lt.dtype not in _INT8 or out_lt.id not in request.output_ids:
                    return None
                code = cf.QUANTIZE
                row[:] = np.asarray(op.attrs["scales"], np.float32)
                a = float(np.float32((op.attrs.get("zps") or [0])[0]))
                if op.attrs["qtype"] == "per_channel" and any(op.attrs.get("zps") or [0]):
                    if len(set(op.attrs["zps"])) != 1:
                        return None
            elif out_lt.dtype != F32:
                return None
            elif op.kind == K.ReLU:
                code = cf.RELU
            elif op.kind == K.Clamp:
                code, a, b = cf.CLAMP, float(np.float32(op.attrs["min"])), float(np.float32(op.attrs["max"]))
            elif op.kind in _FAST_BINARY or op.kind == K.BiasAdd:
                pos = ins.index(value)
                other = ins[1 - pos]
                if other in flow_ids:  # an earlier value of the flow: the epilogue keeps only the running one
                    return None
                if op.kind == K.BiasAdd:
                    code, src = cf.ADD, (cf.CHANNEL if pos == 0 else None)
                else:
                    code = _FAST_BINARY[op.kind][pos]
                    src = _operand_source(lts[other].shape, out_shape, channel)
                if src is None or lts[other].dtype != F32:
                    return None
                if src == cf.FULL:
                    if full is not None:
                        return None
                    full, fscale, fzp = other, 1.0, 0.0
                    deq = pre_by_out.get(other)
                    if deq is not None and deq.kind == K.Dequantize and deq.attrs["qtype"] == "per_tensor" \
                            and lts[deq.inputs[0].id].dtype in _INT8 and used.get(other) == 1 \
                            and deq.inputs[0].id in request.input_ids:
                        full, dropped = deq.inputs[0].id, dropped | {deq.id}
                        fscale = float(np.float32(deq.attrs["scales"][0]))
                        fzp = float(np.float32((deq.attrs.get("zps") or [0])[0]))
                else:
                    bind.append((len(codes), other, src))
            else:
                return None
            codes.append(code)
            srcs.append(src)
            fpar.append((a, b))
            chan_rows.append(row)
            value = out_lt.id
            i += 1
        if full is None:
            fscale, fzp = 1.0, 0.0
        segments.append(FastSegment(
            stage, np.asarray(codes, np.int32), np.asarray(srcs, np.int32),
            np.asarray(fpar, np.float32).reshape(-1, 2), np.asarray(chan_rows, np.float32).reshape(-1, oc),
            bind, full, fscale, fzp, value))
    if segments[-1].out_id not in request.output_ids:
        return None
    return segments, dropped


class ConvPlan:
    """Pre-steps on whole tensors, then per image: conv stages and chain ops on blocks."""

    name = "conv_im2col_blas"

    def __init__(self, request, pre_steps, flow, fmt, n_images, outputs, constants, fast=None):
        self.request = request
        self.fast = fast  # FastSegments of the 2-D path, or None (chain ops on blocks)
        self.gemm_paths = None  # set by each fast execution (see _gemm_path)
        self._buffers = threading.local()  # the fast path's per-image buffers, per thread
        self.pre_steps = pre_steps  # (fn, op, out_lts, ctx) on whole tensors
        self.flow = flow  # ConvStage | (op, out_lt, ctx)
        self.fmt = fmt
        self.n_images = n_images
        self.outputs = outputs  # tensor id -> lt
        self.constants = constants  # tensor ids of constant inputs

    def run_arrays(self, arrays: dict, keys: dict | None = None) -> dict:
        """Execute on logical arrays keyed by tensor id (``keys``: the buffers of
        constant inputs, for the constant tensor cache); returns all arrays."""
        arrays = dict(arrays)
        keys = keys or {}
        if self.fast is not None:
            tid, lt = next(iter(self.outputs.items()))
            arrays[tid] = scratch.empty(lt.shape, dtypes.numpy_dtype(lt.dtype))
            self._run_fast(arrays, keys, arrays[tid])
            return arrays
        for fn, op, out_lts, ctx in self.pre_steps:
            for lt, value in zip(out_lts, fn(op, [arrays[lt.id] for lt in op.inputs], out_lts, ctx)):
                arrays[lt.id] = value
        lts = self.request.lts
        results = {tid: scratch.empty(lt.shape, dtypes.numpy_dtype(lt.dtype)) for tid, lt in self.outputs.items()}
        weights = {}
        for s in self.flow:
            if isinstance(s, ConvStage):
                ids = s.param_ids()
                key = tuple(keys[i] for i in ids) if all(i in keys for i in ids) else None
                weights[id(s)] = s.weights(arrays, key)
        operands = {}
        for step in self.flow:
            if not isinstance(step, ConvStage) and step[0].kind not in (K.BiasAdd, K.BatchNormInference):
                op, out_lt, _ = step
                for lt in op.inputs:
                    if lt.id in arrays and lt.id not in operands:
                        operands[lt.id] = to_ncx(np.broadcast_to(arrays[lt.id], out_lt.shape), self.fmt)
        buf: dict = {}
        for n in range(self.n_images):
            blocks = {}
            for step in self.flow:
                if isinstance(step, ConvStage):
                    x = blocks[step.x_id] if step.x_id in blocks else to_ncx(arrays[step.x_id], self.fmt)[n]
                    x = x.reshape((step.geo.in_channels,) + step.geo.in_spatial)
                    w2, bias = weights[id(step)]
                    y = step.run(x, w2, bias, buf)
                    blocks[step.out_id] = dtypes.convert(y, lts[step.out_id].dtype)
                    continue
                op, out_lt, ctx = step
                shape = next(blocks[lt.id].shape for lt in op.inputs if lt.id in blocks)
                ins = []
                for lt in op.inputs:
                    if lt.id in blocks:
                        ins.append(blocks[lt.id])
                    elif op.kind in (K.BiasAdd, K.BatchNormInference):
                        ins.append(arrays[lt.id])
                    else:
                        ins.append(operands[lt.id][n].reshape(shape))
                blocks[out_lt.id] = _run_block_op(op, ins, out_lt, ctx)
            for tid, out in results.items():
                target = to_ncx(out, self.fmt)[n]
                target[...] = blocks[tid].reshape(target.shape)
        arrays.update(results)
        return arrays

    def _buffer(self, name, shape, dtype=np.float32) -> np.ndarray:
        """A per-image buffer of the fast path, kept per thread across executions.

        Like oneDNN's library-mode scratchpad (the primitive owns it): pages a
        fresh scratch buffer takes at every execution cost more than the work
        on them here (measured: depthwise 144x56x56 1.05 ms on fresh pages,
        0.35 ms on warm ones), and the buffers are small (one image)."""
        pool = getattr(self._buffers, "pool", None)
        if pool is None:
            pool = self._buffers.pool = {}
        buf = pool.get(name)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = pool[name] = np.empty(shape, dtype)
        return buf

    def _run_fast(self, arrays: dict, keys: dict, out: np.ndarray) -> None:
        """The 2-D path: per image, per segment im2col/depthwise -> GEMM -> one epilogue pass."""
        for fn, op, out_lts, ctx in self.pre_steps:
            for lt, value in zip(out_lts, fn(op, [arrays[lt.id] for lt in op.inputs], out_lts, ctx)):
                arrays[lt.id] = value
        calls, _ = self._fast_calls(arrays, keys, out, self._buffer)
        for call in calls:
            call()

    def _fast_calls(self, arrays: dict, keys: dict, out: np.ndarray, buffer) -> tuple[list, bool]:
        """(the kernel calls of one execution of the 2-D path, in order, each a
        callable without arguments; whether they can be bound: no operand is read or
        converted per call, weights are constant, no call allocates).  ``buffer(name,
        shape, dtype)`` gives the intermediates.  execute and bind run the same calls."""
        bindable = not self.pre_steps
        prepared = []
        for seg in self.fast:
            st = seg.stage
            ids = st.param_ids()
            key = tuple(keys[i] for i in ids) if all(i in keys for i in ids) else None
            bindable = bindable and key is not None and not seg.bind
            w2, bias = st.weights(arrays, key)
            chan, fpar = seg.chan, seg.fpar
            if seg.bind:
                chan, fpar = chan.copy(), fpar.copy()
                for step, tid, src in seg.bind:
                    value = dtypes.to_f32(arrays[tid]).reshape(-1)
                    if src == cf.SCALAR:
                        fpar[step, 0] = value[0]
                    else:
                        chan[step] = value
            full = None if seg.full_id is None else to_ncx(arrays[seg.full_id], self.fmt)
            int8_gemm = st.int8 is not None and not st.direct_depthwise
            int_w = _int8_gemm_weights(st, w2, key, arrays[st.x_id].dtype) if int8_gemm else None
            # the f32 path's exact reduction length (a pass over the weights: not on the int8 GEMM path)
            chunk = _exact_reduction(w2, st.int8) if int8_gemm and int_w is None else 0
            prepared.append((w2, _EMPTY if bias is None else bias.reshape(-1), chan, fpar, full, chunk, int_w))
        #: per segment, the kernel that computed its convolution (tests read it)
        self.gemm_paths = tuple(_gemm_path(seg.stage, p[5], p[6]) for seg, p in zip(self.fast, prepared))
        is_int = out.dtype != np.float32
        lo, hi = _INT8.get(self.outputs[self.fast[-1].out_id].dtype, (0, 0))
        x_all = to_ncx(arrays[self.fast[0].stage.x_id], self.fmt)
        out_ncx = to_ncx(out, self.fmt)
        dummy_full = np.zeros((1, 1), np.float32)
        last = len(self.fast) - 1
        bands = openblas.available()
        calls = []
        for n in range(self.n_images):
            x = x_all[n]
            for s, (seg, (w2, bias, chan, fpar, full, chunk, int_w)) in enumerate(zip(self.fast, prepared)):
                st, geo = seg.stage, seg.stage.geo
                kh, kw = geo.kernel
                sh, sw = geo.strides
                dh, dw = geo.dilations
                ph, pw = geo.pads_begin
                oh, ow = geo.out_spatial
                P, OC = oh * ow, geo.out_channels
                zp = np.float32(0.0 if st.int8 is None else st.int8["x_zp"])
                scale = _NO_SCALE if st.int8 is None else st.int8["scale_vec"]
                dest = _view2d(out_ncx[n], OC, P) if s == last else buffer(("mid", s), (OC, P), np.float32)
                f = dummy_full if full is None else full[n].reshape(OC, P)
                ep = (scale, bias, seg.codes, seg.srcs, fpar, chan, f, np.float32(seg.fscale), np.float32(seg.fzp),
                      dest, is_int, np.float32(lo), np.float32(hi))
                x_next = dest.reshape((OC,) + tuple(geo.out_spatial))
                one_gemm = not st.direct_depthwise and int_w is None and (st.int8 is None or geo.reduction <= chunk)
                if one_gemm and bands and P * OC * geo.reduction > 0:  # im2col, GEMM and epilogue band
                    # by band in one kernel (empty products take numpy's matmul below)
                    rows = -(-oh // min(oh, split_threads()))  # deterministic mode: bands by shape
                    nb = -(-oh // rows)
                    w = np.ascontiguousarray(w2[0])
                    xflat, cols, wp = _EMPTY, _EMPTY, ow
                    if geo.pointwise and st.int8 is None and x.flags.c_contiguous:
                        mode = cf.IN_PLACE
                        xflat = x.reshape(-1)
                    elif geo.strides == (1, 1):
                        mode, wp = cf.SHIFTED, ow + (kw - 1) * dw
                        taps = _shifted_weights(st, w, key)
                        cols = buffer(("cols", s), (nb * taps.shape[1] * (rows + (kh - 1) * dh) * wp,), np.float32)
                    else:
                        mode = cf.IM2COL
                        cols = buffer(("cols", s), (nb * geo.reduction * rows * ow,), np.float32)
                    args = (openblas.sgemm_address(), mode, x, xflat, zp, taps if mode == cf.SHIFTED else w,
                            kh, kw, sh, sw, dh, dw, ph, pw, oh, ow, rows, wp, cols,
                            buffer(("y", s), (nb * OC * rows * wp,), np.float32)) + ep + (np.zeros(nb, np.uint8),)
                    calls.append(_band_call(args, w))
                    x = x_next
                    continue
                if st.direct_depthwise:
                    y = buffer(("y", s), (OC, P), np.float32)
                    calls.append(partial(cf.depthwise_2d, x, zp, w2, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow, y))
                elif isinstance(int_w, PairWeights):  # exact int32 sums on the AVX2 int8 GEMM
                    y = self._pairs_gemm_calls(s, x, zp, int_w, geo, buffer, calls)
                elif int_w is not None:  # exact int32 sums on the VNNI int8 GEMM
                    y = self._int8_gemm_calls(s, x, int_w, geo, buffer, calls)
                else:
                    if geo.pointwise and st.int8 is None and x.flags.c_contiguous:
                        cols = x.reshape(geo.in_channels, P)  # the image itself
                    else:
                        cols = buffer(("cols", s), (geo.reduction, P), np.float32)
                        calls.append(partial(cf.im2col_2d, x, zp, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow, cols))
                    if st.int8 is not None and geo.reduction > chunk:
                        y = buffer(("y", s), (OC, P), np.float64)
                        calls.append(partial(_int_gemm_into, cols, w2, chunk, y))  # exact integer sums, f64
                        bindable = False  # int_gemm's chunks allocate
                    elif st.int8 is not None:  # one f32 GEMM is exact: its integer sums as they are
                        y = buffer(("y", s), (OC, P), np.float32)
                        calls.append(partial(np.matmul, w2[0], cols, out=y))
                    else:
                        y = buffer(("y", s), (OC, P), np.float32)
                        calls.append(partial(store.matmul_into, np.ascontiguousarray(w2[0]), cols, y))
                calls.append(partial(cf.epilogue, y, *ep))
                x = x_next
        return calls, bindable

    def _int8_gemm_calls(self, s: int, x: np.ndarray, vnni: "Int8Weights", geo: cv.Geometry, buffer,
                         calls: list) -> np.ndarray:
        """Appends to ``calls`` the kernels of ``sum_j w[o, j] * (cols[j, p] - zp)`` as
        int32 [OC, P] for image ``x`` (u8/s8); returns that result's buffer.  The
        columns are gathered straight into igemm's packed B (8-bit, zero point not
        subtracted), the packed weights are A, and the row-sum term ``cb * rowsum(w)``
        takes the zero point out exactly."""
        oh, ow = geo.out_spatial
        P, OC = oh * ow, geo.out_channels
        panels = -(-P // igemm.NR)
        bp = buffer(("bp", s), (panels * vnni.k4 * igemm.NR * 4,), np.uint8)
        C, H, W = x.shape
        if geo.strides == (1, 1) and ow == W and x.flags.c_contiguous:  # one long copy per row of B
            calls.append(partial(cf.im2col_packed_2d_flat, x.reshape(C, H * W), H, W, vnni.shift, vnni.pad,
                                 *geo.kernel, *geo.dilations, *geo.pads_begin, oh, vnni.k4, bp.view(np.uint32)))
        else:
            calls.append(partial(cf.im2col_packed_2d, x, vnni.shift, vnni.pad, *geo.kernel, *geo.strides,
                                 *geo.dilations, *geo.pads_begin, oh, ow, vnni.k4, bp.view(np.uint32)))
        y = buffer(("y32", s), (OC, P), np.int32)
        calls.append(partial(igemm.driver(True), vnni.ap, OC, bp, vnni.k4, vnni.colterm, vnni.cb, vnni.rowsum,
                             False, y))
        return y

    def _pairs_gemm_calls(self, s: int, x: np.ndarray, zp, pair: PairWeights, geo: cv.Geometry, buffer,
                          calls: list) -> np.ndarray:
        """Appends to ``calls`` the kernels of ``sum_j w[o, j] * (cols[j, p] - zp)`` as
        int32 [OC, P] on the AVX2 int8 GEMM; returns that result's buffer.  The columns
        less the zero point are gathered straight into igemm16's int16-pair panels: im2col
        columns, or (``pair.wp``) the image's rows shifted by each kernel column, ``pair.wp``
        wide, which the GEMM reads once per kernel row (its ``taps``) with that row's weights."""
        oh, ow = geo.out_spatial
        P, OC = oh * ow, geo.out_channels
        C, H, W = x.shape
        NR = igemm16.NR
        y = buffer(("y32", s), (OC, P), np.int32)
        if pair.wp:
            kh, kw = geo.kernel
            dh, dw = geo.dilations
            rows = oh + (kh - 1) * dh  # image rows the kernel rows read, padding included
            bp = buffer(("bp16", s), (rows * pair.wp // NR * pair.k2 * NR,), np.uint32)
            calls.append(partial(cf.im2col_pairs_2d, x, zp, 1, kw, 1, 1, 1, dw, *geo.pads_begin, rows, pair.wp,
                                 pair.k2, bp))
            calls.append(partial(igemm16.gemm, pair.ap, OC, bp, pair.k2, kh, dh * pair.wp // NR, pair.wp, ow, y))
            return y
        bp = buffer(("bp16", s), (-(-P // NR) * pair.k2 * NR,), np.uint32)
        if geo.strides == (1, 1) and ow == W and x.flags.c_contiguous:  # one long copy per row of B
            calls.append(partial(cf.im2col_pairs_2d_flat, x.reshape(C, H * W), H, W, int(zp), *geo.kernel,
                                 *geo.dilations, *geo.pads_begin, oh, pair.k2, bp))
        else:
            calls.append(partial(cf.im2col_pairs_2d, x, zp, *geo.kernel, *geo.strides, *geo.dilations,
                                 *geo.pads_begin, oh, ow, pair.k2, bp))
        calls.append(partial(igemm16.gemm, pair.ap, OC, bp, pair.k2, 1, 0, P, P, y))
        return y

    def bind(self, inputs: dict, outputs: dict):
        """A callable that runs this plan on these tensors (see ``CompiledPartition.bind``):
        the 2-D path's kernel calls with their whole argument lists made once (views of
        the tensors' memory, intermediates taken now); None where a call needs Python
        work (the block path, reference pre-steps, per-call operands or weights, an
        output that is not written in place)."""
        if self.fast is None:
            return None
        tid, tensor = next(iter(outputs.items()))
        out = tensor.numpy()
        if out.dtype != dtypes.numpy_dtype(tensor.lt.dtype) or not out.flags.writeable:
            return None
        arrays = {i: t.numpy() for i, t in inputs.items()}
        keys = {i: t.buffer for i, t in inputs.items() if i in self.constants}
        taken: dict = {}  # this binding's intermediates, taken once (execute reuses the plan's per-thread pool)

        def buffer(name, shape, dtype):
            if name not in taken:
                taken[name] = scratch.empty(shape, dtype)
            return taken[name]

        calls, bindable = self._fast_calls(arrays, keys, out, buffer)
        if not bindable:
            return None
        if len(calls) == 1:
            return calls[0]

        def run() -> None:
            for call in calls:
                call()

        return run

    def execute(self, inputs: dict, outputs: dict) -> None:
        keys = {tid: t.buffer for tid, t in inputs.items() if tid in self.constants}
        if self.fast is not None:
            tid, tensor = next(iter(outputs.items()))
            view = tensor.numpy()
            direct = view.dtype == dtypes.numpy_dtype(tensor.lt.dtype) and view.flags.writeable
            out = view if direct else scratch.empty(tensor.lt.shape, dtypes.numpy_dtype(tensor.lt.dtype))
            self._run_fast({tid: t.numpy() for tid, t in inputs.items()}, keys, out)
            if not direct:
                tensor.write(out)
            return
        arrays = self.run_arrays({tid: t.numpy() for tid, t in inputs.items()}, keys)
        for tid, tensor in outputs.items():
            tensor.write(arrays[tid])


# ---------------------------------------------------------------- building
def _rounder(request, conv, index):
    """The reference's rounding of conv input ``index`` (fpmath; dequantized data)."""
    fp = request.fpmath
    if index in dequantized_inputs(request.ops).get(conv.id, frozenset()):
        return fp.round_dequantized_weight
    dtype = request.lts[conv.inputs[index].id].dtype
    return lambda a: fp.round_input(a, dtype)


def _downstream(ops, start_id) -> set:
    """Tensor ids computed (transitively) from the output of op ``start_id``."""
    flow = set()
    for op in ops:
        if op.id == start_id or any(lt.id in flow for lt in op.inputs):
            flow.update(lt.id for lt in op.outputs)
    return flow


def _stage(request, conv, ops_by_out, after, int8=None) -> ConvStage | str:
    """A ConvStage for ``conv``, folding a following BiasAdd and BatchNormInference
    (``after``: the consumers chain of the partition, op by op)."""
    lts = request.lts
    x_lt, w_lt, out_lt = (lts[conv.inputs[0].id], lts[conv.inputs[1].id], lts[conv.outputs[0].id])
    if x_lt.shape is None or len(x_lt.shape) < 3:
        return f"conv (op {conv.id}) input rank is not >= 3"
    geo = _geometry(conv, x_lt, w_lt, out_lt)
    bias_id = conv.inputs[2].id if len(conv.inputs) > 2 else None
    out_id, bn = conv.outputs[0].id, None
    absorbed = []
    if out_lt.dtype == F32:
        nxt = after.get(out_id)
        if nxt is not None and nxt.kind == K.BiasAdd and bias_id is None and \
                nxt.attrs["data_format"] == conv.attrs["data_format"] and lts[nxt.outputs[0].id].dtype == F32:
            bias_id, out_id = nxt.inputs[1].id, nxt.outputs[0].id
            absorbed.append(nxt.id)
            nxt = after.get(out_id)
        if nxt is not None and nxt.kind == K.BatchNormInference and int8 is None and \
                conv.kind == K.Convolution and \
                nxt.attrs["data_format"] == conv.attrs["data_format"] and lts[nxt.outputs[0].id].dtype == F32:
            bn, out_id = nxt, nxt.outputs[0].id
            absorbed.append(nxt.id)
    x_id = int8["x_id"] if int8 else conv.inputs[0].id
    w_id = int8["w_id"] if int8 else conv.inputs[1].id
    return ConvStage(conv, geo, x_id, out_id, w_id, bias_id, bn, int8,
                     _rounder(request, conv, 0), _rounder(request, conv, 1), absorbed)


def build(request: CompileRequest):
    """The plan of a Convolution partition, or why the fast path does not apply."""
    lts, ops = request.lts, request.ops
    convs = [op for op in ops if op.kind in (K.Convolution, K.ConvTranspose)]
    first = convs[0]
    fmt = first.attrs["data_format"]
    if any(c.attrs["data_format"] != fmt for c in convs):
        return "the convolutions' data formats differ"
    flow_ids = _downstream(ops, first.id)
    ops_by_out = {lt.id: op for op in ops for lt in op.outputs}
    after = {lt.id: op for op in ops for lt in op.inputs if op.id != first.id}
    int8 = _int8_params(request, first, ops_by_out)
    stages, absorbed = {}, set()
    for conv in convs:
        stage = _stage(request, conv, ops_by_out, after, int8 if conv is first else None)
        if isinstance(stage, str):
            return stage
        stages[conv.id] = stage
        absorbed.update(stage.absorbed)
    skip = int8["skip"] if int8 else set()
    pre, flow = [], []
    for op in ops:
        if op.id in skip or op.id in absorbed:
            continue
        ctx = RefContext(fpmath=request.fpmath)
        out_lts = [lts[lt.id] for lt in op.outputs]
        if op.id in stages:
            flow.append(stages[op.id])
        elif op.outputs[0].id in flow_ids:
            reason = _chain_reason(op, lts, fmt, flow_ids)
            if reason:
                return reason
            flow.append((op, out_lts[0], ctx))
        else:
            pre.append((REFERENCE[op.kind], op, out_lts, ctx))
    stage_outs = {s.out_id for s in stages.values()}
    for op in ops:
        if op.id in skip | absorbed and any(lt.id in request.output_ids and lt.id not in stage_outs
                                             for lt in op.outputs):
            return "a folded op's output leaves the partition"
    outputs = {tid: lts[tid] for tid in request.output_ids}
    if not all(tid in flow_ids for tid in outputs):
        return "a partition output is not computed from the convolution"
    constants = {tid for tid in request.input_ids if lts[tid].property == PropertyType.constant}
    n_images = lts[first.inputs[0].id].shape[0]
    fast = _fast_segments(request, flow, pre, fmt, flow_ids)
    if fast is not None:
        segments, dropped = fast
        pre = [step for step in pre if step[1].id not in dropped]
        return ConvPlan(request, pre, flow, fmt, n_images, outputs, constants, segments)
    return ConvPlan(request, pre, flow, fmt, n_images, outputs, constants)

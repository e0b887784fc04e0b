"""Data movement, Interpolate, End and Dropout cases."""
from __future__ import annotations

import math

import numpy as np

from graph_api.enums import OpKind as K

from .records import (EXACT, In, OpCase, Out, as_f64, bf16_rne, each, f16_rne, product_range)

FLOATS = ("f32", "bf16", "f16")


def _identity(inputs, attrs):
    return [as_f64(inputs[0])]


def type_cast_cases():
    cases = []
    for src, dst, rnd in (("f32", "bf16", bf16_rne), ("f32", "f16", f16_rne),
                          ("bf16", "f32", None), ("f16", "f32", None)):
        for i, shape in enumerate(((3, 5), (2, 2, 7))):
            expected = (lambda r: lambda ins, attrs: [each(r, ins[0])])(rnd) if rnd else _identity
            cases.append(OpCase(f"TypeCast_{src}_{dst}_{i}", K.TypeCast, (In(shape, src, -70, 70),),
                                (Out(shape, dst),), expected, tol=EXACT, seed=5000 + len(cases)))
    return cases


def _flat(x):
    return [x[idx] for idx in np.ndindex(x.shape)]


def movement_cases():
    cases = []
    for dt in FLOATS:
        for i, shape in enumerate(((3, 4), (2, 3, 5))):
            cases.append(OpCase(f"Reorder_{dt}_{i}", K.Reorder, (In(shape, dt),), (Out(shape, dt),),
                                _identity, tol=EXACT, seed=5100 + len(cases)))
        for i, (src, target, special, out) in enumerate((((2, 3, 4), [0, -1], True, (2, 12)),
                                                         ((6, 4), [3, -1, 2], False, (3, 4, 2)))):
            cases.append(OpCase(
                f"StaticReshape_{dt}_{i}", K.StaticReshape, (In(src, dt),), (Out(out, dt),),
                (lambda o: lambda ins, attrs: [np.array(_flat(as_f64(ins[0]))).reshape(o)])(out),
                {"shape": target, "special_zero": special}, tol=EXACT, seed=5100 + len(cases)))
        for i, (src, order, out) in enumerate((((2, 3, 4), [2, 0, 1], (4, 2, 3)),
                                               ((3, 5), [-1, -2], (5, 3)))):
            cases.append(OpCase(f"StaticTranspose_{dt}_{i}", K.StaticTranspose, (In(src, dt),),
                                (Out(out, dt),), _transpose_expected, {"order": order}, tol=EXACT,
                                seed=5100 + len(cases)))
        for i, (shapes, axis, out) in enumerate(((((2, 3), (2, 1), (2, 2)), 1, (2, 6)),
                                                 (((1, 2, 3), (2, 2, 3)), 0, (3, 2, 3)))):
            cases.append(OpCase(f"Concat_{dt}_{i}", K.Concat, tuple(In(s, dt) for s in shapes),
                                (Out(out, dt),), _concat_expected, {"axis": axis}, tol=EXACT,
                                seed=5100 + len(cases)))
        for i, (shape, axis) in enumerate((((2, 3, 4), 1), ((5, 2), -1))):
            cases.append(OpCase(f"GenIndex_{dt}_{i}", K.GenIndex, (In(shape, dt),),
                                (Out(shape, "s32"),), _gen_index_expected, {"axis": axis},
                                seed=5100 + len(cases)))
    return cases


def _transpose_expected(inputs, attrs):
    x = as_f64(inputs[0])
    order = [a % x.ndim for a in attrs["order"]]
    out = np.empty([x.shape[a] for a in order])
    for idx in np.ndindex(out.shape):
        src = [0] * x.ndim
        for i, a in enumerate(order):
            src[a] = idx[i]
        out[idx] = x[tuple(src)]
    return [out]


def _concat_expected(inputs, attrs):
    xs = [as_f64(x) for x in inputs]
    axis = attrs["axis"] % xs[0].ndim
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    out = np.empty(shape)
    start = 0
    for x in xs:
        for idx in np.ndindex(x.shape):
            out[idx[:axis] + (idx[axis] + start,) + idx[axis + 1:]] = x[idx]
        start += x.shape[axis]
    return [out]


def _gen_index_expected(inputs, attrs):
    shape = np.shape(inputs[0])
    axis = attrs["axis"] % len(shape)
    out = np.empty(shape, dtype=np.int64)
    for idx in np.ndindex(shape):
        out[idx] = idx[axis]
    return [out]


# -------------------------------------------------------------- Interpolate
def _coordinate(o, in_size, out_size, mode):
    if mode == "align_corners":
        return 0.0 if out_size == 1 else o * (in_size - 1) / (out_size - 1)
    return (o + 0.5) * in_size / out_size - 0.5


def _taps(o, in_size, out_size, attrs):
    """[(index, weight)] of one output coordinate along one dim."""
    ctm = attrs.get("coordinate_transformation_mode", "half_pixel")
    c = _coordinate(o, in_size, out_size, ctm)
    if attrs["mode"] == "nearest":
        return [(min(max(math.floor(c + 0.5), 0), in_size - 1), 1.0)]
    c = min(max(c, 0.0), in_size - 1)
    lo = math.floor(c)
    return [(lo, 1 - (c - lo)), (min(lo + 1, in_size - 1), c - lo)]


def _interpolate_expected(inputs, attrs):
    nxc = attrs.get("data_format", "NXC") == "NXC"
    x = as_f64(inputs[0])
    x = np.moveaxis(x, -1, 1) if nxc else x
    in_sp = x.shape[2:]
    out_sp = attrs.get("sizes") or [int(math.floor(i * s)) for i, s in zip(in_sp, attrs["scales"])]
    out = np.zeros(x.shape[:2] + tuple(out_sp))
    for o in product_range(*out_sp):
        per_dim = [_taps(oo, i, n, attrs) for oo, i, n in zip(o, in_sp, out_sp)]
        for corner in product_range(*(len(t) for t in per_dim)):  # every 2^d corner
            weight = math.prod(per_dim[d][c][1] for d, c in enumerate(corner))
            src = tuple(per_dim[d][c][0] for d, c in enumerate(corner))
            out[(Ellipsis,) + o] += weight * x[(Ellipsis,) + src]
    return [np.moveaxis(out, 1, -1) if nxc else out]


INTERPOLATE_CONFIGS = (  # src, out, attrs
    ((1, 2, 4, 4), (1, 2, 8, 8), dict(mode="nearest", sizes=[8, 8], data_format="NCX")),
    ((1, 5, 5, 2), (1, 3, 3, 2), dict(mode="nearest", sizes=[3, 3])),
    ((1, 2, 3, 5), (1, 2, 6, 4), dict(mode="linear", sizes=[6, 4], data_format="NCX")),
    ((1, 3, 4, 2), (1, 5, 7, 2), dict(mode="bilinear", sizes=[5, 7],
                                      coordinate_transformation_mode="align_corners")),
    ((1, 2, 5), (1, 2, 3), dict(mode="nearest", sizes=[3], data_format="NCX",
                                coordinate_transformation_mode="align_corners")),
    ((1, 2, 3, 3), (1, 2, 6, 6), dict(mode="nearest", scales=[2.0, 2.0], data_format="NCX")),
)


def interpolate_cases():
    cases = []
    for dt in FLOATS:
        for i, (si, so, attrs) in enumerate(INTERPOLATE_CONFIGS):
            cases.append(OpCase(f"Interpolate_{dt}_{i}", K.Interpolate, (In(si, dt),),
                                (Out(so, dt),), _interpolate_expected, attrs, seed=5200 + len(cases)))
    # the optional s32 sizes input (the output size still comes from the attribute/shape)
    cases.append(OpCase("Interpolate_f32_sizes_input", K.Interpolate,
                        (In((1, 3, 3, 2)), In((2,), "s32", values=[6, 4])), (Out((1, 6, 4, 2)),),
                        _interpolate_expected, dict(mode="linear", sizes=[6, 4]), seed=5290))
    return cases


# ---------------------------------------------------------------- End, Dropout
def end_cases():
    return [OpCase(f"End_{dt}_{i}", K.End, (In(shape, dt, -10, 10),), (), lambda ins, attrs: [])
            for dt in FLOATS + ("s8", "u8", "s32") for i, shape in enumerate(((2, 3), (4,)))]


MASK64 = 2 ** 64 - 1


def splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def dropout_keep(seed: int, offset: int, count: int, p: float) -> list[bool]:
    """The documented counter-based stream, in pure Python integers."""
    key = splitmix64(seed & MASK64)
    keep = []
    for i in range(count):
        u = ((splitmix64(((offset + i) & MASK64) ^ key) >> 40) + 1) / 2.0 ** 24
        keep.append(u > p)
    return keep


def _dropout_expected(inputs, attrs):
    x = as_f64(inputs[0])
    seed, offset = int(np.asarray(inputs[1])), int(np.asarray(inputs[2]))
    p = float(np.float32(np.asarray(inputs[3])))
    keep = np.array(dropout_keep(seed, offset, x.size, p)).reshape(x.shape)
    return [np.where(keep, x / (1 - p), 0.0), keep.astype(np.int64)]


def dropout_cases():
    cases = []
    configs = (("f32", (4, 8), 42, 7, 0.3, True), ("bf16", (2, 3, 5), -5, 0, 0.5, False),
               ("f16", (16,), 1, 2 ** 40, 0.25, True))
    for dt, shape, seed, offset, p, with_mask in configs:
        ins = (In(shape, dt), In((), "s64", values=seed, host_scalar=True),
               In((), "s64", values=offset, host_scalar=True),
               In((), "f32", values=p, host_scalar=True))
        outs = (Out(shape, dt),) + ((Out(shape, "u8"),) if with_mask else ())
        cases.append(OpCase(f"Dropout_{dt}", K.Dropout, ins, outs, _dropout_expected,
                            seed=5300 + len(cases)))
    return cases


def misc_cases():
    return (type_cast_cases() + movement_cases() + interpolate_cases() + end_cases()
            + dropout_cases())

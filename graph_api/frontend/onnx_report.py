"""``graph-api run model.onnx``: fill or read the inputs, run, time, print, check.

Inputs are read from ``--inputs FILE.npz`` (arrays by input name) or ``FILE.npy`` (the one
input), or filled: floats uniform in [-2, 2] (the JSON filler's rule for plain inputs), integers
in [0, 8) (valid token ids and indices for any table of 8 or more rows), booleans true;
symbolic dims are 1.  ``--check`` compares every output with ONNX Runtime on the same
file (``graph_api.check.compare``: f32 outputs within 2e-5 of ``|e| + max|e|``), or with
ONNX's reference evaluator when ONNX Runtime is absent.
"""
from __future__ import annotations

import os

import numpy as np

from ..check import compare
from ..cli import partition_table
from ..dtypes import DataType
from ..errors import InvalidArguments
from ..runner import PartitionRun

FILL_LOW, FILL_HIGH, INT_HIGH = -2.0, 2.0, 8


def fill_inputs(model, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, rt in model.inputs.items():
        if rt.shape is None:
            raise InvalidArguments(f"input {name!r} has an unknown rank: give it with --inputs FILE.npz")
        shape = [1 if d < 0 else d for d in rt.shape]
        dtype = rt.np_dtype if rt.np_dtype is not None else np.dtype(np.float32)
        if dtype.kind == "f" or dtype.name == "bfloat16":
            feeds[name] = rng.uniform(FILL_LOW, FILL_HIGH, shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[name] = rng.integers(0, INT_HIGH, shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[name] = np.ones(shape, bool)
        else:
            raise InvalidArguments(f"input {name!r} is {dtype}: give it with --inputs FILE.npz")
    return feeds


def read_inputs(model, path: str) -> dict:
    if not os.path.isfile(path):
        raise InvalidArguments(f"{path}: no such inputs file")
    try:
        loaded = np.load(path, allow_pickle=False)
    except Exception as err:  # noqa: BLE001 - numpy's errors on a bad file vary
        raise InvalidArguments(f"{path}: not a .npy/.npz file ({type(err).__name__}: {err})") from None
    if isinstance(loaded, np.ndarray):
        if len(model.input_names) != 1:
            raise InvalidArguments(f"{path} holds one array; the model has inputs {model.input_names}: use .npz")
        return {model.input_names[0]: loaded}
    return {name: loaded[name] for name in loaded.files}


def reference_outputs(model, feeds: dict) -> tuple[dict, str]:
    """ONNX Runtime's outputs (or ONNX's reference evaluator's) on the model's own file."""
    try:
        from .onnx_models import ort_session

        sess = ort_session(model.proto)
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(None, feeds))), "ONNX Runtime"
    except ImportError:
        from onnx.reference import ReferenceEvaluator

        ref = ReferenceEvaluator(model.proto)
        return dict(zip(model.output_names, ref.run(None, feeds))), "onnx.reference"


def report(model, feeds=None, *, seed: int = 0, repeat: int = 1, check: bool = False):
    """Run ``model`` and describe it: (lines, ok)."""
    if feeds is None:
        feeds = fill_inputs(model, seed)
    elif isinstance(feeds, (str, os.PathLike)):
        feeds = read_inputs(model, os.fspath(feeds))
    outs = model.run(feeds, repeat=max(1, repeat))
    host = model.host_steps
    lines = [f"model       {getattr(model, 'source', '<ModelProto>')}",
             f"            ai.onnx opset {model.opset}, {len(model.segments)} graph_api segment(s), "
             f"{len(host)} host step(s), fpmath {model.segments[0].graph.fpmath if model.segments else '-'}",
             "inputs      " + ", ".join(f"{n} {a.dtype}[{'x'.join(map(str, a.shape))}]" for n, a in feeds.items())]
    for stage in model.stages:
        lines.append("")
        if stage in host:
            from .onnx_import import node_label
            lines.append(f"stage {stage.index}     host step {node_label(stage.node)}  {stage.ms:.3f} ms")
            continue
        runs = {part.id: PartitionRun(part, comp, cms, ms) for part, comp, cms, ms in stage.timings}
        lines.append(f"stage {stage.index}     graph_api segment: {len(stage.graph.ops)} ops")
        lines += partition_table([r.partition for r in runs.values()], runs)
    ok = True
    if check:
        expected, who = reference_outputs(model, feeds)
        lines.append("")
        for name in model.output_names:
            got = outs[name]
            fpmath = model.segments[0].graph.fpmath if model.segments else None
            verdict = compare(expected[name], got, _ga_type(got.dtype), fpmath)
            ok &= verdict.ok
            detail = verdict.message or f"max |diff| {verdict.max_abs:.3g}"
            lines.append(f"check       output {name} {got.dtype}[{'x'.join(map(str, got.shape))}]: "
                         f"{'ok' if verdict.ok else 'MISMATCH'} ({detail})")
        good = sum(1 for line in lines if line.startswith("check") and ": ok" in line)
        lines.append(f"check       {good} of {len(model.output_names)} outputs match {who}")
    return lines, ok


def _ga_type(np_dtype) -> DataType:
    from ..dtypes import from_numpy

    try:
        return from_numpy(np_dtype)
    except Exception:  # noqa: BLE001
        return DataType.f32

"""The ``graph-api`` command line: run, inspect and draw oneDNN graph JSON files.

::

    graph-api run FILE.json [--policy fusion|debug] [--fpmath MODE] [--apply-to-int]
                            [--repeat N] [--check] [--seed N] [--mb N]
    graph-api run --batch BATCH_FILE [--inputs-root DIR] [--workers N | --scheduler ADDRESS]
    graph-api run MODEL.onnx [--fpmath MODE] [--repeat N] [--check] [--inputs FILE.npz]
    graph-api partitions FILE.json [--policy fusion|debug]
    graph-api dot FILE.json [-o out.dot] [--policy fusion|debug]

``run`` loads the graph, fills its inputs as benchdnn does (:mod:`graph_api.fill`),
partitions, compiles and executes it and prints one row per partition.  With
``--check`` every graph output is compared with the unfused numpy reference
(:func:`graph_api.check.compare`, per-data-type tolerances) and the exit code
is 1 on a mismatch.  ``run --batch`` runs a benchdnn graph batch file
(:mod:`graph_api.batch`) and prints benchdnn's summary line; exit code 1 when a
case failed.  Its cases run on ``--workers N`` local processes (default one per
core; 1 runs them in this process) or on the Dask cluster at ``--scheduler``
(:mod:`graph_api.batch_pool`), with the same lines in the same order.  Errors are one line, ``graph-api: error: <message>``,
exit code 2 — among them a graph that needs more memory than the budget
(:mod:`graph_api.memory`), refused before any input is allocated.  Also ``python -m graph_api``.

The functions :func:`prepare` and :func:`execute` are what ``run`` does; the
conformance tests call them directly.
"""
from __future__ import annotations

import argparse
import functools
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import graph_api

from . import fill, rewrite
from .check import Verdict, compare
from .enums import FPMathMode, OpKind, PartitionPolicy
from .errors import GraphError, InvalidArguments
from .fpmath import FPMath
from .json_io import load
from .memory import check_graph
from .runner import GraphRun, run_graph
from .batch import run_batch
from .batch_pool import run_batch_parallel

EXIT_OK, EXIT_MISMATCH, EXIT_ERROR = 0, 1, 2


# ====================================================================== running a file
@dataclass
class Prepared:
    """A loaded graph made ready to run: benchdnn's rewrites applied."""

    path: str
    loaded: object  # the Graph as in the file
    graph: object  # the Graph that runs
    notes: list[str] = field(default_factory=list)


@dataclass
class OutputCheck:
    tid: int
    lt: object
    verdict: Verdict


@dataclass
class Report:
    """What ``run`` did: partitions, timings, input roles and the output checks."""

    prepared: Prepared
    partitions: list
    run: GraphRun
    roles: dict
    checks: list[OutputCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.verdict.ok for c in self.checks)


def prepare(path, fpmath: str | None = None, apply_to_int: bool | None = None,
            mb: int | None = None, max_elements: int | None = None) -> Prepared:
    """Load ``path`` and apply the run-time rewrites benchdnn applies.

    Args:
        fpmath: override the file's fpmath mode (``--attr-fpmath``).
        apply_to_int: override ``apply_to_int`` (None keeps the file's).
        mb: set the leading batch dim (``--mb``).
        max_elements: shrink batch (then heads) dims until the graph's tensors
            hold at most this many elements (for CI-sized runs).
    """
    loaded = load(path)
    graph, notes = loaded, []
    if fpmath is not None or apply_to_int is not None:
        mode = fpmath if fpmath is not None else graph.fpmath.mode
        apply = apply_to_int if apply_to_int is not None else graph.fpmath.apply_to_int
        graph = rewrite.rebuild(graph, fpmath=FPMath.make(mode, apply))
        notes.append(f"fpmath overridden: {graph.fpmath} (file: {loaded.fpmath})")
    rounded = rewrite.power_of_two_scales(graph)
    if rounded is not graph:
        notes.append("static quantization scales rounded up to powers of two")
    graph = rounded
    if mb is not None:
        graph, what = rewrite.set_batch(graph, mb)
        if what:
            notes.append(f"batch changed: {what}")
    if max_elements is not None:
        graph, what = rewrite.reduce_batch(graph, max_elements)
        if what:
            notes.append(f"batch reduced to fit {max_elements:,} elements: {what}")
    return Prepared(str(path), loaded, graph, notes)


def graph_outputs(graph) -> list[int]:
    """Graph outputs as oneDNN has them: tensors no op consumes, and tensors an
    ``End`` op consumes even when other ops use them too (SDPA-backward dMask)."""
    marked = [op.inputs[0].id for op in graph.ops.values() if op.kind == OpKind.End]
    return list(dict.fromkeys(list(graph.output_ids) + marked))


def runnable(partitions) -> list:
    """Partitions to execute: a lone ``End`` marks a graph output and computes nothing."""
    return [p for p in partitions if not all(op.kind == OpKind.End for op in p.ops)]


def execute(prepared: Prepared, policy=PartitionPolicy.fusion, repeat: int = 1,
            check: bool = False, seed: int = fill.SEED) -> Report:
    """Fill, partition, compile and execute; with ``check`` compare every graph
    output with the unfused reference (:func:`graph_api.fill.reference_arrays`)."""
    graph = prepared.graph
    partitions = graph.get_partitions(policy)
    check_graph(graph, runnable(partitions))  # before the filler allocates the inputs
    roles = fill.input_roles(graph)
    feeds = fill.fill_inputs(graph, seed, roles)
    run = run_graph(graph, feeds, partitions=runnable(partitions), repeat=repeat)
    report = Report(prepared, partitions, run, roles)
    if check:
        expected = fill.reference_arrays(graph, feeds)
        ops = list(graph.ops.values())
        for tid in graph_outputs(graph):
            lt = graph.tensors[tid]
            if tid in run.outputs:
                verdict = compare(expected[tid], run.outputs[tid], lt.dtype, graph.fpmath, ops)
            else:
                verdict = Verdict(False, "no partition returns this graph output (it is marked by an End op)")
            report.checks.append(OutputCheck(tid, lt, verdict))
    return report


# ====================================================================== tables
def _kinds(ops, width: int = 44) -> str:
    text = ",".join(op.kind.name for op in ops)
    return text if len(text) <= width else text[: width - 3] + "..."


def _header(prepared: Prepared, partitions, policy) -> list[str]:
    graph, loaded = prepared.graph, prepared.loaded
    supported = sum(p.is_supported() for p in partitions)
    recorded = getattr(loaded, "recorded_engine_kind", graph.engine_kind.name)
    lines = [f"graph       {prepared.path}",
             f"            {len(graph.ops)} ops, {len(graph.input_ids)} inputs, {len(graph.output_ids)} outputs, "
             f"engine cpu (file: {recorded}), fpmath {graph.fpmath}, policy {PartitionPolicy(policy).name}",
             f"partitions  {len(partitions)} ({supported} supported)"]
    lines += [f"note        {note}" for note in prepared.notes]
    return lines


def partition_table(partitions, runs=None) -> list[str]:
    """One row per partition; timings when ``runs`` (PartitionRun by id) is given."""
    head = f"{'id':>4}  {'ops':>3}  {'op kinds':<44}  {'pattern':<30}  {'supported':<9}  {'fpmath':<18}"
    if runs is not None:
        head += f"  {'kernel':<16}  {'compile ms':>10}  {'execute ms':>10}"
    lines = [head.rstrip(), "-" * len(head.rstrip())]
    for p in partitions:
        row = (f"{p.id:>4}  {len(p.ops):>3}  {_kinds(p.ops):<44}  {p.get_kind():<30}  "
               f"{'yes' if p.is_supported() else 'no':<9}  {str(p.fpmath):<18}")
        if runs is not None:
            r = runs.get(p.id)
            kernel = r.compiled.plan.name if r and r.compiled is not None else "-"
            row += f"  {kernel:<16}  {r.compile_ms:>10.2f}  {r.execute_ms:>10.3f}" if r else \
                f"  {'-':<16}  {'-':>10}  {'-':>10}"
        lines.append(row.rstrip())
    if runs is not None:
        total_c = sum(r.compile_ms for r in runs.values())
        total_e = sum(r.execute_ms for r in runs.values())
        lines.append(f"{'total':<{len(head) - 24}}{total_c:>10.2f}  {total_e:>10.3f}")
    for p in partitions:
        if not p.is_supported():
            lines.append(f"partition {p.id} unsupported: {p.unsupported_reason()}")
    return lines


def _roles_line(roles: dict) -> str:
    counts = Counter(r.name for r in roles.values())
    return "inputs      " + ", ".join(f"{name} x{n}" for name, n in sorted(counts.items()))


def report_lines(report: Report, policy) -> list[str]:
    runs = {r.partition.id: r for r in report.run.partitions}
    lines = _header(report.prepared, report.partitions, policy) + [_roles_line(report.roles), ""]
    lines += partition_table(report.partitions, runs)
    if report.checks:
        lines.append("")
        for c in report.checks:
            shape = "x".join(map(str, c.lt.shape))
            status = "ok" if c.verdict.ok else "MISMATCH"
            detail = c.verdict.message or f"max |diff| {c.verdict.max_abs:.3g}"
            lines.append(f"check       output {c.tid} {c.lt.dtype.name}[{shape}]: {status} ({detail})")
        good = sum(c.verdict.ok for c in report.checks)
        lines.append(f"check       {good} of {len(report.checks)} outputs match the unfused reference")
    return lines


# ====================================================================== explanations
NO_EXPLANATION = "no pattern library explanation available"


def explanations(graph):
    """Why ops were not fused (``graph.explain_partitions()``): a dict op id ->
    reason, a list of lines, or None."""
    result = graph.explain_partitions()
    if result is None or isinstance(result, dict):
        return result
    if isinstance(result, str):
        return result.splitlines()
    return [str(line) for line in result]


def explanation_lines(graph, partitions) -> list[str]:
    single = [p.ops[0] for p in partitions if len(p.ops) == 1]
    lines = ["", f"not fused   {len(single)} single-op partition(s)"]
    if not single:
        return lines
    try:
        found = explanations(graph)
    except Exception as err:  # noqa: BLE001 - the table is still worth printing
        lines.append(f"            pattern library explanation failed: {type(err).__name__}: {err}")
        return lines
    if found is None:
        lines.append(f"            {NO_EXPLANATION}")
    elif isinstance(found, dict):
        for op in single:
            reason = found.get(op.id, "no pattern starts or ends at this op kind")
            lines.append(f"  op {op.id} ({op.kind.name}): {reason}")
    else:
        lines += [f"  {line}" for line in found]
    return lines


# ====================================================================== dot
def _quote(text) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _lt_label(lt) -> str:
    shape = "?" if lt.shape is None else "x".join("?" if d < 0 else str(d) for d in lt.shape)
    return f"%{lt.id} {lt.dtype.name}[{shape}]"


def to_dot(graph, partitions) -> str:
    """Graphviz text: ops as boxes inside one cluster per partition, tensors on edges."""
    graph = partitions[0].graph if partitions else graph  # the copy with Composite ops inlined
    lines = ["digraph graph_api {", "  rankdir=TB;", '  node [shape=box, fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=8];']
    for p in partitions:
        color = "black" if p.is_supported() else "red"
        lines.append(f"  subgraph cluster_p{p.id} {{")
        lines.append(f"    label={_quote(f'partition {p.id}: {p.get_kind()}' + ('' if p.is_supported() else ' (unsupported)'))};")
        lines.append(f"    color={color}; style={'rounded' if p.is_supported() else 'dashed'};")
        for op in p.ops:
            lines.append(f"    op{op.id} [label={_quote(f'{op.kind.name} #{op.id}')}];")
        lines.append("  }")
    for tid in graph.input_ids:
        lines.append(f"  t{tid} [shape=ellipse, label={_quote(_lt_label(graph.tensors[tid]))}];")
        for op_id, port in graph.consumers.get(tid, []):
            lines.append(f"  t{tid} -> op{op_id} [label={_quote(f'in {port}')}];")
    for u, v, tid, data in graph.nx.edges(keys=True, data=True):
        lines.append(f"  op{u} -> op{v} [label={_quote(_lt_label(graph.tensors[tid]))}];")
    for tid in graph.output_ids:
        op_id, _ = graph.producer[tid]
        lines.append(f"  t{tid} [shape=ellipse, style=bold, label={_quote(_lt_label(graph.tensors[tid]))}];")
        lines.append(f"  op{op_id} -> t{tid};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_svg(dot_path: Path) -> Path | None:
    """``dot -Tsvg`` next to ``dot_path`` when Graphviz is installed, else None."""
    exe = shutil.which("dot")
    if exe is None:
        return None
    svg = dot_path.with_suffix(".svg")
    subprocess.run([exe, "-Tsvg", str(dot_path), "-o", str(svg)], check=True, capture_output=True)
    return svg


# ====================================================================== commands
def cmd_run(args) -> int:
    if args.batch is not None:
        return cmd_run_batch(args)
    if args.workers is not None or args.scheduler is not None:
        raise InvalidArguments("--workers and --scheduler are for --batch BATCH_FILE")
    if str(args.file).endswith(".onnx"):  # the ONNX front door, loaded through the facade
        model = graph_api.import_onnx(args.file, fpmath=args.fpmath or "strict", policy=args.policy)
        lines, ok = model.report(args.inputs, seed=args.seed, repeat=args.repeat, check=args.check)
        print("\n".join(lines))
        return EXIT_OK if ok else EXIT_MISMATCH
    if args.inputs is not None:
        raise InvalidArguments("--inputs is for .onnx models (JSON graphs are filled as benchdnn does)")
    prepared = prepare(args.file, args.fpmath, args.apply_to_int, args.mb)
    report = execute(prepared, args.policy, args.repeat, args.check, args.seed)
    print("\n".join(report_lines(report, args.policy)))
    return EXIT_OK if report.ok else EXIT_MISMATCH


def cmd_run_batch(args) -> int:
    if args.file is not None:
        raise InvalidArguments(f"give either a graph file ({args.file}) or --batch, not both")
    if args.scheduler is not None and args.workers is not None:
        raise InvalidArguments("give either --workers (local processes) or --scheduler (a Dask cluster), not both")
    # flushed per line: a long batch shows its progress (and a killed run its cases so far)
    echo = functools.partial(print, flush=True)
    if args.workers == 1:
        summary = run_batch(args.batch, args.inputs_root, echo=echo)
    else:
        summary = run_batch_parallel(args.batch, args.inputs_root, echo=echo, workers=args.workers,
                                     scheduler=args.scheduler)
    return EXIT_OK if summary.ok else EXIT_MISMATCH


def cmd_partitions(args) -> int:
    prepared = prepare(args.file)
    partitions = prepared.graph.get_partitions(args.policy)
    lines = _header(prepared, partitions, args.policy) + [""] + partition_table(partitions)
    lines += explanation_lines(prepared.graph, partitions)
    print("\n".join(lines))
    return EXIT_OK


def cmd_dot(args) -> int:
    graph = load(args.file)
    text = to_dot(graph, graph.get_partitions(args.policy))
    if args.output is None:
        sys.stdout.write(text)
        return EXIT_OK
    out = Path(args.output)
    dot_path = out.with_suffix(".dot") if out.suffix == ".svg" else out
    dot_path.write_text(text, encoding="utf-8")
    print(f"wrote {dot_path}")
    svg = render_svg(dot_path)
    if svg is not None:
        print(f"wrote {svg}")
    elif out.suffix == ".svg":
        raise OSError(f"cannot write {out}: Graphviz 'dot' is not on the PATH (the .dot file was written)")
    return EXIT_OK


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _policy(text: str) -> PartitionPolicy:
    if text not in PartitionPolicy.__members__:
        raise argparse.ArgumentTypeError(f"expected fusion or debug, got {text!r}")
    return PartitionPolicy[text]


FILL_RULE = """input data (graph_api.fill): MatMul src = integers in [-4,4], weights =
integers in [-2,2] * 2^-floor(log2(K)/2); SDPA Divide scale in {2,4,8}, Multiply
scale in {0.25,0.5,1}; masks feeding SoftMax causal (0 / -inf); implicit causal
mask lengths = real S_q/S_kv; quantized ints narrow around the zero point with
power-of-two scales; Dropout seed 123456, offset 1, p 0.5; SDPA backward stats =
logsumexp of the scores; anything else uniform in [-2,2]."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="graph-api", description="Run, inspect and draw oneDNN Graph JSON files on the CPU.")
    sub = parser.add_subparsers(dest="command", metavar="{run,partitions,dot}", required=True)

    def add(name, help_text, epilog=None):
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("file", nargs="?" if name == "run" else None,
                       help="a oneDNN graph JSON file (graph dump or benchdnn --case); run: or an .onnx model")
        p.add_argument("--policy", type=_policy, default=PartitionPolicy.fusion, metavar="{fusion,debug}",
                       help="partition policy: fusion (patterns) or debug (one op per partition)")
        return p

    run = add("run", "load, fill inputs, partition, compile, execute and time a graph", FILL_RULE)
    run.add_argument("--fpmath", choices=[m.name for m in FPMathMode],
                     help="override the graph's fpmath mode")
    run.add_argument("--apply-to-int", action=argparse.BooleanOptionalAction, default=None,
                     help="override fpmath apply_to_int (default: as in the file)")
    run.add_argument("--repeat", type=_positive, default=1, metavar="N",
                     help="execute each partition N times, report the best time")
    run.add_argument("--check", action="store_true",
                     help="compare every graph output with the unfused reference; exit 1 on a mismatch")
    run.add_argument("--seed", type=int, default=fill.SEED, help="seed of the input filler")
    run.add_argument("--inputs", metavar="FILE.npz", default=None,
                     help="an .onnx model's inputs by name (.npz) or its one input (.npy); default: filled")
    run.add_argument("--mb", type=_positive, default=None, metavar="N",
                     help="set the leading batch dim to N, as benchdnn --mb")
    run.add_argument("--batch", metavar="BATCH_FILE",
                     help="run every --case of a benchdnn graph batch file (instead of FILE.json)")
    run.add_argument("--inputs-root", metavar="DIR", default=None,
                     help="folder the batch file's --case/--batch paths are relative to "
                          "(default: found from the batch file)")
    run.add_argument("--workers", type=_positive, default=None, metavar="N",
                     help="--batch: run the cases on N worker processes (default: one per core; "
                          "1: in this process, one after another)")
    run.add_argument("--scheduler", metavar="ADDRESS", default=None,
                     help="--batch: run the cases on the Dask distributed cluster at ADDRESS "
                          "(e.g. tcp://host:8786; needs pip install 'graph_api[dask]')")
    run.set_defaults(handler=cmd_run)
    add("partitions", "print the partition table and why unfused ops were not fused").set_defaults(
        handler=cmd_partitions)
    dot = add("dot", "write the graph as Graphviz dot, partitions as clusters (.svg too if 'dot' is installed)")
    dot.add_argument("-o", "--output", metavar="OUT.dot",
                     help="output file (.dot, or .svg to render); default: print to stdout")
    dot.set_defaults(handler=cmd_dot)
    return parser


def main(argv=None) -> int:
    """Entry point of ``graph-api``; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "run" and args.file is None and args.batch is None:
            parser.error("run needs a graph file (the argument 'file') or --batch BATCH_FILE")
    except SystemExit as stop:  # argparse has printed usage or help
        return int(stop.code or 0)
    try:
        return args.handler(args)
    except (GraphError, OSError) as err:
        print(f"graph-api: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    except MemoryError:  # an allocation the budget did not foresee (scratch, another process)
        print("graph-api: error: [out_of_memory] the system refused an allocation; "
              "lower the batch (--mb) or the memory budget (GRAPH_API_MEMORY_BUDGET)", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())

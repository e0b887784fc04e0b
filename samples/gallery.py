"""What samples hand to the gallery, the partition pictures, and the HTML page.

A sample calls :func:`graph` for each graph it wants drawn (with the partitions
it ran, and the kernel of each) and :func:`error` for each number it checks;
both print as they go, so a sample run alone reads the same.  ``python -m
samples`` collects them per sample (:func:`start`) for its summary table and
writes the page (:func:`write_html`).

Pictures are drawn with matplotlib (a set-up dependency of the samples; no
system Graphviz): ops in topological layers from left to right, each partition
a coloured box behind its ops, labelled with its pattern and kernel.
"""
from __future__ import annotations

import html
import inspect
import io
from dataclasses import dataclass, field


@dataclass
class Picture:
    title: str
    svg: str
    partitions: int


@dataclass
class Record:
    """Everything one sample showed."""

    pictures: list[Picture] = field(default_factory=list)
    errors: list[tuple[str, float, float]] = field(default_factory=list)
    partitions: int = 0
    skipped: str = ""  # why the sample could not run here (an optional package is absent)

    @property
    def worst_error(self) -> float | None:
        return max((value for _, value, _ in self.errors), default=None)


_current = Record()


def start() -> Record:
    """A fresh record for the next sample."""
    global _current
    _current = Record()
    return _current


def error(what: str, value: float, bound: float) -> float:
    """Print and record a checked error; fail the sample when it exceeds ``bound``."""
    _current.errors.append((what, float(value), float(bound)))
    print(f"{what}: error {value:.3e} (bound {bound:.0e})")
    if not value <= bound:
        raise AssertionError(f"{what}: error {value:.3e} exceeds {bound:.0e}")
    return value


def skip(reason: str) -> None:
    """Say the sample cannot run here (e.g. an optional package is absent): not a failure."""
    _current.skipped = reason
    print(f"skipped: {reason}")


def graph(title: str, the_graph, partitions, kernels: dict | None = None) -> None:
    """Print the partitions and record a picture of them.

    Args:
        partitions: the partitions (``graph.get_partitions()``), or the
            ``PartitionRun`` list of a ``run_graph`` result.
        kernels: partition id -> kernel name (taken from the runs when given runs).
    """
    kernels = dict(kernels or {})
    parts = []
    for item in partitions:
        part = getattr(item, "partition", item)
        compiled = getattr(item, "compiled", None)
        if compiled is not None:
            kernels.setdefault(part.id, compiled.plan.name)
        parts.append(part)
    print(f"{title}: {len(the_graph.ops)} ops -> {len(parts)} partitions")
    for part in parts:
        ops = ",".join(op.kind.name for op in part.ops)
        kernel = kernels.get(part.id, "")
        print(f"  partition {part.id}: {part.get_kind():22s} {kernel:20s} [{ops}]")
    _current.partitions += len(parts)
    try:
        svg = draw(the_graph, parts, kernels)
    except ImportError:  # matplotlib absent: the sample still runs, without its picture
        return
    _current.pictures.append(Picture(title, svg, len(parts)))


# ---------------------------------------------------------------- the picture
_COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
            "#ff9da7", "#9c755f", "#bab0ac"]


def _layers(the_graph) -> dict[int, int]:
    """Op id -> its longest distance from a graph input (its column)."""
    producer = {lt.id: op.id for op in the_graph.ops.values() for lt in op.outputs}
    column: dict[int, int] = {}
    for op_id in the_graph.topological_op_ids():
        op = the_graph.ops[op_id]
        column[op_id] = max((column[producer[lt.id]] + 1 for lt in op.inputs if lt.id in producer),
                            default=0)
    return column


def draw(the_graph, partitions, kernels: dict) -> str:
    """The graph with each partition as a coloured box; returns SVG text."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.patches import FancyBboxPatch, Patch

    column = _layers(the_graph)
    rows: dict[int, int] = {}
    place = {}
    for op_id in the_graph.topological_op_ids():
        c = column[op_id]
        place[op_id] = (c * 2.2, -rows.get(c, 0) * 1.1)
        rows[c] = rows.get(c, 0) + 1
    width = max(x for x, _ in place.values()) + 2.6
    depth = max(-y for _, y in place.values())  # rows below the first, in plot units
    fig, ax = plt.subplots(figsize=(min(2.0 + width * 0.9, 18), 1.0 + (depth + 2.0) * 0.6))
    producer = {lt.id: op.id for op in the_graph.ops.values() for lt in op.outputs}
    for op in the_graph.ops.values():  # edges first, under the boxes
        for lt in op.inputs:
            if lt.id in producer:
                (x0, y0), (x1, y1) = place[producer[lt.id]], place[op.id]
                # an edge that skips columns along one row arcs over the boxes between
                bend = "arc3,rad=-0.18" if y0 == y1 and x1 - x0 > 2.3 else "arc3"
                ax.annotate("", (x1 - 0.8, y1), (x0 + 0.8, y0),
                            arrowprops=dict(arrowstyle="->", color="#555", lw=0.8, connectionstyle=bend))
    legend = []
    for i, part in enumerate(partitions):
        colour = _COLOURS[i % len(_COLOURS)]
        xs = [place[op.id][0] for op in part.ops]
        ys = [place[op.id][1] for op in part.ops]
        ax.add_patch(FancyBboxPatch((min(xs) - 0.95, min(ys) - 0.45), max(xs) - min(xs) + 1.9,
                                    max(ys) - min(ys) + 1.0, boxstyle="round,pad=0.05",
                                    fc=colour, alpha=0.22, ec=colour, lw=1.5))
        # neighbouring clusters sit one column (2.2 units) apart, narrower than a
        # "kind / kernel" text: the box carries a short tag, the legend the words
        # drawn just above the partition's last op: the bounding boxes of two
        # partitions can share a corner, their last ops never share a place
        tag = f"p{part.id}"
        tx, ty = max((place[op.id] for op in part.ops), key=lambda xy: (xy[0], xy[1]))
        ax.text(tx - 0.75, ty + 0.3, tag, fontsize=7, color=colour, va="bottom",
                fontweight="bold")
        words = part.get_kind() + (f" / {kernels[part.id]}" if part.id in kernels else "")
        legend.append(Patch(fc=colour, alpha=0.5, ec=colour, label=f"{tag}: {words}"))
    for op in the_graph.ops.values():
        x, y = place[op.id]
        ax.add_patch(FancyBboxPatch((x - 0.75, y - 0.25), 1.5, 0.5, boxstyle="round,pad=0.02",
                                    fc="white", ec="#333", lw=0.8))
        ax.text(x, y, op.kind.name, ha="center", va="center", fontsize=7)
    ax.set_xlim(-1.2, width - 1.0)
    ax.set_ylim(-depth - 0.7, 1.3)
    ax.axis("off")
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(0.0, 0.0), fontsize=7,
              ncol=max(1, min(3, int(width // 9) + 1)), frameon=False)
    out = io.StringIO()
    fig.savefig(out, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = out.getvalue()
    return text[text.index("<svg"):]


# ---------------------------------------------------------------- the page
def write_html(path, entries) -> None:
    """One section per sample: what it shows, its pictures, its output, its code.

    ``entries``: (name, module, status, seconds, output text, Record).
    """
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>graph_api samples</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}"
             "pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:12px}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px}"
             ".fail{color:#c00}.ok{color:#080}svg{max-width:100%;height:auto}</style></head><body>",
             "<h1>graph_api samples gallery</h1>", _summary_table(entries)]
    for name, module, status, seconds, output, record in entries:
        doc = inspect.getdoc(module) if module is not None else ""
        parts.append(f"<h2 id='{html.escape(name)}'>{html.escape(name)} "
                     f"<span class='{'ok' if status == 'ok' else 'fail'}'>{html.escape(status)}</span></h2>")
        parts.append(f"<pre>{html.escape(doc or '')}</pre>")
        for picture in record.pictures:
            parts.append(f"<h3>{html.escape(picture.title)}</h3>{picture.svg}")
        parts.append(f"<h3>Output ({seconds:.2f} s)</h3><pre>{html.escape(output)}</pre>")
        if module is not None:
            source = inspect.getsource(module)
            parts.append(f"<details><summary>Code</summary><pre>{html.escape(source)}</pre></details>")
    parts.append("</body></html>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))


def _summary_table(entries) -> str:
    rows = ["<table><tr><th>sample</th><th>status</th><th>partitions</th><th>max error</th>"
            "<th>time (s)</th></tr>"]
    for name, _, status, seconds, _, record in entries:
        worst = record.worst_error
        rows.append(f"<tr><td><a href='#{html.escape(name)}'>{html.escape(name)}</a></td>"
                    f"<td class='{'ok' if status == 'ok' else 'fail'}'>{html.escape(status)}</td>"
                    f"<td>{record.partitions}</td><td>{'' if worst is None else f'{worst:.2e}'}</td>"
                    f"<td>{seconds:.2f}</td></tr>")
    return "\n".join(rows) + "</table>"

"""The PyTorch front door: a Dynamo backend named ``graph_api``.

::

    import torch
    compiled = torch.compile(model, backend="graph_api")      # the entry point in pyproject.toml
    compiled = torch.compile(model, backend=backend(check=True, explain=True))

Dynamo captures the model's FX graph; AOTAutograd lowers it to ATen
(:func:`graph_api_backend`); on the first call with each set of input shapes the
ATen graph is lowered onto oneDNN Graph ops (:mod:`torch_lower`), partitioned
with ``get_partitions()``, each supported partition compiled, and the FX graph
rewritten so every partition is one call while the other nodes stay torch calls
(:mod:`torch_graph`).  Tensors cross without copies (numpy views of the CPU
tensors), parameters and buffers are constant logical tensors, prepared once.

Options (``torch.compile(..., options={...})`` or :func:`backend`):

``fpmath``   the graph's fpmath mode (``"strict"``; ``"bf16"``, ``"tf32"``, ... as ``FPMathMode``)
``check``    run every partition also on eager torch's inputs and compare with
             eager's outputs; a mismatch raises :class:`CheckMismatch` naming the nodes
``explain``  print each graph's :class:`Report` when it compiles (or a callable
             that receives it); :func:`reports` returns them all anyway
``threads``  ``"auto"`` (default) applies :func:`thread_policy`, ``None`` leaves threads alone
``max_shapes``   how many shape specialisations of one graph stay compiled (default 8; the
             least recently used is dropped, with its buffers)
``max_compiles`` how many specialisations one graph may compile in all (default 64); a
             new shape past it runs that graph in eager torch, with one warning

A node the lowering cannot express stays in torch: one :class:`FallbackWarning`
per compiled graph names such compute nodes and why.  Anything that fails
while compiling a graph (a bug here, an op the runtime refuses) falls back to
eager for that graph, with a warning; the process never crashes.

Shapes: the ATen graph is specialised per concrete input shapes (a graph that
Dynamo made dynamic, with ``dynamic=True`` or automatically after a shape change, is
re-traced for each new shape with ``make_fx``); each specialisation builds and compiles
its own partitions, and the report counts them (one :func:`reports` entry each).  The
number stays bounded: at most ``max_shapes`` specialisations are kept per graph (an LRU)
and at most ``max_compiles`` are ever made; past that, new shapes run eagerly.  A
static KV cache (fixed shapes per decode step) compiles once.
"""
from __future__ import annotations

import math
import warnings
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import torch
from torch._dynamo.backends.common import aot_autograd
from functorch.compile import make_boxed_func

import graph_api as ga
from graph_api.check import compare
from graph_api.errors import ExecutionError, GraphError, InvalidArguments

from . import torch_graph as tg
from . import torch_int4  # noqa: F401  (registers graph_api::dequantize_int4 and its rule)
from . import torch_lower as tl
from . import torch_threads

from .torch_int4 import Int4Linear, quantize_linear_weights_int4

__all__ = ["graph_api_backend", "backend", "quantize_linear_weights_int4", "Int4Linear", "Options", "Report", "reports", "reset_reports",
           "FallbackWarning", "CheckMismatch", "thread_policy"]

thread_policy = torch_threads.apply


class FallbackWarning(UserWarning):
    """Part of a captured graph runs in eager torch instead of graph_api."""


class CheckMismatch(ExecutionError):
    """check mode: a partition's output differs from eager torch's (names the nodes)."""


@dataclass(frozen=True)
class Options:
    fpmath: str = "strict"
    check: bool = False
    explain: object = False
    threads: object = "auto"
    max_shapes: int = 8
    max_compiles: int = 64

    @classmethod
    def parse(cls, options) -> "Options":
        options = dict(options or {})
        known = ("fpmath", "check", "explain", "threads", "max_shapes", "max_compiles")
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise InvalidArguments(f"graph_api backend: unknown option(s) {unknown}; "
                                   f"known: {', '.join(known)}")
        made = cls(**options)
        for name in ("max_shapes", "max_compiles"):
            value = getattr(made, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidArguments(f"graph_api backend: {name}={value!r}; expected an int >= 1")
        try:
            ga.FPMath.make(made.fpmath, False)
        except (GraphError, ValueError, KeyError) as err:
            raise InvalidArguments(f"graph_api backend: fpmath={made.fpmath!r}: {err}") from None
        if made.threads not in ("auto", None):
            raise InvalidArguments(f"graph_api backend: threads={made.threads!r}; expected 'auto' or None")
        return made


# ---------------------------------------------------------------- the report
@dataclass
class Report:
    """What one compiled graph (one set of input shapes) runs where.

    ``compute``: ATen nodes that compute floating-point values (matmul, conv,
    attention, norms, softmax, pooling, reductions, element-wise, casts; not views,
    constants or integer mask bookkeeping); ``in_graph_api`` of them run inside
    graph_api partitions.
    """

    shapes: str = ""
    compute: int = 0
    in_graph_api: int = 0
    by_category: Counter = field(default_factory=Counter)  # category -> [total, in graph_api]
    partitions: list = field(default_factory=list)  # (call name, kind, kernel, node names)
    torch_nodes: list = field(default_factory=list)  # (node, target, reason)
    unfused: dict = field(default_factory=dict)  # node -> why its op runs alone
    graphs: int = 1
    compiles: int = 0
    reused: int = 0  # partitions whose outputs stay in buffers kept between calls
    graph: object = field(default=None, repr=False)  # the graph_api Graph (None: nothing lowered)
    parts: list = field(default_factory=list, repr=False)  # its partitions that run in graph_api
    kernels: dict = field(default_factory=dict, repr=False)  # partition id -> kernel name

    @property
    def coverage(self) -> float:
        return self.in_graph_api / self.compute if self.compute else 1.0

    @property
    def fused(self) -> Counter:
        return Counter(kind for _, kind, _, _ in self.partitions)

    def __str__(self) -> str:
        lines = [f"graph_api: {self.in_graph_api}/{self.compute} ATen compute nodes in graph_api partitions "
                 f"({100 * self.coverage:.1f}%), {len(self.partitions)} partitions, {self.graphs} graph(s), "
                 f"{self.compiles} partition compiles" + (f"; inputs {self.shapes}" if self.shapes else "")]
        for cat, (total, inside) in sorted(self.by_category.items()):
            lines.append(f"  {cat:10s} {inside:4d} / {total:<4d} in graph_api")
        lines.append("  partitions: " + ", ".join(f"{k} x{n}" for k, n in self.fused.most_common()))
        for name, target, reason in self.torch_nodes:
            lines.append(f"  torch: {name} ({target}): {reason}")
        for name, why in sorted(self.unfused.items())[:20]:
            lines.append(f"  unfused: {name}: {why}")
        if len(self.unfused) > 20:
            lines.append(f"  unfused: ... {len(self.unfused) - 20} more")
        return "\n".join(lines)

    @staticmethod
    def combine(reports) -> "Report":
        """One report over several graphs (graph breaks, several shapes)."""
        total = Report(graphs=0)
        cats: dict = {}
        for r in reports:
            total.compute += r.compute
            total.in_graph_api += r.in_graph_api
            total.partitions += r.partitions
            total.torch_nodes += r.torch_nodes
            total.unfused.update(r.unfused)
            total.graphs += r.graphs
            total.compiles += r.compiles
            total.reused += r.reused
            for cat, (a, b) in r.by_category.items():
                x = cats.setdefault(cat, [0, 0])
                x[0] += a
                x[1] += b
        total.by_category = Counter({k: tuple(v) for k, v in cats.items()})
        return total


_REPORTS: list[Report] = []


def reports() -> list[Report]:
    """Every graph's report since the last :func:`reset_reports`, in compile order."""
    return list(_REPORTS)


def reset_reports() -> None:
    _REPORTS.clear()


def _report(built, shapes) -> Report:
    low = built.lowerer
    report = Report(shapes=shapes, compiles=sum(len(c._variants) for c in built.calls))
    cats: dict = {}
    for node in low.gm.graph.nodes:
        if not tl.is_compute(node):
            continue
        inside = node in built.in_graph_api
        entry = cats.setdefault(tl.category(node), [0, 0])
        entry[0] += 1
        entry[1] += inside
        report.compute += 1
        report.in_graph_api += inside
        if not inside:
            report.torch_nodes.append((node.name, str(node.target), low.reasons.get(node, "kept in torch")))
    report.by_category = Counter({k: tuple(v) for k, v in cats.items()})
    report.partitions = [(c.name, c.partition.get_kind(), c.kernel, c.node_names) for c in built.calls]
    report.unfused = dict(built.explained)
    report.graph = built.graph
    report.reused = sum(c.reuse for c in built.calls)
    report.parts = [c.partition for c in built.calls]
    report.kernels = {c.partition.id: c.kernel for c in built.calls}
    return report


# ---------------------------------------------------------------- the compiled function
class GraphApiFunction:
    """The boxed function AOTAutograd calls for one ATen graph: per input shapes a
    :class:`torch_graph.Built` (rewritten module), compiled on first call."""

    def __init__(self, aten_gm, constant: list[bool], options: Options):
        self.gm, self.constant, self.options = aten_gm, constant, options
        self.variants: OrderedDict = OrderedDict()  # shape key -> Built (or gm: eager), LRU order
        self.compiled = 0  # specialisations made, evicted ones included
        self.dynamic = any(_symbolic(tl.meta(n)) for n in aten_gm.graph.nodes if n.op == "placeholder")

    def __call__(self, *args):
        args = list(args)
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        run = self.variants.get(key)
        if run is None:
            run = self._specialise(args, key)
        else:
            self.variants.move_to_end(key)
        if self.options.threads == "auto":
            torch_threads.apply()
        if self.options.check and run is not self.gm:
            _check(run, args, self.options)
        module = run.module if run is not self.gm else run
        return module(*args)

    def _specialise(self, args, key):
        """A new shape: compile it within the budget (else eager), keep at most max_shapes."""
        if self.compiled >= self.options.max_compiles:
            if self.compiled == self.options.max_compiles:
                self.compiled += 1  # warn once
                warnings.warn(f"graph_api: this graph compiled {self.options.max_compiles} shape specialisations "
                              f"(max_compiles); new shapes run in eager torch", FallbackWarning, stacklevel=3)
            return self.gm
        self.compiled += 1
        run = self.variants[key] = self._compile(args, key)
        while len(self.variants) > self.options.max_shapes:
            self.variants.popitem(last=False)
        return run

    def _compile(self, args, key):
        gm = self.gm
        try:
            if self.dynamic:
                from torch.fx.experimental.proxy_tensor import make_fx

                gm = make_fx(self.gm, tracing_mode="fake")(*args)
            constant = self.constant if len(self.constant) == len(args) else [False] * len(args)
            built = tg.build(gm, args, constant, self.options.fpmath)
        except Exception as err:  # never crash the user's model: eager for this graph
            warnings.warn(f"graph_api: this graph runs in eager torch: compiling it failed with "
                          f"{type(err).__name__}: {err}", FallbackWarning, stacklevel=2)
            return self.gm
        shapes = ", ".join(str(list(a.shape)) for a, c in zip(args, constant)
                           if isinstance(a, torch.Tensor) and not c)
        report = _report(built, shapes)
        _REPORTS.append(report)
        if report.torch_nodes:
            names = "; ".join(f"{n} ({r})" for n, _, r in report.torch_nodes[:6])
            more = f" and {len(report.torch_nodes) - 6} more" if len(report.torch_nodes) > 6 else ""
            warnings.warn(f"graph_api: {len(report.torch_nodes)} of {report.compute} ATen compute nodes "
                          f"stay in eager torch: {names}{more}", FallbackWarning, stacklevel=2)
        explain = self.options.explain
        if callable(explain):
            explain(report)
        elif explain:
            print(report)
        return built


def _symbolic(value) -> bool:
    if isinstance(value, torch.SymInt):
        return True
    return isinstance(value, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in value.shape)


def _check(built, args, options):
    """Every partition on eager torch's own inputs, against eager torch's outputs."""
    values = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            values[n] = result = super().run_node(n)
            return result

    with torch.no_grad():
        Recorder(built.lowerer.gm).run(*args)
    fpmath = ga.FPMath.make(options.fpmath, False)
    for call in built.calls:
        nodes = call.value_nodes
        ins = []
        for tid in call.var_ids:
            node = nodes.get(tid)
            value = values.get(node) if node is not None else None
            shape = tuple(call.partition.graph.tensors[tid].shape)
            if not isinstance(value, torch.Tensor) or (value.numel() * (2 if tid in call.packed else 1)
                                                       != math.prod(shape)):
                break
            ins.append(value if tid in call.packed else value.reshape(shape))
        else:
            got = call(*ins)
            for tid, result in zip(call.out_ids, got):
                node = nodes.get(tid)
                expected = values.get(node)
                if not isinstance(expected, torch.Tensor) or expected.numel() != result.numel():
                    continue
                expected = expected.reshape(result.shape)  # a linear layer's rows kept N-D here
                verdict = compare(tg.as_numpy(expected.float() if expected.dtype == torch.bfloat16 else expected),
                                  tg.as_numpy(result.float() if result.dtype == torch.bfloat16 else result),
                                  call.out_lts[call.out_ids.index(tid)].dtype, fpmath)
                if not verdict.ok:
                    raise CheckMismatch(
                        f"check: {call.name} (kernel {call.kernel}; nodes {', '.join(call.node_names)}) output "
                        f"{node.name} differs from eager torch: {verdict.message}")


# ---------------------------------------------------------------- the backend
def _is_constant(node, example) -> bool:
    """Parameters and buffers of the module (Dynamo's graph arguments say so)."""
    if isinstance(example, torch.nn.Parameter):
        return True
    grapharg = node.meta.get("grapharg") if hasattr(node, "meta") else None
    source = getattr(grapharg, "source", None)
    name = getattr(source, "name", "")
    name = name() if callable(name) else str(name)
    return "_parameters[" in name or "_buffers[" in name


def graph_api_backend(gm, example_inputs, options=None, mode=None, **kwargs):
    """The Dynamo backend (``torch.compile(model, backend="graph_api")``)."""
    opts = Options.parse({**(options or {}), **kwargs})
    if any(isinstance(e, torch.Tensor) and e.device.type != "cpu" for e in example_inputs):
        warnings.warn("graph_api: tensors on a non-CPU device; this graph runs in eager torch",
                      FallbackWarning, stacklevel=2)
        return gm.forward
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    constant = [_is_constant(n, e) for n, e in zip(placeholders, example_inputs)]

    def forward_compiler(aten_gm, fake_inputs):
        n_aten = sum(1 for n in aten_gm.graph.nodes if n.op == "placeholder")
        lifted = n_aten - len(constant)  # parameters AOTAutograd lifted from the module itself
        mask = [True] * lifted + constant if lifted >= 0 else [False] * n_aten
        return make_boxed_func(GraphApiFunction(aten_gm, mask, opts))

    def backward_compiler(aten_gm, fake_inputs):  # training: gradients run in eager torch
        return make_boxed_func(aten_gm.forward)

    return aot_autograd(fw_compiler=forward_compiler, bw_compiler=backward_compiler,
                        inference_compiler=forward_compiler)(gm, example_inputs)


def backend(fpmath="strict", check=False, explain=False, threads="auto", max_shapes=8, max_compiles=64):
    """A backend with these options: ``torch.compile(model, backend=backend(check=True))``."""
    opts = {"fpmath": fpmath, "check": check, "explain": explain, "threads": threads,
            "max_shapes": max_shapes, "max_compiles": max_compiles}
    Options.parse(opts)

    def graph_api_with_options(gm, example_inputs):
        return graph_api_backend(gm, example_inputs, options=opts)

    return graph_api_with_options

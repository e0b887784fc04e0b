"""graph_api sits on one-way layers (read from the sources with ast, every import
counted, function-local ones too):

    front doors     graph_api.frontend.*: PyTorch, ONNX  (top; their frameworks imported lazily)
    runtime + CLI   graph, partition, runner, builder, cli, json_io, ...
    backend seam    graph_api.backend: the runtime's one way down
    kernels, patterns                                          (patterns never import kernels)
    core            dtypes, enums, errors, logical_tensor, op, schema, opset, shapes, ...

A lazy import may keep Numba out of ``import graph_api``; it may not hide a cycle.
"""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: the bottom layer: types, tables and helpers that know nothing of graphs being run
CORE = {f"graph_api.{m}" for m in (
    "dtypes enums errors logical_tensor op schema opset shapes config fpmath postops infer "
    "dot_algorithm indexing_maps check tensor engine memory partition_cache opset_doc "
    "composite composite_library sparse_encoding sparse_storage sparse_tensor sparse_ops constant_cache "
    "working_memory").split()}
#: the top layer: what runs graphs and partitions, and the command line
RUNTIME = {f"graph_api.{m}" for m in (
    "graph partition runner builder cli batch batch_pool json_io rewrite fill composite_inline "
    "backend __main__ dump").split()}
#: the one runtime module that reaches kernels and patterns
SEAM = "graph_api.backend"
#: known upward imports, each a function-local import of the Graph class (a
#: composite's decomposition is checked, and its native form partitioned, as a
#: graph); the test fails on any other
KNOWN = {
    ("graph_api.composite", "graph_api.graph"),
    ("graph_api.backend", "graph_api.graph"),
    ("graph_api.json_io", "graph_api.graph"),
    ("graph_api.graph", "graph_api.partition"),
}


def _module_files():
    for folder, package in (("graph_api", "graph_api"), ("kernels", "graph_api.kernels"),
                            ("patterns", "graph_api.patterns")):
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package,) + parts)
            yield (name[: -len(".__init__")] if name.endswith(".__init__") else name), path


MODULES = dict(_module_files())


def _imports(name: str, path: Path):
    """(imported module, line, function-local?) for every import of a graph_api module."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for target in targets:
            if target.startswith("graph_api"):
                yield target, node.lineno, id(node) not in top


def _layer(module: str) -> str:
    if module in CORE:
        return "core"
    if module in RUNTIME:
        return "runtime"
    if module.startswith("graph_api.kernels"):
        return "kernels"
    if module.startswith("graph_api.patterns"):
        return "patterns"
    if module.startswith("graph_api.frontend"):
        return "frontend"
    return "package"  # graph_api/__init__.py: the public facade


#: layer -> layers it may import
ALLOWED = {
    "core": {"core"},
    "patterns": {"core", "patterns"},
    "kernels": {"core", "kernels", "patterns"},
    "runtime": {"core", "runtime"},
    "frontend": {"core", "runtime", "frontend", "package"},
    "package": {"core", "runtime", "package", "frontend"},
}


def test_every_module_has_a_layer():
    unplaced = [m for m in MODULES if m.startswith("graph_api.") and m.count(".") == 1
                and _layer(m) == "package"]
    assert unplaced == [], f"place these modules in CORE or RUNTIME: {unplaced}"


def test_imports_go_one_way():
    wrong = []
    for name, path in MODULES.items():
        for target, line, _ in _imports(name, path):
            if target == "graph_api" or (name, target) in KNOWN:
                continue
            allowed = ALLOWED[_layer(name)] | ({"kernels", "patterns"} if name == SEAM else set())
            if _layer(target) not in allowed:
                wrong.append(f"{path.relative_to(ROOT)}:{line} ({_layer(name)}) imports {target} ({_layer(target)})")
    assert wrong == [], "\n".join(wrong)


def test_the_known_upward_imports_still_exist():
    """The exception list shrinks when an exception goes away."""
    found = {(name, target) for name, path in MODULES.items() for target, _, _ in _imports(name, path)}
    assert KNOWN | MUTUAL <= found, (KNOWN | MUTUAL) - found


#: mutual dependencies inside one layer, each broken by one function-local import:
#: opset's table holds the Composite row / a composite verifies its ops against the
#: table; the shipped decompositions are built from composite's classes / composite
#: loads them on first lookup; the CLI runs batch files / a batch case runs through
#: the CLI's execute
MUTUAL = {
    ("graph_api.composite", "graph_api.opset"),
    ("graph_api.composite", "graph_api.composite_library"),
    ("graph_api.batch", "graph_api.cli"),
    # a Tensor over a sparse logical tensor is a SparseTensor, a subclass of Tensor
    ("graph_api.tensor", "graph_api.sparse_tensor"),
}


def test_function_local_imports_only_keep_numba_out_of_import_graph_api():
    """A lazy import in the runtime, core and pattern layers must be a known upward
    reference or one side of a known mutual dependency (no cycle hidden).  The
    kernels' lazy imports keep Numba out of ``import graph_api``: the registry
    imports a plan module, and a plan module its Numba kernels, only when used."""
    local = sorted(f"{path.relative_to(ROOT)}:{line} imports {target}"
                   for name, path in MODULES.items() if _layer(name) in ("runtime", "core", "package", "patterns")
                   for target, line, is_local in _imports(name, path)
                   if is_local and (name, target) not in KNOWN | MUTUAL
                   # the facade's front-door entry points (ga.from_onnx, ...) load their module,
                   # and with it the framework, only when called
                   and not (_layer(name) == "package" and _layer(target) == "frontend"))
    assert local == [], "\n".join(local)


def test_import_graph_api_loads_no_numba():
    code = "import sys, graph_api; print('numba' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.stdout.strip() == "False", done.stderr

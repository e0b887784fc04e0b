"""The install layout: pyproject maps kernels/ and patterns/ under the graph_api namespace.

A `pip install .` must add `graph_api` as its only top-level import name, so pyproject lists the
packages by hand (setuptools' package-dir); this test keeps that list equal to the folders of the
repository, and checks that a source tree never imports the layers under a second name.
"""
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _packages_in_tree():
    """Dotted install names of every folder with an __init__.py, as package-dir maps them."""
    found = set()
    for top, name in (("graph_api", "graph_api"), ("kernels", "graph_api.kernels"),
                      ("patterns", "graph_api.patterns")):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top)
            found.add(".".join([name, *rel.parts]))
    return found


def test_pyproject_lists_every_package_folder_under_the_graph_api_namespace():
    setuptools = _pyproject()
    assert set(setuptools["packages"]) == _packages_in_tree()
    assert setuptools["package-dir"] == {"graph_api": "graph_api", "graph_api.kernels": "kernels",
                                         "graph_api.patterns": "patterns"}


def test_a_source_tree_imports_the_layers_only_under_graph_api():
    code = ("import sys, graph_api, graph_api.kernels.registry, graph_api.patterns.library;"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'kernels', 'patterns'}));"
            "print(graph_api.kernels.__file__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0] == "[]"
    assert Path(out[1]).resolve() == ROOT / "kernels" / "__init__.py"


def test_no_module_imports_kernels_or_patterns_as_top_level_names():
    offenders = []
    for folder in ("graph_api", "kernels", "patterns", "samples", "benchmarks", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                words = line.split()
                if len(words) >= 2 and words[0] in ("import", "from") and \
                        words[1].split(".")[0] in ("kernels", "patterns"):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []

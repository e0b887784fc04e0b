"""Every fast kernel is registered with the pattern object it serves, and every
role its builder reads from the match bindings is a node of that pattern.

The builders run on every canonical graph of the pattern library (the graphs
tests/patterns checks are one fused partition each), with bindings that record
the roles read.  Compiling skips the warm-up run: only the builders matter here.
"""
import pytest

import graph_api as ga
from graph_api import backend
from graph_api.kernels import registry
from graph_api.patterns.library import PATTERNS
from graph_api.patterns.pattern import Group, Pattern
from tests.patterns.test_cnn_patterns import CNN_CANONICAL
from tests.patterns.test_library import CANONICAL


class RecordingBindings(dict):
    """The match bindings, remembering every role a builder asks for."""

    def __init__(self, bindings, read: set):
        super().__init__(bindings)
        self.read = read

    def __getitem__(self, role):
        self.read.add(role)
        return super().__getitem__(role)

    def get(self, role, default=None):
        self.read.add(role)
        return super().get(role, default)

    def __contains__(self, role):
        self.read.add(role)
        return super().__contains__(role)


def test_every_registered_kernel_names_a_library_pattern_object():
    for key in registry.KERNELS:
        if key == registry.DOT_KEY:  # MatMul algorithms / maps of any pattern, asked first
            continue
        assert isinstance(key[0], (Pattern, Group)) and any(key[0] is p for p in PATTERNS), key


@pytest.fixture(scope="module")
def roles_read():
    """pattern name -> roles its builders read over every canonical graph."""
    read: dict[str, set] = {}
    patch = pytest.MonkeyPatch()

    def recording(pattern, builder):
        def build(request):
            request.bindings = RecordingBindings(request.bindings, read.setdefault(pattern.name, set()))
            return builder(request)
        return build

    for key, builder in list(registry.KERNELS.items()):
        if key != registry.DOT_KEY:
            patch.setitem(registry.KERNELS, key, recording(key[0], builder))
    patch.setattr(backend, "_run_on_placeholders", lambda plan, request: None)
    try:
        for _, _, factory in CANONICAL + CNN_CANONICAL:
            graph = factory()
            for part in graph.get_partitions():
                part.compile(part.get_input_ports(), part.get_output_ports(), ga.Engine())
    finally:
        patch.undo()
    return read


def test_every_role_a_builder_reads_is_a_node_of_its_pattern(roles_read):
    """A builder serving several patterns (the SDPA builder: plain, compressed and
    GQA forms) may ask for the optional roles of its sibling patterns: the reads
    must be nodes of the patterns registered with that builder, so a misspelt
    role (which would read None forever) fails here."""
    served = {key[0].name: (key[0], builder) for key, builder in registry.KERNELS.items()
              if key != registry.DOT_KEY}
    assert set(roles_read) == set(served), "a registered pattern's builder never ran on a canonical graph"
    for name, roles in roles_read.items():
        builder = served[name][1]
        # a Group's bindings are its template name and the experts' own bindings
        nodes = {node.name for pattern, other in served.values() if other is builder
                 for node in getattr(pattern, "nodes", ())} | \
            ({"template", "experts"} if isinstance(served[name][0], Group) else set())
        assert roles <= nodes, f"{name}: the builder reads {sorted(roles - nodes)}, not nodes of its patterns"

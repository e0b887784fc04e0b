"""Engine and stream: the CPU only; both exist to mirror oneDNN's calls."""
from __future__ import annotations

from .enums import EngineKind, parse_enum
from .errors import InvalidArguments


class Engine:
    """A CPU engine (``dnnl::engine``)."""

    def __init__(self, kind=EngineKind.cpu, index: int = 0):
        self.kind = parse_enum(EngineKind, kind, "engine kind")
        if self.kind != EngineKind.cpu:
            raise InvalidArguments(f"engine kind {self.kind.name} is not available; this runtime has cpu only")
        if index != 0:
            raise InvalidArguments(f"cpu engine index {index} does not exist; only 0")
        self.index = index

    def get_kind(self) -> EngineKind:
        return self.kind

    def __repr__(self) -> str:
        return f"Engine({self.kind.name}, {self.index})"


class Stream:
    """An in-order stream; execution is synchronous, so ``wait`` returns at once."""

    def __init__(self, engine: Engine):
        if not isinstance(engine, Engine):
            raise InvalidArguments(f"Stream needs an Engine, got {type(engine).__name__}")
        self.engine = engine

    def get_engine(self) -> Engine:
        return self.engine

    def wait(self) -> None:
        return None

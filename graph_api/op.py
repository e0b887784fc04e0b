"""``Op``: one operation of the graph (kind, ordered inputs/outputs, attrs)."""
from __future__ import annotations

from typing import Iterable

from .enums import OpAttr, OpKind, parse_enum
from .errors import InvalidArguments
from .logical_tensor import LogicalTensor


class Op:
    """An op as oneDNN's ``dnnl::graph::op``.

    Both of oneDNN's constructors, Python-spelled: ``Op(id, kind, "name")`` and
    ``Op(id, kind, inputs, outputs, "name")`` (a string where the inputs would
    be is the name), plus keywords (``name=``, ``attrs=``).

    Attribute values are plain Python: bool, int, float, str, list[int],
    list[float].  Defaults from the schema are written in by ``Graph.add_op``.
    """

    def __init__(self, id: int, kind, inputs: Iterable[LogicalTensor] | str = (),
                 outputs: Iterable[LogicalTensor] = (), name: str = "", attrs: dict | None = None):
        if not isinstance(id, int) or isinstance(id, bool) or id < 0:
            raise InvalidArguments(f"op id must be a non-negative int, got {id!r}")
        if isinstance(inputs, str):  # op(id, kind, name)
            if outputs or name:
                raise InvalidArguments(f"op {id}: Op(id, kind, name) takes no inputs/outputs after the name")
            inputs, name = (), inputs
        if not isinstance(name, str):
            raise InvalidArguments(f"op {id}: the name must be a string, got {type(name).__name__}")
        if isinstance(inputs, LogicalTensor) or isinstance(outputs, LogicalTensor):
            raise InvalidArguments(f"op {id}: inputs and outputs are lists of LogicalTensors")
        self.id = id
        self.kind = parse_enum(OpKind, kind, "op kind")
        self.name = name or f"{self.kind.name}_{id}"
        self.inputs: list[LogicalTensor] = []
        self.outputs: list[LogicalTensor] = []
        self.attrs: dict = {}
        for lt in inputs:
            self.add_input(lt)
        for lt in outputs:
            self.add_output(lt)
        for key, value in (attrs or {}).items():
            self.set_attr(key, value)

    def set_attr(self, name, value) -> "Op":
        """``name``: the attribute's name or its :class:`~graph_api.enums.OpAttr`."""
        if isinstance(name, OpAttr):
            name = name.name
        if not isinstance(name, str) or not name:
            raise InvalidArguments(f"op {self.id}: attribute name must be a non-empty string")
        if isinstance(value, tuple):
            value = list(value)
        if isinstance(value, str) and not value:
            raise InvalidArguments(f"op {self.id}: attribute {name!r} is an empty string")
        self.attrs[name] = value
        return self

    def get_attr(self, name: str, default=None):
        return self.attrs.get(name, default)

    def _check_lt(self, lt):
        if not isinstance(lt, LogicalTensor):
            raise InvalidArguments(f"op {self.id}: expected a LogicalTensor, got {type(lt).__name__}")
        return lt

    def add_input(self, lt: LogicalTensor) -> "Op":
        self.inputs.append(self._check_lt(lt))
        return self

    def add_inputs(self, lts) -> "Op":
        for lt in lts:
            self.add_input(lt)
        return self

    def add_output(self, lt: LogicalTensor) -> "Op":
        self.outputs.append(self._check_lt(lt))
        return self

    def add_outputs(self, lts) -> "Op":
        for lt in lts:
            self.add_output(lt)
        return self

    def get_id(self) -> int:
        return self.id

    def get_kind(self) -> OpKind:
        return self.kind

    def copy(self) -> "Op":
        return Op(self.id, self.kind, list(self.inputs), list(self.outputs), self.name,
                  {k: (list(v) if isinstance(v, list) else v) for k, v in self.attrs.items()})

    def __repr__(self) -> str:
        attrs = ", ".join(f"{k}={v}" for k, v in sorted(self.attrs.items()))
        ins = ", ".join(map(repr, self.inputs))
        outs = ", ".join(map(repr, self.outputs))
        return f"{outs} = {self.kind.name}#{self.id}({ins}{'; ' + attrs if attrs else ''})"

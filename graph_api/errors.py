"""One error hierarchy mirroring oneDNN's status codes.

Every error carries a :class:`Status` so callers that think in oneDNN terms can
switch on ``err.status``; Python callers can catch the builtin base classes
(``ValueError`` for invalid arguments, ``TypeError`` for data types, ...).
"""
from __future__ import annotations

import enum


class Status(enum.IntEnum):
    """oneDNN ``dnnl_status_t`` values."""

    success = 0
    out_of_memory = 1
    invalid_arguments = 2
    unimplemented = 3
    last_impl_reached = 4
    runtime_error = 5
    not_required = 6
    invalid_graph = 7
    invalid_graph_op = 8
    invalid_shape = 9
    invalid_data_type = 10


class GraphError(Exception):
    """Base class of every error raised by graph_api."""

    status: Status = Status.runtime_error

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"[{self.status.name}] {self.message}"


class InvalidArguments(GraphError, ValueError):
    status = Status.invalid_arguments


class Unimplemented(GraphError, NotImplementedError):
    status = Status.unimplemented


class InvalidGraph(GraphError, ValueError):
    status = Status.invalid_graph


class InvalidGraphOp(GraphError, ValueError):
    status = Status.invalid_graph_op


class InvalidShape(GraphError, ValueError):
    status = Status.invalid_shape


class InvalidDataType(GraphError, TypeError):
    status = Status.invalid_data_type


class OutOfMemory(GraphError, MemoryError):
    status = Status.out_of_memory


class ExecutionError(GraphError, RuntimeError):
    status = Status.runtime_error


def op_label(op) -> str:
    """'op 3 (MatMul "qk")' — how every message names an op."""
    name = f' "{op.name}"' if getattr(op, "name", "") else ""
    return f"op {op.id} ({op.kind.name}{name})"

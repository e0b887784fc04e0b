"""Sparse tensor encodings (StableHLO sparsity RFC, seed 003): levels over dimension variables.

An encoding maps the dimensions of the logical tensor to the *levels* of its
storage.  Each level has a level expression (a dimension variable, ``d floordiv b``
or ``d mod b``), a format and two properties::

    (i, j) -> (i : dense, j : compressed)                              CSR
    (i, j) -> (j : dense, i : compressed)                              CSC
    (i, j) -> (i : compressed(nonunique), j : singleton)               COO
    (i, j) -> (i floordiv 4 : dense, j floordiv 4 : compressed,
               i mod 4 : dense, j mod 4 : dense)                       BCSR 4x4
    (i, j) -> (i : dense, j floordiv 4 : dense, j mod 4 : compressed(2:4))   2:4

Formats: ``dense`` (every coordinate of the level is stored), ``compressed``
(positions + coordinates per parent), ``singleton`` (one coordinate per parent,
after a non-unique level), ``compressed(n:m)`` (exactly n stored coordinates in
every block of m; the block is the level's ``d mod m`` expression).  Properties
``unique``/``nonunique`` and ``ordered``/``nonordered`` (defaults unique, ordered)
are written in parentheses: ``compressed(nonunique, nonordered)``.

Rules (violations raise :class:`~graph_api.errors.InvalidArguments` naming the level):
dense and n:m levels are unique and ordered; a singleton level follows a
non-unique compressed or singleton level, and a level after a non-unique level
is a singleton; an n:m level is the last level, after dense levels only, with
expression ``d mod m``; every dimension appears either once as a variable or
once as ``floordiv b`` followed later by ``mod b``.

The encoding is immutable and hashable: it takes part in logical tensor equality.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InvalidArguments

DENSE, COMPRESSED, SINGLETON, STRUCTURED = "dense", "compressed", "singleton", "structured"
#: expression operators: the variable itself, its block index, its index inside the block
VAR, FLOORDIV, MOD = "", "floordiv", "mod"


@dataclass(frozen=True)
class Level:
    """One storage level: ``dim`` (index of the dimension variable), ``op`` with
    ``block`` (VAR, or FLOORDIV/MOD by ``block``), the format and properties;
    ``n``:``m`` for STRUCTURED levels."""

    dim: int
    format: str
    op: str = VAR
    block: int = 1
    unique: bool = True
    ordered: bool = True
    n: int = 0
    m: int = 0

    def size(self, dim_size: int) -> int:
        """Number of coordinates of this level for a dimension of ``dim_size``."""
        if self.op == FLOORDIV:
            return dim_size // self.block
        if self.op == MOD:
            return self.block
        return dim_size

    def format_text(self) -> str:
        props = [p for p, on in (("nonunique", not self.unique), ("nonordered", not self.ordered)) if on]
        if self.format == STRUCTURED:
            return f"compressed({self.n}:{self.m})"
        return f"{self.format}({', '.join(props)})" if props else self.format


@dataclass(frozen=True)
class SparseEncoding:
    """Dimension names and levels; see the module docstring."""

    dims: tuple[str, ...]
    levels: tuple[Level, ...]
    name: str = ""  # the preset it came from, for messages only (not compared)

    def __post_init__(self):
        object.__setattr__(self, "dims", tuple(self.dims))
        object.__setattr__(self, "levels", tuple(self.levels))
        _validate(self)

    def __eq__(self, other) -> bool:
        return isinstance(other, SparseEncoding) and (self.dims, self.levels) == (other.dims, other.levels)

    def __hash__(self) -> int:
        return hash((self.dims, self.levels))

    # ------------------------------------------------------------ notation
    def __str__(self) -> str:
        return to_text(self)

    def __repr__(self) -> str:
        return f"#{self.name}" if self.name else f"<{to_text(self)}>"

    @property
    def rank(self) -> int:
        return len(self.dims)

    def level_sizes(self, shape) -> tuple[int, ...]:
        return tuple(lv.size(shape[lv.dim]) for lv in self.levels)

    def check_shape(self, shape, what: str) -> None:
        """The encoding fits a tensor of this (known or partly known) shape."""
        if shape is None:
            return
        if len(shape) != self.rank:
            raise InvalidArguments(f"{what}: encoding {self} has {self.rank} dimensions, the shape "
                                   f"{list(shape)} has {len(shape)}")
        for lv in self.levels:
            d = shape[lv.dim]
            if lv.op == FLOORDIV and d >= 0 and d % lv.block:
                raise InvalidArguments(
                    f"{what}: dimension {self.dims[lv.dim]} of size {d} is not a multiple of the "
                    f"block {lv.block} of encoding {self}")

    def dim_order(self) -> tuple[int, ...]:
        """Dimensions in the order their outermost level stores them."""
        order = []
        for lv in self.levels:
            if lv.dim not in order:
                order.append(lv.dim)
        return tuple(order)

    def to_json(self) -> str:
        """The JSON extension field's value: the notation text."""
        return to_text(self)


def _validate(enc: SparseEncoding) -> None:
    if not enc.dims or len(set(enc.dims)) != len(enc.dims):
        raise InvalidArguments(f"sparse encoding: dimension names {list(enc.dims)} must be distinct and non-empty")
    if not enc.levels:
        raise InvalidArguments("sparse encoding: at least one level is needed")
    seen: dict[int, list[Level]] = {}
    for i, lv in enumerate(enc.levels):
        where = f"sparse encoding {to_text(enc)}: level {i}"
        if lv.format not in (DENSE, COMPRESSED, SINGLETON, STRUCTURED):
            raise InvalidArguments(f"{where}: unknown format {lv.format!r}")
        if not 0 <= lv.dim < len(enc.dims):
            raise InvalidArguments(f"{where}: dimension index {lv.dim} out of range")
        if lv.op not in (VAR, FLOORDIV, MOD) or lv.block < 1 or (lv.op == VAR and lv.block != 1):
            raise InvalidArguments(f"{where}: expression {lv.op} {lv.block} is not a variable, "
                                   f"'floordiv b' or 'mod b' with b >= 1")
        if lv.format in (DENSE, STRUCTURED) and not (lv.unique and lv.ordered):
            raise InvalidArguments(f"{where}: a {lv.format} level is always unique and ordered")
        prev = enc.levels[i - 1] if i else None
        if lv.format == SINGLETON and (prev is None or prev.format not in (COMPRESSED, SINGLETON)
                                       or prev.unique):
            raise InvalidArguments(f"{where}: a singleton level must follow a non-unique "
                                   f"compressed or singleton level")
        if prev is not None and not prev.unique and lv.format != SINGLETON:
            raise InvalidArguments(f"{where}: the level after a non-unique level must be a singleton")
        if lv.format == STRUCTURED:
            if not 0 < lv.n <= lv.m or lv.m > 256:
                raise InvalidArguments(f"{where}: n:m structure {lv.n}:{lv.m} needs 0 < n <= m <= 256")
            if lv.op != MOD or lv.block != lv.m:
                raise InvalidArguments(f"{where}: compressed({lv.n}:{lv.m}) needs the expression "
                                       f"'{enc.dims[lv.dim]} mod {lv.m}' (a block of {lv.m})")
            if i != len(enc.levels) - 1 or any(p.format != DENSE for p in enc.levels[:i]):
                raise InvalidArguments(f"{where}: compressed({lv.n}:{lv.m}) must be the last level, "
                                       f"after dense levels only")
        seen.setdefault(lv.dim, []).append(lv)
    for d, name in enumerate(enc.dims):
        uses = seen.get(d, [])
        ops = [(lv.op, lv.block) for lv in uses]
        ok = ops == [(VAR, 1)] or (len(ops) == 2 and ops[0][0] == FLOORDIV and ops[1][0] == MOD
                                   and ops[0][1] == ops[1][1])
        if not ok:
            raise InvalidArguments(
                f"sparse encoding {to_text(enc)}: dimension {name} must appear once as '{name}' or as "
                f"'{name} floordiv b' then '{name} mod b'; it appears as "
                f"{[_expr_text(enc.dims, lv) for lv in uses] or 'nothing'}")


# ---------------------------------------------------------------- text form
def _expr_text(dims, lv: Level) -> str:
    return dims[lv.dim] if lv.op == VAR else f"{dims[lv.dim]} {lv.op} {lv.block}"


def to_text(enc: SparseEncoding) -> str:
    """``(i, j) -> (i : dense, j : compressed)``"""
    levels = ", ".join(f"{_expr_text(enc.dims, lv)} : {lv.format_text()}" for lv in enc.levels)
    return f"({', '.join(enc.dims)}) -> ({levels})"


_WRAPPER = re.compile(r"^\s*#?\s*(sparse_tensor\.encoding\s*<(?P<body>.*)>)\s*$", re.S)
_TOP = re.compile(r"^\s*\((?P<dims>[^()]*)\)\s*->\s*\((?P<levels>.*)\)\s*$", re.S)
_EXPR = re.compile(r"^(?P<var>[A-Za-z_]\w*)(?:\s+(?P<op>floordiv|mod)\s+(?P<b>\d+))?$")
_FORMAT = re.compile(r"^(?P<fmt>dense|compressed|singleton)(?:\s*\((?P<args>[^()]*)\))?$")
_NM = re.compile(r"^(?P<n>\d+)\s*:\s*(?P<m>\d+)$")


def _split_levels(text: str) -> list[str]:
    """Split at commas outside parentheses."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        depth += (ch == "(") - (ch == ")")
        cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _parse_level(dims, item: str, text: str) -> Level:
    if ":" not in item:
        raise InvalidArguments(f"sparse encoding {text!r}: level {item!r} needs 'expression : format'")
    expr, fmt = item.split(":", 1)
    e = _EXPR.match(expr.strip())
    if e is None or e["var"] not in dims:
        raise InvalidArguments(f"sparse encoding {text!r}: level expression {expr.strip()!r} is not "
                               f"one of {list(dims)}, 'd floordiv b' or 'd mod b'")
    f = _FORMAT.match(fmt.strip())
    if f is None:
        raise InvalidArguments(f"sparse encoding {text!r}: level format {fmt.strip()!r} is not "
                               f"dense, compressed, singleton or compressed(n:m)")
    op, block = (e["op"] or VAR), int(e["b"] or 1)
    fields = dict(dim=dims.index(e["var"]), format=f["fmt"], op=op, block=block)
    args = [a.strip() for a in (f["args"] or "").split(",") if a.strip()]
    props = {"unique": True, "ordered": True}
    for arg in args:
        nm = _NM.match(arg)
        if nm and f["fmt"] == COMPRESSED and len(args) == 1:
            fields.update(format=STRUCTURED, n=int(nm["n"]), m=int(nm["m"]))
        elif arg in ("unique", "nonunique", "ordered", "nonordered"):
            props["unique" if arg.endswith("unique") else "ordered"] = not arg.startswith("non")
        else:
            raise InvalidArguments(f"sparse encoding {text!r}: unknown level property {arg!r} "
                                   f"(unique, nonunique, ordered, nonordered, or n:m for compressed)")
    return Level(**fields, **props)


def parse(text: str) -> SparseEncoding:
    """An encoding from the notation (``#sparse_tensor.encoding<...>`` wrapper optional)
    or a preset name (``CSR``, ``BCSR4x4``, ``2:4``)."""
    if not isinstance(text, str):
        raise InvalidArguments(f"sparse encoding: expected a string, got {type(text).__name__}")
    w = _WRAPPER.match(text)
    body = w["body"] if w else text
    top = _TOP.match(body)
    if top is None:
        preset = PRESETS.get(text.strip().upper().replace("_", ""))
        if preset is not None:
            return preset()
        m = re.fullmatch(r"BCSR(\d+)X(\d+)", text.strip().upper())
        if m:
            return bcsr(int(m[1]), int(m[2]))
        raise InvalidArguments(f"sparse encoding {text!r}: expected '(dims) -> (levels)' or a preset "
                               f"({', '.join(sorted(PRESETS))}, BCSR<r>x<c>)")
    dims = tuple(d.strip() for d in top["dims"].split(",") if d.strip())
    levels = tuple(_parse_level(dims, item, text) for item in _split_levels(top["levels"]))
    return SparseEncoding(dims, levels)


def read(value) -> SparseEncoding | None:
    """What ``LogicalTensor(sparse_encoding=...)`` accepts: None, an encoding, notation or a preset name."""
    if value is None or isinstance(value, SparseEncoding):
        return value
    return parse(value)


# ---------------------------------------------------------------- presets
_IJ = ("i", "j")


def csr(batch: int = 0) -> SparseEncoding:
    """Compressed rows; ``batch`` leading dense batch dimensions."""
    dims = tuple(f"b{k}" for k in range(batch)) + _IJ
    lv = [Level(k, DENSE) for k in range(batch)] + [Level(batch, DENSE), Level(batch + 1, COMPRESSED)]
    return SparseEncoding(dims, lv, "CSR")


def csc() -> SparseEncoding:
    return SparseEncoding(_IJ, (Level(1, DENSE), Level(0, COMPRESSED)), "CSC")


def coo() -> SparseEncoding:
    return SparseEncoding(_IJ, (Level(0, COMPRESSED, unique=False), Level(1, SINGLETON)), "COO")


def dcsr() -> SparseEncoding:
    return SparseEncoding(_IJ, (Level(0, COMPRESSED), Level(1, COMPRESSED)), "DCSR")


def bcsr(br: int, bc: int) -> SparseEncoding:
    """Block CSR with ``br x bc`` dense blocks (block rows dense, block columns compressed)."""
    return SparseEncoding(_IJ, (Level(0, DENSE, FLOORDIV, br), Level(1, COMPRESSED, FLOORDIV, bc),
                                Level(0, DENSE, MOD, br), Level(1, DENSE, MOD, bc)), f"BCSR{br}x{bc}")


def nm(n: int = 2, m: int = 4) -> SparseEncoding:
    """n:m structured sparsity on 1 x m blocks along the last dimension (2:4 by default)."""
    return SparseEncoding(_IJ, (Level(0, DENSE), Level(1, DENSE, FLOORDIV, m),
                                Level(1, STRUCTURED, MOD, m, n=n, m=m)), f"{n}:{m}")


PRESETS = {"CSR": csr, "CSC": csc, "COO": coo, "DCSR": dcsr, "2:4": nm}


# ---------------------------------------------------------------- shapes of storage
def kind(enc: SparseEncoding) -> str:
    """The fast-kernel family of a 2-D encoding: 'csr', 'csc', 'bcsr', 'nm' or 'other'."""
    lv = enc.levels
    plain = lambda x, d, f: x.dim == d and x.op == VAR and x.format == f and x.unique and x.ordered
    if enc.rank == 2 and len(lv) == 2 and plain(lv[0], 0, DENSE) and plain(lv[1], 1, COMPRESSED):
        return "csr"
    if enc.rank == 2 and len(lv) == 2 and plain(lv[0], 1, DENSE) and plain(lv[1], 0, COMPRESSED):
        return "csc"
    if enc.rank == 2 and len(lv) == 4 and [(x.dim, x.op, x.format) for x in lv] == [
            (0, FLOORDIV, DENSE), (1, FLOORDIV, COMPRESSED), (0, MOD, DENSE), (1, MOD, DENSE)] \
            and lv[1].unique and lv[1].ordered:
        return "bcsr"
    if enc.rank == 2 and len(lv) == 3 and [(x.dim, x.op, x.format) for x in lv] == [
            (0, VAR, DENSE), (1, FLOORDIV, DENSE), (1, MOD, STRUCTURED)]:
        return "nm"
    return "other"

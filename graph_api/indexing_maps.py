"""MatMul / BatchReduceMatMul ``indexing_maps`` (linalg matmul with affine maps, seed 001).

Three affine maps, for A, B and C, over one loop domain::

    (d0, d1, d2) -> (d0, d2)            # matmul: d0 = m, d1 = n, d2 = k
    (dB, d0, d1, d2) -> (dB, d0, d2)    # batch: dB = the batch dim

The loop dims are positional (any names may be written; this module writes
``dB, d0, d1, d2``).  Each map lists which loop dims index its operand, in
the operand's dim order, so a map is a transpose or a broadcast of the
default one: ``C[c-dims] = sum over the dims not in C of A[a-dims] * B[b-dims]``
(the einsum of the three maps, as ``linalg.generic``).  Defaults
(no attribute)::

    MatMul             (m, k) x (k, n) -> (m, n); with a batch dim (b, m, k) x (b, k, n) -> (b, m, n)
    BatchReduceMatMul  (b, m, k) x (b, k, n) -> (m, n)   (summed over the batch)

Rules (each error names its rule): :data:`RULES`.  A broadcast operand lacks
the broadcast dim (a ``B x N`` tensor for ``(dB, d1)``); a size-1 dim does not
broadcast when maps are given.  Maps equal to the default are dropped at
``add_op`` so a graph says the same thing one way.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .errors import InvalidGraphOp, op_label

BATCH, M, N, K = "b", "m", "n", "k"
#: loop dims of the two domains, and how maps spell them
DOMAINS = {3: (M, N, K), 4: (BATCH, M, N, K)}
SPELLING = {M: "d0", N: "d1", K: "d2", BATCH: "dB"}

RULES = {
    "count": "three maps (A, B, C)",
    "syntax": "affine map syntax '(d0, d1, d2) -> (d0, d2)'",
    "projected": "results are distinct loop dims (a projected permutation)",
    "domain": "the three maps share one loop domain",
    "domain_size": "3 loop dims (m, n, k) or 4 (batch, m, n, k); BatchReduceMatMul has 4",
    "batch_first": "the batch dim stays the batch dim (first; transposes only move matmul dims)",
    "matrix": "an operand map has one or two of the matmul dims m, n, k",
    "read": "every loop dim appears in a map (a dim only C has is sized by C's shape)",
    "brgemm_c": "BatchReduceMatMul's C has no batch dim (no batch broadcast of C)",
    "flags": "maps replace transpose_a/transpose_b (both must be false)",
    "rank": "operand rank matches its map",
    "sizes": "a loop dim has one size in every operand",
}

_MAP_RE = re.compile(r"^\s*(?:affine_map\s*<)?\s*\(([^()]*)\)\s*->\s*\(([^()]*)\)\s*>?\s*$")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Maps:
    """Three maps as tuples of loop-dim letters (b, m, n, k) over one domain."""

    a: tuple
    b: tuple
    c: tuple
    batched: bool

    @property
    def domain(self) -> tuple:
        return DOMAINS[4 if self.batched else 3]

    def operands(self) -> tuple:
        return self.a, self.b, self.c

    def strings(self) -> list[str]:
        return [format_map(self.domain, m) for m in self.operands()]



def make(a, b, c, batched: bool) -> Maps:
    return Maps(tuple(a), tuple(b), tuple(c), batched)


def default(kind_name: str, batched: bool) -> Maps:
    if kind_name == "BatchReduceMatMul":
        return make("bmk", "bkn", "mn", True)
    return make("bmk", "bkn", "bmn", True) if batched else make("mk", "kn", "mn", False)


def from_flags(batched: bool, transpose_a: bool, transpose_b: bool) -> Maps:
    """The maps ``transpose_a``/``transpose_b`` mean (for matrix or batch operands)."""
    lead = (BATCH,) if batched else ()
    a = lead + ((K, M) if transpose_a else (M, K))
    b = lead + ((N, K) if transpose_b else (K, N))
    return make(a, b, lead + (M, N), batched)


def format_map(domain, results) -> str:
    names = ", ".join(SPELLING[d] for d in domain)
    return f"({names}) -> ({', '.join(SPELLING[d] for d in results)})"


# ------------------------------------------------------------------ parsing
def _broken(op, rule: str, detail: str) -> InvalidGraphOp:
    return InvalidGraphOp(f"{op_label(op)}: indexing_maps break rule '{rule}' "
                          f"({RULES[rule]}): {detail}")


def _parse_one(op, text, which: str):
    """(loop dim names, result names) of one map string."""
    match = _MAP_RE.match(text) if isinstance(text, str) else None
    if not match:
        raise _broken(op, "syntax", f"map of {which} is {text!r}")
    dims = [d.strip() for d in match.group(1).split(",") if d.strip()]
    results = [r.strip() for r in match.group(2).split(",") if r.strip()]
    if any(not _NAME_RE.match(d) for d in dims) or len(set(dims)) != len(dims):
        raise _broken(op, "syntax", f"map of {which} {text!r}: loop dims must be distinct names")
    for r in results:
        if r not in dims:
            raise _broken(op, "projected", f"map of {which} {text!r} has result {r!r}, "
                                           f"not one of its loop dims {dims}")
    if len(set(results)) != len(results):
        raise _broken(op, "projected", f"map of {which} {text!r} repeats a loop dim")
    return dims, results


def parse(op, value) -> Maps:
    """Maps from the attribute value (three strings), checking the rules that
    need no shapes; ``InvalidGraphOp`` naming the rule otherwise."""
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise _broken(op, "count", f"got {value!r}")
    parsed = [_parse_one(op, text, which) for text, which in zip(value, "ABC")]
    dims = parsed[0][0]
    for (other, _), which in zip(parsed[1:], "BC"):
        if len(other) != len(dims):
            raise _broken(op, "domain", f"A's map has {len(dims)} loop dims, {which}'s has {len(other)}")
    if len(dims) not in DOMAINS or (op.kind.name == "BatchReduceMatMul" and len(dims) != 4):
        raise _broken(op, "domain_size", f"got {len(dims)} loop dims {dims}")
    # loop dims are positional: rename every map's names to the domain letters
    domain = DOMAINS[len(dims)]
    letters = [tuple(domain[names.index(r)] for r in results) for names, results in parsed]
    maps = Maps(*letters, batched=len(dims) == 4)
    check_rules(op, maps)
    return maps


def check_rules(op, maps: Maps) -> None:
    """The shape-free rules on parsed maps."""
    for results, which in zip(maps.operands(), "ABC"):
        if BATCH in results and results[0] != BATCH:
            raise _broken(op, "batch_first", f"{which}'s map {format_map(maps.domain, results)}")
        matmul_dims = [d for d in results if d != BATCH]
        least = 0 if which == "C" else 1  # C may sum every matmul dim; A and B read one
        if not least <= len(matmul_dims) <= 2:
            raise _broken(op, "matrix", f"{which}'s map {format_map(maps.domain, results)}")
    unread = [SPELLING[d] for d in maps.domain if d not in maps.a + maps.b + maps.c]
    if unread:
        raise _broken(op, "read", f"loop dim(s) {unread} appear in no map")
    if op.kind.name == "BatchReduceMatMul" and BATCH in maps.c:
        raise _broken(op, "brgemm_c", f"C's map {format_map(maps.domain, maps.c)}")


def maps_of(op) -> Maps | None:
    """The op's explicit maps (attrs already verified), or None for the default."""
    value = op.attrs.get("indexing_maps")
    return None if value is None else parse(op, value)


def effective(op, ranks) -> Maps | None:
    """The maps an op computes with: explicit ones, else the default or the
    transpose flags' maps when the operand ranks fit one loop domain (rank 2
    and 2, or 3 and 3); None when they do not (1-D or numpy-broadcast batch)."""
    explicit = maps_of(op)
    if explicit is not None:
        return explicit
    if op.kind.name == "BatchReduceMatMul":
        return default("BatchReduceMatMul", True)
    if tuple(ranks) not in ((2, 2), (3, 3)):
        return None
    return from_flags(ranks[0] == 3, op.attrs.get("transpose_a", False),
                      op.attrs.get("transpose_b", False))


# ------------------------------------------------------------------ shapes
def loop_sizes(op, maps: Maps, a_shape, b_shape, c_shape=None) -> dict:
    """Loop dim -> size from A, B and (declared) C; ``InvalidGraphOp`` (rank,
    sizes) on a clash.  Unknown dims (-1) take another operand's size."""
    sizes: dict = {d: -1 for d in maps.domain}
    for shape, results, which in ((a_shape, maps.a, "A"), (b_shape, maps.b, "B"),
                                  (c_shape, maps.c, "C")):
        if shape is None:
            continue
        if len(shape) != len(results):
            raise _broken(op, "rank", f"{which} has shape {list(shape)} (rank {len(shape)}), "
                                      f"its map {format_map(maps.domain, results)} has {len(results)} results")
        for dim, size in zip(results, shape):
            seen = sizes[dim]
            if size != -1 and seen != -1 and size != seen:
                raise _broken(op, "sizes", f"{SPELLING[dim]} is {seen} in one operand and {size} in "
                                           f"{which} (A {_show(a_shape)}, B {_show(b_shape)}, C {_show(c_shape)})")
            if size != -1:
                sizes[dim] = size
    return sizes


def _show(shape) -> str:
    return "?" if shape is None else str(list(shape))


def output_shape(op, maps: Maps, a_shape, b_shape, c_shape=None):
    """C's shape (dims only C has come from its declared shape), or None when an
    input rank is unknown."""
    sizes = loop_sizes(op, maps, a_shape, b_shape, c_shape)
    if a_shape is None or b_shape is None:
        return None
    return tuple(sizes[d] for d in maps.c)


def c_only(maps: Maps) -> tuple:
    """C's loop dims that neither A nor B reads (C is broadcast along them)."""
    return tuple(d for d in maps.c if d not in maps.a + maps.b)


def summed_spec(maps: Maps) -> str:
    """einsum subscripts of the contraction without C's broadcast-only dims."""
    kept = "".join(d for d in maps.c if d not in c_only(maps))
    return f"{''.join(maps.a)},{''.join(maps.b)}->{kept}"


def broadcast_c(result, maps: Maps, c_shape):
    """``result`` (C's dims minus :func:`c_only`) broadcast to C's shape (a view)."""
    missing = tuple(i for i, d in enumerate(maps.c) if d in c_only(maps))
    if not missing:
        return result
    return np.broadcast_to(np.expand_dims(result, missing), tuple(c_shape))


def check_attr(op, value):
    """Validate ``indexing_maps`` at add_op; returns the canonical strings, or
    None when the maps are the default (the attribute is then dropped)."""
    maps = parse(op, value)
    if op.attrs.get("transpose_a") or op.attrs.get("transpose_b"):
        raise _broken(op, "flags", "transpose_a/transpose_b are set as well as indexing_maps")
    shapes = [lt.shape for lt in op.inputs[:2]]
    if len(shapes) == 2:
        loop_sizes(op, maps, *shapes, op.outputs[0].shape if op.outputs else None)
    if maps == default(op.kind.name, maps.batched):
        return None
    return maps.strings()


# ------------------------------------------------------------------ folding
def through_transpose(results: tuple, order) -> tuple | None:
    """The map of S when the operand is ``StaticTranspose(S, order)`` with map
    ``results`` (operand dim i is S dim order[i]); None if the ranks differ."""
    rank = len(results)
    if len(order) != rank:
        return None
    order = [o % rank for o in order]
    source = [None] * rank
    for i, o in enumerate(order):
        source[o] = results[i]
    return tuple(source)


def through_unit_reshape(results: tuple, src_shape, dst_shape) -> tuple | None:
    """The map of S when the operand is ``StaticReshape(S)`` that only inserts
    size-1 dims (dst is src with unit dims added); the inserted dims become
    broadcast dims (dropped from the map).  None for any other reshape."""
    if src_shape is None or dst_shape is None or -1 in src_shape or -1 in dst_shape:
        return None
    if len(dst_shape) != len(results) or len(dst_shape) <= len(src_shape):
        return None
    kept, s = [], 0
    for d, size in enumerate(dst_shape):
        if s < len(src_shape) and src_shape[s] == size:
            kept.append(results[d])
            s += 1
        elif size != 1:
            return None
    return tuple(kept) if s == len(src_shape) else None


def canonical(op, maps: Maps) -> Maps | None:
    """``maps`` if they differ from the op kind's default, else None."""
    return None if maps == default(op.kind.name, maps.batched) else maps


def folded_maps(op, folds: dict, shape_of) -> Maps | None:
    """The maps of ``op`` reading the sources of its folded producers directly.

    ``folds`` maps an input port (0 = A, 1 = B) to the StaticTranspose or
    unit-dim StaticReshape feeding it; ``shape_of(lt)`` gives known shapes.
    None when a fold is not expressible (a transpose moving the batch dim, a
    reshape that is not broadcast-only, a numpy batch broadcast of the MatMul)
    or would change C's shape.
    """
    shapes = [shape_of(lt) for lt in op.inputs[:2]]
    if any(s is None for s in shapes) or not folds:
        return None
    maps = effective(op, [len(s) for s in shapes])
    if maps is None:
        return None
    results, sources = [maps.a, maps.b], list(shapes)
    for port, fold in folds.items():
        src, dst = shape_of(fold.inputs[0]), shape_of(fold.outputs[0])
        if fold.kind.name == "StaticTranspose":
            results[port] = through_transpose(results[port], fold.attrs["order"])
        else:
            results[port] = through_unit_reshape(results[port], src, dst)
        if results[port] is None:
            return None
        sources[port] = src
    candidate = Maps(results[0], results[1], maps.c, maps.batched)
    try:
        check_rules(op, candidate)
        after = output_shape(op, candidate, *sources, shape_of(op.outputs[0]))
    except InvalidGraphOp:
        return None
    return candidate if after == tuple(shape_of(op.outputs[0]) or ()) else None


def folded_matmul(op, folds: dict, shape_of):
    """A copy of ``op`` reading the folds' sources, its maps in canonical form
    (dropped when default, transpose flags cleared); None when not foldable."""
    maps = folded_maps(op, folds, shape_of)
    if maps is None:
        return None
    new = op.copy()
    for port, fold in folds.items():
        new.inputs[port] = fold.inputs[0]
    for flag in ("transpose_a", "transpose_b"):
        if flag in new.attrs:
            new.attrs[flag] = False
    new.attrs.pop("indexing_maps", None)
    if canonical(op, maps) is not None:
        new.attrs["indexing_maps"] = maps.strings()
    return new

"""Render the op table as markdown: ``python -m graph_api.opset_doc > docs/opset.md``."""
from __future__ import annotations

from .opset import OP_SCHEMAS
from .schema import ANY_TYPE, NO_DEFAULT, REQUIRED


def _types(schema) -> str:
    parts = []
    for var, allowed in schema.type_vars.items():
        names = "any" if allowed is ANY_TYPE else ",".join(sorted(d.name for d in allowed))
        ports = [p.name for p in schema.inputs + schema.outputs if p.type_var == var]
        parts.append(f"{'/'.join(ports)}: {names}")
    return "; ".join(parts)


def _attrs(schema) -> str:
    out = []
    for a in schema.attrs:
        if a.default is REQUIRED:
            out.append(f"{a.name} (req)")
        elif a.default is NO_DEFAULT:
            out.append(f"{a.name}")
        else:
            default = a.default
            if isinstance(default, tuple) and len(default) > 4:
                default = f"[{default[0]}]*{len(default)}"
            out.append(f"{a.name}={default}")
    return ", ".join(out)


def markdown() -> str:
    lines = ["# Op set", "", f"{len(OP_SCHEMAS)} op kinds; every one runs (numpy reference kernels, "
             "Numba kernels for the fused hot paths).", "",
             "| op | inputs | outputs | data types | attributes (default) |", "|---|---|---|---|---|"]
    for kind in sorted(OP_SCHEMAS, key=lambda k: k.name):
        s = OP_SCHEMAS[kind]
        ins = ", ".join(p.name + ("?" if p.optional else "") + ("..." if p.variadic else "") for p in s.inputs)
        outs = ", ".join(p.name + ("?" if p.optional else "") + ("..." if p.variadic else "") for p in s.outputs)
        lines.append(f"| {kind.name} | {ins} | {outs} | {_types(s)} | {_attrs(s)} |")
    infinite = [f"{k.name}.{a.name}" for k in sorted(OP_SCHEMAS, key=lambda k: k.name)
                for a in OP_SCHEMAS[k].attrs if a.infinite]
    lines += ["", "Float attributes (f32, f32[]) hold finite f32 values: NaN, +-inf and values that are "
              "+-inf in f32 (1e39) are `invalid_graph_op` at `add_op`, naming the op and the attribute. "
              f"Only {', '.join(infinite)} take +-inf (a one-sided clip; min <= max, as oneDNN's clip)."]
    extensions = [k for k in sorted(OP_SCHEMAS, key=lambda k: k.name) if "extension" in OP_SCHEMAS[k].doc]
    if extensions:  # rows that are not oneDNN ops (their docs say so)
        lines += ["", "Project extensions (not oneDNN op kinds):", ""]
        lines += [f"* {k.name}: {OP_SCHEMAS[k].doc}" for k in extensions]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")

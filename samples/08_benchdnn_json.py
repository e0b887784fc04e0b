"""Loading and running oneDNN's own benchdnn graph files (JSON), as ``graph-api run --check`` does.

oneDNN serializes graphs to JSON (graph dumps, and the inputs of benchdnn's graph driver).
``ga.load`` reads them unchanged; ``graph_api.cli.prepare`` applies benchdnn's run-time
rewrites (power-of-two static scales) and ``execute`` fills the inputs as benchdnn does,
runs the partitions and compares every output with the unfused numpy reference. Three of
the oneDNN files shipped as test data are run: compressed-K/V SDPA in int4, a gated MLP
with int4 weights, and an int8 MatMul with post-ops.

    python -m samples 08_benchdnn_json
"""
from __future__ import annotations

from pathlib import Path

from graph_api.cli import execute, prepare
from samples import gallery

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "onednn-graphs"
FILES = ["complex_fusion/mha/sdpa-compressed-kv-int4-gs32.json",
         "complex_fusion/mlp/gated-mlp-int4.json",
         "pattern/int8/int8_matmul_post_ops_fusion.json"]

#: max abs difference allowed by output type: benchdnn fills small integers, so outputs
#: are O(1-10); f16 keeps ~3 decimal digits; an integer output may differ by one step
#: when an f32 value sits on a rounding tie
BOUND = {"f32": 1e-4, "f16": 2e-2, "bf16": 1e-1, "u8": 1.0, "s8": 1.0}


def main(small: bool = False) -> None:
    if not DATA.exists():
        print(f"the oneDNN files are test data of a source checkout ({DATA}); nothing to run")
        return
    for name in FILES:
        prepared = prepare(DATA / name, max_elements=1_000_000 if small else None)
        for note in prepared.notes:
            print(f"  note: {note}")
        report = execute(prepared, check=True)
        gallery.graph(name, prepared.graph, report.run.partitions)
        for check in report.checks:
            v = check.verdict
            print(f"  output {check.tid} ({check.lt.dtype.name}): {'ok' if v.ok else 'MISMATCH'} {v.message}")
            # benchdnn's own per-dtype tolerance rule decides (graph_api.check.compare)
            assert v.ok, v.message
            gallery.error(f"{Path(name).name} output {check.tid}, max abs vs reference", v.max_abs,
                          BOUND[check.lt.dtype.name])


if __name__ == "__main__":
    main()

"""Run the samples gallery: ``python -m samples [--small] [--out DIR] [NAME ...]``.

Each sample runs with a progress line, its output shown as it goes; then a
summary table (sample, status, partitions, max error, time), and an HTML page
with every sample's description, partition pictures, output and code.  The exit
code is 1 when any sample fails.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
import traceback
from pathlib import Path

from samples import SAMPLES, gallery, load


class _Tee(io.TextIOBase):
    """Writes to the terminal and keeps a copy for the page (``copy``: shared with another tee)."""

    def __init__(self, stream, copy=None):
        self.stream, self.copy = stream, copy if copy is not None else io.StringIO()

    def write(self, text):
        self.stream.write(text)
        self.copy.write(text)
        return len(text)

    def flush(self):
        self.stream.flush()


def run_one(name: str, small: bool):
    """(module, status, seconds, output, record) of one sample."""
    record = gallery.start()
    tee = _Tee(sys.stdout)
    # stderr too: "compiling the SDPA kernel (first run only, cached on disk)" belongs on the page
    err_tee = _Tee(sys.stderr, tee.copy)
    start = time.perf_counter()
    module, status = None, "ok"
    with contextlib.redirect_stdout(tee), contextlib.redirect_stderr(err_tee):
        try:
            module = load(name)
            module.main(small=small)
            if record.skipped:
                status = "skipped"
        except Exception:  # a failing sample is reported in the table, the others still run
            status = "FAILED"
            print(traceback.format_exc())
    return module, status, time.perf_counter() - start, tee.copy.getvalue(), record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m samples", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"samples to run (default: all of {', '.join(SAMPLES)})")
    parser.add_argument("--small", action="store_true", help="small shapes (what the tests run)")
    parser.add_argument("--out", default="samples-gallery", help="folder for the HTML page")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in SAMPLES]
    if unknown:
        parser.error(f"unknown sample(s) {', '.join(unknown)}; known: {', '.join(SAMPLES)}")
    names = args.names or SAMPLES
    entries = []
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name} ...", flush=True)
        module, status, seconds, output, record = run_one(name, args.small)
        print(f"[{i}/{len(names)}] {name} {status} in {seconds:.2f} s\n", flush=True)
        entries.append((name, module, status, seconds, output, record))

    print(f"{'sample':34s} {'status':7s} {'partitions':>10s} {'max error':>10s} {'time s':>8s}")
    for name, _, status, seconds, _, record in entries:
        worst = record.worst_error
        print(f"{name:34s} {status:7s} {record.partitions:10d} "
              f"{'' if worst is None else f'{worst:.2e}':>10s} {seconds:8.2f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    page = out / "index.html"
    gallery.write_html(page, entries)
    failed = [name for name, _, status, *_ in entries if status not in ("ok", "skipped")]
    print(f"\ngallery written to {page.resolve()}")
    skipped = sum(1 for entry in entries if entry[2] == "skipped")
    print(f"samples: {len(entries) - len(failed) - skipped} ok, {skipped} skipped, {len(failed)} failed" + (f" ({', '.join(failed)})" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

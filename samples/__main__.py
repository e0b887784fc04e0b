"""Run the samples gallery: ``python -m samples [--small] [--jobs N] [--out DIR] [NAME ...]``.

Each sample runs with a progress line and its output; then a summary table
(sample, status, partitions, max error, time), and an HTML page with every
sample's description, partition pictures, output and code.  The exit code is 1
when any sample fails.

Samples run in ``--jobs`` processes at once (default: one per CPU), each sample's
output printed whole when it ends: on a fresh machine most of a sample's time is
the single-threaded first compile of its kernels (cached on disk afterwards), so
two processes on two cores take about half the time.  ``--jobs 1`` (or a single
sample) runs in this process with the output shown as it goes.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

from samples import SAMPLES, gallery, load, run_captured, run_one


def _run_parallel(names, small: bool, jobs: int):
    """Every sample in ``jobs`` worker processes (started fresh: ``spawn``, no forked
    thread pools); each prints whole, in the order they end.  The entries come back in
    gallery order."""
    done = {}
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
        running = {pool.submit(run_captured, name, small): name for name in names}
        for future in as_completed(running):
            name = running[future]
            try:
                status, seconds, output, record = future.result()
            except Exception:  # the worker itself died: the sample failed, the others go on
                status, seconds, output, record = "FAILED", 0.0, traceback.format_exc(), gallery.Record()
            i = len(done) + 1
            print(f"[{i}/{len(names)}] {name}\n{output}[{i}/{len(names)}] {name} {status} in {seconds:.2f} s\n",
                  flush=True)
            done[name] = (status, seconds, output, record)
    entries = []
    for name in names:
        try:
            module = load(name)  # for the page: its description and code
        except Exception:
            module = None
        entries.append((name, module, *done[name]))
    return entries


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m samples", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"samples to run (default: all of {', '.join(SAMPLES)})")
    parser.add_argument("--small", action="store_true", help="small shapes (what the tests run)")
    parser.add_argument("--out", default="samples-gallery", help="folder for the HTML page")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                        help="samples run at once, each in its own process (default: one per CPU)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in SAMPLES]
    if unknown:
        parser.error(f"unknown sample(s) {', '.join(unknown)}; known: {', '.join(SAMPLES)}")
    names = args.names or SAMPLES
    jobs = max(1, min(args.jobs, len(names)))
    entries = [] if jobs == 1 else _run_parallel(names, args.small, jobs)
    for i, name in enumerate(names if jobs == 1 else (), 1):
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

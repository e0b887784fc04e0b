"""Run the samples gallery: ``python -m samples [--small] [NAME ...]``."""
from __future__ import annotations

import argparse
import sys
import time

from samples import SAMPLES, load


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m samples", description=__doc__)
    parser.add_argument("names", nargs="*", help=f"samples to run (default: all of {', '.join(SAMPLES)})")
    parser.add_argument("--small", action="store_true", help="small shapes (what the tests run)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in SAMPLES]
    if unknown:
        parser.error(f"unknown sample(s) {', '.join(unknown)}; known: {', '.join(SAMPLES)}")
    for name in args.names or SAMPLES:
        print(f"=== {name}")
        start = time.perf_counter()
        load(name).main(small=args.small)
        print(f"=== {name} done in {time.perf_counter() - start:.2f} s\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

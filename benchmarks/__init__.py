"""Benchmark suite: ``python -m benchmarks [--quick] [--out FILE]``."""

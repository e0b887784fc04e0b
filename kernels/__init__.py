"""Kernels: numpy reference ground truth (``kernels.reference``), fast kernels, registry."""

"""Kernels: numpy reference ground truth (``graph_api.kernels.reference``), fast kernels, registry."""

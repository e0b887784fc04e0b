"""Front doors: models from other frameworks turned into graph_api graphs.

Each front door is one module that imports its framework (PyTorch, ONNX) only when it is
used, so ``import graph_api`` never loads them.  Front doors sit above the runtime: they
build ``Graph`` objects with the public API and run them through the same partitioner,
compiler and kernels as a hand-built graph.
"""

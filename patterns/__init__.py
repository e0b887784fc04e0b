"""Pattern matcher and pattern library (fusion).

* :mod:`graph_api.patterns.pattern` — patterns as small data graphs (nodes, edges,
  optional groups, repetition, predicates, whole-match checks);
* :mod:`graph_api.patterns.matcher` — the one generic matcher (anchored at a sink,
  walking producers, backtracking over every choice);
* :mod:`graph_api.patterns.partitioner` — greedy by priority, rejects escaping
  intermediates and cycles, leaves the rest as single ops;
* :mod:`graph_api.patterns.library` — ``PATTERNS``, highest priority first;
* :mod:`graph_api.patterns.explain` — why an op was not fused (``graph.explain_partitions()``).
"""

"""Pattern matcher and pattern library (fusion).

* :mod:`patterns.pattern` — patterns as small data graphs (nodes, edges,
  optional groups, repetition, predicates, whole-match checks);
* :mod:`patterns.matcher` — the one generic matcher (anchored at a sink,
  walking producers, backtracking over every choice);
* :mod:`patterns.partitioner` — greedy by priority, rejects escaping
  intermediates and cycles, leaves the rest as single ops;
* :mod:`patterns.library` — ``PATTERNS``, highest priority first;
* :mod:`patterns.explain` — why an op was not fused (``graph.explain_partitions()``).
"""

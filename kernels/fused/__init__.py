"""Fast plans for fused partitions: glue between pattern bindings and Numba kernels.

Each module here turns a :class:`~graph_api.kernels.plan.CompileRequest` of one pattern
into a plan that runs a Numba kernel on the fused core and, for any ops of the
partition the kernel does not cover (a Quantize tail, say), the reference
steps — so the fused partition computes what the unfused ops compute.
Builders return a plan, or a string saying why the fast path does not apply
(the registry then uses the composed reference plan and logs the reason).
"""

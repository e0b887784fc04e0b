"""Grouped MatMul (mixture of experts): ``grouped_gemv`` (one parallel launch over
every expert's rows and column blocks) and ``plan`` (the ``grouped_matmul`` partition)."""

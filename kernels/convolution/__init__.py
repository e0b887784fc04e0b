"""Convolution (and ConvTranspose) partitions: the numpy cores (:mod:`.conv`: im2col, BLAS,
depthwise, exact integer sums), the Numba fast 2-D path (:mod:`.conv_fast`), the int8
GEMM of AVX2 CPUs without VNNI (:mod:`.igemm16`), and the plan (:mod:`.conv_plan`)."""

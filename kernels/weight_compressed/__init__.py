"""Weight-compressed MatMul (int4/int8 weights, f32/bf16/f16 activations): the entry and
prepared layouts (:mod:`.wmatmul`), the int4 decode kernels on the interleaved layout
(:mod:`.wgemv4`, nibbles to floats by :mod:`.lut4`'s 16-entry table; :mod:`.wgemv4_bf16`
under fpmath bf16), the int8 decode (:mod:`.wgemv8`), and the plans of the MatMul and
gated-MLP partitions (:mod:`.wmatmul_plan`, :mod:`.mlp_plan`)."""

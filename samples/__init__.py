"""The samples gallery: runnable examples, each a ``main(small=False)``.

``python -m samples`` runs them all; ``python -m samples NAME ...`` runs some;
``--small`` uses the small shapes the tests use.
"""
import importlib

#: the gallery, in reading order (module names under samples/)
SAMPLES = [
    "01_first_graph",
    "02_int4_decoder_layer",
    "15_int4_rfc_matmul",
    "03_grouped_quantization",
    "04_sdpa",
    "05_compressed_sdpa",
    "06_gated_mlp_int4",
    "07_fpmath_modes",
    "08_benchdnn_json",
    "09_why_not_fused",
    "10_dot_algorithms_and_maps",
    "11_composite_ops",
    "13_llm_decode",
    "14_minilm_encoder",
    "12_cnn_block",
    "16_sparse_weights",
]


def load(name: str):
    return importlib.import_module(f"samples.{name}")

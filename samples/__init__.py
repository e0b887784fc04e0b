"""The samples gallery: runnable examples, each a ``main(small=False)``.

``python -m samples`` runs them all; ``python -m samples NAME ...`` runs some;
``--small`` uses the small shapes the tests use.
"""
import importlib

#: the gallery, in reading order (module names under samples/)
SAMPLES = [
    "01_first_graph",
    "02_int4_decoder_layer",
    "12_cnn_block",
]


def load(name: str):
    return importlib.import_module(f"samples.{name}")

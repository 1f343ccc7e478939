"""Elementwise family: each op compiled (not fallen back) and equal to eager, two shapes."""
import pytest
import torch

import blade
from helpers import run_compiled

# Lambdas cannot be scripted: these single-op models are traced.
TRACE = blade.Config(allow_tracing=True)

SHAPES = [((4, 8), (8,)), ((2, 3, 5), (3, 1))]


def binary_ops():
    return {
        "add": lambda x, y: x + y,
        "sub": lambda x, y: x - y,
        "mul": lambda x, y: x * y,
        "div": lambda x, y: x / (y.abs() + 1),
        "add_alpha": lambda x, y: torch.add(x, y, alpha=2.5),
        "add_scalar": lambda x, y: x + 3.0 + y,
        "mul_scalar": lambda x, y: x * 0.5 * y,
        "div_scalar": lambda x, y: x / 4.0 - y,
        "rsub_scalar": lambda x, y: 1.0 - x * y,
        "pow_scalar": lambda x, y: x.abs().pow(1.5) + y,
        "pow_tensor": lambda x, y: (x.abs() + 1).pow(y),
        "maximum": lambda x, y: torch.maximum(x, y),
        "where": lambda x, y: torch.where(x > y, x, y * 2),
        "masked_fill": lambda x, y: x.masked_fill(y > 0, -1.0),
        "compare": lambda x, y: torch.where(x >= 0.1, x, y) + torch.where(x < y, y, x),
    }


def unary_ops():
    return {
        "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
        "gelu": torch.nn.functional.gelu,
        "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
        "exp": torch.exp, "log": lambda x: torch.log(x.abs() + 1e-3),
        "sqrt": lambda x: torch.sqrt(x.abs()), "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.5),
        "neg": torch.neg, "abs": torch.abs, "erf": torch.erf, "silu": torch.nn.functional.silu,
        "clamp": lambda x: torch.clamp(x, -0.5, 0.5),
    }


class Binary(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, y):
        return self.fn(x, y)


class Unary(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x) * 1.0


@pytest.mark.parametrize("shapes", SHAPES, ids=["2d", "3d"])
@pytest.mark.parametrize("name", sorted(binary_ops()))
def test_binary(name, shapes):
    torch.manual_seed(0)
    x, y = torch.randn(*shapes[0]), torch.randn(*shapes[1])
    run_compiled(Binary(binary_ops()[name]), (x, y), TRACE)


@pytest.mark.parametrize("shape", [(16,), (3, 4, 5)], ids=["1d", "3d"])
@pytest.mark.parametrize("name", sorted(unary_ops()))
def test_unary(name, shape):
    torch.manual_seed(0)
    x = torch.randn(*shape)
    run_compiled(Unary(unary_ops()[name]), (x,), TRACE)

"""Reduction family: sum/mean/amax over dims, softmax and log_softmax."""
import pytest
import torch

import blade
from helpers import run_compiled

TRACE = blade.Config(allow_tracing=True)

OPS = {
    "sum": lambda x: x.sum(dim=-1),
    "sum_keepdim": lambda x: x.sum(dim=(0, 1), keepdim=True),
    "mean": lambda x: x.mean(dim=1),
    "amax": lambda x: x.amax(dim=-1),
    "amin": lambda x: x.amin(dim=0, keepdim=True),
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "log_softmax": lambda x: torch.log_softmax(x, dim=1),
}


class Reduce(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x * 1.0)


@pytest.mark.parametrize("shape", [(6, 10), (2, 5, 7)], ids=["2d", "3d"])
@pytest.mark.parametrize("name", sorted(OPS))
def test_reduction(name, shape):
    torch.manual_seed(0)
    run_compiled(Reduce(OPS[name]), (torch.randn(*shape),), TRACE)

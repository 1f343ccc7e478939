"""View family: view/reshape/permute/transpose/unsqueeze/squeeze/expand/flatten."""
import pytest
import torch

import blade
from helpers import run_compiled

TRACE = blade.Config(allow_tracing=True)

OPS = {
    "view": lambda x: x.view(x.shape[0], -1) * 2,
    "reshape": lambda x: (x * 2).reshape(-1),
    "permute": lambda x: (x * 2).permute(2, 0, 1) + 1,
    "transpose": lambda x: (x + 1).transpose(0, 2).contiguous() * 3,
    "unsqueeze": lambda x: (x + 1).unsqueeze(1) * 2,
    "squeeze": lambda x: (x + 1).unsqueeze(0).squeeze(0) * 2,
    "expand": lambda x: (x.sum(dim=1, keepdim=True) * 2).expand(x.shape[0], 4, x.shape[2]) + 1,
    "flatten": lambda x: torch.flatten(x * 2, 1) + 1,
}


class View(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize("shape", [(2, 3, 4), (5, 4, 6)], ids=["small", "larger"])
@pytest.mark.parametrize("name", sorted(OPS))
def test_view(name, shape):
    torch.manual_seed(0)
    run_compiled(View(OPS[name]), (torch.randn(*shape),), TRACE)

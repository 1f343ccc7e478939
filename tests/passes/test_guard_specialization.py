"""guard_specialization: the optimized body runs under blade::guard_admits; inputs it
refuses run the unspecialized graph, which is the model for any input."""
import torch
from torch.testing import FileCheck

from blade.report import GUARD_ATTRIBUTE
from graph_runner import run_pass


class Flatten(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x.reshape(x.size(0), -1)) * 2


def test_the_guard_chooses_between_the_specialized_and_the_unspecialized_body():
    before, _, after, c = run_pass(Flatten(), (torch.randn(2, 3, 4),), "guard")
    assert "blade::guard_admits" not in before
    FileCheck().check("blade::guard_admits").check("prim::If").check("blade::execute") \
        .check("block1").check("aten::reshape").run(after)
    module = c.module
    for shape in ((2, 3, 4), (5, 2, 2), (1, 7)):
        x = torch.randn(*shape)
        torch.testing.assert_close(module(x), Flatten()(x))
    guard = getattr(module, GUARD_ATTRIBUTE)
    assert guard.calls() == 3 and guard.fallbacks() == 2

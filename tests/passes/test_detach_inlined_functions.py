"""detach_inlined_functions: a frozen graph's call stacks name the methods its nodes were
inlined from through placeholders that outlive them, so an op that raises later still gets
its TorchScript traceback (the methods themselves are freed with the scripted module)."""
import gc

import pytest
import torch

import blade  # noqa: F401  (loads the runtime)
from blade import _C
from blade.quiet import quiet_torchscript


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.fc(x))


def frozen_and_detached():
    with quiet_torchscript():
        scripted = torch.jit.script(torch.nn.Sequential(Block(), Block()).eval())
        frozen = torch.jit.freeze(scripted)
    rebuilt = _C.detach_inlined_functions(frozen.graph)
    return frozen, rebuilt


def test_every_inlined_node_gets_a_call_stack_that_outlives_its_methods():
    frozen, rebuilt = frozen_and_detached()
    assert rebuilt >= 4  # two linears and two relus, at least
    gc.collect()
    # The traceback of an op that raises names the methods it came from, by name.
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied") as e:
        frozen(torch.randn(4, 7))
    assert "forward" in str(e.value)
    x = torch.randn(4, 8)
    torch.testing.assert_close(frozen(x), frozen(x))


def test_a_graph_without_inlined_calls_has_nothing_to_rebuild():
    graph = torch._C.parse_ir("""
        graph(%x : Tensor):
          %y : Tensor = aten::relu(%x)
          return (%y)""")
    assert _C.detach_inlined_functions(graph) == 0

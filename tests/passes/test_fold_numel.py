"""fold_numel: numel() of a tensor whose sizes are all known becomes a constant; a tensor
with a dynamic dim keeps it."""
import torch
from torch.testing import FileCheck

import blade  # noqa: F401  (loads the runtime)
from blade import _C
from blade.quiet import quiet_torchscript


class Flatten(torch.nn.Module):
    def forward(self, x):
        return x.view(x.numel() // 4, 4)


def typed(example, *resized):
    with quiet_torchscript():
        module = torch.jit.freeze(torch.jit.script(Flatten().eval()))
    graph = module.graph
    _C.materialize_types(graph, (module._c, example), True,
                         [(module._c, more) for more in resized])
    return module, graph


def test_numel_of_known_sizes_folds():
    module, graph = typed(torch.randn(2, 3, 4))
    FileCheck().check("aten::numel").run(str(graph))
    assert _C.fold_numel(graph) == 1
    FileCheck().check_not("aten::numel").check("prim::Constant[value=24]").run(str(graph))
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(module(x), Flatten()(x))


def test_numel_of_a_dynamic_dim_stays():
    _, graph = typed(torch.randn(2, 3, 4), torch.randn(5, 3, 4))
    assert _C.fold_numel(graph) == 0
    FileCheck().check("aten::numel").run(str(graph))

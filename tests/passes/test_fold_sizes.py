"""fold_sizes: sizes of static dims fold; x.size() of a partly dynamic x becomes a list of
per-dim sizes; sizes of dynamic dims never fold."""
import torch
from torch.testing import FileCheck

import blade  # noqa: F401  (loads the runtime)
from blade import _C
from blade.compiler import quiet_torchscript


class Heads(torch.nn.Module):
    def forward(self, x):
        b, t, c = x.shape
        d = x.size(-1) // 4
        return x.view(b, t, 4, d).transpose(1, 2).reshape(b * 4, t, d)


def typed_graph(example, resized):
    with quiet_torchscript():
        module = torch.jit.freeze(torch.jit.script(Heads().eval()))
    graph = module.graph
    _C.materialize_types(graph, (module._c, example), True, [(module._c, resized)])
    return module, graph


def test_static_dims_fold_and_dynamic_ones_become_per_dim_sizes():
    module, graph = typed_graph(torch.randn(2, 8, 16), torch.randn(3, 9, 16))
    FileCheck().check("int[] = aten::size(").run(str(graph))
    assert _C.fold_sizes(graph) == 2
    torch._C._jit_pass_peephole_list_idioms(graph, True)
    torch._C._jit_pass_constant_propagation(graph)
    text = str(graph)
    FileCheck().check_not("int[] = aten::size(").run(text)
    # b and t are computed at run time; c and d are constants.
    FileCheck().check_count("int = aten::size(", 2, exactly=True).run(text)
    FileCheck().check("prim::Constant[value=4]").run(text)
    for shape in ((2, 8, 16), (5, 3, 16), (1, 1, 16)):
        x = torch.randn(*shape)
        torch.testing.assert_close(module(x), Heads()(x))


def test_fully_static_and_unknown_shapes_are_left_to_others():
    module, graph = typed_graph(torch.randn(2, 8, 16), torch.randn(2, 8, 16))
    before = str(graph)
    assert _C.fold_sizes(graph) == 1      # size(-1) folds; x.shape is PyTorch's to fold
    FileCheck().check("int[] = aten::size(").run(str(graph))
    with quiet_torchscript():
        untyped = torch.jit.freeze(torch.jit.script(Heads().eval())).graph
    assert _C.fold_sizes(untyped) == 0
    assert before != str(graph)

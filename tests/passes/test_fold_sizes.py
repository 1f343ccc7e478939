"""fold_sizes: sizes of static dims fold; x.size() of a partly dynamic x becomes a list of
per-dim sizes; sizes of dynamic dims never fold."""
import torch
from torch.testing import FileCheck

import blade  # noqa: F401  (loads the runtime)
from blade import _C
from blade.quiet import quiet_torchscript


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


def test_fully_static_sizes_become_lists_of_constants_and_unknown_ones_stay():
    module, graph = typed_graph(torch.randn(2, 8, 16), torch.randn(2, 8, 16))
    assert _C.fold_sizes(graph) == 2      # size(-1) and x.shape
    FileCheck().check_not("int[] = aten::size(").check("prim::ListConstruct").run(str(graph))
    torch._C._jit_pass_peephole_list_idioms(graph, True)
    torch._C._jit_pass_constant_propagation(graph)
    FileCheck().check_not("aten::size").check_not("prim::ListConstruct").run(str(graph))
    x = torch.randn(2, 8, 16)
    torch.testing.assert_close(module(x), Heads()(x))
    with quiet_torchscript():
        untyped = torch.jit.freeze(torch.jit.script(Heads().eval())).graph
    assert _C.fold_sizes(untyped) == 0


class WritesItsShape(torch.nn.Module):
    def forward(self, x):
        target = x.shape          # a list TorchScript lets forward write
        target[1] = 3
        return torch.zeros(target) + x[:, :3]


def test_a_written_size_list_keeps_the_write():
    """The peephole would fold x.shape into one list constant that _set_item then writes
    while the run goes on: the constant would still say [2, 8] (which the importer would
    read) where the zeros are [2, 3]. As a list of constants, the write is folded into it."""
    with quiet_torchscript():
        module = torch.jit.freeze(torch.jit.script(WritesItsShape().eval()))
    graph = module.graph
    _C.materialize_types(graph, (module._c, torch.randn(2, 8)), True)
    assert _C.fold_sizes(graph) == 1
    torch._C._jit_pass_remove_mutation(graph)
    torch._C._jit_pass_constant_propagation(graph)
    text = str(graph)
    # The zeros' size folded with the write (constant propagation then folded the zeros).
    FileCheck().check_not("aten::_set_item").check_not("[2, 8]").run(text)
    FileCheck().check("Float(2, 3, strides=[3, 1]").check("prim::Constant").run(text)
    x = torch.randn(2, 8)   # (eager's torch.Size cannot be written: compare by hand)
    torch.testing.assert_close(module(x), x[:, :3])

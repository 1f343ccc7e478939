"""graph_contents: the node kinds of a graph, its tensor constants (read and replaced, in
one order) and the tensors its container constants hold, as the model cache reads them;
and the removal of an attribute from a class type and its modules."""
import torch

import blade  # noqa: F401  (loads the runtime)
from blade import _C
from blade.quiet import quiet_torchscript


class Affine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4))
        self.bias = torch.nn.Parameter(torch.randn(4))
        self.unused = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return torch.tanh(x * self.weight + self.bias)


def frozen():
    with quiet_torchscript():
        return torch.jit.freeze(torch.jit.script(Affine().eval()))


def test_node_kinds_are_distinct_and_sorted():
    kinds = _C.node_kinds(frozen().graph)
    assert kinds == sorted(set(kinds))
    assert {"aten::mul", "aten::add", "aten::tanh", "prim::Constant"} <= set(kinds)


def test_tensor_constants_are_read_and_replaced_in_one_order():
    module = frozen()
    constants = _C.tensor_constants(module.graph)
    assert len(constants) == 2
    replaced = [torch.zeros_like(t) for t in constants]
    _C.set_tensor_constants(module.graph, replaced, False)
    assert all(a is b or torch.equal(a, b) for a, b in
               zip(_C.tensor_constants(module.graph), replaced))
    x = torch.randn(4)
    torch.testing.assert_close(module(x), torch.zeros(4))


def test_tensors_in_container_constants_are_counted():
    graph = frozen().graph
    assert _C.tensors_in_containers(graph) == 0
    with graph.insert_point_guard(next(iter(graph.nodes()))):
        graph.insertConstant([torch.ones(2), torch.zeros(2)])
    assert _C.tensors_in_containers(graph) == 2


def test_an_attribute_is_removed_from_the_type_and_its_modules():
    with quiet_torchscript():
        scripted = torch.jit.script(Affine().eval())
    assert scripted._c.hasattr("unused")
    assert _C.remove_attribute([scripted._c], "unused")
    assert not scripted._c.hasattr("unused")
    assert not _C.remove_attribute([scripted._c], "unused")

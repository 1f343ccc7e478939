"""materialize_types: types recorded from a run on the example inputs."""
import torch
from torch.testing import FileCheck

import blade  # noqa: F401  (loads the runtime)
from blade import _C
from blade.quiet import quiet_torchscript


class Branchy(torch.nn.Module):
    def forward(self, x, flag: bool):
        y = torch.relu(x)
        if flag:
            z = y * 2.0
        else:
            z = y.to(torch.float64) - 1.0
        return z


def frozen(model):
    with quiet_torchscript():
        return torch.jit.freeze(torch.jit.script(model.eval()))


def test_records_dtype_and_sizes_and_leaves_unreached_values_alone():
    module = frozen(Branchy())
    graph = module.graph
    FileCheck().check("Tensor = aten::relu").run(str(graph))
    x = torch.randn(4, 8)
    count, returned = _C.materialize_types(graph, (module._c, x, True), True)
    assert count >= 3
    # What the graph returned on the inputs comes back too (the engine check's example).
    assert len(returned) == 1
    torch.testing.assert_close(returned[0], Branchy()(x, True), rtol=0, atol=0)
    text = str(graph)
    FileCheck().check("Float(4, 8").check("aten::relu").check("block0").check(
        "Float(4, 8").check("aten::mul").check("block1").check("Tensor = aten::to").run(text)
    # The graph still computes the same results.
    x = torch.randn(4, 8)
    torch.testing.assert_close(module(x, True), Branchy()(x, True))
    torch.testing.assert_close(module(x, False), Branchy()(x, False))


def test_dynamic_policy_keeps_rank_not_sizes():
    module = frozen(Branchy())
    graph = module.graph
    _C.materialize_types(graph, (module._c, torch.randn(4, 8), True), False)
    FileCheck().check("Float(*, *").check("aten::relu").run(str(graph))


def test_values_seen_with_several_shapes_keep_only_what_agrees():
    class Grow(torch.nn.Module):
        def forward(self, x, n: int):
            for _ in range(n):
                x = torch.cat([x, x], dim=0)
            return x

    module = frozen(Grow())
    graph = module.graph
    _C.materialize_types(graph, (module._c, torch.randn(2, 5), 3), True)
    # Inside the loop the carried value is seen as [2,5], [4,5], [8,5]: dim 0 varies.
    FileCheck().check("prim::Loop").check("Float(*, 5").run(str(graph))


def numel_fn(x):
    return x.reshape(x.numel() // x.size(-1), x.size(-1)) * 2.0


def test_fold_numel_of_known_sizes():
    with quiet_torchscript():
        scripted = torch.jit.script(numel_fn)
    graph = scripted.graph.copy()
    assert _C.fold_numel(graph) == 0            # sizes unknown: left alone
    _C.materialize_types(graph, (torch.randn(2, 3, 4),), True)
    FileCheck().check("aten::numel").run(str(graph))
    assert _C.fold_numel(graph) == 1
    FileCheck().check_not("aten::numel").check("prim::Constant[value=24]").run(str(graph))
    with quiet_torchscript():
        function = torch._C._create_function_from_graph("f", graph)
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(function(x), scripted(x))


class Pair(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x) + y, x.sum(dim=1)


def test_runs_of_other_sizes_give_shared_shape_symbols():
    module = frozen(Pair())
    graph = module.graph
    _C.materialize_types(graph, (module._c, torch.randn(4, 8), torch.randn(4, 8)), True,
                         [(module._c, torch.randn(5, 8), torch.randn(5, 8))])
    inputs = list(graph.inputs())[1:]
    x, y = (v.type().symbolic_sizes() for v in inputs)
    assert x[1] == 8 and y[1] == 8
    assert x[0] < 0 and x[0] == y[0]          # one symbol: equal in every run
    total = [n for n in graph.nodes() if n.kind() == "aten::sum"][0].output()
    assert total.type().symbolic_sizes() == [x[0]]

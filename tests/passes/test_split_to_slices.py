"""split_to_slices: unpacked splits/chunks/unbinds become slices/selects, same results."""
import torch
from torch.testing import FileCheck

import blade
from blade import _C
from blade.quiet import quiet_torchscript


def frozen_graph(fn, example):
    with quiet_torchscript():
        scripted = torch.jit.script(fn)
        graph = scripted.graph.copy()
    _C.materialize_types(graph, (example,), True)
    return scripted, graph


def run_graph(graph, x):
    with quiet_torchscript():
        function = torch._C._create_function_from_graph("f", graph)
    return function(x)


def check(fn, example, before, after):
    scripted, graph = frozen_graph(fn, example)
    FileCheck().check(before).run(str(graph))
    assert _C.split_to_slices(graph) == 1
    FileCheck().check_not(before).check_not("prim::ListUnpack").check(after).run(str(graph))
    for x in (example, torch.randn_like(example)):
        torch.testing.assert_close(run_graph(graph, x), scripted(x))


def split_fn(x):
    q, k, v = x.split(4, dim=1)
    return q * 2 + k - v


def split_sizes_fn(x):
    a, b = torch.split(x, [3, 9], dim=-1)
    return a.sum(dim=-1) + b.sum(dim=-1)


def chunk_fn(x):
    a, b = x.chunk(2, dim=0)
    return a - b


def unbind_fn(x):
    a, b, c = x.unbind(1)
    return a * b + c


def test_split_becomes_slices():
    check(split_fn, torch.randn(3, 12), "aten::split", "aten::slice")


def test_split_with_sizes_becomes_slices():
    check(split_sizes_fn, torch.randn(2, 12), "aten::split", "aten::slice")


def test_chunk_becomes_slices():
    check(chunk_fn, torch.randn(4, 5), "aten::chunk", "aten::slice")


def test_unbind_becomes_selects():
    check(unbind_fn, torch.randn(2, 3, 4), "aten::unbind", "aten::select")


def test_escaping_list_is_left_alone():
    def fn(x):
        parts = x.split(2, dim=0)
        return parts[0] + parts[1], parts     # the list itself leaves the graph

    _, graph = frozen_graph(fn, torch.randn(4, 3))
    assert _C.split_to_slices(graph) == 0
    FileCheck().check("aten::split").run(str(graph))


def test_unknown_size_is_left_alone():
    _, graph = frozen_graph(split_fn, torch.randn(3, 12))
    graph.inputs().__next__().setType(torch._C.TensorType.get())
    for node in graph.nodes():  # forget every materialized type
        for out in node.outputs():
            if isinstance(out.type(), torch._C.TensorType):
                out.setType(torch._C.TensorType.get())
    assert _C.split_to_slices(graph) == 0


def test_qkv_split_keeps_one_cluster():
    class Qkv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 24)

        def forward(self, x):
            q, k, v = self.proj(x).split(8, dim=-1)
            return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v

    report = blade.report(blade.optimize(Qkv().eval(), (torch.randn(2, 5, 8),)))
    assert len(report.clusters) == 1 and report.coverage == 1.0, str(report)


def chunk_list_fn(x):
    parts = x.chunk(4, dim=-1)
    total = parts[0]
    for p in parts[1:]:
        total = total + p * 0.5
    return total * len(parts)


def test_split_list_that_is_only_read_becomes_a_list_of_slices():
    scripted, graph = frozen_graph(chunk_list_fn, torch.randn(3, 16))
    FileCheck().check("aten::chunk").check("aten::__getitem__").run(str(graph))
    assert _C.split_to_slices(graph) == 1
    FileCheck().check_not("aten::chunk").check("aten::slice").check("prim::ListConstruct") \
        .run(str(graph))
    x = torch.randn(3, 16)
    torch.testing.assert_close(run_graph(graph, x), scripted(x))


def chunk_list_appended_fn(x):
    parts = x.chunk(2, dim=0)
    parts.append(x)
    return torch.cat(parts)


def test_split_list_that_is_mutated_is_left_alone():
    _, graph = frozen_graph(chunk_list_appended_fn, torch.randn(4, 3))
    assert _C.split_to_slices(graph) == 0

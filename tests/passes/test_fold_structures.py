"""fold_structures: dicts with constant keys and appended lists that never escape are
folded; anything else is left alone. Same results before and after."""
from typing import Dict, List

import torch
from torch.testing import FileCheck

from blade import _C
from blade.quiet import quiet_torchscript


def scripted_graph(fn):
    with quiet_torchscript():
        scripted = torch.jit.script(fn)
    return scripted, scripted.graph.copy()


def run_graph(graph, *inputs):
    with quiet_torchscript():
        return torch._C._create_function_from_graph("f", graph)(*inputs)


def check_same(scripted, graph, *shapes):
    for _ in range(2):
        inputs = [torch.randn(*s) for s in shapes]
        torch.testing.assert_close(run_graph(graph, *inputs), scripted(*inputs))


def dict_fn(x):
    d: Dict[str, torch.Tensor] = {"a": x * 2.0, "b": x + 1.0}
    d["c"] = torch.tanh(d["a"])
    d["a"] = d["b"] * 3.0          # overwritten key: later reads see the new value
    return d["a"] + d["c"]


def test_dict_with_constant_keys_is_folded():
    scripted, graph = scripted_graph(dict_fn)
    FileCheck().check("prim::DictConstruct").check("aten::_set_item") \
        .check("aten::__getitem__").run(str(graph))
    assert _C.fold_structures(graph) == 1
    FileCheck().check_not("prim::DictConstruct").check_not("aten::_set_item") \
        .check_not("aten::__getitem__").run(str(graph))
    check_same(scripted, graph, (3, 4))


def escaping_dict_fn(x) -> Dict[str, torch.Tensor]:
    d: Dict[str, torch.Tensor] = {"a": x * 2.0}
    d["b"] = d["a"] + 1.0
    return d


def missing_key_fn(x, flag: bool):
    d: Dict[str, torch.Tensor] = {"a": x}
    if flag:
        d["b"] = x * 2.0
    return d["b"]


def test_dicts_that_escape_or_miss_a_key_are_left_alone():
    for fn in (escaping_dict_fn, missing_key_fn):
        _, graph = scripted_graph(fn)
        before = str(graph)
        assert _C.fold_structures(graph) == 0
        assert str(graph) == before


def list_fn(x):
    parts: List[torch.Tensor] = [x]
    parts.append(x * 2.0)
    first = parts[0]
    parts.append(torch.relu(x))
    return torch.cat(parts, dim=0) + first.sum()


def test_appended_list_becomes_one_list_construct():
    scripted, graph = scripted_graph(list_fn)
    FileCheck().check("prim::ListConstruct").check("aten::append").check("aten::append") \
        .run(str(graph))
    assert _C.fold_structures(graph) == 2
    FileCheck().check_not("aten::append").check("prim::ListConstruct") \
        .check("aten::cat").run(str(graph))
    check_same(scripted, graph, (3, 4))


def loop_list_fn(x, n: int):
    parts: List[torch.Tensor] = []
    for i in range(n):
        parts.append(x * float(i))
    return torch.stack(parts)


def stored_list_fn(x):
    parts: List[torch.Tensor] = [x]
    nested: List[List[torch.Tensor]] = [parts]
    parts.append(x + 1.0)
    return torch.cat(nested[0])


def test_lists_appended_in_loops_or_stored_elsewhere_are_left_alone():
    for fn in (loop_list_fn, stored_list_fn):
        _, graph = scripted_graph(fn)
        before = str(graph)
        assert _C.fold_structures(graph) == 0
        assert str(graph) == before

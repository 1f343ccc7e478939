"""functionalize_input_writes: in-place writes into graph inputs become functional values and
blade::write_back nodes; the graph then computes the same results and leaves the same values
in the caller's tensors. Writes it does not handle stay."""
from typing import List

import torch
from torch.testing import FileCheck

import blade  # noqa: F401  (registers blade::write_back)
from blade import _C
from test_fold_structures import run_graph, scripted_graph


def check_same_writes(scripted, graph, *shapes):
    """The graph and the scripted function give the same results and leave the same values
    in their inputs."""
    for _ in range(2):
        inputs = [torch.randn(*s) for s in shapes]
        mine = [t.clone() for t in inputs]
        torch.testing.assert_close(run_graph(graph, *mine), scripted(*inputs))
        for got, want in zip(mine, inputs):
            torch.testing.assert_close(got, want)


def add_then_read(x, y):
    x.add_(y)
    return x * 2.0


def slice_copy(cache, new):
    cache[:, 2:4] = new
    return cache.sum(1)


def select_fill_and_twice(x):
    x[0].fill_(1.5)
    x.mul_(3.0)
    return torch.tanh(x)


def returns_the_write(x):
    return x.relu_()


def test_writes_into_inputs_become_write_backs():
    for fn, shapes in ((add_then_read, [(4, 5), (4, 5)]), (slice_copy, [(3, 6), (3, 2)]),
                       (select_fill_and_twice, [(3, 4)]), (returns_the_write, [(6,)])):
        scripted, graph = scripted_graph(fn)
        assert _C.functionalize_input_writes(graph) >= 1, fn.__name__
        FileCheck().check("blade::write_back").check_not("aten::add_") \
            .check_not("aten::copy_").check_not("aten::fill_").check_not("aten::mul_") \
            .check_not("aten::relu_").run(str(graph))
        check_same_writes(scripted, graph, *shapes)


def test_later_reads_take_the_new_value():
    scripted, graph = scripted_graph(add_then_read)
    _C.functionalize_input_writes(graph)
    # the product reads the sum, not the input: both can join one engine
    total = next(n for n in graph.nodes() if n.kind() == "aten::add")
    product = next(n for n in graph.nodes() if n.kind() == "aten::mul")
    assert product.inputsAt(0) == total.output(), str(graph)


def test_a_second_write_reads_the_first_and_replaces_its_write_back():
    scripted, graph = scripted_graph(select_fill_and_twice)
    _C.functionalize_input_writes(graph)
    FileCheck().check_count("blade::write_back", 1, exactly=True).run(str(graph))
    check_same_writes(scripted, graph, (3, 4))


def read_between_writes(x, y):
    x.add_(1.0)
    z = y * 2.0                      # another input: taken to share no memory with x
    x.mul_(2.0)
    return z


def read_of_a_view_between_writes(x):
    row = x[0]
    x.add_(1.0)
    z = row * 2.0                    # a view made before: reads x, so its write-back stays
    x.mul_(2.0)
    return z


def test_write_back_goes_when_nothing_reads_the_tensor_between():
    # The input guard admits no y that shares memory with x (ral/guard.h), so the read of y
    # does not keep the first write-back.
    scripted, graph = scripted_graph(read_between_writes)
    _C.functionalize_input_writes(graph)
    FileCheck().check_count("blade::write_back", 1, exactly=True).run(str(graph))
    check_same_writes(scripted, graph, (5,), (5,))
    scripted, graph = scripted_graph(read_of_a_view_between_writes)
    _C.functionalize_input_writes(graph)
    FileCheck().check_count("blade::write_back", 2, exactly=True).run(str(graph))
    check_same_writes(scripted, graph, (3, 5))


def view_kept(x):
    x.add_(1.0)
    return x.view(-1)


def test_views_after_the_write_stay_views_of_the_input():
    scripted, graph = scripted_graph(view_kept)
    _C.functionalize_input_writes(graph)
    x = torch.randn(2, 3)
    out = run_graph(graph, x)
    assert out.data_ptr() == x.data_ptr()


def metadata_write(x):
    x.unsqueeze_(0)
    return x


def write_in_branch(x, flag: bool):
    if flag:
        x.add_(1.0)
    return x


def write_into_a_list_element(xs: List[torch.Tensor]):
    xs[0].add_(1.0)
    return xs[0]


def test_writes_it_does_not_handle_stay():
    for fn, op in ((metadata_write, "aten::unsqueeze_"), (write_in_branch, "aten::add_"),
                   (write_into_a_list_element, "aten::add_")):
        scripted, graph = scripted_graph(fn)
        assert _C.functionalize_input_writes(graph) == 0, fn.__name__
        FileCheck().check(op).check_not("blade::write_back").run(str(graph))


class RunningMean(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.zeros(4))

    def forward(self, x):
        self.mean.mul_(0.9).add_(x.mean(0) * 0.1)
        return x - self.mean


def test_writes_into_module_attributes_become_write_backs():
    model = RunningMean()
    frozen = torch.jit.freeze(torch.jit.script(model.eval()))
    graph = frozen.graph.copy()
    assert _C.functionalize_input_writes(graph) == 2
    FileCheck().check("prim::GetAttr[name=\"mean\"]").check("blade::write_back") \
        .check_not("aten::add_").run(str(graph))
    x = torch.randn(3, 4)
    reference = RunningMean()
    want = reference(x)
    got = torch._C._create_function_from_graph("f", graph)(frozen._c, x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(frozen.mean, reference.mean)

"""functionalize_input_writes: in-place writes into graph inputs become functional values and
blade::write_back nodes; the graph then computes the same results and leaves the same values
in the caller's tensors. Writes it does not handle stay."""
from typing import List, Optional

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


def copy_into(x, y):
    x.copy_(y * 2.0)
    return x.sum(1)


def fill_and_twice(x):
    x.fill_(1.5)
    x.mul_(3.0)
    return torch.tanh(x)


def returns_the_write(x):
    return x.relu_()


def test_writes_into_inputs_become_write_backs():
    for fn, shapes in ((add_then_read, [(4, 5), (4, 5)]), (copy_into, [(3, 6), (3, 6)]),
                       (fill_and_twice, [(3, 4)]), (returns_the_write, [(6,)])):
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
    product = next(n for n in graph.nodes() if n.kind() == "aten::mul")
    read = product.inputsAt(0).node()   # the sum, cast to x's dtype
    assert read.kind() == "aten::type_as" and read.inputsAt(0).node().kind() == "aten::add", \
        str(graph)


def test_a_second_write_reads_the_first_and_replaces_its_write_back():
    scripted, graph = scripted_graph(fill_and_twice)
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


def slice_write(cache, new):
    cache[:, 2:4] = new              # eager writes two columns: a functional copy writes all
    return cache.sum(1)


def index_put_write(x, i, v):
    x.index_put_((i,), v)            # likewise: a few elements
    return x.sum()


def test_writes_it_does_not_handle_stay():
    for fn, op in ((metadata_write, "aten::unsqueeze_"), (write_in_branch, "aten::add_"),
                   (write_into_a_list_element, "aten::add_"), (slice_write, "aten::copy_"),
                   (index_put_write, "aten::index_put_")):
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
    FileCheck().check("prim::GetAttr[name=\"mean\"]").check_not("aten::add_(") \
        .check("blade::write_back").run(str(graph))
    x = torch.randn(3, 4)
    reference = RunningMean()
    want = reference(x)
    got = torch._C._create_function_from_graph("f", graph)(frozen._c, x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(frozen.mean, reference.mean)


# Cases a review found giving wrong values in a first version: each against eager.

def copy_then_update(x, y):
    y.copy_(x)                       # y holds x's old values, not a view of x
    x.add_(1.0)
    return y * 1.0


def view_read_after_the_next_write(x):
    x.add_(1.0)
    v = x[0]
    x.mul_(2.0)                      # v sees this write in eager
    return v + 0.0


def second_write_reads_an_old_view(x):
    r0 = x[0]
    x.add_(1.0)
    x[1].add_(r0)                    # r0 reads x after the first write
    return x * 1.0


def write_into_an_old_view(x):
    r = x[1]
    x.add_(1.0)
    r.mul_(2.0)                      # a view taken before the first write
    return x * 1.0


def comparison_in_place(x):
    x.gt_(0.0)                       # x stays float
    return x + 1.5


def test_reviewed_cases_give_eagers_values():
    for fn, shapes in ((copy_then_update, [(3, 4), (3, 4)]),
                       (view_read_after_the_next_write, [(3, 4)]),
                       (second_write_reads_an_old_view, [(3, 4)]),
                       (write_into_an_old_view, [(3, 4)]),
                       (comparison_in_place, [(3, 4)])):
        scripted, graph = scripted_graph(fn)
        assert _C.functionalize_input_writes(graph) >= 1, fn.__name__
        torch._C._jit_pass_lint(graph)
        check_same_writes(scripted, graph, *shapes)


def square_after_a_branch(x, y, flag: bool):
    x.add_(1.0)
    if flag:
        y = y * 2.0
    x.mul_(x)                        # reads x: the first write-back must stay
    return x + y


def narrow_int_add(x, y):
    x.add_(y)                        # int8 += int32 wraps around in int8
    return x * 3


def test_writes_around_branches_and_narrow_integers_give_eagers_values():
    scripted, graph = scripted_graph(square_after_a_branch)
    _C.functionalize_input_writes(graph)
    for flag in (True, False):
        x, y = torch.randn(5), torch.randn(5)
        mine = x.clone()
        torch.testing.assert_close(run_graph(graph, mine, y, flag), scripted(x, y, flag))
        torch.testing.assert_close(mine, x)
    scripted, graph = scripted_graph(narrow_int_add)
    _C.functionalize_input_writes(graph)
    x = torch.randint(-128, 127, (16,), dtype=torch.int8)
    y = torch.randint(0, 1000, (16,), dtype=torch.int32)
    mine = x.clone()
    torch.testing.assert_close(run_graph(graph, mine, y), scripted(x, y))
    torch.testing.assert_close(mine, x)


def masked_twos(y, mask: Optional[torch.Tensor]):
    if mask is not None:             # as an attention decomposition branches on its mask
        y = y.masked_fill(mask, 2.0)
    return y


def read_after_a_branch_on_another_input(x, mask):
    x.add_(1.0)
    y = masked_twos(torch.zeros(3), mask)   # inlined: a branch that reads only the mask
    return x * 2.0 + y.sum()


def read_after_a_branch_reading_it(x, flag: bool):
    x.add_(1.0)
    y = x
    if flag:
        y = x * 3.0
    return x * 2.0 + y


def test_reads_after_a_branch_that_leaves_the_tensor_alone_take_the_new_value():
    """A branch that neither reads nor writes %x (only other inputs, the guard's promise
    says they share no memory with x) does not stop the reads after it from taking the new
    value, so the write's compute and those reads can join one engine; one that reads %x
    does."""
    scripted, graph = scripted_graph(read_after_a_branch_on_another_input)
    torch._C._jit_pass_inline(graph)
    _C.functionalize_input_writes(graph)
    product = next(n for n in graph.nodes() if n.kind() == "aten::mul")
    assert product.inputsAt(0).node().kind() == "aten::type_as", str(graph)
    for mask in (torch.tensor([True, False, True]), torch.tensor([False, True, True])):
        x = torch.randn(3)
        mine = x.clone()
        torch.testing.assert_close(run_graph(graph, mine, mask), scripted(x, mask))
        torch.testing.assert_close(mine, x)
    scripted, graph = scripted_graph(read_after_a_branch_reading_it)
    _C.functionalize_input_writes(graph)
    product = next(n for n in graph.nodes() if n.kind() == "aten::mul" and
                   n.owningBlock() == graph.block())
    assert product.inputsAt(0) == next(graph.inputs()), str(graph)
    for flag in (True, False):
        x = torch.randn(4)
        mine = x.clone()
        torch.testing.assert_close(run_graph(graph, mine, flag), scripted(x, flag))
        torch.testing.assert_close(mine, x)


def read_through_a_list(x, ys: List[torch.Tensor]):
    x.add_(1.0)
    return ys[0] * 2.0               # ys[0] may be x: the guard does not look into lists


def test_tensors_in_list_inputs_may_share_memory_with_written_ones():
    scripted, graph = scripted_graph(read_through_a_list)
    _C.functionalize_input_writes(graph)
    x = torch.randn(4)
    mine, theirs = x.clone(), x.clone()
    torch.testing.assert_close(run_graph(graph, mine, [mine]), scripted(theirs, [theirs]))


def resize_input(x):
    x.resize_(2)
    return x


def test_writes_that_change_sizes_or_storage_stay():
    scripted, graph = scripted_graph(resize_input)
    assert _C.functionalize_input_writes(graph) == 0

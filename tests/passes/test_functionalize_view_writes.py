"""functionalize_view_writes: writes into slices/selects of fresh tensors become slices and
a cat; writes it cannot prove safe stay. Same results before and after."""
import torch
from torch.testing import FileCheck

from blade import _C
from test_fold_structures import check_same, scripted_graph


def slice_write(x):
    y = x * 2.0
    y[:, 1:3] = torch.tanh(x[:, :2])
    return y + 1.0


def select_write(x):
    y = torch.exp(x)
    y[0] = y[1] * 3.0
    return y / y.sum(dim=0, keepdim=True)


def open_slice_fill(x):
    y = x - 1.0
    y[2:].fill_(0.5)
    return y * x


def test_writes_through_views_become_cat_of_slices():
    for fn, write in ((slice_write, "aten::copy_"), (select_write, "aten::copy_"),
                      (open_slice_fill, "aten::fill_")):
        scripted, graph = scripted_graph(fn)
        FileCheck().check(write).run(str(graph))
        assert _C.functionalize_view_writes(graph) == 1, fn.__name__
        FileCheck().check_not(write).check("aten::cat").run(str(graph))
        check_same(scripted, graph, (4, 6))


def write_into_input(x):
    x[:, 0] = 0.0                    # the caller's tensor changes: must stay
    return x * 2.0


def view_read_after_write(x):
    y = x * 2.0
    row = y[1]
    y[1] = row + 5.0
    return row * 1.0                 # `row` sees the write in eager


def negative_bounds(x):
    y = x * 2.0
    y[:, -2:] = 0.0
    return y


def test_writes_it_cannot_prove_safe_stay():
    for fn in (write_into_input, view_read_after_write, negative_bounds):
        scripted, graph = scripted_graph(fn)
        assert _C.functionalize_view_writes(graph) == 0, fn.__name__
        FileCheck().check("aten::copy_").run(str(graph))

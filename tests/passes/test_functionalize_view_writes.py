"""functionalize_view_writes: writes into slices/selects of fresh tensors become slices and
a cat; writes it cannot prove safe stay. Same results before and after."""
import torch
from torch.testing import FileCheck

import blade
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


def writes_through_several_slices(x):
    y = torch.zeros_like(x)
    y[:2, :3] = 1.0
    y[2:, :3] = 2.0                  # a view of y taken after the first write
    y[:, 3:] = 3.0
    return y * x


def test_writes_through_several_slices_of_one_tensor_are_rewritten_in_turn():
    scripted, graph = scripted_graph(writes_through_several_slices)
    assert _C.functionalize_view_writes(graph) == 3
    FileCheck().check_not("aten::copy_").check_not("aten::fill_").run(str(graph))
    check_same(scripted, graph, (4, 6))


class ShiftedWindowMask(torch.nn.Module):
    """Swin's attention mask: writes through slices with negative bounds into a fresh
    tensor, placed only once the types give the tensor's size."""

    def forward(self, x):
        mask = x.new_zeros((8, 8))
        h_slices = ((0, -4), (-4, -2), (-2, 8))
        count = 0
        for h in h_slices:
            for w in h_slices:
                mask[h[0]:h[1], w[0]:w[1]] = count
                count += 1
        return x + mask.view(2, 4, 2, 4).permute(0, 2, 1, 3).reshape(4, 16)


def test_writes_through_negative_bounds_compile_once_types_place_them():
    from graph_runner import run_pass
    from helpers import run_compiled

    x = torch.randn(4, 16)
    before, rewritten, after, _ = run_pass(ShiftedWindowMask(), (x,),
                                           "functionalize_typed_view_writes")
    assert "aten::copy_" in before and rewritten == 9, before
    assert "aten::copy_" not in after
    for config in (None, blade.Config(dynamic=True)):
        _, report = run_compiled(ShiftedWindowMask(), (x,), config)
        assert report.coverage == 1.0, str(report)

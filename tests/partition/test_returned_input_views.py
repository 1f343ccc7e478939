"""Views of the caller's tensors that the model returns as they are are metadata: made as
in eager, aliasing the inputs, counted apart from the tensor ops (Report.input_views),
never clustered (blade.partition.clustering.returned_input_views)."""
import io

import pytest
import torch

import blade
from helpers import assert_same, run_compiled


class OnlyViews(torch.nn.Module):
    def forward(self, x):
        return (x.view(4, -1).t(), x.diagonal(), x.as_strided((2, 2), (1, 2), 1),
                x.unfold(0, 2, 1), x[1:, :3])


class ViewBesideCompute(torch.nn.Module):
    def forward(self, x):
        return x.t(), torch.relu(x) * 2


class ViewAlsoComputedOn(torch.nn.Module):
    def forward(self, x):
        v = x.t()
        return v, v.exp()


class WrittenView(torch.nn.Module):
    def forward(self, x):
        v = x.view(-1)
        v.add_(1)
        return v


class SizedView(torch.nn.Module):
    def forward(self, x):
        return x.view(x.size(0), -1)


def _optimize(model, inputs, config=None):
    optimized = blade.optimize(model, inputs, config)
    return optimized, blade.report(optimized)


class ShapeFreeViews(torch.nn.Module):
    def forward(self, x):
        return x.t(), x.diagonal(), x[1:], x.unsqueeze(0).expand(2, -1, -1)


def _aliases_as_eager(optimized, model, x, row_slice: int):
    expected, actual = model(x.clone()), optimized(x)
    assert_same(actual, expected)
    for out in actual:  # each output is a view of x, as in eager
        assert out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    actual[row_slice].fill_(7.0)  # x[1:...]: a write through an output is seen in the input, as in eager
    assert float(x[1, 0]) == 7.0


def test_a_model_of_views_of_its_inputs_alone_aliases_them_with_nothing_to_compile():
    x = torch.randn(6, 6)
    optimized, report = _optimize(OnlyViews(), (x.clone(),))
    assert report.total_ops == 0 and report.input_views == 7, str(report)  # x[1:, :3]: 2
    assert not report.unsupported and not report.clusters, str(report)
    assert "views of inputs returned as they are: 7" in str(report)
    _aliases_as_eager(optimized, OnlyViews(), x, 4)


def test_views_of_inputs_alone_with_dynamic_dims_alias_them_on_every_size():
    optimized, report = _optimize(ShapeFreeViews(), (torch.randn(6, 7),),
                                  blade.Config(dynamic=True))
    assert report.total_ops == 0 and report.input_views == 5, str(report)
    for size in ((6, 7), (8, 8), (3, 5)):
        _aliases_as_eager(optimized, ShapeFreeViews(), torch.randn(*size), 2)
    assert blade.report(optimized).guard_fallbacks == 0


def test_a_view_returned_beside_computed_results_leaves_the_rest_compiled_whole():
    x = torch.randn(4, 5)
    optimized, report = run_compiled(ViewBesideCompute(), (x,))
    assert report.coverage == 1.0 and report.input_views == 1, str(report)
    t, _ = optimized(x)
    t.add_(1)
    assert torch.equal(t, x.t())  # the returned view still aliases the input


def test_a_view_that_compiled_ops_also_read_is_counted_with_them():
    optimized, report = run_compiled(ViewAlsoComputedOn(), (torch.randn(4, 5),))
    assert report.coverage == 1.0 and report.input_views == 0, str(report)


def test_a_view_written_into_is_not_metadata_alone():
    x = torch.randn(3, 4)
    optimized, report = _optimize(WrittenView(), (x.clone(),))
    assert report.input_views == 0 and report.total_ops == 2, str(report)
    y = x.clone()
    assert_same(optimized(y), WrittenView()(x.clone()))
    assert torch.equal(y, x + 1)


def test_dynamic_sizes_of_a_returned_view_are_read_per_call():
    optimized, report = _optimize(SizedView(), (torch.randn(2, 3, 4),),
                                  blade.Config(dynamic=True))
    assert report.input_views == 1 and report.total_ops == 0, str(report)
    x = torch.randn(5, 2, 2)
    assert optimized(x).shape == (5, 4)


def test_the_count_survives_save_and_load():
    optimized, _ = _optimize(ViewBesideCompute(), (torch.randn(4, 5),))
    buffer = io.BytesIO()
    torch.jit.save(optimized, buffer)
    buffer.seek(0)
    assert blade.report(torch.jit.load(buffer)).input_views == 1


class ListAndTensorOperandViews(torch.nn.Module):
    def forward(self, x):
        first, second, third = torch.tensor_split(x, 3, dim=1)
        return torch.narrow(x, dim=1, start=torch.tensor(1), length=2), first, second, third


class ListElements(torch.nn.Module):
    def forward(self, x):
        split = torch.tensor_split(x, 3, dim=1)
        return split[0], split[2]


def test_elements_of_a_split_and_views_with_constant_tensor_operands_are_metadata():
    x = torch.randn(4, 6)
    optimized, report = _optimize(ListAndTensorOperandViews(), (x,))
    # narrow: the split returns a list and its unpacking is plumbing, neither a tensor op.
    assert report.total_ops == 0 and report.input_views == 1, str(report)
    assert not report.unsupported, str(report)
    results = optimized(x)
    assert_same(results, ListAndTensorOperandViews()(x))
    assert all(r.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
               for r in results)
    optimized, report = _optimize(ListElements(), (x,))
    assert report.total_ops == 0 and report.input_views == 2, str(report)  # the two items
    assert_same(optimized(x), ListElements()(x))


class UnsafeView(torch.nn.Module):
    def forward(self, x):
        return torch.ops.aten._unsafe_view(x, [x.size(0) * x.size(1)])


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_view_whose_schema_does_not_say_so_still_aliases_its_input(dynamic):
    """_unsafe_view's schema promises a fresh tensor, but eager returns a view."""
    x = torch.randn(3, 4)
    optimized, report = _optimize(UnsafeView(), (x,), blade.Config(dynamic=dynamic))
    assert report.total_ops == 0 and report.input_views == 1, str(report)
    assert optimized(x).data_ptr() == x.data_ptr()

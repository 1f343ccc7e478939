"""Scatters: index_put, scatter, scatter_add, slice_scatter and select_scatter compile
(Torch-MLIR's stablehlo.scatter, lowered by blade/codegen/linalg/scatters.py), and so do
the reducing scatters (partition/converters/scatter.py builds their stablehlo.scatter); all give
eager's results, repeated indices included; an index outside the operand runs the fallback,
which raises PyTorch's error or wraps a negative index as PyTorch does."""
import pytest
import torch

import blade
from helpers import Lambda, assert_ran_compiled, assert_same, assert_same_values, run_compiled

aten = torch.ops.aten

TRACE = blade.Config(allow_tracing=True, cache_dir="off")
ROWS = torch.tensor([0, 4, 2, 4])  # row 4 twice: accumulation must see both


def _x():
    return torch.randn(5, 6)


# case -> (function, its inputs)
CASES = {
    "index_put": (lambda x, v, i: x.index_put((i,), v * 2),
                  lambda: (_x(), torch.randn(4, 6), ROWS)),
    "index_put_accumulate": (lambda x, v, i: x.index_put((i,), v, accumulate=True) + 1,
                             lambda: (_x(), torch.randn(4, 6), ROWS)),
    "index_put_two_dims": (lambda x, v, i: x.index_put((i, i), v, accumulate=True) * 2,
                           lambda: (_x(), torch.randn(4), ROWS)),
    "scatter_src": (lambda x, v, i: x.scatter(0, i, v * 3),
                    lambda: (_x(), torch.randn(2, 6),
                             torch.tensor([[0, 1, 2, 3, 4, 0], [4, 3, 2, 1, 0, 1]]))),
    "scatter_value": (lambda x, i: (x + 1).scatter(1, i, 2.5),
                      lambda: (_x(), torch.tensor([[0, 5], [1, 4], [2, 3], [3, 2], [4, 1]]))),
    "scatter_add": (lambda x, v, i: x.scatter_add(0, i, v) * 2,
                    lambda: (_x(), torch.randn(2, 6),
                             torch.tensor([[0, 0, 1, 1, 2, 2], [0, 0, 0, 4, 4, 4]]))),
    "scatter_reduce_float": (
        lambda x, v, i: tuple(x.scatter_reduce(0, i, v, reduce, include_self=include)
                              for reduce in ("sum", "prod", "amax", "amin", "mean")
                              for include in (True, False)),
        lambda: (_x(), torch.randn(3, 6), torch.tensor([[0, 0, 1, 1, 2, 2], [0, 0, 0, 4, 4, 4],
                                                        [4, 3, 2, 1, 0, 0]]))),
    "scatter_reduce_int": (
        lambda x, v, i: tuple(x.scatter_reduce(1, i, v, reduce, include_self=include)
                              for reduce in ("sum", "prod", "amax", "amin", "mean")
                              for include in (True, False)),
        lambda: (torch.randint(-9, 9, (4, 5), dtype=torch.int32),
                 torch.randint(-9, 9, (3, 6), dtype=torch.int32),
                 torch.tensor([[0, 0, 1, 4], [2, 2, 2, 2], [3, 1, 3, 1]]))),
    "scatter_reduce_op": (
        lambda x, v, i: (x.scatter(1, i, v, reduce="multiply"), x.scatter(1, i, 1.5, reduce="add")),
        lambda: (_x(), torch.randn(5, 4), torch.randint(0, 6, (5, 4)))),
    "slice_scatter": (lambda x, v: torch.slice_scatter(x * 2, v, dim=1, start=1, end=5, step=2),
                      lambda: (_x(), torch.randn(5, 2))),
    "select_scatter": (lambda x, v: torch.select_scatter(x - 1, v, 0, 3),
                       lambda: (_x(), torch.randn(6))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_scatters_compile_and_give_eagers_results(case):
    fn, inputs = CASES[case]
    torch.manual_seed(0)
    _, report = run_compiled(Lambda(fn), inputs(), TRACE, atol=1e-6)
    assert report.compiled_ops == report.total_ops, str(report)


def test_reducing_scatters_propagate_nan_as_eager():
    x = torch.tensor([[1.0, float("nan")], [2.0, 3.0]])
    updates = torch.tensor([[float("nan"), 5.0], [0.5, -1.0]])
    index = torch.tensor([[0, 0], [0, 1]])
    model = Lambda(lambda x, v, i: (x.scatter_reduce(0, i, v, "amax"),
                                    x.scatter_reduce(0, i, v, "amin", include_self=False)))
    optimized = blade.optimize(model, (x, updates, index), TRACE)
    for got, want in zip(optimized(x, updates, index), model(x, updates, index)):
        assert_same_values(got, want)
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops, str(report)
    with pytest.raises(RuntimeError, match="out of bounds|out of range"):
        optimized(x, updates, torch.tensor([[0, 0], [0, 2]]))


class IndexPut(torch.nn.Module):
    def forward(self, x, rows, values):
        return x.index_put((rows,), values, accumulate=True) * 2


def test_an_index_outside_the_operand_runs_the_fallback():
    model = IndexPut()
    x, values = torch.randn(5, 3), torch.randn(2, 3)
    optimized, _ = run_compiled(model, (x, torch.tensor([1, 3]), values),
                                blade.Config(cache_dir="off"))
    with torch.no_grad():
        # A negative index: PyTorch wraps it; the compiled loop reports it and the
        # fallback gives PyTorch's answer.
        negative = torch.tensor([-1, 3])
        assert_same(optimized(x, negative, values), model(x, negative, values))
        with pytest.raises((IndexError, RuntimeError), match="out of bounds|out of range"):
            optimized(x, torch.tensor([1, 5]), values)
    report = blade.report(optimized)
    assert report.runtime_fallbacks == 2, str(report)


class MaskedWrites(torch.nn.Module):
    """`x[mask] = v` in a scripted model (index_put_ on a fresh tensor): one value, one
    per column for a row mask, and an accumulating index_put by an element mask."""

    def forward(self, x, mask, rows, column_values):
        y = x * 2.0
        y[mask] = -1.0
        z = x + 1.0
        z[rows] = column_values
        w = torch.index_put(x * 1.0, (mask,), torch.tensor(0.5), accumulate=True)
        return y, z, w


def test_writes_by_a_boolean_mask_compile_as_selects():
    model = MaskedWrites()
    x = torch.randn(5, 6)
    x[0, 0] = -0.0   # unselected (x > 0.2 is false there): w's -0.0 must stay -0.0
    inputs = (x, x > 0.2, torch.tensor([True, False, True, True, False]), torch.randn(6))
    optimized, report = run_compiled(model, inputs, rtol=0, atol=0)
    assert report.compiled_ops == report.total_ops and not report.unsupported, str(report)
    for _ in range(3):   # other masks through the same engine
        x = torch.randn(5, 6)
        other = (x, x < 0, torch.rand(5) > 0.5, torch.randn(6))
        for got, want in zip(optimized(*other), model(*other)):
            assert_same_values(got, want, 0, 0)
            assert torch.equal(torch.signbit(got), torch.signbit(want))


class MaskedRows(torch.nn.Module):
    def __init__(self, accumulate=False):
        super().__init__()
        self.accumulate = accumulate

    def forward(self, x, mask, values):
        return aten.index_put(x * 1.0, [mask], values, self.accumulate) + 1


@pytest.mark.parametrize("accumulate", [False, True])
def test_a_row_per_selected_position_compiles_and_a_wrong_count_raises(accumulate):
    model = MaskedRows(accumulate)
    x = torch.rand(5, 4)
    mask = torch.tensor([True, False, True, True, False])
    values = torch.rand(3, 4)
    optimized = blade.optimize(model, (x, mask, values))
    other = torch.tensor([False, True, True, False, True])
    for call in ((x, mask, values), (torch.rand(5, 4), other, torch.rand(3, 4))):
        assert_same_values(optimized(*call), model(*call), 0, 0)
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops, str(report)
    four = torch.tensor([True, True, True, True, False])
    with pytest.raises(RuntimeError, match="shape mismatch"):
        model(x, four, values)
    # TorchScript's raise: torch.jit.Error, with the shapes in its message.
    with pytest.raises(torch.jit.Error, match=r"shape mismatch.*\[3, 4\].*select 3 positions"):
        optimized(x, four, values)


def test_a_mask_over_every_dim_takes_one_value_per_selected_element():
    model = MaskedRows()
    x = torch.rand(2, 3, 4, 5)
    mask = torch.zeros(2, 3, 4, 5, dtype=torch.bool)
    mask[0, 1, 2, 3] = mask[1, 0, 1, 2] = mask[1, 2, 3, 4] = True
    values = torch.tensor([1.0, 2.0, 3.0])
    optimized = blade.optimize(model, (x, mask, values))
    assert_same_values(optimized(x, mask, values), model(x, mask, values), 0, 0)
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops, str(report)


def test_one_row_of_values_goes_to_every_selected_position():
    model = MaskedRows()
    x, values = torch.rand(5, 4), torch.rand(1, 4)
    optimized = blade.optimize(model, (x, torch.tensor([True, False, True, True, False]),
                                       values))
    for mask in (torch.tensor([True, False, True, True, False]), torch.ones(5, dtype=torch.bool)):
        assert_same_values(optimized(x, mask, values), model(x, mask, values), 0, 0)


class MaskedCopy(torch.nn.Module):
    """Rows whose count is the mask's own: `y[m] = x[m] * 2` takes as many as m selects."""

    def forward(self, x, m):
        y = x * 1.0
        y[m] = x[m] * 2
        return y + 1


@pytest.mark.parametrize("example", [[1, 0, 1, 1, 0], [0, 0, 1, 0, 0]])
def test_rows_selected_by_the_same_mask_follow_its_count(example):
    model = torch.jit.script(MaskedCopy())
    x = torch.rand(5, 4)
    optimized = blade.optimize(model, (x, torch.tensor(example).bool()))
    for mask in ([1, 1, 1, 1, 0], [0, 0, 0, 0, 0], example):
        m = torch.tensor(mask).bool()
        assert_same_values(optimized(x, m), model(x, m), 0, 0)


def test_a_large_mask_gathers_its_rows_through_a_kernel_call_of_cumsum():
    # The rows' order is a cumsum over the positions: PyTorch's linear scan beyond short ones.
    model = MaskedRows()
    x, mask = torch.rand(2048, 4), torch.rand(2048) > 0.5
    values = torch.rand(int(mask.sum()), 4)
    optimized = blade.optimize(model, (x, mask, values))
    assert_same_values(optimized(x, mask, values), model(x, mask, values), 0, 0)
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops, str(report)
    assert sum(c.kernel_calls for c in report.clusters) == 1, str(report)

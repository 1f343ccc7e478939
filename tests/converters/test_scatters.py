"""Scatters: index_put, scatter, scatter_add, slice_scatter and select_scatter compile
(Torch-MLIR's stablehlo.scatter, lowered by blade/codegen/linalg/scatters.py) and give
eager's results, repeated indices included; an index outside the operand runs the fallback,
which raises PyTorch's error or wraps a negative index as PyTorch does."""
import pytest
import torch

import blade
from helpers import Lambda, assert_same, run_compiled

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

"""Sorting: aten::sort, argsort and topk compile through Torch-MLIR's stablehlo.sort into
PyTorch's own sort and topk kernels (codegen/kernels/sort.py), so values, indices,
ties and NaN come out exactly as eager gives them, for every dtype the kernel takes."""
import pytest
import torch

import blade
from helpers import Lambda, assert_ran_compiled, compiled_whole

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
          torch.int64]

OPS = {
    "sort": lambda x: torch.sort(x, dim=1),
    "sort_descending_last": lambda x: torch.sort(x, dim=-1, descending=True),
    "sort_first": lambda x: torch.sort(x, dim=0),
    "argsort": lambda x: torch.argsort(x, dim=-1, descending=True),
    "topk": lambda x: torch.topk(x, 3, dim=-1),
    "topk_smallest": lambda x: torch.topk(x, 2, dim=1, largest=False),
    "topk_values_only": lambda x: torch.topk(x, 4, dim=-1).values * 2,
}


def sample(dtype, shape=(4, 6, 9)):
    # Few distinct values: ties everywhere, whose order eager's kernels decide.
    torch.manual_seed(0)
    return torch.randint(-3, 4, shape).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d)[6:] for d in DTYPES])
@pytest.mark.parametrize("name", sorted(OPS))
def test_sorts_give_eagers_values_and_indices_ties_included(name, dtype):
    x = sample(dtype)
    _, report = compiled_whole(OPS[name], (x,), rtol=0, atol=0)
    # One kernel call per sort: no loop nest stands in for it.
    assert report.clusters[0].library_calls == 1, str(report)


def test_nan_and_infinities_sort_where_eager_puts_them():
    x = torch.tensor([[3.0, float("nan"), -float("inf"), 1.0, float("inf"), float("nan")],
                      [0.0, -0.0, 2.0, float("nan"), -1.0, 5.0]])
    for fn in (lambda t: torch.sort(t, dim=1), lambda t: torch.sort(t, dim=1, descending=True),
               lambda t: torch.topk(t, 3, dim=1)):
        compiled_whole(fn, (x,), rtol=0, atol=0)


def test_a_sort_between_computations_compiles_into_one_engine():
    def fn(scores, values):
        order = torch.argsort(scores * 2.0 + 1.0, dim=-1, descending=True)
        return torch.gather(values, -1, order).cumsum(-1)

    scores, values = torch.randn(8, 32), torch.randn(8, 32)
    _, report = compiled_whole(fn, (scores, values))
    assert len(report.clusters) == 1, str(report)


def test_a_dynamic_batch_sorts_at_every_size():
    def fn(x):
        values, indices = torch.sort(x, dim=-1, descending=True)
        return values + 1.0, indices

    model = Lambda(fn)
    optimized = blade.optimize(model, (torch.randn(3, 10),),
                               blade.Config(allow_tracing=True, dynamic_dims={0: [0]}))
    for batch in (1, 3, 7):
        x = torch.randn(batch, 10)
        got, want = optimized(x), model(x)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert_ran_compiled(optimized)

"""Reduction family: sums, means, extrema, variance, norms, cumsum; each dtype, two shapes."""
import pytest
import torch

import blade
from helpers import TOLERANCE, Lambda, random_tensor, run_compiled

TRACE = blade.Config(allow_tracing=True)
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
NUMERIC = FLOATS + [torch.int64, torch.int32]

# name -> (fn, dtypes the table allows)
OPS = {
    "sum": (lambda x: x.sum(dim=-1), NUMERIC),
    "sum_keepdim": (lambda x: x.sum(dim=(0, 1), keepdim=True), NUMERIC),
    "sum_all": (lambda x: x.sum(), NUMERIC),
    "cumsum": (lambda x: torch.cumsum(x, dim=1), NUMERIC),
    "amax": (lambda x: x.amax(dim=-1), NUMERIC),
    "amin": (lambda x: x.amin(dim=0, keepdim=True), NUMERIC),
    "mean": (lambda x: x.mean(dim=1), FLOATS),
    "mean_all": (lambda x: x.mean(), FLOATS),
    "logsumexp": (lambda x: torch.logsumexp(x, dim=-1), FLOATS),
    "logsumexp_keepdim": (lambda x: torch.logsumexp(x * 40, dim=(0, 1), keepdim=True), FLOATS),
    "var": (lambda x: x.var(dim=1), FLOATS),
    "std": (lambda x: x.std(dim=-1, keepdim=True), FLOATS),
    "var_mean": (lambda x: torch.var_mean(x, dim=1, correction=0), FLOATS),
    "norm": (lambda x: x.norm(dim=1), FLOATS),
    "vector_norm": (lambda x: torch.linalg.vector_norm(x, ord=2, dim=-1), FLOATS),
}

CASES = [(name, dtype) for name, (_, dtypes) in sorted(OPS.items()) for dtype in dtypes]


@pytest.mark.parametrize("shape", [(6, 10), (2, 5, 7)], ids=["2d", "3d"])
@pytest.mark.parametrize("name,dtype", CASES, ids=[f"{n}-{d}" for n, d in CASES])
def test_reduction(name, dtype, shape):
    torch.manual_seed(0)
    fn = OPS[name][0]
    rtol, atol = TOLERANCE[dtype]
    if dtype in (torch.float16, torch.bfloat16):
        rtol, atol = 5e-2, 1e-1  # sums of many low-precision values
    run_compiled(Lambda(lambda x: fn(x * 1)), (random_tensor(shape, dtype),), TRACE,
                 rtol=rtol, atol=atol)


def test_reduction_with_dtype_argument_is_refused_by_the_validator():
    model = Lambda(lambda x: torch.sum(x * 2, dim=0, dtype=torch.float64))
    report = blade.report(blade.optimize(model, (torch.randn(3, 4),), TRACE))
    reasons = report.unsupported["aten::sum.dim_IntList"].reasons
    assert any("dtype argument is" in r for r in reasons), reasons

"""The vectorizable float32 exp/tanh/erf that replace libm calls in compiled code: accurate
to a few ulp over the whole float range, exact on the special values."""
import pytest
import torch

import blade
from helpers import Lambda

TRACE = blade.Config(allow_tracing=True)
FUNCTIONS = {"exp": torch.exp, "tanh": torch.tanh, "erf": torch.erf}
SPECIALS = [float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 1e-30, -1e-30, 88.7, -88.7,
            88.8, -104.0, 7.9, -7.9, 4.0, -4.0, 3e-4, -3e-4]


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_compiled_math_matches_float64_within_a_few_ulp(name):
    fn = FUNCTIONS[name]
    x = torch.cat([torch.linspace(-110, 100, 400_000), torch.linspace(-6, 6, 400_000),
                   torch.tensor(SPECIALS)]).float()
    optimized = blade.optimize(Lambda(lambda t: fn(t * 1.0)), (x,), TRACE)
    got = optimized(x)
    report = blade.report(optimized)
    assert report.clusters[0].calls == 1 and report.runtime_fallbacks == 0, str(report)
    want = fn(x.double())
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    rounded = want.float()            # what float32 can hold: overflow is inf
    finite = torch.isfinite(rounded)
    assert torch.equal(got[~finite & ~torch.isnan(want)], rounded[~finite & ~torch.isnan(want)])
    normal = finite & (want.abs() > 1.2e-38)
    error = (got.double() - want).abs()[normal] / want.abs()[normal].clamp_min(1e-6)
    assert error.max().item() < 5e-7, (name, error.max().item())

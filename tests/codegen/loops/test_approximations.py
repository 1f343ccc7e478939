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


@pytest.mark.parametrize("scalef", [True, False], ids=["ldexp", "exponent_bits"])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_compiled_math_matches_float64_within_a_few_ulp(name, scalef, monkeypatch):
    # Both ways exp scales by 2**n: ldexp (AVX-512 hosts) and exponent bits (the others).
    from blade.codegen.llvm.native import host_cpu_features
    from blade.codegen.loops import approximations
    if scalef and "avx512f" not in host_cpu_features().split(","):
        pytest.skip("ldexp is used only where the host has vscalefps")
    approximate_math = approximations.approximate_math
    monkeypatch.setattr(approximations, "approximate_math",
                        lambda module, **_: approximate_math(module, scalef=scalef))
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
    if name == "exp":   # flushed to 0 below -87.3 (results under 1.22e-38, never subnormal)
        assert torch.equal(got[x < -87.3], torch.zeros_like(got[x < -87.3]))
    normal = finite & (want.abs() > 1.23e-38)
    error = (got.double() - want).abs()[normal] / want.abs()[normal].clamp_min(1e-6)
    assert error.max().item() < 5e-7, (name, error.max().item())


def test_reciprocal_estimates_only_where_the_division_is_provably_finite():
    """`ninf` (and so the reciprocal estimate) only on divisions whose operands are bounded
    and whose denominator stays away from 0: a polynomial of a clamped input, not a
    model's own x / y."""
    from torch_mlir import ir

    from blade.codegen.loops.approximations import allow_reciprocal
    text = """
    func.func @f(%x: f32, %y: f32) -> (f32, f32, f32) {
      %lo = arith.constant -4.0 : f32
      %hi = arith.constant 4.0 : f32
      %c = arith.constant -0.5 : f32
      %a = arith.maximumf %x, %lo : f32
      %b = arith.minimumf %a, %hi : f32
      %sq = arith.mulf %b, %b : f32
      %q = arith.mulf %sq, %c : f32
      %q1 = arith.addf %q, %c : f32
      %ok = arith.divf %b, %q1 : f32
      %user = arith.divf %x, %y : f32
      %through_zero = arith.divf %b, %b : f32
      return %ok, %user, %through_zero : f32, f32, f32
    }"""
    with ir.Context():
        module = ir.Module.parse(text)
        assert allow_reciprocal(module) == 1
        lines = [line for line in str(module).splitlines() if "arith.divf" in line]
    assert "ninf" in lines[0] and "ninf" not in lines[1] and "ninf" not in lines[2], lines


@pytest.mark.parametrize("exponent", [-2.0, -1.0, -0.5, 0.5, 1.0, 2.0, 3.0, 4.0, 2.5])
def test_power_by_a_constant_matches_eager_without_powf(exponent, tmp_path):
    """x ** c for the small constant exponents ATen special-cases is products, sqrt and a
    division in the compiled loop, not libm's powf per element (which no loop around it
    vectorizes); equal to eager's values within an ulp or two, specials included. Other
    exponents (2.5) keep powf."""
    x = torch.cat([torch.linspace(-50, 50, 100_001),
                   torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"),
                                 1e-20, -1e-20, 3e12])]).float()
    model = Lambda(lambda t: torch.pow(t * 1.0, exponent))
    optimized = blade.optimize(model, (x,), blade.Config(allow_tracing=True,
                                                          dump_dir=str(tmp_path)))
    got, want = optimized(x), model(x)
    report = blade.report(optimized)
    assert report.clusters[0].calls == 1 and report.runtime_fallbacks == 0, str(report)
    llvm = next(tmp_path.glob("*/2_llvm.ll")).read_text()
    assert ("@llvm.pow.f32" in llvm) == (exponent == 2.5), exponent   # powf in the code
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    torch.testing.assert_close(got, want, rtol=3e-7, atol=0.0, equal_nan=True)


@pytest.mark.parametrize("name", ["reciprocal", "quotient"])
def test_division_by_a_square_root_keeps_its_infinities_and_zeros(name):
    """y / sqrt(x) at x = 0 is +-inf and at x = inf is 0 (or NaN for inf / inf), as in
    eager: with `arcp` LLVM would multiply by the reciprocal square root estimate, NaN at
    both (allow_reciprocal leaves such divisions exact)."""
    fn = {"reciprocal": lambda t: 1.0 / torch.sqrt(t * 1.0),
          "quotient": lambda t: (t + 1.0) / torch.sqrt(t * 1.0)}[name]
    x = torch.tensor([0.0, -0.0, float("inf"), 4.0, 1e-30, 3.0, float("nan"), -1.0] * 16)
    optimized = blade.optimize(Lambda(fn), (x,), TRACE)
    got = optimized(x)
    report = blade.report(optimized)
    assert report.clusters[0].calls == 1 and report.runtime_fallbacks == 0, str(report)
    torch.testing.assert_close(got, fn(x), rtol=3e-7, atol=0.0, equal_nan=True)

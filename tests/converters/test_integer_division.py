"""Division-like ops: integer division exact and never trapping, a zero divisor raising as
eager does (the engine reports it and its fallback runs), Python's modulo for remainder, and
comparisons of float constants with int scalars (a Torch-MLIR folding bug worked around)."""
import pytest
import torch

import blade
from helpers import Lambda, assert_ran_compiled, assert_same_values

TRACE = blade.Config(allow_tracing=True)


def _divisions(a, b):
    return (a // b, torch.div(a, b, rounding_mode="floor"),
            torch.div(a, b, rounding_mode="trunc"), torch.fmod(a, b), torch.remainder(a, b),
            torch.remainder(a, -3), torch.fmod(a, 7))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_division_is_compiled_exact_and_a_zero_divisor_raises_as_in_eager(dtype):
    torch.manual_seed(0)
    scale = 2 ** 40 if dtype == torch.int64 else 1  # int64 beyond float64's 2**53
    a = torch.randint(-2 ** 30, 2 ** 30, (6, 16), dtype=dtype) * scale
    b = torch.randint(-9, 10, (6, 16), dtype=dtype)
    b[b == 0] = -1
    model = Lambda(_divisions)
    optimized = blade.optimize(model, (a, b), TRACE)
    for got, want in zip(optimized(a, b), model(a, b)):
        assert got.dtype == want.dtype and torch.equal(got, want)
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops and not report.compile_errors, str(report)

    b[2, 5] = 0
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        model(a, b)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        optimized(a, b)
    assert "integer division by zero" in str(blade.report(optimized))


def test_remainder_has_the_divisors_sign_for_floats_ints_and_scalars():
    torch.manual_seed(0)
    x = torch.randn(5, 8) * 10
    y = torch.randn(5, 8) * 3
    x[0, :4] = torch.tensor([float("inf"), float("nan"), -3.0, 3.0])
    y[0, 4:] = torch.tensor([float("inf"), -float("inf"), 0.0, -2.0])
    ints = torch.randint(-20, 20, (5, 8))
    x[1] = torch.linspace(-3e7, 3e7, 8)  # quotients past float32's 2**24: exact in eager
    y[1] = 0.7

    def fn(x, y, ints):
        return (torch.remainder(x, y), torch.remainder(x, -2.5), torch.remainder(ints, 2.5),
                torch.remainder(ints, y), torch.remainder(ints.bool(), -3), x % 4,
                torch.fmod(x, y), torch.fmod(x, 0.7))

    model = Lambda(fn)
    optimized = blade.optimize(model, (x, y, ints), TRACE)
    for got, want in zip(optimized(x, y, ints), model(x, y, ints)):
        assert_same_values(got, want)
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops and not report.compile_errors, str(report)
    assert report.decomposed.get("aten::remainder.Scalar") == 4, str(report)


def test_threshold_backward_gives_the_promoted_dtype():
    grad = torch.randint(0, 20, (4, 5))
    x = torch.rand(4, 5)
    x[0, 0] = float("nan")
    model = Lambda(lambda g, x: (torch.ops.aten.threshold_backward(g, x, 0.5),
                                 torch.ops.aten.threshold_backward(x * 2, x, 0)))
    optimized = blade.optimize(model, (grad, x), TRACE)
    for got, want in zip(optimized(grad, x), model(grad, x)):
        assert_same_values(got, want)
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops, str(report)


def test_a_float_constant_compared_with_an_int_gives_the_right_mask():
    # Torch-MLIR folds `full_like(x, 2.5) < 0` to all true (it reads the floats' bits as
    # integers); Blade compares with 0.0 instead. Check off: the compiled code itself is right.
    x = torch.randn(3, 4)

    def fn(x):
        full = torch.full_like(x, 2.5)
        return (full < 0) | (x > 9), full.le(2) | (x > 9), torch.full_like(x, 2) < 1

    model = Lambda(fn)
    optimized = blade.optimize(model, (x,), blade.Config(allow_tracing=True,
                                                         check_engines=False))
    for got, want in zip(optimized(x), model(x)):
        assert torch.equal(got, want)
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops, str(report)

"""Elementwise family: each op compiled (not fallen back) and equal to eager, two shapes."""
import pytest
import torch

import blade
from helpers import run_compiled

# Lambdas cannot be scripted: these single-op models are traced.
TRACE = blade.Config(allow_tracing=True)

SHAPES = [((4, 8), (8,)), ((2, 3, 5), (3, 1))]


def binary_ops():
    return {
        "add": lambda x, y: x + y,
        "sub": lambda x, y: x - y,
        "mul": lambda x, y: x * y,
        "div": lambda x, y: x / (y.abs() + 1),
        "add_alpha": lambda x, y: torch.add(x, y, alpha=2.5),
        "add_scalar": lambda x, y: x + 3.0 + y,
        "mul_scalar": lambda x, y: x * 0.5 * y,
        "div_scalar": lambda x, y: x / 4.0 - y,
        "rsub_scalar": lambda x, y: 1.0 - x * y,
        "pow_scalar": lambda x, y: x.abs().pow(1.5) + y,
        "pow_tensor": lambda x, y: (x.abs() + 1).pow(y),
        "maximum": lambda x, y: torch.maximum(x, y),
        "where": lambda x, y: torch.where(x > y, x, y * 2),
        "masked_fill": lambda x, y: x.masked_fill(y > 0, -1.0),
        "compare": lambda x, y: torch.where(x >= 0.1, x, y) + torch.where(x < y, y, x),
    }


def unary_ops():
    return {
        "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
        "gelu": torch.nn.functional.gelu,
        "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
        "exp": torch.exp, "log": lambda x: torch.log(x.abs() + 1e-3),
        "sqrt": lambda x: torch.sqrt(x.abs()), "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.5),
        "neg": torch.neg, "abs": torch.abs, "erf": torch.erf, "silu": torch.nn.functional.silu,
        "clamp": lambda x: torch.clamp(x, -0.5, 0.5),
    }


class Binary(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, y):
        return self.fn(x, y)


class Unary(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x) * 1.0


@pytest.mark.parametrize("shapes", SHAPES, ids=["2d", "3d"])
@pytest.mark.parametrize("name", sorted(binary_ops()))
def test_binary(name, shapes):
    torch.manual_seed(0)
    x, y = torch.randn(*shapes[0]), torch.randn(*shapes[1])
    run_compiled(Binary(binary_ops()[name]), (x, y), TRACE)


@pytest.mark.parametrize("shape", [(16,), (3, 4, 5)], ids=["1d", "3d"])
@pytest.mark.parametrize("name", sorted(unary_ops()))
def test_unary(name, shape):
    torch.manual_seed(0)
    x = torch.randn(*shape)
    run_compiled(Unary(unary_ops()[name]), (x,), TRACE)


# The ops the first tests cover in float32, over the other dtypes the table allows.
from helpers import (TOLERANCE, Lambda, assert_ran_compiled, assert_same_values,  # noqa: E402
                     random_tensor)

F = torch.nn.functional
NUMERIC_OPS = {
    "arith": lambda x, y: (x + y) * y - x,
    "relu_neg_abs": lambda x, y: torch.relu(x) - torch.neg(y).abs(),
    "clamp_max_min": lambda x, y: torch.clamp(torch.maximum(x, y), -2, 2) + torch.minimum(x, y),
    "compare_where": lambda x, y: torch.where(x > y, x, y) + (x == y).to(x.dtype),
}
FLOAT_OPS = {
    "activations": lambda x: F.hardswish(x) + F.hardsigmoid(x) + F.leaky_relu(x, 0.1) + F.elu(x),
    "gelu_silu": lambda x: F.gelu(x) + F.gelu(x, approximate="tanh") + F.silu(x),
    "exp_log": lambda x: torch.exp(x * 0.5) + torch.log1p(x.abs()) + torch.expm1(x * 0.1),
    "trig": lambda x: torch.sin(x) + torch.cos(x) + torch.tanh(x) + torch.atan(x),
    "rounding": lambda x: torch.floor(x) + torch.ceil(x) + torch.round(x) + torch.sign(x),
    "erf_sigmoid": lambda x: torch.erf(x) + torch.sigmoid(x) + torch.rsqrt(x.abs() + 1),
    "isinf_isnan": lambda x: torch.where(torch.isinf(1 / (x * 0)) | torch.isnan(x.log()), x, -x),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int64,
                                   torch.int32], ids=str)
@pytest.mark.parametrize("shape", [(4, 8), (2, 3, 5)], ids=["2d", "3d"])
@pytest.mark.parametrize("name", sorted(NUMERIC_OPS))
def test_numeric_dtypes(name, shape, dtype):
    torch.manual_seed(0)
    x, y = random_tensor(shape, dtype), random_tensor(shape, dtype)
    rtol, atol = TOLERANCE[dtype]
    run_compiled(Lambda(NUMERIC_OPS[name]), (x, y), TRACE, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16,
                                   torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(16,), (3, 4, 5)], ids=["1d", "3d"])
@pytest.mark.parametrize("name", sorted(FLOAT_OPS))
def test_float_dtypes(name, shape, dtype):
    torch.manual_seed(0)
    rtol, atol = TOLERANCE[dtype]
    run_compiled(Lambda(FLOAT_OPS[name]), (random_tensor(shape, dtype),), TRACE, rtol=rtol,
                 atol=max(atol, 1e-5))


@pytest.mark.parametrize("shape", [(4, 8), (2, 3, 5)], ids=["2d", "3d"])
def test_logical_and_casts(shape):
    torch.manual_seed(0)
    x, y = torch.randn(*shape), torch.randn(*shape)

    def fn(x, y):
        m = torch.logical_and(x > 0, y < 0) | torch.logical_not(x > y)
        return torch.where(m, x.to(torch.float64), y.type_as(x).double()), (x * 4).to(torch.int64)

    run_compiled(Lambda(fn), (x, y), TRACE)


def test_integer_true_division_outside_the_dtype_table_is_lowered_by_torch_mlir():
    # The dtype table allows float division only; Torch-MLIR lowers int64 / int64 to a
    # float result, and the engine check proves it.
    x = torch.randint(1, 5, (3, 4))
    _, report = run_compiled(Lambda(lambda x: x / (x + 1)), (x,), TRACE)
    assert report.compiled_ops == report.total_ops, str(report)


def test_xlogy_and_trace_compile_through_decompositions():
    # Neither has a StableHLO lowering in Torch-MLIR; xlogy's zeros and NaNs are PyTorch's.
    x, y = torch.randn(4, 4), torch.rand(4, 4)
    x[0, 0], y[0, 0], y[1, 1] = 0.0, 0.0, float("nan")
    ints = torch.randint(0, 5, (4, 3))

    def fn(x, y, ints):
        return torch.xlogy(x, y), torch.trace(x * 2), torch.trace(ints + 1), torch.xlogy(ints, ints)

    model = Lambda(fn)
    optimized = blade.optimize(model, (x, y, ints), TRACE)
    with torch.no_grad():
        for got, want in zip(optimized(x, y, ints), model(x, y, ints)):
            assert_same_values(got, want)  # NaN in the same places
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops, str(report)
    assert report.decomposed == {"aten::xlogy.Tensor": 2, "aten::trace": 2}, str(report)


def test_isclose_and_isfinite_of_any_dtype_compile():
    from helpers import compiled_whole

    a = torch.tensor([1.0, float("nan"), float("inf"), 2.0, 1e-9])
    b = torch.tensor([1.0 + 1e-6, float("nan"), float("inf"), 2.1, 0.0])
    ints, other_ints = torch.tensor([1, 2, 3]), torch.tensor([1, 3, 3])

    def fn(a, b, ints, other_ints):
        return (torch.isclose(a, b), torch.isclose(a, b, equal_nan=True),
                torch.isclose(a, b, 0.1, 0.0), torch.isclose(ints, other_ints),
                torch.isclose(ints, other_ints, 0.0, 0.0), torch.isclose(a > 1, b > 1),
                torch.isfinite(ints * 2), torch.isfinite(a * 2))

    compiled_whole(fn, (a, b, ints, other_ints))


def test_isfinite_of_complex_numbers_is_eagers():
    z = torch.tensor([complex(float("inf"), 0.0), complex(1.0, 2.0)])
    model = Lambda(lambda z, x: (torch.isfinite(z), x * 2))
    x = torch.randn(3)
    optimized = blade.optimize(model, (z, x), blade.Config(allow_tracing=True))
    assert torch.equal(optimized(z, x)[0], torch.tensor([False, True]))

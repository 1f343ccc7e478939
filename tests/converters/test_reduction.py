"""Reduction family: sums, means, extrema, variance, norms, cumsum; each dtype, two shapes."""
import pytest
import torch

import blade
from helpers import TOLERANCE, Lambda, assert_ran_compiled, compiled_whole, random_tensor, run_compiled

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


def test_reduction_to_a_narrow_integer_dtype_sums_in_int64_and_casts():
    # A float or int64 dtype becomes a cast before the reduction (typed_rewrites.
    # reduction_dtypes); a sum of integers to int32 sums in int64 and casts the sum
    # (the same bits), compiled without a kernel call.
    x = torch.randint(-2 ** 30, 2 ** 30, (3, 4))
    fn = lambda t: (torch.sum(t * 2, dim=0, dtype=torch.int32),  # noqa: E731
                    torch.cumsum(t, 1, dtype=torch.int16), torch.prod(t, 1, dtype=torch.int8))
    _, report = compiled_whole(fn, (x,), rtol=0, atol=0)
    assert not any(c.kernel_calls for c in report.clusters), str(report)


def test_reductions_with_a_dtype_argument_compile_as_a_cast_and_the_reduction():
    x = torch.randn(3, 4)
    ints = torch.randint(-5, 9, (3, 4), dtype=torch.int32)

    def fn(x, ints):
        return (x.sum(1, dtype=torch.float64), x.sum(dtype=torch.float64),
                x.mean(0, dtype=torch.float64), torch.softmax(x, 1, dtype=torch.float64),
                ints.sum(1, dtype=torch.int64), ints.sum(1, dtype=torch.float32),
                torch.log_softmax(x.half(), 1, dtype=torch.float32),
                x.cumsum(1, dtype=torch.float64))

    model = Lambda(fn)
    optimized = blade.optimize(model, (x, ints), TRACE)
    for got, want in zip(optimized(x, ints), model(x, ints)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops, str(report)


def test_max_min_and_arg_reductions_give_the_first_index_and_nan_as_eager():
    # Torch-MLIR's lowering of argmax/max.dim ignores NaN (a wrong index and value where a
    # row holds one); the decomposition gives PyTorch's: NaN and its first index, ties to
    # the first index.
    torch.manual_seed(0)
    x = torch.randn(4, 7)
    x[1, 2] = x[1, 5] = float("nan")
    x[2, :] = 1.0
    ints = torch.randint(0, 3, (4, 7))

    def fn(x, ints):
        return (torch.argmax(x, 1), torch.argmin(x, 0, True), torch.argmax(x),
                torch.argmin(x, keepdim=True), *torch.max(x, 1), *torch.min(x, 0, True),
                torch.argmax(ints, 1), *torch.max(ints, -1))

    model = Lambda(fn)
    optimized = blade.optimize(model, (x, ints), TRACE)
    # The check is off: the compiled code must be right on its own, NaN rows included.
    unchecked = blade.optimize(model, (torch.randn(4, 7), ints),
                               blade.Config(allow_tracing=True, check_engines=False))
    for compiled in (optimized, unchecked):
        for got, want in zip(compiled(x, ints), model(x, ints)):
            assert got.dtype == want.dtype and got.shape == want.shape
            assert torch.equal(got.isnan(), want.isnan()) if got.is_floating_point() else True
            assert torch.equal(got.nan_to_num(), want.nan_to_num())
        report = assert_ran_compiled(compiled)
        assert report.compiled_ops == report.total_ops, str(report)


def test_reductions_of_scalars_and_of_empty_tensors_compile():
    # A 0-d reduction is a copy (typed_rewrites.scalar_reductions: Torch-MLIR's lowering of
    # mean(x, 0, keepdim=True) of a 0-d x crashed the process); a reduce over an empty dim
    # or to an empty result is its init (codegen simplify-degenerate-reductions).
    x, ints, empty = torch.tensor(3.0), torch.tensor(4, dtype=torch.int32), torch.zeros(0, 3)

    def fn(x, ints, empty):
        return (torch.sum(x * 2, 0), torch.mean(x * 2, 0, True), torch.sum(x, dtype=torch.float64),
                torch.sum(ints * 2, 0), torch.amax(x * 2, 0), torch.sum(ints * 2),
                torch.prod(ints + 1), torch.mean(x, -1, True, dtype=torch.float64),
                torch.sum(empty * 2), torch.sum(empty * 2, 0), torch.amax(empty + 1, 1),
                torch.prod(empty * 2, 0))

    compiled_whole(fn, (x, ints, empty))


def test_max_and_argmax_of_a_scalar_along_its_dim():
    x = torch.tensor(3.0)
    compiled_whole(lambda x: (*torch.max(x * 2, 0), torch.argmax(x * 2, 0),
                              torch.argmin(x * 2, 0, True)), (x,))


@pytest.mark.parametrize("length,calls", [(256, 0), (1024, 1)])
def test_a_long_cumsum_calls_the_kernel(length, calls):
    # Compiled, a scan takes time quadratic in its length: beyond 256 PyTorch's kernel runs
    # it, inside the engine.
    x = torch.randint(-5, 6, (3, length)).to(torch.float32)
    _, report = compiled_whole(lambda t: torch.cumsum(t * 2, 1) + 1, (x,), rtol=0, atol=0)
    assert sum(c.kernel_calls for c in report.clusters) == calls, str(report)

"""blade.frontend.typed_rewrites: nodes that Torch-MLIR refused or lowered wrongly for
some dtypes and ranks, written once the types are known as the ops eager computes them
with. Each case is compared with eager and compiled whole; each failed to compile (or
was refused by the engine check) before."""
import pytest
import torch
import torch.nn.functional as F

import blade
from helpers import (Lambda, assert_ran_compiled, assert_same_values, compiled_whole,
                     run_compiled)

aten = torch.ops.aten


def _exact(fn, *inputs):
    return compiled_whole(fn, inputs, rtol=0, atol=0)[1]


def test_float_math_of_integers_casts_them_first():
    torch.manual_seed(0)
    ints = torch.randint(-5, 6, (3, 4))
    compiled_whole(lambda x, y: (aten.erf(x), torch.reciprocal(y), torch.exp(x),
                                 torch.clamp(x, min=-2.5, max=2.5)),
                   (ints, torch.randint(1, 4, (3, 4), dtype=torch.int32)))


def test_narrow_integer_sums_wrap_as_in_eager():
    torch.manual_seed(0)
    x = torch.randint(-100, 100, (3, 400), dtype=torch.int8)
    _exact(lambda x: (torch.sum(x, dim=[], dtype=torch.int32),
                      torch.sum(x, dim=1, dtype=torch.int16),   # wraps past 32767
                      torch.cumsum(x, 1, dtype=torch.int8)), x)


def test_index_select_by_a_0d_index_and_norm_of_a_0d_tensor():
    _exact(lambda x, i: torch.index_select(x, 1, i), torch.randn(3, 4), torch.tensor(2))
    compiled_whole(lambda x: (aten.linalg_vector_norm(x, 3.0, [-1], False),
                              aten.linalg_vector_norm(x, 0, [-1], False),
                              aten.linalg_vector_norm(x, float("inf"), [-1], False)),
                   (torch.tensor(-1.5),))


def test_negative_tensor_indices_count_from_the_end():
    torch.manual_seed(0)
    x = torch.rand(2, 3, 4, 5)
    _exact(lambda x, i, j: (aten.index(x, (None, None, i)), x[:, i, j], x[i]), x,
           torch.tensor([-2, 1, -1]), torch.tensor([-4, 0, 3]))


def test_integer_floor_division_by_a_constant_is_exact_beyond_float64():
    a = torch.tensor([9223372036854775806, -9223372036854775807, 1073741824, -3, -10, 10, 11])
    report = _exact(lambda a: (torch.div(a, 1073741824, rounding_mode="floor"), a // -7,
                               torch.floor_divide(a, 3),
                               torch.div(a, torch.tensor(-5), rounding_mode="floor")), a)
    assert not report.compile_errors
    small = torch.randint(-100, 100, (9,), dtype=torch.int32)
    _exact(lambda a: (a // 7, a // -7, torch.div(a, 2, rounding_mode="floor")), small)


def test_matmul_of_broadcast_batches():
    torch.manual_seed(0)
    compiled_whole(lambda a, b: torch.matmul(a, b), (torch.randn(4, 8, 5), torch.randn(1, 5, 6)))
    compiled_whole(lambda a, b: torch.matmul(a, b),
                   (torch.randn(2, 1, 8, 5), torch.randn(3, 5, 6)))


def test_embedding_with_gradient_flags_compiles_the_lookup():
    torch.manual_seed(0)
    _exact(lambda w, i: (F.embedding(i, w, padding_idx=-1, scale_grad_by_freq=True),
                         F.embedding(i, w, padding_idx=2, sparse=True)),
           torch.randn(10, 4), torch.randint(0, 10, (3, 5)))


class ScatterRuntimeValue(torch.nn.Module):
    def forward(self, x, y, index, value, count):
        return (aten.scatter(y, 2, index, float(value)), aten.scatter(x, 1, index, int(count)))


def _scatter_inputs(value, count, x_dtype=torch.float32):
    torch.manual_seed(0)
    return (torch.rand(10, 8, 6).to(x_dtype), torch.rand(10, 8, 6, dtype=torch.float64),
            torch.randint(0, 4, (2, 4, 3)), value, count)


def test_scatter_of_a_value_read_at_run_time():
    model = ScatterRuntimeValue()
    inputs = _scatter_inputs(torch.rand((), dtype=torch.float64), torch.tensor(7))
    optimized = blade.optimize(model, inputs)
    others = _scatter_inputs(torch.tensor(0.25, dtype=torch.float64), torch.tensor(-3))
    for call in (inputs, others):
        for got, want in zip(optimized(*call), model(*call)):
            assert_same_values(got, want, 0, 0)
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops, str(report)


@pytest.mark.parametrize("value", [torch.tensor(2.7), torch.tensor(-1.5, dtype=torch.float64)])
def test_scatter_of_int_of_a_float_tensor_truncates_as_in_eager(value):
    model = ScatterRuntimeValue()
    inputs = _scatter_inputs(value, value)
    optimized = blade.optimize(model, inputs)
    for got, want in zip(optimized(*inputs), model(*inputs)):
        assert_same_values(got, want, 0, 0)


class ScatterFloatOfFloat(torch.nn.Module):
    def forward(self, x, index, value):
        return aten.scatter(x, 1, index, float(value)) + 1


def test_float_of_a_float32_tensor_scatters_into_float32_compiled():
    # The value is a float32's: it fits whatever float() passes it through.
    model = ScatterFloatOfFloat()
    inputs = (torch.rand(4, 6), torch.randint(0, 6, (4, 2)), torch.tensor(3e38))
    optimized = blade.optimize(model, inputs)
    assert_same_values(optimized(*inputs), model(*inputs), 0, 0)
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops, str(report)


def test_a_scattered_value_that_may_overflow_the_dtype_raises_as_in_eager():
    # int() into int8 may not fit: the scatter stays TorchScript, with eager's check.
    model = ScatterRuntimeValue()
    optimized = blade.optimize(model, _scatter_inputs(torch.tensor(0.5), torch.tensor(3),
                                                      torch.int8))
    with pytest.raises(RuntimeError, match="overflow"):
        model(*_scatter_inputs(torch.tensor(0.5), torch.tensor(300), torch.int8))
    with pytest.raises(RuntimeError, match="overflow"):
        optimized(*_scatter_inputs(torch.tensor(0.5), torch.tensor(300), torch.int8))


@pytest.mark.parametrize("dynamic", [False, True])
def test_negative_indices_first_seen_after_optimize_count_from_the_end(dynamic):
    # The example inputs have none, so the engine check could not have caught a clamp.
    model = Lambda(lambda x, i: x[:, i] * 2)
    x, positive = torch.randn(3, 6), torch.tensor([0, 2, 5, 1])
    optimized = blade.optimize(model, (x, positive),
                               blade.Config(allow_tracing=True, dynamic=dynamic))
    for call in ((x, torch.tensor([-1, -6, 3, -2])), (torch.randn(5, 9), torch.tensor([-9, 8]))):
        if not dynamic and call[0].shape != x.shape:
            continue
        assert_same_values(optimized(*call), model(*call), 0, 0)
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops, str(report)


def test_shifts_by_a_constant_within_the_width():
    torch.manual_seed(0)
    _exact(lambda x, y: (x >> 1, x >> 7, y >> 40),
           torch.randint(-100, 100, (3, 4), dtype=torch.int8),
           torch.randint(-2 ** 50, 2 ** 50, (5,)))
    # Bools (promoted to int64) and shifts past the width are eager's: left to the op.
    for fn, x in ((lambda t: t >> 1, torch.tensor([True, False])),
                  (lambda t: t >> 300, torch.tensor([-5, 5], dtype=torch.int8))):
        model = Lambda(fn)
        optimized = blade.optimize(model, (x,), blade.Config(allow_tracing=True))
        assert torch.equal(optimized(x), model(x))


def test_floor_division_by_a_constant_outside_the_dtype_wraps_as_in_eager():
    for fn, x in ((lambda t: t // 200, torch.tensor([-128, -7, 1, 127], dtype=torch.int8)),
                  (lambda t: t // -3, torch.tensor([1, 7, 200, 255], dtype=torch.uint8))):
        model = Lambda(fn)
        optimized = blade.optimize(model, (x,), blade.Config(allow_tracing=True))
        assert torch.equal(optimized(x), model(x))


class ScaledThenCastToItsOwnDtype(torch.nn.Module):
    """A `quantize_dynamic` Linear ends with `Y.to(torch.float)` of its float result."""

    def forward(self, x):
        y = torch.tanh(x) * 2
        return y.to(torch.float32), y.to(torch.float32, memory_format=torch.preserve_format)


def test_a_cast_to_its_own_dtype_is_its_input_and_no_view_is_refused():
    x = torch.randn(4, 6)
    _, report = run_compiled(ScaledThenCastToItsOwnDtype(), (x,))
    assert report.compiled_ops == report.total_ops and not report.unsupported, str(report)
    # Eager's result is `y` itself, twice: an in-place write through one is seen in the other.
    optimized = blade.optimize(ScaledThenCastToItsOwnDtype(), (x,))
    first, second = optimized(x)
    first.add_(1)
    assert torch.equal(first, second)


def test_a_cast_with_copy_or_a_memory_format_still_copies():
    x = torch.randn(4, 6)
    model = Lambda(lambda x: (x.to(torch.float32, copy=True),
                              x.to(torch.float32, memory_format=torch.contiguous_format)))
    optimized = blade.optimize(model, (x,), blade.Config(allow_tracing=True))
    copied, contiguous = optimized(x)
    assert copied.data_ptr() != x.data_ptr() and torch.equal(copied, x)
    assert torch.equal(contiguous, x)

"""Ops that nothing lowers to StableHLO, compiled through Blade's decompositions: short
cumulative products (eager's running product, unrolled), kthvalue of short rows (a sort),
max-unpooling (a scatter), im2col (strided slices), conv_tbc, norms and prims' reductions.
Each is compared with eager and compiled whole: before these, each was a lone call of
PyTorch's kernel, left to TorchScript."""
import pytest
import torch
import torch.nn.functional as F

import blade
from helpers import Lambda, assert_ran_compiled, compiled_whole

aten = torch.ops.aten
prims = torch.ops.prims


def _whole(fn, *inputs, rtol=1e-5, atol=1e-5):
    return compiled_whole(fn, inputs, rtol=rtol, atol=atol)[1]


@pytest.mark.parametrize("shape,dim", [((2, 7, 4), 1), ((3, 16), -1), ((1,), 0),
                                       ((5, 1), 1), ((4, 0), 1)])
def test_cumprod_is_eagers_running_product_bit_for_bit(shape, dim):
    torch.manual_seed(0)
    x = torch.rand(shape) + 0.5
    report = _whole(lambda x: aten.cumprod(x, dim), x, rtol=0, atol=0)
    assert "aten::cumprod" in report.decomposed


def test_cumprod_accumulates_as_eager_does():
    torch.manual_seed(0)
    ints = torch.randint(-3, 4, (15, 2), dtype=torch.int32)
    _whole(lambda x: (aten.cumprod(x, 0), aten.cumprod(x, 0, dtype=torch.float64),
                      aten.cumprod(x > 0, 1)), ints, rtol=0, atol=0)
    # In double for float (a partial product beyond float's range comes back), in float for
    # half and bfloat16; zeros, infinities and NaN as the running product gives them.
    x = torch.tensor([[1e30, 1e-30], [1e30, 1e-30], [1e-30, 1e30], [1e-30, 1e30],
                      [float("inf"), 0.0], [float("nan"), 1.0]])
    _whole(lambda x: aten.cumprod(x, 0), x, rtol=0, atol=0)
    _whole(lambda x: aten.cumprod(x, 0), torch.tensor([300.0, 300.0, 1e-3, 1e-3]).half(),
           rtol=0, atol=0)
    _whole(lambda x: aten.cumprod(x, 0), (1 + torch.rand(16) * 0.01).bfloat16(),
           rtol=0, atol=0)


def test_a_long_cumprod_calls_the_kernel():
    x = torch.rand(3, 40) + 0.5
    optimized, report = compiled_whole(lambda x: aten.cumprod(x * 2, 1) + 1, (x,))
    assert report.clusters[0].kernel_calls == 1, str(report)


def test_kthvalue_matches_eager_values_and_positions():
    torch.manual_seed(0)
    distinct = torch.randperm(36, dtype=torch.int32).reshape(2, 6, 3)
    report = _whole(lambda x: aten.kthvalue(x, 4, 1), distinct, rtol=0, atol=0)
    assert "aten::kthvalue" in report.decomposed
    _whole(lambda x: aten.kthvalue(x, 2, 0, True), torch.randn(5, 3), rtol=0, atol=0)
    _whole(lambda x: aten.kthvalue(x, 1), torch.randn(4, 7, dtype=torch.float64),
           rtol=0, atol=0)


def test_kthvalue_with_ties_gives_the_value_and_a_position_holding_it():
    # Among equal values eager names no particular position.
    x = torch.tensor([[3.0, 1.0, 3.0, 2.0, 3.0], [0.0, 0.0, 1.0, 0.0, 2.0]])
    model = Lambda(lambda x: aten.kthvalue(x, 4, 1))
    optimized = blade.optimize(model, (x,), blade.Config(allow_tracing=True))
    values, indices = optimized(x)
    assert torch.equal(values, model(x)[0])
    assert torch.equal(x.gather(1, indices.unsqueeze(1)).squeeze(1), values)
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops, str(report)


def test_max_unpool_scatters_each_value_to_its_position():
    torch.manual_seed(0)
    pooled, indices = F.max_pool2d(torch.rand(2, 2, 4, 8), 2, return_indices=True)
    _whole(lambda x, i: (aten.max_unpool2d(x, i, [4, 8]),
                         aten.max_unpool2d(x[0], i[0], [4, 8])), pooled, indices,
           rtol=0, atol=0)
    pooled, indices = F.max_pool3d(torch.rand(2, 2, 4, 4, 6), 2, return_indices=True)
    _whole(lambda x, i: aten.max_unpool3d(x, i, [4, 4, 6], [2, 2, 2], [0, 0, 0]),
           pooled, indices, rtol=0, atol=0)


def test_im2col_matches_nn_unfold():
    torch.manual_seed(0)
    _whole(lambda x: aten.im2col(x, [2, 3], [1, 2], [1, 0], [2, 1]), torch.randn(2, 3, 7, 9),
           rtol=0, atol=0)
    _whole(lambda x: F.unfold(x, 3, padding=1), torch.randn(3, 5, 6), rtol=0, atol=0)


def test_conv_tbc_and_norm_match_eager():
    torch.manual_seed(0)
    _whole(lambda x, w, b: aten.conv_tbc(x, w, b, 1), torch.randn(7, 2, 4),
           torch.randn(3, 4, 5), torch.randn(5))
    _whole(lambda x: (aten.norm(x, 3.0), aten.norm(x)), torch.randn(4, 5))


def test_conv_tbc_shorter_than_its_kernel_is_empty_as_in_eager():
    model = Lambda(lambda x, w, b: aten.conv_tbc(x, w, b, 0) + 1)
    inputs = (torch.randn(2, 2, 3), torch.randn(3, 3, 4), torch.randn(4))
    optimized = blade.optimize(model, inputs, blade.Config(allow_tracing=True))
    assert optimized(*inputs).shape == model(*inputs).shape == (0, 2, 4)


def test_prims_reductions_and_casts_match_eager():
    torch.manual_seed(0)
    x = torch.randn(3, 4, 5)
    _whole(lambda x: (prims.sum(x, [0, 2]), prims.sum(x, []), prims.prod(x, [1]),
                      prims.prod(x, [0, 2]), prims.prod(x, []),
                      prims.convert_element_type(x, torch.float64)), x)
    # Eager runs sum's and prod's kernels: integers reduce to int64.
    ints = torch.full((2, 3), 2 ** 30, dtype=torch.int32)
    _whole(lambda x: (prims.sum(x, [1]), prims.prod(x.to(torch.int8), [1])), ints,
           rtol=0, atol=0)

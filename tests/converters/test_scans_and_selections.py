"""Ops that nothing lowers to StableHLO, compiled through Blade's decompositions: cumulative
products (a scan of log2(n) steps), kthvalue (a sort), determinants (elimination with partial
pivoting), max-unpooling (a scatter), im2col (strided slices), conv_tbc, weight norm, norms,
shifts and prims' reductions. Each is compared with eager and compiled whole: before these,
each was a lone call of PyTorch's kernel, left to TorchScript."""
import pytest
import torch
import torch.nn.functional as F

import blade
from helpers import Lambda, assert_ran_compiled, compiled_whole

aten = torch.ops.aten
prims = torch.ops.prims


def _whole(fn, *inputs, rtol=1e-5, atol=1e-5):
    return compiled_whole(fn, inputs, rtol=rtol, atol=atol)[1]


@pytest.mark.parametrize("shape,dim", [((2, 7, 4), 1), ((3, 33), -1), ((1,), 0),
                                       ((5, 1), 1), ((4, 0), 1)])
def test_cumprod_matches_eager(shape, dim):
    torch.manual_seed(0)
    x = torch.rand(shape) + 0.5
    report = _whole(lambda x: aten.cumprod(x, dim), x)
    assert "aten::cumprod" in report.decomposed


def test_cumprod_of_integers_and_to_a_dtype_follows_eager_promotion():
    torch.manual_seed(0)
    ints = torch.randint(-3, 4, (19, 2), dtype=torch.int32)
    _whole(lambda x: (aten.cumprod(x, 0), aten.cumprod(x, 0, dtype=torch.float64),
                      aten.cumprod(x > 0, 1)), ints, rtol=0, atol=0)
    # Zeros, infinities and NaN propagate as eager's running product does.
    x = torch.tensor([[2.0, 0.0, float("inf"), 3.0], [float("nan"), 1.0, -2.0, 0.5]])
    _whole(lambda x: aten.cumprod(x, 1), x, rtol=0, atol=0)


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


@pytest.mark.parametrize("shape", [(4, 4), (3, 5, 5), (2, 2, 7, 7), (1, 1)])
def test_determinants_match_eager(shape):
    torch.manual_seed(0)
    a = torch.randn(shape)
    report = _whole(lambda a: (torch.linalg.det(a),) + tuple(torch.linalg.slogdet(a)), a,
                    rtol=1e-4, atol=1e-5)
    assert {"aten::linalg_det", "aten::linalg_slogdet"} <= set(report.decomposed)


def test_determinants_of_singular_and_float64_matrices_match_eager():
    torch.manual_seed(0)
    a = torch.rand(3, 4, 4)
    a[1, 2] = a[1, 0] * 2  # two rows alike
    a[2, :, 1] = 0         # a zero column
    _whole(lambda a: (torch.linalg.det(a),) + tuple(torch.linalg.slogdet(a)), a, rtol=1e-4, atol=1e-5)
    _whole(lambda a: torch.linalg.det(a), torch.randn(2, 9, 9, dtype=torch.float64),
           rtol=1e-9, atol=1e-9)


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


def test_conv_tbc_weight_norm_and_norm_match_eager():
    torch.manual_seed(0)
    _whole(lambda x, w, b: aten.conv_tbc(x, w, b, 1), torch.randn(7, 2, 4),
           torch.randn(3, 4, 5), torch.randn(5), rtol=1e-5, atol=1e-5)
    v = torch.randn(3, 4, 5)
    _whole(lambda v, g0, g2: aten._weight_norm_interface(v, g0, 0) +
           aten._weight_norm_interface(v, g2, 2),
           v, torch.randn(3, 1, 1), torch.randn(1, 1, 5))
    _whole(lambda x: (aten.norm(x, 3.0), aten.norm(x)), torch.randn(4, 5))


def test_shift_by_a_scalar_and_prims_reductions_match_eager():
    torch.manual_seed(0)
    _whole(lambda x: (x >> 1, x >> 3), torch.randint(-100, 100, (3, 4), dtype=torch.int8),
           rtol=0, atol=0)
    x = torch.randn(3, 4, 5)
    _whole(lambda x: (prims.sum(x, [0, 2]), prims.prod(x, [1]), prims.prod(x, [0, 2]),
                      prims.convert_element_type(x, torch.float64)), x)

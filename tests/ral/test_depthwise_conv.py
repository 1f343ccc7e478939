"""Blade's depthwise convolution (csrc/ral/depthwise_conv.*) called directly: every
geometry an engine may hand it (3x3 and 5x5 filters, strides, dilations, paddings, images
smaller than the filter's reach, channel counts off the 16- or 8-lane blocks) against a float64
convolution of the same operands, and the bias, ReLU, SiLU and NaN handling."""
import pytest
import torch

from blade import _C

pytestmark = pytest.mark.skipif(not _C.depthwise_conv_available(),
                                reason="the kernel runs on AVX-512 CPUs or AVX2 ones with FMA")
F = torch.nn.functional


def reference(x, weight, bias, stride, padding, dilation, relu, silu=False, hardswish=False):
    """float64 NCHW convolution of the NHWC input, back to NHWC."""
    y = F.conv2d(x.double().permute(0, 3, 1, 2), weight.double(),
                 None if bias is None else bias.double(), stride, padding, dilation,
                 groups=x.shape[3]).permute(0, 2, 3, 1)
    if hardswish:
        return F.hardswish(y)
    return F.silu(y) if silu else torch.relu(y) if relu else y


@pytest.mark.parametrize("kernel", [3, 5])
@pytest.mark.parametrize("stride, dilation", [(1, 1), (2, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize("channels, size", [(16, (7, 7)), (37, (13, 11)), (5, (2, 17)),
                                            (48, (1, 1)), (33, (9, 4)), (3, (5, 30))])
def test_matches_a_float64_convolution(kernel, stride, dilation, channels, size):
    torch.manual_seed(channels * 10 + kernel)
    x = torch.randn(2, *size, channels)
    weight = torch.randn(channels, 1, kernel, kernel)
    bias = torch.randn(channels)
    padding = dilation * (kernel // 2)
    filters = weight[:, 0].permute(1, 2, 0).contiguous()
    for relu, silu, hardswish, b in ((False, False, False, bias), (True, False, False, None),
                                     (False, True, False, bias), (False, False, True, bias)):
        got = _C.depthwise_conv2d(x, filters, b, [stride] * 2, [padding] * 2,
                                  [dilation] * 2, relu, silu=silu, hardswish=hardswish)
        want = reference(x, weight, b, stride, padding, dilation, relu, silu, hardswish)
        assert got.shape == want.shape
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_asymmetric_and_missing_padding():
    torch.manual_seed(0)
    x = torch.randn(1, 9, 12, 20)
    weight = torch.randn(20, 1, 5, 5)
    filters = weight[:, 0].permute(1, 2, 0).contiguous()
    for padding in ([0, 0], [2, 0], [0, 2], [1, 2]):
        got = _C.depthwise_conv2d(x, filters, None, [1, 1], padding, [1, 1], False)
        want = reference(x, weight, None, 1, padding, 1, False)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_nan_stays_through_the_relu_and_reaches_only_its_neighbours():
    x = torch.ones(1, 6, 6, 16)
    x[0, 2, 3, 4] = float("nan")
    filters = torch.ones(3, 3, 16)
    y = _C.depthwise_conv2d(x, filters, None, [1, 1], [1, 1], [1, 1], True)
    nan = torch.isnan(y[0, :, :, 4])
    assert nan.sum() == 9 and nan[1:4, 2:5].all()
    assert not torch.isnan(y[0, :, :, 5]).any()


def test_refuses_other_filters_and_mismatched_operands():
    x = torch.randn(1, 5, 5, 8)
    with pytest.raises(RuntimeError, match="does not run here .* or for a 7x7 filter"):
        _C.depthwise_conv2d(x, torch.randn(7, 7, 8), None, [1, 1], [3, 3], [1, 1], False)
    with pytest.raises(RuntimeError, match="filters \\[kh, kw, c\\]"):
        _C.depthwise_conv2d(x, torch.randn(3, 3, 9), None, [1, 1], [1, 1], [1, 1], False)
    with pytest.raises(RuntimeError, match="positive strides"):
        _C.depthwise_conv2d(x, torch.randn(3, 3, 8), None, [0, 1], [1, 1], [1, 1], False)
    with pytest.raises(RuntimeError, match="the bias needs 8 float32 values"):
        _C.depthwise_conv2d(x, torch.randn(3, 3, 8), torch.randn(3), [1, 1], [1, 1], [1, 1],
                            False)


def test_silu_matches_torch_over_its_range_and_at_its_edges():
    """The kernels' SiLU (csrc/ral/conv_activation.*) through a filter that passes each
    value through (the centre tap; the others fall outside a one-pixel image): within a few
    float32 ulps of float64 over [-30, 30], 0 far below zero, NaN for NaN and -inf, the
    value itself far above."""
    filters = torch.zeros(3, 3, 16)
    filters[1, 1] = 1.0

    def silu(values):
        count = values.numel()
        x = values.view(count, 1, 1, 1).expand(count, 1, 1, 16).contiguous()
        return _C.depthwise_conv2d(x, filters, None, [1, 1], [1, 1], [1, 1], False,
                                   silu=True)[:, 0, 0, 0]

    t = torch.linspace(-30, 30, 120001)
    want = F.silu(t.double())
    assert float(((silu(t).double() - want).abs() / want.abs().clamp_min(1e-30)).max()) < 1e-6
    edges = torch.tensor([-1e30, -200.0, -90.0, -79.0, 87.0, 100.0, 1e30,
                          float("inf"), float("-inf"), float("nan")])
    got = silu(edges)
    want = F.silu(edges.double())
    assert got[:3].eq(0).all() and torch.equal(got.isnan(), want.isnan())
    torch.testing.assert_close(got[3:8].double(), want[3:8], rtol=1e-6, atol=0)

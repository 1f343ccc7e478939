"""Config(precision="int8"): Blade's own post-training quantization of linear layers
(blade/frontend/quantize.py) and the int8 kernel engines call (csrc/ral/int8_kernels.h)."""
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import blade
from blade import _C
from blade.frontend import quantize as q
from helpers import assert_ran_compiled, ir_before

HAS_INT8 = blade.int8_supported()
needs_int8 = pytest.mark.skipif(not HAS_INT8, reason="this CPU has no int8 kernels")
# Blade's own int8 kernels, and the doors for models quantized before (their 8-bit weights),
# need a dot product (VNNI, AVX-VNNI or AMX); AVX2 alone runs oneDNN's with 7-bit weights.
HAS_DOT_PRODUCT = _C.has_int8_dot_product()
needs_dot_product = pytest.mark.skipif(not HAS_DOT_PRODUCT,
                                       reason="this CPU lacks VNNI, AVX-VNNI and AMX")
HAS_AVX2 = "avx2" in _C.host_cpu_flags()


@pytest.fixture(autouse=True)
def small_layers_quantized(monkeypatch):
    """The models here are small: every layer is quantized, however few its multiply-adds
    (test_small_layers_stay_float checks the rule)."""
    monkeypatch.setattr(q, "MIN_MACS", 0)


@pytest.fixture
def without_int8_dot_product():
    """The process behaves as on a CPU without VNNI and AMX: with AVX2, as on one whose
    int8 kernels take weights within +-64 only."""
    _C.set_int8_dot_product_allowed(False)
    try:
        yield
    finally:
        _C.set_int8_dot_product_allowed(True)


@pytest.fixture
def without_int8_kernels():
    """The process behaves as on a CPU with neither VNNI nor AVX2."""
    _C.set_int8_dot_product_allowed(False)
    _C.set_int8_pair_sums_allowed(False)
    try:
        yield
    finally:
        _C.set_int8_dot_product_allowed(True)
        _C.set_int8_pair_sums_allowed(True)


def reference_linear(x, weight_q, weight_scale, bias, scale, zero_point):
    """The op's definition in float64: uint8 activations (ties to even), int8 weights."""
    xq = torch.clamp(torch.round(x.double() / scale) + zero_point, 0, 255)
    w = weight_q.double() * weight_scale.double().unsqueeze(1)
    y = torch.nn.functional.linear((xq - zero_point) * scale, w)
    return y + bias.double() if bias is not None else y


def quantized_weight(n, k):
    torch.manual_seed(1)
    return q.quantize_weight(torch.randn(n, k) * 0.1)


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                               torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10)).eval()


def calibration(n=8, shape=(32, 64)):
    torch.manual_seed(2)
    return [torch.randn(*shape) for _ in range(n)]


# --- the op --------------------------------------------------------------------------------

@pytest.mark.parametrize("scale, zero_point", [(0.02, 128), (0.05, 0), (-1.0, 0)])
def test_quantized_linear_matches_its_definition(scale, zero_point):
    weight_q, weight_scale = quantized_weight(48, 96)
    bias = torch.randn(48)
    x = torch.randn(2, 5, 96)
    got = torch.ops.blade.quantized_linear(x, weight_q, weight_scale, bias,
                                           torch.tensor([scale, zero_point]), None, "none")
    if scale <= 0:  # measured on this input: its range in 255 steps
        scale, zero_point = q.uint8_range(float(x.min()), float(x.max()))
    want = reference_linear(x, weight_q, weight_scale, bias, scale, zero_point)
    assert got.shape == (2, 5, 48) and got.dtype == torch.float32
    # Integer products are exact; what is left is float32 rounding of the scaled sums.
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_quantized_linear_without_dot_product_instructions_gives_the_same_answer(
        without_int8_dot_product):
    weight_q, weight_scale = quantized_weight(32, 64)
    x = torch.randn(7, 64)
    got = torch.ops.blade.quantized_linear(x, weight_q, weight_scale, None,
                                           torch.tensor([0.03, 120.0]), None, "none")
    want = reference_linear(x, weight_q, weight_scale, None, 0.03, 120)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not HAS_AVX2, reason="this CPU lacks AVX2")
@pytest.mark.parametrize("kind", ["linear", "conv2d"])
def test_int8_products_without_a_dot_product_never_saturate(without_int8_dot_product, kind):
    """AVX2's u8 x s8 multiply-add sums pairs of products in 16 bits: 255 * 127 * 2 would
    saturate. Inputs at the top of their range times weights of 127 must run in float32
    (counted), weights of 64 on the int8 kernels, and both give the exact answer."""
    scale, zero_point = 0.01, 0
    x = torch.full((3, 64), 255 * scale)  # every byte 255
    if kind == "conv2d":
        x = x.reshape(3, 64, 1, 1).expand(3, 64, 4, 4).contiguous()
    for value, in_float in ((127, 1), (64, 0), (-64, 0), (-128, 1)):
        shape = (16, 64) if kind == "linear" else (16, 64, 1, 1)
        weight_q = torch.full(shape, value, dtype=torch.int8)
        weight_scale = torch.full((16,), 0.002)
        before = _C.int8_float_path_calls()
        if kind == "linear":
            got = torch.ops.blade.quantized_linear(
                x, weight_q, weight_scale, None, torch.tensor([scale, zero_point]), None,
                "none")
            want = reference_linear(x, weight_q, weight_scale, None, scale, zero_point)
        else:
            got = torch.ops.blade.quantized_conv2d(
                x, weight_q, weight_scale, None, [1, 1], [0, 0], [1, 1], 1,
                torch.tensor([scale, zero_point]), None, "none")
            want = reference_conv(x, weight_q, weight_scale, None, scale, zero_point, 1, 0)
        assert _C.int8_float_path_calls() - before == in_float, value
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not HAS_AVX2, reason="this CPU lacks AVX2")
def test_int8_without_a_dot_product_compiles_7_bit_weights(without_int8_dot_product):
    """On a CPU with AVX2 but no VNNI, Config(precision="int8") quantizes weights within
    +-64, which its int8 kernels multiply exactly: the engine runs them, none in float32,
    close to eager."""
    model, cal = mlp(), calibration(4)
    x = torch.randn(32, 64)
    optimized = blade.optimize(model, (x,), blade.Config(precision="int8", calibration=cal))
    before = _C.int8_float_path_calls()
    with torch.no_grad():
        got, want = optimized(x), model(x)
    assert _C.int8_float_path_calls() == before
    report = assert_ran_compiled(optimized)
    assert report.clusters[0].precision == "int8" and len(report.int8["layers"]) == 3, \
        str(report)
    engine = getattr(optimized, report.clusters[0].name)
    weights = [p for p in engine.params() if p.dtype == torch.int8]
    assert len(weights) == 3 and max(int(w.abs().max()) for w in weights) == 64
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert float(cosine) > 0.999


@pytest.mark.parametrize("dot_product", [True, False])
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("uint8_out", [False, True])
def test_few_rows_run_blade_s_matrix_vector_product(dot_product, rows, uint8_out):
    """A linear layer's 1 to 4 rows run Blade's matrix-vector product (VNNI's, or AVX2's
    where the CPU has no dot product), counted as Blade's kernel and not in float32: 37
    columns (a partial block of 16), a depth of 70 (no multiple of 4), ReLU, float32 or
    uint8 results, against the definition."""
    if dot_product and not HAS_DOT_PRODUCT or not HAS_INT8:
        pytest.skip("this CPU lacks the instructions")
    _C.set_int8_dot_product_allowed(dot_product)
    try:
        weight_q, weight_scale = q.quantize_weight(torch.randn(37, 70) * 0.1)
        bias, x = torch.randn(37), torch.randn(rows, 70)
        out_range = torch.tensor([0.02, 30.0]) if uint8_out else None
        calls, in_float = _C.int8_conv_calls(), _C.int8_float_path_calls()
        got = torch.ops.blade.quantized_linear(x, weight_q, weight_scale, bias,
                                               torch.tensor([0.03, 110.0]), out_range, "relu")
        assert _C.int8_conv_calls() == calls + 1 and _C.int8_float_path_calls() == in_float
    finally:
        _C.set_int8_dot_product_allowed(True)
    want = torch.relu(reference_linear(x, weight_q, weight_scale, bias, 0.03, 110))
    if uint8_out:
        assert got.dtype == torch.int8
        want = torch.clamp(torch.round(want / 0.02) + 30, 0, 255)
        # Float32 rounding of the scaled sums may move a tie by one step.
        assert float((got.view(torch.uint8).double() - want).abs().max()) <= 1
    else:
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@needs_int8
def test_an_input_rounds_to_uint8_ties_to_even_clamped_nan_to_zero():
    """Rounding the float32 input to uint8 (vectorized per instruction set, with a scalar
    tail): ties to even, clamped to [0, 255], NaN to 0, over 1850 values (no multiple of
    any vector), read back exactly through an identity weight of 64s."""
    scale, zero_point = 0.5, 100
    values = (torch.arange(1850) % 700 - 350).float() / 2 + 0.25  # ties at x * 2 + 100
    values[::7] = (torch.arange(0, 1850, 7) % 600 - 300).float() / 4
    values[5], values[40], values[333], values[1849] = \
        float("nan"), float("inf"), -float("inf"), 1e30
    x = values.reshape(50, 37)
    weight_q = (torch.eye(37) * 64).to(torch.int8)
    got = torch.ops.blade.quantized_linear(x, weight_q, torch.full((37,), 1 / 64), None,
                                           torch.tensor([scale, zero_point]), None, "none")
    scaled = x * (1 / scale) + zero_point
    want = torch.where(scaled.isnan(), 0.0, torch.round(scaled).clamp(0, 255))
    assert torch.equal(got / scale + zero_point, want)


def test_quantized_linear_names_what_is_wrong():
    weight_q, weight_scale = quantized_weight(8, 16)
    in_range = torch.tensor([0.1, 0.0])
    with pytest.raises(RuntimeError, match=r"quantized_linear: the input's last dim is 12, "
                                           r"the weight takes 16"):
        torch.ops.blade.quantized_linear(torch.randn(3, 12), weight_q, weight_scale, None,
                                         in_range, None, "none")
    with pytest.raises(RuntimeError, match="the weight must be a 2-d int8 tensor"):
        torch.ops.blade.quantized_linear(torch.randn(3, 16), weight_q.float(), weight_scale,
                                         None, in_range, None, "none")
    with pytest.raises(RuntimeError, match=r"zero point must be an integer in \[0, 255\]"):
        torch.ops.blade.quantized_linear(torch.randn(3, 16), weight_q, weight_scale, None,
                                         torch.tensor([0.1, 300.0]), None, "none")
    with pytest.raises(RuntimeError, match=r"input_range must be float32 \[2\]"):
        torch.ops.blade.quantized_linear(torch.randn(3, 16), weight_q, weight_scale, None,
                                         torch.tensor([0.1]), None, "none")


def reference_conv(x, weight_q, weight_scale, bias, scale, zero_point, stride, padding,
                   groups=1):
    xq = torch.clamp(torch.round(x.double() / scale) + zero_point, 0, 255)
    w = weight_q.double() * weight_scale.double().view(-1, 1, 1, 1)
    return torch.nn.functional.conv2d((xq - zero_point) * scale, w,
                                      None if bias is None else bias.double(), stride, padding,
                                      1, groups)


@pytest.mark.parametrize("stride, padding, groups, use_bias", [
    (1, 1, 1, True), (2, 0, 1, False), (1, 2, 4, True)])
def test_quantized_conv2d_matches_its_definition(stride, padding, groups, use_bias):
    torch.manual_seed(3)
    weight_q, weight_scale = q.quantize_weight(torch.randn(16, 32 // groups, 3, 3) * 0.1)
    bias = torch.randn(16) if use_bias else None
    x = torch.randn(2, 32, 13, 11)
    got = torch.ops.blade.quantized_conv2d(x, weight_q, weight_scale, bias, [stride] * 2,
                                           [padding] * 2, [1, 1], groups,
                                           torch.tensor([0.03, 128.0]), None, "none")
    want = reference_conv(x, weight_q, weight_scale, bias, 0.03, 128, stride, padding, groups)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


@needs_dot_product
@pytest.mark.parametrize("channels, size, kernel, stride, padding", [
    (16, (9, 10), 3, 1, 1), (40, (11, 12), 5, 1, 2), (72, (13, 9), 3, 2, 1),
    (136, (7, 7), 5, 1, 2), (64, (12, 15), 5, 2, 0), (24, (10, 11), 3, 3, 2),
    (64, (4, 4200), 3, 1, 1)])  # interleaved rows past what a thread keeps: made per call
@pytest.mark.parametrize("post_op", ["none", "relu", "hardswish"])
@pytest.mark.parametrize("uint8_out", [False, True])
@pytest.mark.parametrize("dot_products", [True, False])
def test_depthwise_int8_kernel_matches_its_definition(channels, size, kernel, stride,
                                                      padding, post_op, uint8_out,
                                                      dot_products):
    """Blade's depthwise kernels on carried uint8 data (VNNI dot products over 4 interleaved
    rows; float32 on AVX-512 CPUs without VBMI, and for 16 channels or fewer): channel
    counts past a vector of 16 and a block of 64, windows at every row offset of a quad,
    the padding's zero point, each post-op, float32 and uint8 results, against the
    convolution of the real values."""
    torch.manual_seed(channels + kernel + stride)
    x = torch.randint(0, 256, (2, *size, channels), dtype=torch.uint8)
    weight_q = torch.randint(-127, 128, (channels, 1, kernel, kernel), dtype=torch.int8)
    weight_scale = torch.rand(channels) * 0.01
    bias = torch.randn(channels)
    out_range = torch.tensor([0.08, 20.0]) if uint8_out else None
    calls = _C.int8_conv_calls()
    _C.set_depthwise_int8_enabled(dot_products)
    try:
        got = torch.ops.blade.quantized_conv2d(
            x.view(torch.int8), weight_q, weight_scale, bias, [stride] * 2, [padding] * 2,
            [1, 1], channels, torch.tensor([0.05, 77.0]), out_range, post_op)
    finally:
        _C.set_depthwise_int8_enabled(True)
    assert _C.int8_conv_calls() == calls + 1  # Blade's kernel, not oneDNN's
    real = (x.double() - 77).permute(0, 3, 1, 2) * 0.05
    want = torch.nn.functional.conv2d(
        real, weight_q.double() * weight_scale.double().view(-1, 1, 1, 1), bias.double(),
        stride, padding, 1, channels)
    want = {"none": want, "relu": want.relu(),
            "hardswish": torch.nn.functional.hardswish(want)}[post_op]
    if uint8_out:
        assert got.dtype == torch.int8 and got.shape == (2, *want.shape[2:], channels)
        steps = got.view(torch.uint8).permute(0, 3, 1, 2).double()
        want_steps = torch.clamp(torch.round(want / 0.08) + 20, 0, 255)
        assert float((steps - want_steps).abs().max()) <= 1  # float32 against float64
        assert float((steps - want_steps).abs().mean()) < 0.01
    else:
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


def test_chained_convolutions_pass_uint8_nhwc_with_the_same_answer():
    """A convolution with the next one's range hands on uint8 NHWC bytes (ReLU applied by
    oneDNN); the next convolving them gives what it gives on the float32 ReLU output."""
    torch.manual_seed(4)
    first_q, first_scale = q.quantize_weight(torch.randn(16, 8, 3, 3) * 0.1)
    second_q, second_scale = q.quantize_weight(torch.randn(16, 16, 1, 1) * 0.1)
    x, bias = torch.randn(2, 8, 10, 9), torch.randn(16)
    in_range = torch.tensor([0.02, 128.0])

    def first(output_range, post_op):
        return torch.ops.blade.quantized_conv2d(x, first_q, first_scale, bias, [1, 1], [1, 1],
                                                [1, 1], 1, in_range, output_range, post_op)

    plain = torch.relu(first(None, "none"))
    torch.testing.assert_close(first(None, "relu"), plain, rtol=0, atol=0)
    mid_range = torch.tensor([float(plain.max()) / 255, 0.0])
    carried = first(mid_range, "relu")
    assert carried.dtype == torch.int8 and carried.shape == (2, 10, 9, 16)
    steps = (carried.view(torch.uint8).permute(0, 3, 1, 2).float() * mid_range[0] - plain)
    assert float(steps.abs().max()) <= 0.5001 * float(mid_range[0])  # rounded once

    def second(activation):
        return torch.ops.blade.quantized_conv2d(activation, second_q, second_scale, None,
                                                [1, 1], [0, 0], [1, 1], 1, mid_range, None,
                                                "none")

    torch.testing.assert_close(second(carried), second(plain), rtol=1e-5, atol=1e-5)


def uint8_bytes(x, scale, zero_point):
    """`x` (float32 [N, C, H, W]) rounded to uint8, as the int8 [N, H, W, C] bytes that int8
    layers hand on."""
    xq = torch.clamp(torch.round(x / scale) + zero_point, 0, 255).to(torch.uint8)
    return xq.permute(0, 2, 3, 1).contiguous().view(torch.int8)


def from_bytes(carried, scale, zero_point):
    return (carried.view(torch.uint8).permute(0, 3, 1, 2).double() - zero_point) * scale


@pytest.mark.parametrize("accum_kind", ["float", "uint8"])
@pytest.mark.parametrize("output_kind", ["float", "uint8"])
@pytest.mark.parametrize("post_op", ["none", "relu"])
@pytest.mark.parametrize("dot_product", [True, False])
def test_quantized_conv2d_add_matches_its_definition(accum_kind, output_kind, post_op,
                                                     dot_product):
    """post_op(conv + accum) for every mix of float32 and uint8 operands and result, with
    and without int8 dot products, and the accum is left as it was."""
    if dot_product and not HAS_DOT_PRODUCT:
        pytest.skip("this CPU lacks VNNI, AVX-VNNI and AMX")
    torch.manual_seed(6)
    weight_q, weight_scale = q.quantize_weight(torch.randn(16, 8, 3, 3) * 0.1)
    x, bias = torch.randn(2, 8, 9, 7), torch.randn(16)
    accum = torch.randn(2, 16, 5, 4) * 2
    accum_range = torch.tensor([0.02, 120.0])
    operand = accum if accum_kind == "float" else uint8_bytes(accum, 0.02, 120)
    before = operand.clone()
    added = accum.double() if accum_kind == "float" else from_bytes(operand, 0.02, 120)
    want = reference_conv(x, weight_q, weight_scale, bias, 0.03, 128, 2, 1)
    if output_kind == "uint8" and accum_kind == "float":
        added = from_bytes(uint8_bytes(accum, 0.02, 120), 0.02, 120)  # rounded first
    want = want + added
    if post_op == "relu":
        want = torch.relu(want)
    output_range = torch.tensor([0.05, 100.0]) if output_kind == "uint8" else None
    _C.set_int8_dot_product_allowed(dot_product)
    try:
        got = torch.ops.blade.quantized_conv2d_add(
            x, weight_q, weight_scale, bias, [2, 2], [1, 1], [1, 1], 1,
            torch.tensor([0.03, 128.0]), operand, accum_range, output_range, post_op)
    finally:
        _C.set_int8_dot_product_allowed(True)
    assert torch.equal(operand, before)
    if output_kind == "float":
        assert got.dtype == torch.float32 and got.shape == (2, 16, 5, 4)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    else:
        assert got.dtype == torch.int8 and got.shape == (2, 5, 4, 16)
        low, high = -100 * 0.05, 155 * 0.05
        error = (from_bytes(got, 0.05, 100) - want.clamp(low, high)).abs().max()
        assert float(error) <= 0.5001 * 0.05  # rounded once


def test_quantized_conv2d_add_names_what_is_wrong():
    weight_q, weight_scale = q.quantize_weight(torch.randn(8, 4, 1, 1))

    def call(accum, output_range=None, accum_range=(0.1, 0.0)):
        return torch.ops.blade.quantized_conv2d_add(
            torch.randn(1, 4, 6, 6), weight_q, weight_scale, None, [1, 1], [0, 0], [1, 1], 1,
            torch.tensor([0.1, 0.0]), accum, torch.tensor(accum_range), output_range, "none")

    with pytest.raises(RuntimeError, match=r"quantized_conv2d_add: the tensor added has sizes "
                                           r"\[1, 8, 6, 5\] \(\[N, O, H, W\]\), the "
                                           r"convolution makes \[1, 8, 6, 6\]"):
        call(torch.randn(1, 8, 6, 5))
    with pytest.raises(RuntimeError, match="accum_range needs a positive scale"):
        call(torch.randn(1, 8, 6, 6), torch.tensor([0.1, 0.0]), (-1.0, 0.0))
    with pytest.raises(RuntimeError, match="the tensor added must be a float32"):
        call(torch.randn(1, 8, 6, 6).double())


@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil_mode, channels", [
    (3, 2, 1, 1, False, 64), (2, 2, 0, 1, True, 70), (3, 1, 1, 2, False, 130),
    (3, 2, 0, 1, True, 5),
    # 3 x 3 windows inside the image read whole (64 channels at a time); the rest listed.
    (3, 1, 0, 1, False, 128), (3, 2, 1, 1, True, 64)])
def test_quantized_max_pool2d_is_max_pool2d_of_the_bytes(kernel, stride, padding, dilation,
                                                        ceil_mode, channels):
    torch.manual_seed(7)
    values = torch.randint(0, 256, (2, channels, 11, 9), dtype=torch.uint8)
    carried = values.permute(0, 2, 3, 1).contiguous().view(torch.int8)
    got = torch.ops.blade.quantized_max_pool2d(carried, [kernel] * 2, [stride] * 2,
                                               [padding] * 2, [dilation] * 2, ceil_mode)
    want = torch.nn.functional.max_pool2d(values.float(), kernel, stride, padding, dilation,
                                          ceil_mode)
    assert got.dtype == torch.int8
    assert torch.equal(got.view(torch.uint8).permute(0, 3, 1, 2).float(), want)


def test_quantized_max_pool2d_names_what_is_wrong():
    with pytest.raises(RuntimeError, match="quantized_max_pool2d: the input must be the "
                                           "uint8"):
        torch.ops.blade.quantized_max_pool2d(torch.randn(1, 4, 4, 8), [2, 2], [2, 2], [0, 0],
                                             [1, 1], False)
    with pytest.raises(RuntimeError, match="padding at most half the kernel"):
        torch.ops.blade.quantized_max_pool2d(torch.zeros(1, 4, 4, 8, dtype=torch.int8),
                                             [2, 2], [2, 2], [2, 2], [1, 1], False)


@pytest.mark.parametrize("post_op", ["relu", "gelu", "gelu_tanh"])
def test_chained_linears_pass_uint8_with_the_same_answer(post_op):
    torch.manual_seed(5)
    first_q, first_scale = quantized_weight(32, 16)
    second_q, second_scale = quantized_weight(8, 32)
    x, bias = torch.randn(4, 3, 16), torch.randn(32)
    in_range = torch.tensor([0.03, 128.0])

    def first(output_range, op):
        return torch.ops.blade.quantized_linear(x, first_q, first_scale, bias, in_range,
                                                output_range, op)

    plain = first(None, "none")
    activated = {"relu": torch.relu(plain), "gelu": torch.nn.functional.gelu(plain),
                 "gelu_tanh": torch.nn.functional.gelu(plain, approximate="tanh")}[post_op]
    torch.testing.assert_close(first(None, post_op), activated, rtol=1e-4, atol=1e-4)
    low, high = float(activated.min()), float(activated.max())
    mid_range = torch.tensor(q.uint8_range(low, high), dtype=torch.float32)
    carried = first(mid_range, post_op)
    assert carried.dtype == torch.int8 and carried.shape == (4, 3, 32)
    back = (carried.view(torch.uint8).float() - mid_range[1]) * mid_range[0]
    assert float((back - activated).abs().max()) <= 0.51 * float(mid_range[0])

    def second(activation):
        return torch.ops.blade.quantized_linear(activation, second_q, second_scale, None,
                                                mid_range, None, "none")

    # The same uint8 values but where float32 rounding flips one: a step times a weight.
    assert float((second(carried) - second(activated)).abs().max()) < \
        2 * float(mid_range[0]) * float(second_scale.max()) * 127


def test_quantized_conv2d_names_what_is_wrong():
    weight_q, weight_scale = q.quantize_weight(torch.randn(8, 4, 3, 3))
    with pytest.raises(RuntimeError, match="quantized_conv2d: the input has 6 channels, the "
                                           "weight takes 4 x 1 groups"):
        torch.ops.blade.quantized_conv2d(torch.randn(1, 6, 8, 8), weight_q, weight_scale, None,
                                         [1, 1], [0, 0], [1, 1], 1, torch.tensor([0.1, 0.0]),
                                         None, "none")


def test_weights_are_symmetric_per_output_channel():
    weight = torch.randn(16, 32)
    weight[3] = 0.0  # an all-zero row keeps a usable scale
    values, scales = q.quantize_weight(weight)
    assert values.dtype == torch.int8
    assert int(values.abs().max()) == _C.int8_weight_limit() and _C.int8_weight_limit() > 0
    assert scales.shape == (16,) and bool((scales > 0).all())
    assert bool((values[3] == 0).all())
    error = (values.float() * scales.unsqueeze(1) - weight).abs()
    assert bool((error <= scales.unsqueeze(1) / 2 + 1e-7).all())


def test_range_search_clips_an_outlier_that_min_max_would_keep():
    torch.manual_seed(0)
    values = torch.randn(50000)
    values[0] = 80.0  # one outlier stretches min/max's steps 20-fold
    layer = q.LinearLayer(node=None, name="fc", low=float(values.min()),
                          high=float(values.max()), samples=[values])
    q.choose_range(layer)
    min_max_scale, _ = q.uint8_range(float(values.min()), float(values.max()))
    assert layer.scale < min_max_scale
    assert 0 <= layer.zero_point <= 255


# --- Config(precision="int8") --------------------------------------------------------------

def test_config_checks_the_int8_options():
    with pytest.raises(ValueError, match="calibration.*needs precision='int8'"):
        blade.Config(calibration=[torch.randn(2)])
    with pytest.raises(ValueError, match="non-empty list of example inputs"):
        blade.Config(precision="int8", calibration=[])
    with pytest.raises(ValueError, match="float_layers.*needs precision='int8'"):
        blade.Config(float_layers=["fc"])


@pytest.mark.skipif(HAS_INT8, reason="this CPU has int8 kernels")
def test_cpu_without_int8_kernels_refuses_int8_at_compile_time():
    with pytest.raises(ValueError, match="VNNI"):
        blade.optimize(mlp(), (torch.randn(32, 64),), blade.Config(precision="int8"))


def test_optimize_refuses_int8_where_the_cpu_lacks_it(without_int8_kernels):
    with pytest.raises(ValueError, match="precision='int8'.*VNNI"):
        blade.optimize(mlp(), (torch.randn(32, 64),), blade.Config(precision="int8"))


@needs_int8
def test_int8_engine_runs_quantized_layers_close_to_eager():
    model, cal = mlp(), calibration()
    x = torch.randn(32, 64)
    optimized = blade.optimize(model, (x,), blade.Config(precision="int8", calibration=cal))
    with torch.no_grad():
        got, want = optimized(x), model(x)
    report = assert_ran_compiled(optimized)
    assert [c.precision for c in report.clusters] == ["int8"], str(report)
    assert report.coverage == 1.0, str(report)
    assert len(report.int8["layers"]) == 3, str(report)
    assert report.int8["calibration_inputs"] == 8
    assert report.int8["cosine"] > 0.999, str(report)
    assert "precision: int8 (3 linear and convolution layers" in str(report)
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert float(cosine) > 0.999
    # int8 really ran: the answer moved by about a quantization step, not float rounding.
    assert float((got - want).abs().max()) > 1e-4
    # The engine agrees with its TorchScript subgraph, which runs the same int8 layers.
    engine = getattr(optimized, report.clusters[0].name)
    with torch.no_grad():
        torch.testing.assert_close(engine.run_code([x]), engine.run_subgraph([x]),
                                   rtol=1e-4, atol=1e-4)


@needs_int8
def test_int8_results_are_made_in_the_engine_buffers():
    """An int8 layer's result is oneDNN's output made in the buffer the engine allocated for
    it, not copied there; where a temporary of the same size takes that buffer (a float
    input of K = 4N features, rounded to uint8 by the kernel), the result is copied and
    still right."""
    torch.manual_seed(0)
    model = TwoInputs().eval()
    x, z = torch.randn(32, 64), torch.randn(32, 256)
    cal = [(torch.randn(32, 64), torch.randn(32, 256)) for _ in range(4)]
    optimized = blade.optimize(model, (x, z), blade.Config(precision="int8", calibration=cal))
    with torch.no_grad():
        optimized(x, z)
    report = assert_ran_compiled(optimized)
    assert len(report.int8["layers"]) == 2, str(report)
    engine = getattr(optimized, report.clusters[0].name)
    placed, copied = _C.kernel_call_result_counts()
    with torch.no_grad():  # the engine's inputs in its graph's order: z, then x
        got = engine.run_code([z, x])
    placed_now, copied_now = _C.kernel_call_result_counts()
    # The first layer's [32, 256] float32 result is made in place; the second's input
    # (32 x 256 bytes, rounded to uint8: a graph input, which the kernel rounds) is as
    # large as its [32, 64] float32 result.
    assert (placed_now - placed, copied_now - copied) == (1, 1)
    with torch.no_grad():
        torch.testing.assert_close(got, engine.run_subgraph([z, x]), rtol=1e-5, atol=1e-5)


class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

    def forward(self, x, z):
        y = self.a(x)
        return y, self.b(z) + y[:, :64]


class ResidualBlock(torch.nn.Module):
    """A residual int8 convolution whose addend is the uint8 output of an earlier one, and
    whose own uint8 result feeds the last convolution."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.conv1 = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(32, 32, 1)
        self.conv3 = torch.nn.Conv2d(32, 16, 1)

    def forward(self, x):
        y = torch.relu(self.stem(x))
        return self.conv3(torch.relu(self.conv2(torch.relu(self.conv1(y))) + y))


@needs_int8
def test_residual_int8_convolution_results_are_made_in_the_engine_buffers():
    """oneDNN's sum writes into a private copy of the addend made in the engine's buffer
    for the result: that copy is the result (the op's own returned copy is not copied in
    again), and the addend, still the stem's output, is left as it was."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 20, 18)
    cal = [torch.randn(2, 3, 20, 18) for _ in range(4)]
    optimized = blade.optimize(ResidualBlock().eval(), (x,),
                               blade.Config(precision="int8", calibration=cal))
    with torch.no_grad():
        optimized(x)
    report = assert_ran_compiled(optimized)
    assert report.int8["layers"] == ["stem", "conv1", "conv2", "conv3"], str(report)
    engine = getattr(optimized, report.clusters[0].name)
    placed, copied = _C.kernel_call_result_counts()
    with torch.no_grad():
        got = engine.run_code([x])
    placed_now, copied_now = _C.kernel_call_result_counts()
    # The uint8 results of the stem, conv1 and the residual conv2 made in place, and conv3's
    # float32 one too (channels_last, into an NHWC buffer: codegen/stablehlo/layouts.py).
    assert (placed_now - placed, copied_now - copied) == (4, 0)
    with torch.no_grad():
        torch.testing.assert_close(got, engine.run_subgraph([x]), rtol=1e-4, atol=1e-4)


class MobileBlock(torch.nn.Module):
    """An expanding int8 convolution, a float depthwise one (dilated: Blade's int8 kernel
    does not take it) between hardswishes, and a projecting int8 convolution: the float32
    results and inputs of int8 layers."""

    def __init__(self):
        super().__init__()
        self.expand = torch.nn.Conv2d(8, 32, 1)
        self.depthwise = torch.nn.Conv2d(32, 32, 3, padding=2, dilation=2, groups=32)
        self.project = torch.nn.Conv2d(32, 16, 1)

    def forward(self, x):
        y = torch.nn.functional.hardswish(self.expand(x))
        return self.project(torch.nn.functional.hardswish(self.depthwise(y)))


@needs_int8
def test_int8_convolutions_read_and_write_float_nhwc(tmp_path):
    """An int8 convolution's float32 result and input are NHWC buffers (`float32:nhwc` in
    its kernel call): the hardswishes and the depthwise convolution between run on NHWC
    data, the result is made in its buffer, and nothing transposes but the model's output."""
    torch.manual_seed(0)
    model = MobileBlock().eval()
    x = torch.randn(2, 8, 12, 10)
    cal = [torch.randn(2, 8, 12, 10) for _ in range(4)]
    optimized = blade.optimize(model, (x,), blade.Config(
        precision="int8", calibration=cal, dump_dir=str(tmp_path)))
    with torch.no_grad():
        for _ in range(_C.kernel_trial_calls()):  # then each layer runs its kept kernel
            got = optimized(x)
    report = assert_ran_compiled(optimized)
    assert report.int8["layers"] == ["expand", "project"], str(report)
    module = ir_before(tmp_path, "sink-slices")
    calls = [line for line in module.splitlines() if "blade::quantized_conv2d" in line]
    assert len(calls) == 2 and all("float32:nhwc" in line for line in calls), calls
    # The only transpose of 4-d data: the output's, to NCHW (the bias's is 3-d).
    transposes = re.findall(r"stablehlo.transpose .*dims = \[(\d+, \d+, \d+, \d+)\]", module)
    assert transposes == ["0, 3, 1, 2"], module
    engine = getattr(optimized, report.clusters[0].name)
    placed, copied = _C.kernel_call_result_counts()
    with torch.no_grad():
        torch.testing.assert_close([got], engine.run_subgraph([x]), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(engine.run_code([x]), [got], rtol=0, atol=0)
    assert _C.kernel_call_result_counts() == (placed + 2, copied)


class InvertedResidual(torch.nn.Module):
    """MobileNetV2's block: expand, depthwise 3x3 at stride 2 and 5x5, project, with ReLUs
    between, and a grouped convolution that is not depthwise."""

    def __init__(self):
        super().__init__()
        self.expand = torch.nn.Conv2d(8, 48, 1)
        self.depthwise = torch.nn.Conv2d(48, 48, 3, stride=2, padding=1, groups=48)
        self.depthwise5 = torch.nn.Conv2d(48, 48, 5, padding=2, groups=48)
        self.grouped = torch.nn.Conv2d(48, 48, 3, padding=1, groups=4)
        self.project = torch.nn.Conv2d(48, 16, 1)

    def forward(self, x):
        y = torch.relu(self.depthwise(torch.relu(self.expand(x))))
        y = self.grouped(torch.relu(self.depthwise5(y)))
        return self.project(y)


@needs_dot_product
def test_depthwise_convolutions_are_int8_and_pass_uint8_on():
    """Depthwise 3x3 and 5x5 convolutions are int8 (uint8 data, Blade's depthwise kernel),
    handed uint8 by the layer before and handing it on; other grouped ones stay float32."""
    report = run_block_in_int8(InvertedResidual(), (2, 8, 15, 13))
    assert report.int8["layers"] == ["expand", "depthwise", "depthwise5", "project"], \
        str(report)
    assert "grouped convolution" in report.int8["float_layers"]["grouped"], str(report)
    assert report.int8["chained"] == 2, str(report)  # expand's and depthwise's
    # Blade's depthwise kernel ran for both (timed in their kernel trials).
    choices = list(report.engine.kernel_choices())
    for filters in ("[48, 1, 3, 3]", "[48, 1, 5, 5]"):
        assert any(line.startswith(f"weight {filters}") and "Blade int8" in line
                   for line in choices), choices


def run_block_in_int8(model, shape):
    """`model` optimized in int8 on random inputs of `shape`, checked against eager
    (cosine) and its engine's code against its subgraph; the report."""
    torch.manual_seed(0)
    model.eval()
    x = torch.randn(shape)
    cal = [torch.randn(shape) for _ in range(4)]
    optimized = blade.optimize(model, (x,), blade.Config(precision="int8", calibration=cal))
    with torch.no_grad():
        got, want = optimized(x), model(x)
    report = assert_ran_compiled(optimized)
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert float(cosine) > 0.999, float(cosine)
    engine = getattr(optimized, report.clusters[0].name)
    # The engine's code against its subgraph, both on oneDNN's int8 kernels: in an engine a
    # layer runs whichever kernel its trial timed faster, outside one Blade's, and the two
    # round a hardswish's result apart by a uint8 step now and then (seen with some
    # weights). Blade's kernels have tests of their own against the ops' definitions.
    _C.set_int8_conv_enabled(False)
    try:
        with torch.no_grad():
            torch.testing.assert_close(engine.run_code([x]), engine.run_subgraph([x]),
                                       rtol=1e-4, atol=1e-4)
    finally:
        _C.set_int8_conv_enabled(True)
    report.engine = engine
    return report


class HardswishBlock(torch.nn.Module):
    """MobileNetV3's block without squeeze-excitation: hardswish after the expanding and
    the depthwise convolutions."""

    def __init__(self):
        super().__init__()
        self.expand = torch.nn.Conv2d(8, 40, 1)
        self.depthwise = torch.nn.Conv2d(40, 40, 5, padding=2, groups=40)
        self.project = torch.nn.Conv2d(40, 16, 1)

    def forward(self, x):
        h = torch.nn.functional.hardswish
        return self.project(h(self.depthwise(h(self.expand(x)))))


@needs_dot_product
def test_hardswish_is_a_convolutions_post_op_and_uint8_passes_on():
    """A hardswish between int8 convolutions runs in the first one's epilogue, before it
    rounds its result to uint8 for the next: nothing float32 between them."""
    report = run_block_in_int8(HardswishBlock(), (2, 8, 11, 12))
    assert report.int8["layers"] == ["expand", "depthwise", "project"], str(report)
    assert report.int8["chained"] == 2, str(report)
    assert "aten::hardswish" not in report.engine.fallback_ir(), report.engine.fallback_ir()


class AttentionWithInt8Projection(torch.nn.Module):
    """Attention beside an int8 linear layer, so that its engine is an int8 one."""

    def __init__(self, head_dim):
        super().__init__()
        self.proj = torch.nn.Linear(head_dim, head_dim)

    def forward(self, q, k, v, mask):
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(attended)


@needs_int8
@pytest.mark.skipif(not _C.bf16_attention_supported(), reason="this CPU lacks AVX512-BF16")
@pytest.mark.parametrize("batch, heads, rows, keys, head_dim, masked", [
    (1, 12, 128, 128, 64, False),   # BERT-base's heads: one block of rows a head
    (2, 3, 600, 600, 32, True),     # several blocks a head, reusing its k and v
    (1, 2, 7, 37, 16, True),        # keys not a whole vector: padded pairs
    (1, 2, 7, 37, 16, "empty row"),  # and a row the mask hides whole: zeros, not NaN
])
def test_int8_engines_multiply_attention_in_bf16(batch, heads, rows, keys, head_dim, masked):
    """An int8 engine's attention multiplies bfloat16 operands (float32 sums and softmax),
    on AMX tiles or AVX512-BF16's dot products, where those are faster than float32 ones
    here (made to here): about bfloat16's rounding from the float32 products, never more."""
    torch.manual_seed(0)
    q = torch.randn(batch, heads, rows, head_dim)
    k, v = torch.randn(batch, heads, keys, head_dim), torch.randn(batch, heads, keys, head_dim)
    mask = (torch.where(torch.rand(batch, 1, rows, keys) > 0.2, 0.0, -1e4) if masked
            else torch.zeros(1, 1, 1, keys))
    if masked == "empty row":
        mask[:, :, 3] = -float("inf")
    model = AttentionWithInt8Projection(head_dim).eval()
    inputs = (q, k, v, mask)
    optimized = blade.optimize(model, inputs, blade.Config(precision="int8",
                                                           calibration=[inputs]))
    with torch.no_grad():
        for _ in range(_C.kernel_trial_calls()):  # past the projection's kernel trial
            optimized(*inputs)
    report = assert_ran_compiled(optimized)
    assert [c.precision for c in report.clusters] == ["int8"], str(report)
    with torch.no_grad():
        chosen = optimized(*inputs)
        try:
            _C.set_bf16_attention("always")
            bf16 = optimized(*inputs)
            _C.set_bf16_attention("never")
            f32 = optimized(*inputs)
        finally:
            _C.set_bf16_attention("when faster")
    assert_ran_compiled(optimized)
    # By default the faster products run: bf16 where this CPU multiplies them faster.
    assert torch.equal(chosen, bf16 if _C.bf16_attention_faster() else f32)
    assert not bf16.isnan().any()
    difference = float((bf16 - f32).abs().max())
    # Rounded operands move the answer (the products ran in bfloat16), by about 2^-8 of
    # the outputs' size: the projection's int8 steps do not amplify it past a few steps.
    assert 0 < difference < 0.05 * float(f32.abs().max()), difference
    cosine = torch.nn.functional.cosine_similarity(bf16.flatten(), f32.flatten(), dim=0)
    assert float(cosine) > 0.9999


class ConvNet(torch.nn.Module):
    """Convolutions large enough for int8 (q.MIN_MACS), a depthwise one (stays float32),
    BatchNorm folded by freezing, a residual, pooling and a linear head."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.conv1 = torch.nn.Conv2d(32, 64, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(64)
        self.depthwise = torch.nn.Conv2d(64, 64, 3, padding=1, groups=64)
        self.conv2 = torch.nn.Conv2d(64, 64, 1)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x):
        y = torch.relu(self.stem(x))
        y = torch.relu(self.bn1(self.conv1(y)))
        y = y + self.conv2(torch.relu(self.depthwise(y)))
        return self.head(y.mean((2, 3)))


@needs_int8
def test_int8_convolutions_run_compiled_close_to_eager():
    torch.manual_seed(0)
    model = ConvNet().eval()
    with torch.no_grad():
        model.bn1.running_mean.uniform_(-0.5, 0.5)
        model.bn1.running_var.uniform_(0.5, 2.0)
    # 47 x 45 pixels: partial tiles in the layout changes around each convolution.
    x = torch.randn(2, 3, 47, 45)
    cal = [torch.randn(2, 3, 47, 45) for _ in range(4)]
    optimized = blade.optimize(model, (x,), blade.Config(precision="int8", calibration=cal))
    with torch.no_grad():
        got, want = optimized(x), model(x)
    report = assert_ran_compiled(optimized)
    assert report.coverage == 1.0, str(report)
    # The depthwise layer is int8 where Blade's depthwise kernel runs (AVX-512), else float.
    expected = {"conv1", "conv2"} | ({"depthwise"} if _C.int8_depthwise_available() else set())
    assert set(report.int8["layers"]) >= expected, str(report)
    engine = getattr(optimized, report.clusters[0].name)
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert float(cosine) > 0.999, float(cosine)
    assert float((got - want).abs().max()) > 1e-5  # int8 ran
    # The engine (a kernel call writing oneDNN's channels_last result into its NCHW
    # buffer) and its subgraph agree.
    with torch.no_grad():
        torch.testing.assert_close(engine.run_code([x]), engine.run_subgraph([x]),
                                   rtol=1e-4, atol=1e-4)


@needs_int8
def test_small_layers_stay_float(monkeypatch):
    monkeypatch.setattr(q, "MIN_MACS", 1 << 24)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).eval()
    cal = [torch.randn(128, 256) for _ in range(2)]
    optimized = blade.optimize(model, (cal[0],), blade.Config(precision="int8",
                                                               calibration=cal))
    report = blade.report(optimized)
    assert report.int8["layers"] == ["0", "2"], str(report)  # 16.8M and 33.6M
    assert "0.7M multiply-adds a call" in report.int8["float_layers"]["4"], str(report)


@needs_int8
def test_small_convolutions_on_blades_kernel_are_int8(monkeypatch):
    """Blade's int8 convolution costs little a call, so a small convolution is int8 where
    it runs it (MobileNet's), and float32 where only oneDNN's would."""
    monkeypatch.setattr(q, "MIN_MACS", 1 << 24)
    torch.manual_seed(0)
    x = torch.randn(1, 8, 12, 10)
    cal = [torch.randn(1, 8, 12, 10) for _ in range(2)]
    model = MobileBlock().eval()
    for blades in (True, False):
        monkeypatch.setattr(q._C, "int8_conv_available", lambda: blades)
        optimized = blade.optimize(model, (x,), blade.Config(precision="int8",
                                                            calibration=cal))
        report = blade.report(optimized)
        if blades:
            assert report.int8["layers"] == ["expand", "project"], str(report)
        else:
            assert report.int8["layers"] == [], str(report)
            assert "multiply-adds a call" in report.int8["float_layers"]["expand"]


@needs_int8
def test_weight_bound_layers_are_int8_whatever_their_multiply_adds(monkeypatch):
    """At batch 1 a linear layer reads its weight to compute one row: few multiply-adds,
    but its time is the weight's bytes, which int8 cuts to a quarter. Layers of 1M weights
    and more at that few rows are int8 (a decoder's at batch 1, a classifier's); a small
    weight at one row stays float32."""
    monkeypatch.setattr(q, "MIN_MACS", 1 << 24)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1536), torch.nn.SiLU(),
                                torch.nn.Linear(1536, 1024), torch.nn.SiLU(),
                                torch.nn.Linear(1024, 16)).eval()
    x = torch.randn(1, 1024)
    cal = [torch.randn(1, 1024) for _ in range(4)]
    optimized = blade.optimize(model, (x,), blade.Config(precision="int8", calibration=cal))
    report = blade.report(optimized)
    assert report.int8["layers"] == ["0", "2"], str(report)  # 1.6M weights each, one row
    assert "multiply-adds a call" in report.int8["float_layers"]["4"], str(report)
    with torch.no_grad():
        got = optimized(x)
        expected = model(x)
    assert_ran_compiled(optimized)
    assert torch.nn.functional.cosine_similarity(got, expected).item() > 0.999


class TwoReaders(torch.nn.Module):
    """A small 1x1 convolution and a large 3x3 one reading one input."""

    def __init__(self):
        super().__init__()
        self.small = torch.nn.Conv2d(64, 8, 1)
        self.large = torch.nn.Conv2d(64, 64, 3, padding=1)
        self.alone = torch.nn.Conv2d(8, 8, 1)

    def forward(self, x):
        return self.alone(torch.relu(self.small(x))).sum() + self.large(x).sum()


@needs_int8
def test_a_small_layer_beside_a_large_one_on_its_input_stays_int8(monkeypatch):
    monkeypatch.setattr(q, "MIN_MACS", 1 << 24)
    # As where oneDNN's kernel runs them: Blade's takes small convolutions whatever else.
    monkeypatch.setattr(q._C, "int8_conv_available", lambda: False)
    torch.manual_seed(0)
    cal = [torch.randn(1, 64, 48, 48) for _ in range(2)]
    optimized = blade.optimize(TwoReaders().eval(), (cal[0],),
                               blade.Config(precision="int8", calibration=cal))
    report = blade.report(optimized)
    # small: 1.2M multiply-adds, but its input is rounded to uint8 for `large` anyway.
    assert set(report.int8["layers"]) == {"small", "large"}, str(report)
    assert "alone" in report.int8["float_layers"], str(report)


@needs_int8
def test_float_layers_and_excluded_ops_keep_layers_float():
    model, cal = mlp(), calibration(2)
    x = torch.randn(32, 64)
    kept = blade.optimize(model, (x,), blade.Config(precision="int8", calibration=cal,
                                                     float_layers=["2"]))
    report = blade.report(kept)
    assert report.int8["float_layers"] == {"2": "it is in Config.float_layers"}, str(report)
    assert "2" not in report.int8["layers"]
    assert "kept float32: 2: it is in Config.float_layers" in str(report)
    none = blade.optimize(model, (x,), blade.Config(precision="int8", calibration=cal,
                                                     excluded_ops=["aten::linear"]))
    assert blade.report(none).int8["layers"] == []


@needs_int8
def test_an_end_layer_that_int8_would_spoil_stays_float():
    """The first layer reads one feature 1000 times larger than the others (and weighs it
    1000 times less): one uint8 scale for all of them rounds the small ones away, so the
    calibration run measures the cost and keeps the layer float."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 8)).eval()
    with torch.no_grad():
        model[0].weight[:, 0] *= 1e-3

    def sample():
        x = torch.randn(64, 16)
        x[:, 0] *= 1000.0
        return x

    cal = [sample() for _ in range(4)]
    optimized = blade.optimize(model, (cal[0],), blade.Config(precision="int8",
                                                               calibration=cal))
    report = blade.report(optimized)
    assert "0" in report.int8["float_layers"], str(report)
    assert "lowered the output's cosine similarity" in report.int8["float_layers"]["0"]
    assert report.int8["layers"] == ["2", "4"], str(report)
    x = sample()
    with torch.no_grad():
        cosine = torch.nn.functional.cosine_similarity(optimized(x).flatten(),
                                                       model(x).flatten(), dim=0)
    assert float(cosine) > 0.999


@needs_int8
def test_int8_classifier_agrees_with_its_float_model():
    """A small classifier trained here on synthetic data: int8 must pick the same class as
    the float model on at least 99% of held-out samples."""
    torch.manual_seed(0)
    centers = torch.randn(10, 32) * 2.0

    def data(n):
        labels = torch.randint(0, 10, (n,))
        return centers[labels] + torch.randn(n, 32), labels

    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        x, y = data(256)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    cal = [data(128)[0] for _ in range(8)]
    test_x, test_y = data(2000)
    optimized = blade.optimize(model, (test_x,), blade.Config(precision="int8",
                                                               calibration=cal))
    with torch.no_grad():
        float_top1 = model(test_x).argmax(1)
        int8_top1 = optimized(test_x).argmax(1)
    assert float((float_top1 == test_y).float().mean()) > 0.9  # the model learned
    agreement = float((int8_top1 == float_top1).float().mean())
    assert agreement >= 0.99, agreement
    assert_ran_compiled(optimized)


# --- saved int8 models ---------------------------------------------------------------------

LOAD_AND_RUN = textwrap.dedent("""
    import sys, torch, blade
    from blade import _C
    if sys.argv[3] != "with":
        _C.set_int8_dot_product_allowed(False)
    if sys.argv[3] == "without_int8":
        _C.set_int8_pair_sums_allowed(False)
    model = torch.jit.load(sys.argv[1])
    x, expected = torch.load(sys.argv[2])
    with torch.no_grad():
        got = model(x)
    report = blade.report(model)
    print("compiled", all(c.running_compiled for c in report.clusters))
    print("status", report.clusters[0].status)
    print("maxdiff", float((got - expected).abs().max()))
""")


@needs_int8
@pytest.mark.parametrize("cpu", ["with", "without_dot_product", "without_int8"])
@pytest.mark.parametrize("kind", ["linears", "convolutions"])
def test_saved_int8_model_runs_in_a_fresh_process(tmp_path, cpu, kind):
    """Linears, or convolutions with a residual add folded into one (the op the loading
    process must know too). Loaded where the CPU lacks a dot product, the engine runs if
    its weights were quantized for AVX2 (this CPU has no dot product either), else it is
    refused; where the CPU has no int8 kernels at all, refused."""
    if kind == "linears":
        model, cal = mlp(), calibration(4)
        x = torch.randn(32, 64)
    else:
        torch.manual_seed(0)
        model, cal = ConvNet().eval(), [torch.randn(2, 3, 20, 18) for _ in range(4)]
        x = torch.randn(2, 3, 20, 18)
    optimized = blade.optimize(model, (x,), blade.Config(precision="int8", calibration=cal))
    with torch.no_grad():
        expected = optimized(x)
    if kind == "convolutions":
        assert blade.report(optimized).int8["residual_adds"] == 1
    path = tmp_path / "int8.pt"
    torch.jit.save(optimized, str(path))
    if kind == "linears":
        float_path = tmp_path / "float.pt"
        torch.jit.save(blade.optimize(model, (x,)), str(float_path))
        # int8 weights: the file holds a quarter of the float weights' bytes, and some code.
        assert os.path.getsize(path) < 0.5 * os.path.getsize(float_path)
    torch.save((x, expected), str(tmp_path / "io.pt"))
    script = tmp_path / "run.py"
    script.write_text(LOAD_AND_RUN)
    result = subprocess.run([sys.executable, str(script), str(path), str(tmp_path / "io.pt"),
                             cpu], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    if cpu == "with" or (cpu == "without_dot_product" and not HAS_DOT_PRODUCT):
        assert lines["compiled"] == "True", result.stdout
        # The loaded engine's kernel trials may run oneDNN's kernel on the call where this
        # process ran Blade's: the two GELUs may round an activation to neighbouring steps
        # (seen: 1 of 8192, 9.4e-4 at the output), else they agree.
        assert float(lines["maxdiff"]) < 2e-3, result.stdout
    else:
        # Refused at load with the reason; the fallback runs the same int8 math in float32.
        assert lines["compiled"] == "False", result.stdout
        assert "int8" in lines["status"] and "avx512_vnni" in lines["status"], result.stdout
        if cpu == "without_dot_product":
            assert "within +-64" in lines["status"], result.stdout
        assert float(lines["maxdiff"]) < 1e-3, result.stdout


# --- models quantized before optimize ------------------------------------------------------

@needs_dot_product
@pytest.mark.parametrize("qconfig", ["per_tensor", "per_channel"])
def test_quantize_dynamic_model_compiles_its_int8_layers(qconfig):
    """torch.ao.quantization.quantize_dynamic's layers become Blade's int8 layers, with the
    model's own int8 weights: compiled whole, and no further from the float model than
    eager's int8 (fbgemm rounds activations to 7 bits, Blade to 8)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10)).eval()
    chosen = {"per_tensor": torch.ao.quantization.default_dynamic_qconfig,
              "per_channel": torch.ao.quantization.per_channel_dynamic_qconfig}[qconfig]
    quantized = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear: chosen},
                                                       dtype=torch.qint8)
    x = torch.randn(16, 64)
    optimized = blade.optimize(quantized, (x,))
    with torch.no_grad():
        got, eager_int8, float_model = optimized(x), quantized(x), model(x)
    report = assert_ran_compiled(optimized)
    assert report.coverage == 1.0, str(report)
    assert [c.precision for c in report.clusters] == ["int8"], str(report)
    assert "quantized before optimize" in str(report)
    eager_error = float((eager_int8 - float_model).abs().max())
    assert float((got - eager_int8).abs().max()) <= 2 * eager_error
    assert float((got - float_model).abs().max()) <= 1.5 * eager_error


class StaticLinears(torch.nn.Module):
    """Eager-mode static quantization: QuantStub -> Linear -> DeQuantStub, twice."""

    def __init__(self):
        super().__init__()
        self.quantize = torch.ao.quantization.QuantStub()
        self.first = torch.nn.Linear(32, 64)
        self.dequantize = torch.ao.quantization.DeQuantStub()
        self.quantize_again = torch.ao.quantization.QuantStub()
        self.second = torch.nn.Linear(64, 8)
        self.dequantize_again = torch.ao.quantization.DeQuantStub()

    def forward(self, x):
        h = torch.relu(self.dequantize(self.first(self.quantize(x))))
        return self.dequantize_again(self.second(self.quantize_again(h)))


class WritesAfterQuantizing(StaticLinears):
    def forward(self, x):
        q = self.quantize(x)
        x.mul_(2.0)  # the quantized copy holds the values of before
        return self.dequantize(self.first(q)), x


@needs_dot_product
@pytest.mark.parametrize("qconfig", ["per_tensor", "per_channel"])
def test_static_quantized_linears_compile_to_eager_s_numbers(qconfig):
    """torch.ao.quantization's static quantized::linear between quantize_per_tensor and
    dequantize becomes Blade's int8 layer with the model's int8 weight, input range and
    output range: compiled whole, and eager's int8 results (both round the same
    integers; at most a rounding of the float result to uint8 may differ, one step)."""
    torch.manual_seed(0)
    model = StaticLinears().eval()
    chosen = {"per_tensor": torch.ao.quantization.default_qconfig,
              "per_channel": torch.ao.quantization.get_default_qconfig("x86")}[qconfig]
    model.qconfig = chosen
    torch.ao.quantization.prepare(model, inplace=True)
    for _ in range(8):
        model(torch.randn(16, 32))
    torch.ao.quantization.convert(model, inplace=True)
    x = torch.randn(16, 32)
    optimized = blade.optimize(model, (x,))
    step = model.second.scale
    for inputs in (x, torch.randn(16, 32) * 2):
        with torch.no_grad():
            got, expected = optimized(inputs), model(inputs)
        assert float((got - expected).abs().max()) <= step * 1.001
        assert float((got != expected).float().mean()) < 0.01
    report = assert_ran_compiled(optimized)
    assert report.coverage == 1.0 and [c.precision for c in report.clusters] == ["int8"], \
        str(report)
    torch.manual_seed(0)
    writes = WritesAfterQuantizing().eval()
    writes.qconfig = chosen
    torch.ao.quantization.prepare(writes, inplace=True)
    writes(torch.randn(16, 32))
    torch.ao.quantization.convert(writes, inplace=True)
    optimized = blade.optimize(writes, (x.clone(),))
    with torch.no_grad():
        (got, got_x), (expected, expected_x) = optimized(x.clone()), writes(x.clone())
    assert float((got - expected).abs().max()) <= writes.first.scale * 1.001
    assert torch.equal(got_x, expected_x)


class ConvHead(torch.nn.Module):
    """A convolution, a residual one, global pooling and a linear layer: PT2E quantizes
    the convolutions, the linear layer and the residual add."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.residual = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        y = y + self.residual(y)
        return self.fc(y.mean((2, 3)))


def pt2e_quantized(model, x, dynamic: bool):
    """`model` through torchao's PT2E flow with X86InductorQuantizer."""
    pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
    x86 = pytest.importorskip("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")
    quantizer = x86.X86InductorQuantizer()
    quantizer.set_global(x86.get_default_x86_inductor_quantization_config(is_dynamic=dynamic))
    prepared = pt2e.prepare_pt2e(torch.export.export(model, (x,)).module(), quantizer)
    with torch.no_grad():
        for _ in range(4):
            prepared(torch.randn_like(x))
    return pt2e.convert_pt2e(prepared)


@needs_dot_product
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("form", ["graph_module", "exported_program"])
def test_pt2e_quantized_model_runs_as_fused_int8_layers(dynamic, form, tmp_path):
    torch.manual_seed(0)
    model = ConvHead().eval()
    x = torch.randn(2, 3, 16, 16)
    quantized = pt2e_quantized(model, x, dynamic)
    given = quantized if form == "graph_module" else torch.export.export(quantized, (x,))
    optimized = blade.optimize(given, (x,))
    with torch.no_grad():
        got, own, float_model = optimized(x), quantized(x), model(x)
    report = assert_ran_compiled(optimized)
    assert report.coverage == 1.0, str(report)  # every q/dq fused or compiled
    assert [c.precision for c in report.clusters] == ["int8"], str(report)
    # Integer products where PT2E's eager multiplies dequantized floats: the same numbers
    # but for float32 rounding, far inside one quantization step.
    assert float((got - own).abs().max()) < 1e-4
    assert float((own - float_model).abs().max()) > 1e-4  # quantization really happened
    # No Python-defined op is left: the saved model loads and runs wherever blade does.
    assert "quantized_decomposed" not in str(optimized.inlined_graph)
    path = tmp_path / "pt2e.pt"
    torch.jit.save(optimized, str(path))
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.load(str(path))(x), got, rtol=0, atol=0)


@needs_dot_product
@pytest.mark.parametrize("block", [InvertedResidual, HardswishBlock])
def test_pt2e_quantized_mobile_blocks_run_compiled(block):
    """PT2E's depthwise and grouped convolutions, and its hardswish between them, run
    fused in the int8 engine (Blade's depthwise kernel), as PT2E's own eager computes."""
    torch.manual_seed(0)
    x = torch.randn(1, 8, 15, 13)
    quantized = pt2e_quantized(block().eval(), x, dynamic=False)
    optimized = blade.optimize(quantized, (x,))
    with torch.no_grad():
        own = quantized(x)
        for _ in range(_C.kernel_trial_calls()):  # the trials': Blade's kernels, oneDNN's
            torch.testing.assert_close(optimized(x), own, rtol=0, atol=1e-4)
    report = assert_ran_compiled(optimized)
    assert report.coverage == 1.0, str(report)
    assert [c.precision for c in report.clusters] == ["int8"], str(report)
    # The depthwise convolution's trial timed Blade's kernel.
    choices = [line for c in report.clusters for line in c.kernel_choices]
    assert any(re.match(r"weight \[\d+, 1, [35], [35]\].*Blade int8 \d", line)
               for line in choices), choices


def test_lowered_quantize_ops_compute_as_pt2e_defines_them():
    """quant_fusion.lower's aten ops give PT2E's own quantize/dequantize results."""
    from torch.ao.quantization.fx import _decomposed  # noqa: F401  (registers the ops)

    from blade.frontend import quant_fusion

    def fake_quantize(x):
        q = torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.05, 100, 0, 255,
                                                               torch.uint8)
        return torch.ops.quantized_decomposed.dequantize_per_tensor(q, 0.05, 100, 0, 255,
                                                                    torch.uint8)

    x = torch.randn(64) * 5
    traced = torch.jit.trace(fake_quantize, (x,))
    assert quant_fusion.lower(traced.graph) == 2
    assert "quantized_decomposed" not in str(traced.graph)
    torch.testing.assert_close(traced(x), fake_quantize(x), rtol=0, atol=0)


@needs_int8
def test_model_cache_keys_the_calibration_inputs_by_their_values(tmp_path, request):
    """The same int8 optimize is taken from the model cache; other calibration values (of
    the same shapes, which a key by their repr could not tell apart) compile again. Kernel
    trials off: each engine would keep whichever of two kernels it timed faster, whose
    results differ in float32 rounding."""
    model, cal = mlp(), calibration(2)
    x = torch.randn(32, 64)
    _C.set_kernel_trials(False)
    request.addfinalizer(lambda: _C.set_kernel_trials(True))

    def optimize(samples):
        return blade.optimize(model, (x,), blade.Config(precision="int8", calibration=samples,
                                                         cache_dir=str(tmp_path)))

    first = optimize(cal)
    again = optimize([t.clone() for t in cal])
    other = optimize([t * 3 for t in cal])
    assert blade.report(first).model_cache == ""
    assert blade.report(again).model_cache == "hit", str(blade.report(again))
    assert blade.report(other).model_cache == "", str(blade.report(other))
    with torch.no_grad():
        torch.testing.assert_close(again(x), first(x), rtol=0, atol=0)
        assert not torch.equal(other(x), first(x))  # its ranges differ


@needs_int8
def test_a_calibration_input_the_model_cannot_take_is_one_clear_error():
    cal = [torch.randn(32, 64), torch.randn(32, 48)]  # the second: wrong feature count
    with pytest.raises(blade.ExampleInputsError, match=r"calibration input 1 \(input: "
                                                       r"float32\[32,48\]\)"):
        blade.optimize(mlp(), (torch.randn(32, 64),),
                       blade.Config(precision="int8", calibration=cal))


@needs_int8
def test_int8_with_dynamic_shapes_serves_other_batch_sizes():
    """Under Config(dynamic=True) the int8 linear layers stay inside the engine (their
    result's sizes are their input's but for the last), for every batch size; sizes going
    back and forth at one address, as the kernel calls' operand views are kept only while
    their buffers' sizes stay the same too."""
    model, cal = mlp(), calibration(4)
    optimized = blade.optimize(model, (torch.randn(32, 64),),
                               blade.Config(precision="int8", calibration=cal, dynamic=True))
    # Leading rows of one tensor: the first layer's operand at one address, its sizes
    # changing.
    rows_of = torch.randn(50, 64, generator=torch.Generator().manual_seed(5))
    inputs = {rows: rows_of[:rows] for rows in (1, 7, 32, 50)}
    first = {}
    for rows in (1, 7, 32, 50, 7, 1, 50):
        with torch.no_grad():
            got, want = optimized(inputs[rows]), model(inputs[rows])
        assert got.shape == (rows, 10)
        if rows in first:  # the same input again, after other sizes: the same answer (but
            # for a kernel trial's other kernel, rounding apart)
            assert float(torch.nn.functional.cosine_similarity(
                got.flatten(), first[rows].flatten(), dim=0)) > 0.9999
            continue
        first[rows] = got
        assert float(torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(),
                                                           dim=0)) > 0.999
    report = assert_ran_compiled(optimized)
    assert report.guard_fallbacks == 0 and report.coverage == 1.0, str(report)
    assert [c.precision for c in report.clusters] == ["int8"], str(report)
    assert len(report.int8["layers"]) == 3, str(report)


class PooledResidualNet(torch.nn.Module):
    """A strided stem, an int8 max pool (rounding its size up), a residual add folded into
    a convolution, a 1x1 and a 3x3 of stride 2 and dilation 2 (a 5 x 5 window): every int8
    kernel call whose result's spatial sizes follow from its input's."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.pool = torch.nn.MaxPool2d(3, 2, 1, ceil_mode=True)
        self.conv = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.wide = torch.nn.Conv2d(16, 32, 1)
        self.down = torch.nn.Conv2d(32, 24, 3, stride=2, dilation=2)
        self.head = torch.nn.Linear(24, 10)

    def forward(self, x):
        y = self.pool(torch.relu(self.stem(x)))
        y = torch.relu(self.conv(y) + y)
        y = torch.relu(self.down(torch.relu(self.wide(y))))
        return self.head(y.mean((2, 3)))


@needs_int8
def test_int8_convolutions_with_dynamic_shapes_serve_other_image_sizes():
    """Under Config(dynamic=True) the int8 convolutions and max pool stay inside the engine
    (each result's batch and spatial sizes computed from its input's), for images of every
    size and batch, square or not; an image too small for a filter is refused by the
    convolution and runs the TorchScript fallback with eager's answer."""
    torch.manual_seed(0)
    model = PooledResidualNet().eval()
    generator = torch.Generator().manual_seed(3)
    cal = [(torch.randn(2, 3, 32, 32, generator=generator),) for _ in range(4)]
    optimized = blade.optimize(model, (torch.randn(2, 3, 32, 32),),
                               blade.Config(precision="int8", calibration=cal, dynamic=True))
    for shape in ((2, 3, 32, 32), (3, 3, 40, 24), (1, 3, 17, 33), (4, 3, 64, 64),
                  (3, 3, 40, 24)):
        x = torch.randn(shape, generator=generator)
        with torch.no_grad():
            got, want = optimized(x), model(x)
        assert got.shape == want.shape
        assert float(torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(),
                                                           dim=0)) > 0.999, shape
    report = assert_ran_compiled(optimized)
    assert report.guard_fallbacks == 0 and report.coverage == 1.0, str(report)
    assert [c.precision for c in report.clusters] == ["int8"], str(report)
    assert {"stem", "conv", "wide", "down"} <= set(report.int8["layers"]), str(report)
    # 6 x 6 pixels: the 5 x 5 window does not fit the pooled 2 x 2 image.
    tiny = torch.randn(1, 3, 6, 6, generator=generator)
    with torch.no_grad(), pytest.raises(RuntimeError):
        model(tiny)
    with torch.no_grad(), pytest.raises(RuntimeError, match="quantized_conv2d.*does not fit"), \
            pytest.warns(UserWarning, match="ran its TorchScript subgraph") as warned:
        optimized(tiny)
    # The fallback's reason is the op's message, without PyTorch's C++ backtrace.
    assert not any("frame #" in str(w.message) for w in warned), [str(w.message) for w in warned]


class SequenceConvs(torch.nn.Module):
    """A sequence model's 1-d convolutions (padded, strided, dilated) and a linear head."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Conv1d(40, 64, 5, padding=2)
        self.strided = torch.nn.Conv1d(64, 64, 3, stride=2, padding=1)
        self.dilated = torch.nn.Conv1d(64, 64, 3, padding=2, dilation=2)
        self.head = torch.nn.Linear(64, 12)

    def forward(self, x):
        y = torch.relu(self.strided(torch.relu(self.first(x))))
        return self.head(torch.relu(self.dilated(y)).mean(-1))


@needs_int8
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_conv1d_layers_are_int8_convolutions(dynamic):
    """aten::conv1d runs as a 2-d convolution of a 1 x k filter (decompositions.py), so its
    layers are int8 ones, named by their weights as before; Config.float_layers keeps one
    float by that name."""
    torch.manual_seed(0)
    model = SequenceConvs().eval()
    generator = torch.Generator().manual_seed(4)
    cal = [(torch.randn(2, 40, 120, generator=generator),) for _ in range(4)]
    x = torch.randn(2, 40, 120, generator=generator)
    optimized = blade.optimize(model, (x,), blade.Config(precision="int8", calibration=cal,
                                                         dynamic=dynamic))
    for inputs in [x] + ([torch.randn(3, 40, 77, generator=generator)] if dynamic else []):
        with torch.no_grad():
            got, want = optimized(inputs), model(inputs)
        assert float(torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(),
                                                           dim=0)) > 0.999
    report = assert_ran_compiled(optimized)
    assert report.coverage == 1.0 and report.guard_fallbacks == 0, str(report)
    assert {"first", "strided", "dilated"} <= set(report.int8["layers"]), str(report)
    kept = blade.optimize(model, (x,), blade.Config(precision="int8", calibration=cal,
                                                    float_layers=["dilated"]))
    assert "dilated" in blade.report(kept).int8["float_layers"], str(blade.report(kept))


def test_model_cache_keys_the_weight_limit(without_int8_dot_product):
    """Weights quantized for one limit must not be served where the CPU's kernels take
    another (a test switching the dot product off; a cache shared across CPUs)."""
    from blade import model_cache
    without = model_cache._environment()
    _C.set_int8_dot_product_allowed(True)
    with_dot_product = model_cache._environment()
    assert (without == with_dot_product) == (not HAS_DOT_PRODUCT)
    assert f"int8 weights within {_C.int8_weight_limit()}" in with_dot_product

"""Blade's own int8 convolution (csrc/ral/int8_conv.*): an implicit GEMM over uint8 NHWC
activations, multiplied in Blade's register tiles (AVX-512 VNNI) or by oneDNN's u8 x s8
microkernel, with Blade's epilogue. It runs the convolutions of
blade::quantized_conv2d(_add) it takes; the rest run oneDNN's qconv2d."""
import pytest
import torch

import blade
from blade import _C
from helpers import assert_ran_compiled, run_both

needs_kernel = pytest.mark.skipif(not _C.int8_conv_available(),
                                  reason="this CPU lacks AVX-512 VNNI, AMX-INT8 and AVX2")
# The largest weight magnitude the int8 kernels take here (AVX2's pair sums: 64).
LIMIT = _C.int8_weight_limit() or 127
needs_depthwise = pytest.mark.skipif(not _C.int8_depthwise_available(),
                                     reason="this CPU lacks AVX-512 (the int8 depthwise kernel)")

INPUT_RANGE = torch.tensor([0.02, 7.0])    # scale, zero point
OUTPUT_RANGE = torch.tensor([0.05, 3.0])
ADDED_RANGE = torch.tensor([0.03, 5.0])


@pytest.fixture(autouse=True)
def oneDNN_back_on():
    yield
    _C.set_int8_conv_enabled(True)
    _C.set_int8_conv_tiles(True)


@pytest.fixture(params=["tiles", "microkernel"])
def multiply(request):
    """Blade's register tiles, or (on AMX-INT8 CPUs) its AMX tiles or (elsewhere) oneDNN's
    brgemm microkernel, where each runs here."""
    _C.set_int8_conv_tiles(request.param == "tiles")
    if _C.int8_conv_tiles_run() != (request.param == "tiles"):
        pytest.skip(f"the {request.param} do not run on this CPU")
    return request.param


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request):
    """The kernel's blocks on one thread and split between two (tests run on one each),
    however few products the convolution has (the kernel runs those on one thread)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    _C.set_int8_conv_serial_products(0 if request.param > 1 else -1)
    yield request.param
    _C.set_int8_conv_serial_products(-1)
    torch.set_num_threads(before)


def operands(batch, channels, size, out_channels, kernel, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (batch, size[0], size[1], channels), dtype=torch.uint8,
                      generator=gen)
    weight = torch.randint(-LIMIT, LIMIT + 1, (out_channels, channels, kernel, kernel),
                           dtype=torch.int8, generator=gen)
    scale = torch.rand(out_channels, generator=gen) * 0.01 + 0.001
    bias = torch.randn(out_channels, generator=gen)
    return x.view(torch.int8), weight, scale, bias


def real_image(x):
    """The uint8 NHWC input (as int8 bytes) as the float64 [N, C, H, W] values it stands for."""
    return ((x.view(torch.uint8).double() - INPUT_RANGE[1]) * INPUT_RANGE[0]).permute(0, 3, 1, 2)


def reference(x, weight, scale, bias, stride, padding, added=None):
    """The convolution in float64 on the dequantized operands, ReLU after any addend."""
    w = weight.double() * scale.double().view(-1, 1, 1, 1)
    y = torch.nn.functional.conv2d(real_image(x), w, bias.double(), stride, padding)
    if added is not None:
        y = y + added
    return torch.relu(y)


def uint8_of(result):
    """A uint8 result ([N, H, W, C] as int8 bytes) as real values, [N, C, H, W]."""
    q = result.view(torch.uint8).double()
    return ((q - OUTPUT_RANGE[1]) * OUTPUT_RANGE[0]).permute(0, 3, 1, 2)


POST_OPS = {"relu": torch.relu, "hardswish": torch.nn.functional.hardswish,
            "none": lambda y: y}


def assert_rounds_to(result, want, onednn=None):
    """A uint8 result is `want` (float64, [N, C, H, W]) rounded with OUTPUT_RANGE (clamped
    to it), and within one step of oneDNN's where given."""
    step, zero_point = OUTPUT_RANGE[0].item(), OUTPUT_RANGE[1].item()
    clamped = want.clamp(min=-zero_point * step, max=(255 - zero_point) * step)
    assert (uint8_of(result) - clamped).abs().max() <= 0.5 * step + 1e-4
    if onednn is not None:
        assert (result.view(torch.uint8).int() - onednn.view(torch.uint8).int()).abs().max() <= 1


@needs_kernel
@pytest.mark.parametrize("batch, channels, size, out_channels, kernel, stride, padding", [
    (1, 64, (14, 14), 256, 1, 1, 0),   # a bottleneck's 1x1: rows in one plane, no copy
    (2, 32, (9, 11), 70, 3, 1, 1),     # padding; a partial block of output channels
    (1, 36, (13, 10), 130, 3, 2, 1),   # stride 2: a strided walk (tiles), 4 planes, odd sizes
    (2, 68, (12, 12), 8, 1, 2, 0),     # a strided 1x1: the input as it is (tiles), subsampled
    (1, 16, (11, 9), 24, 5, 1, 2),     # a 5x5 filter
    (1, 4, (23, 23), 64, 7, 2, 3),     # a 7x7 stem of four channels
    (2, 3, (20, 17), 64, 7, 2, 3),     # an image's 3 channels: unfolded, 147 bytes a pixel
    (1, 3, (45, 44), 24, 7, 2, 3),     # a wider one: blocks of rows span output rows
    (1, 3, (40, 37), 16, 3, 1, 1),     # 3 channels at stride 1
    (1, 3, (32, 32), 32, 4, 4, 0),     # a 4x4 patchify stem, no padding
    (1, 2, (5, 1), 8, 3, 3, 1),        # a 1-pixel row: every filter row partly padding
    (1, 2, (6, 2), 8, 3, 4, 1),        # the same at stride 4
    (1, 1, (9, 8), 16, 3, 1, 1),       # one channel: 9 bytes a pixel, padded to 12
    (1, 3, (19, 23), 130, 5, 2, 2),    # unfolded rows reused by three blocks of outputs
    (1, 3, (5, 3), 8, 1, 2, 0),        # a strided 1x1 of 3 channels: planes, spread
    (1, 4, (9, 9), 8, 3, 2, 1),        # 4 channels: planes (nothing padded), spread
    (1, 6, (7, 7), 24, 1, 1, 0),       # no padding or stride: copied to pad 6 channels to 8
    (1, 5, (8, 9), 16, 3, 1, 1),       # rows keep their left padding; 5 channels padded
    (1, 32, (9, 9), 48, 3, 1, 0),      # no padding, a filter wider than 1
    (1, 260, (3, 3), 1, 3, 1, 1),      # more channels than rows, one output channel
    (1, 128, (4, 5), 200, 3, 1, 1),    # a weight 16x its input and more: column blocks split
    (1, 12, (6, 7), 20, 3, 1, 2),      # padding 2: taps read two columns into the next row
    (1, 8, (5, 6), 16, 1, 1, 1),       # padding as wide as the filter: rows padded both sides
    (4, 32, (180, 180), 8, 3, 2, 1),   # planes past what a thread keeps: made per call
    (1, 256, (96, 96), 64, 1, 1, 0),   # a 1x1 over 2.3 MB of input: rows fetched ahead
    (1, 256, (96, 96), 130, 1, 1, 0),  # the same by three column blocks taking rows in turn
    (1, 2, (7, 9), 8, 1, 3, 0),        # a strided 1x1 of 2 channels: spread at stride 3
    (1, 2, (9, 10), 8, 1, 4, 0),       # and at stride 4
    (1, 16, (11, 9), 20, 3, 3, 1),     # stride 3: the walk steps 3 pixels
    (2, 8, (10, 10), 24, 2, 2, 0),     # a 2x2 stride-2 downsampling: the tiles copy nothing
    (1, 12, (9, 12), 16, 4, 2, 1),     # a 4x4 filter at stride 2: a filter row one group
    (1, 8, (8, 7), 16, 3, 2, 2),       # padding 2 at stride 2: taps read the next row's
])
def test_blades_kernel_matches_the_real_convolution_and_onednns(
        batch, channels, size, out_channels, kernel, stride, padding, threads, multiply):
    x, weight, scale, bias = operands(batch, channels, size, out_channels, kernel, 0)
    (mine, onednn), ran = run_both(lambda: torch.ops.blade.quantized_conv2d(
        x, weight, scale, bias, [stride] * 2, [padding] * 2, [1, 1], 1, INPUT_RANGE,
        OUTPUT_RANGE, "relu"))
    assert ran == [1, 0]
    want = reference(x, weight, scale, bias, stride, padding)
    # Rounded once to the output's step: within half a step of the real value (and a
    # float32 rounding), within one step of oneDNN's rounding of it.
    assert_rounds_to(mine, want, onednn)


@needs_kernel
@pytest.mark.parametrize("batch, channels, size, filter_size, stride, padding", [
    (2, 8, (9, 10), (3, 3), (2, 1), (1, 1)),   # row stride 2, column stride 1: padded rows
    (1, 12, (8, 11), (3, 3), (1, 2), (0, 1)),  # column stride 2
    (1, 16, (6, 13), (1, 7), (1, 1), (0, 3)),  # a 1 x 7 filter: seven taps merged
    (1, 16, (13, 6), (7, 1), (1, 1), (3, 0)),  # a 7 x 1 filter
    (2, 2, (7, 9), (3, 3), (1, 1), (2, 1)),    # unequal padding; 2 channels padded to 4
    (1, 3, (12, 30), (5, 11), (2, 3), (2, 5)),  # filter rows of 33 bytes: 64-byte moves
    (2, 3, (10, 9), (3, 5), (1, 2), (0, 2)),   # unfolded with unequal strides and padding
    (1, 1, (9, 12), (5, 7), (2, 1), (2, 4)),   # unfolded, one channel: many edge pixels
    (1, 3, (6, 5), (3, 7), (1, 1), (1, 3)),    # filter rows past both edges of a line
])
@pytest.mark.parametrize("post_op, uint8_result", [("relu", True), ("hardswish", True),
                                                   ("hardswish", False)])
def test_unequal_strides_paddings_and_filters(batch, channels, size, filter_size, stride,
                                              padding, post_op, uint8_result, threads):
    """Both ways of multiplying agree exactly with each other and with the real
    convolution within half a step, on geometry that differs by direction."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randint(0, 256, (batch, size[0], size[1], channels), dtype=torch.uint8,
                      generator=gen).view(torch.int8)
    weight = torch.randint(-LIMIT, LIMIT + 1, (40, channels) + filter_size, dtype=torch.int8,
                           generator=gen)
    scale = torch.rand(40, generator=gen) * 0.01 + 0.001
    bias = torch.randn(40, generator=gen)
    results = []
    for tiles in (True, False):
        _C.set_int8_conv_tiles(tiles)
        before = _C.int8_conv_calls()
        results.append(torch.ops.blade.quantized_conv2d(
            x, weight, scale, bias, list(stride), list(padding), [1, 1], 1, INPUT_RANGE,
            OUTPUT_RANGE if uint8_result else None, post_op))
        assert _C.int8_conv_calls() == before + 1
    assert torch.equal(results[0], results[1])
    w = weight.double() * scale.double().view(-1, 1, 1, 1)
    want = POST_OPS[post_op](torch.nn.functional.conv2d(real_image(x), w, bias.double(),
                                                        stride, padding))
    if uint8_result:
        assert_rounds_to(results[0], want)
    else:
        torch.testing.assert_close(results[0].double(), want, rtol=1e-5, atol=1e-4)


@needs_kernel
@pytest.mark.parametrize("kernel, stride, padding", [(1, 1, 0), (3, 2, 1)])
@pytest.mark.parametrize("channels", [32, 24, 4, 3, 2, 1])
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_float_results_and_float_inputs(kernel, stride, padding, channels, layout, multiply):
    """A float32 input, NCHW or channels_last (quantized by the op: transposed in 16 x 16
    tiles and their tails, a few channels as an image's a pixel at a time, channels_last
    value by value) and a float32 result, channels_last. The input lies within a third of a
    step of the values it stands for, so it rounds back to them."""
    x, weight, scale, bias = operands(2, channels, (10, 37), 40, kernel, 1)
    noise = (torch.rand(real_image(x).shape, generator=torch.Generator().manual_seed(5)) - 0.5)
    real = (real_image(x) + noise * (2 / 3) * INPUT_RANGE[0].item()).float()
    (mine, onednn), ran = run_both(lambda: torch.ops.blade.quantized_conv2d(
        real.contiguous(memory_format=layout), weight, scale, bias, [stride] * 2,
        [padding] * 2, [1, 1], 1, INPUT_RANGE, None, "relu"))
    assert ran == [1, 0]
    assert mine.is_contiguous(memory_format=torch.channels_last)
    want = reference(x, weight, scale, bias, stride, padding).float()
    torch.testing.assert_close(mine, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine, onednn, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_an_images_few_channels_round_as_one_value_at_a_time(channels):
    """A float32 NCHW image of at most 4 channels is quantized a pixel's channels at once
    (csrc/ral/layout_kernels.cpp): x * (1 / scale) + zero point rounded twice in float32,
    clamped to [0, 255], ties to even, NaN to 0, as the scalar form. An identity 1x1
    convolution returns the steps (q - zero point) * scale exactly."""
    scale, zero_point = 0.25, 7.0
    gen = torch.Generator().manual_seed(channels)
    # Ties (k + 0.5 steps), values past both ends, infinities and NaN, over 5 x 7 pixels
    # (whole groups of 8 pixels and a tail).
    x = (torch.randint(-20, 260, (1, channels, 5, 7), generator=gen).float() - zero_point +
         0.5) * scale
    x.view(-1)[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30])
    weight = torch.eye(channels, dtype=torch.int8).view(channels, channels, 1, 1)
    got = torch.ops.blade.quantized_conv2d(
        x, weight, torch.ones(channels), None, [1, 1], [0, 0], [1, 1], 1,
        torch.tensor([scale, zero_point]), None, "none")
    inverse = torch.tensor(1 / scale, dtype=torch.float32)
    steps = torch.nan_to_num(x * inverse + zero_point, nan=0.0).clamp(0, 255).round()
    torch.testing.assert_close(got, (steps - zero_point) * scale, rtol=0, atol=0)


@needs_kernel
@pytest.mark.parametrize("batch, channels, size, out_channels, kernel, stride, padding", [
    (1, 64, (14, 14), 256, 1, 1, 0),   # 196 rows: 39 tiles of 5 and one of 1, 32 of 6 and 4
    (1, 36, (13, 10), 130, 3, 2, 1),   # a strided walk; blocks of 4 vectors and of 1
    (2, 32, (9, 11), 70, 3, 1, 1),     # padding, two images
    (1, 256, (96, 96), 64, 1, 1, 0),   # rows fetched ahead
])
def test_wide_tiles_of_5_rows_give_the_6_rows_results(batch, channels, size, out_channels,
                                                       kernel, stride, padding, threads):
    """The tiles of 4 vectors run 5 rows on AMD's Zen 4, 6 elsewhere: both heights, run on
    any CPU with the VNNI tiles, give the same bytes (the same sums and epilogue), with a
    residual add too, and match the real convolution."""
    _C.set_int8_conv_tiles(True)
    if not _C.int8_conv_tiles_run() or LIMIT != 127:
        pytest.skip("the VNNI register tiles do not run on this CPU")
    x, weight, scale, bias = operands(batch, channels, size, out_channels, kernel, 4)
    out_h = (size[0] + 2 * padding - kernel) // stride + 1
    out_w = (size[1] + 2 * padding - kernel) // stride + 1
    added = torch.randint(0, 256, (batch, out_h, out_w, out_channels), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(5)).view(torch.int8)
    results = {}
    try:
        for rows in (6, 5):
            _C.set_int8_wide_tile_rows(rows)
            calls = _C.int8_conv_calls()
            results[rows] = (
                torch.ops.blade.quantized_conv2d(
                    x, weight, scale, bias, [stride] * 2, [padding] * 2, [1, 1], 1,
                    INPUT_RANGE, OUTPUT_RANGE, "relu"),
                torch.ops.blade.quantized_conv2d_add(
                    x, weight, scale, bias, [stride] * 2, [padding] * 2, [1, 1], 1,
                    INPUT_RANGE, added, ADDED_RANGE, OUTPUT_RANGE, "relu"))
            assert _C.int8_conv_calls() == calls + 2  # Blade's kernel ran both
    finally:
        _C.set_int8_wide_tile_rows(0)
    assert torch.equal(results[5][0], results[6][0])
    assert torch.equal(results[5][1], results[6][1])
    assert_rounds_to(results[5][0], reference(x, weight, scale, bias, stride, padding))
    with pytest.raises(RuntimeError, match="rows must be 0 .*, 6 or 5, got 4"):
        _C.set_int8_wide_tile_rows(4)


@needs_kernel
@pytest.mark.parametrize("added_dtype", [torch.int8, torch.float32])
@pytest.mark.parametrize("uint8_result", [True, False])
@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize("out_channels", [72, 24, 40])  # narrow tiles of 1, 2 and 3 vectors
def test_residual_adds(added_dtype, uint8_result, kernel, out_channels, threads, multiply):
    """The tensor added: the uint8 activation of another int8 layer (NHWC bytes), or
    float32 (rounded with its range first for a uint8 result, as oneDNN's sum takes it)."""
    x, weight, scale, bias = operands(2, 32, (8, 8), out_channels, kernel, 2)
    padding = kernel // 2
    gen = torch.Generator().manual_seed(3)
    if added_dtype == torch.int8:
        added = torch.randint(0, 256, (2, 8, 8, out_channels), dtype=torch.uint8,
                              generator=gen)
        added_real = ((added.double() - ADDED_RANGE[1]) * ADDED_RANGE[0]).permute(0, 3, 1, 2)
        added = added.view(torch.int8)
    else:
        added = torch.randn(2, out_channels, 8, 8, generator=gen)
        added_real = added.double()
        if uint8_result:
            q = torch.clamp(torch.round(added_real / ADDED_RANGE[0] + ADDED_RANGE[1]), 0, 255)
            added_real = (q - ADDED_RANGE[1]) * ADDED_RANGE[0]
    (mine, onednn), ran = run_both(lambda: torch.ops.blade.quantized_conv2d_add(
        x, weight, scale, bias, [1, 1], [padding] * 2, [1, 1], 1, INPUT_RANGE, added,
        ADDED_RANGE, OUTPUT_RANGE if uint8_result else None, "relu"))
    assert ran == [1, 0]
    want = reference(x, weight, scale, bias, 1, padding, added_real)
    if uint8_result:
        assert_rounds_to(mine, want, onednn)
    else:
        torch.testing.assert_close(mine, want.float(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mine, onednn, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("kernel, out_channels", [(1, 64), (3, 40)])
def test_an_input_of_zero_point_0_matches_the_real_convolution(kernel, out_channels, threads,
                                                                multiply):
    """An input whose zero point is 0 (a ReLU's) has no share of it to subtract from the
    sums (the register tiles skip the step): the result is still the real convolution's,
    a residual added, within one step of oneDNN's."""
    x, weight, scale, bias = operands(2, 32, (8, 8), out_channels, kernel, 4)
    input_range = torch.tensor([0.02, 0.0])
    added = torch.randint(0, 256, (2, 8, 8, out_channels), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(5))
    added_real = ((added.double() - ADDED_RANGE[1]) * ADDED_RANGE[0]).permute(0, 3, 1, 2)
    (mine, onednn), ran = run_both(lambda: torch.ops.blade.quantized_conv2d_add(
        x, weight, scale, bias, [1, 1], [kernel // 2] * 2, [1, 1], 1, input_range,
        added.view(torch.int8), ADDED_RANGE, OUTPUT_RANGE, "relu"))
    assert ran == [1, 0]
    real = (x.view(torch.uint8).double() * 0.02).permute(0, 3, 1, 2)
    w = weight.double() * scale.double().view(-1, 1, 1, 1)
    want = torch.relu(torch.nn.functional.conv2d(real, w, bias.double(), 1, kernel // 2) +
                      added_real)
    assert_rounds_to(mine, want, onednn)


@needs_kernel
@pytest.mark.parametrize("channels, groups, dilation", [(16, 2, 1), (16, 1, 2)])
def test_what_it_does_not_take_runs_onednns(channels, groups, dilation):
    """Groups, dilation: oneDNN's kernel, still right."""
    x, _, scale, bias = operands(1, channels, (9, 9), 8, 3, 4)
    weight = torch.randint(-LIMIT, LIMIT + 1, (8, channels // groups, 3, 3), dtype=torch.int8)
    before = _C.int8_conv_calls()
    got = torch.ops.blade.quantized_conv2d(x, weight, scale, bias, [1, 1], [1, 1],
                                           [dilation] * 2, groups, INPUT_RANGE, None, "none")
    assert _C.int8_conv_calls() == before
    real = real_image(x)
    w = weight.double() * scale.double().view(-1, 1, 1, 1)
    want = torch.nn.functional.conv2d(real, w, bias.double(), 1, 1, dilation, groups)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


class Bottleneck(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # Layers large enough for Blade's quantization to make them int8.
        self.stem = torch.nn.Conv2d(3, 64, 3, padding=1)
        self.reduce = torch.nn.Conv2d(64, 64, 1)
        self.conv = torch.nn.Conv2d(64, 64, 3, padding=1)
        self.expand = torch.nn.Conv2d(64, 64, 1)
        self.head = torch.nn.Conv2d(64, 64, 1)

    def forward(self, x):
        y = torch.relu(self.stem(x))
        z = torch.relu(self.conv(torch.relu(self.reduce(y))))
        return self.head(torch.relu(self.expand(z) + y))


def int8_engine(model, x):
    cal = [torch.randn(x.shape) for _ in range(4)]
    return blade.optimize(model, (x,), blade.Config(precision="int8", calibration=cal))


@needs_kernel
def test_an_int8_engine_times_blades_kernel_against_onednns():
    """Blade's quantization of a bottleneck: every int8 convolution (the float stem aside)
    is a kernel trial of Blade's kernel against oneDNN's, which times each a few times and
    settles; the engine's results are near the float model's, as oneDNN's alone are."""
    torch.manual_seed(0)
    x = torch.randn(1, 3, 64, 64)
    model = Bottleneck().eval()
    optimized = int8_engine(model, x)
    before = _C.int8_conv_calls()
    with torch.no_grad():
        for _ in range(_C.kernel_trial_calls()):
            first = optimized(x)
    ran = _C.int8_conv_calls() - before
    report = assert_ran_compiled(optimized)
    takes = report.int8["layers"]
    assert {"reduce", "conv", "expand", "head"} <= set(takes), str(report)
    # Each trial's timed runs of Blade's kernel (more once it is kept).
    assert ran >= 3 * len(takes)
    engine = getattr(optimized, report.clusters[0].name)
    trials = [line for line in engine.kernel_choices() if "Blade int8" in line]
    assert len(trials) == len(takes) and "undecided" not in str(trials), trials
    _C.set_int8_conv_enabled(False)
    with torch.no_grad():
        onednn = int8_engine(model, x)(x)
        want = model(x)
    for got in (first, onednn):
        cosine = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
        assert cosine > 0.999
    torch.testing.assert_close(first, onednn, rtol=0, atol=0.05 * want.abs().max())


@needs_depthwise
@pytest.mark.parametrize("batch, channels, size, kernel, stride, padding", [
    (1, 32, (12, 11), 3, 1, 1),   # MobileNet's 3x3, a whole vector of channels twice
    (2, 24, (9, 10), 3, 2, 1),    # stride 2; a partial vector of channels
    (1, 72, (14, 13), 5, 2, 2),   # a 5x5 at stride 2
    (1, 40, (7, 7), 5, 1, 2),     # a 5x5 wider than half the image: every column a border
    (1, 16, (9, 8), 3, 2, 0),     # no padding: every tap inside
    (1, 40, (6, 21), 5, 1, 2),    # rows of 17 inside pixels: two windows of 8 and one
    (1, 20, (7, 9), 3, 1, 1),     # 20 channels: a partial vector
    (1, 20, (10, 11), 3, 3, 1),   # stride 3: one pixel at a time, a partial vector
])
@pytest.mark.parametrize("uint8_result", [True, False])
@pytest.mark.parametrize("float_input", [False, True])
@pytest.mark.parametrize("post_op", ["relu", "hardswish", "none"])
def test_depthwise_convolutions(batch, channels, size, kernel, stride, padding, uint8_result,
                                float_input, post_op, threads):
    """A depthwise convolution (one int8 filter per channel) on uint8 data, by Blade's
    depthwise kernel in float32: as the float64 reference within rounding, and as oneDNN's
    within one step of a uint8 result."""
    x, weight, scale, bias = operands(batch, channels, size, channels, kernel, 6)
    weight = weight[:, :1].contiguous()
    source = real_image(x).float().contiguous(memory_format=torch.channels_last) \
        if float_input else x
    (mine, onednn), ran = run_both(lambda: torch.ops.blade.quantized_conv2d(
        source, weight, scale, bias, [stride] * 2, [padding] * 2, [1, 1], channels,
        INPUT_RANGE, OUTPUT_RANGE if uint8_result else None, post_op))
    assert ran == [1, 0]
    w = weight.double() * scale.double().view(-1, 1, 1, 1)
    want = POST_OPS[post_op](torch.nn.functional.conv2d(real_image(x), w, bias.double(),
                                                        stride, padding, groups=channels))
    if uint8_result:
        assert_rounds_to(mine, want, onednn)
    else:
        assert mine.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(mine.double(), want, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(mine, onednn, rtol=1e-5, atol=1e-4)


@needs_kernel
@pytest.mark.parametrize("post_op, low", [("relu", 3), ("none", 0)])
def test_uint8_results_far_past_their_range_agree_in_tiles_and_microkernel(post_op, low):
    """A result scale so small that the sums land far past int32 in its units: the register
    tiles' packed clamp saturates as the microkernel's epilogue does, value for value, to
    255 above and the lower bound below (the zero point under ReLU)."""
    x, weight, scale, bias = operands(1, 16, (4, 4), 64, 1, 9)
    tiny = torch.tensor([1e-12, 3.0])
    results = []
    for tiles in (True, False):
        _C.set_int8_conv_tiles(tiles)
        if _C.int8_conv_tiles_run() != tiles:
            pytest.skip("the tiles and the microkernel do not both run on this CPU")
        before = _C.int8_conv_calls()
        results.append(torch.ops.blade.quantized_conv2d(
            x, weight, scale, bias, [1, 1], [0, 0], [1, 1], 1, INPUT_RANGE, tiny,
            post_op).view(torch.uint8))
        assert _C.int8_conv_calls() == before + 1   # Blade's kernel ran, not oneDNN's
    assert torch.equal(results[0], results[1])
    assert set(results[0].unique().tolist()) == {low, 255}


@needs_kernel
@pytest.mark.parametrize("kernel, stride", [(1, 1), (3, 2)])
@pytest.mark.parametrize("uint8_result", [True, False])
def test_hardswish_post_op(kernel, stride, uint8_result, multiply):
    """MobileNetV3's activation after a convolution, in the epilogue before rounding: as
    the reference within rounding, and as oneDNN's. A sum's post-op cannot be hardswish."""
    x, weight, scale, bias = operands(2, 24, (9, 10), 40, kernel, 8)
    padding = kernel // 2
    (mine, onednn), ran = run_both(lambda: torch.ops.blade.quantized_conv2d(
        x, weight, scale, bias, [stride] * 2, [padding] * 2, [1, 1], 1, INPUT_RANGE,
        OUTPUT_RANGE if uint8_result else None, "hardswish"))
    assert ran == [1, 0]
    w = weight.double() * scale.double().view(-1, 1, 1, 1)
    want = torch.nn.functional.hardswish(
        torch.nn.functional.conv2d(real_image(x), w, bias.double(), stride, padding))
    if uint8_result:
        assert_rounds_to(mine, want, onednn)
    else:
        torch.testing.assert_close(mine.double(), want, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(mine, onednn, rtol=1e-5, atol=1e-4)
    with pytest.raises(RuntimeError, match="post_op must be 'none' or 'relu'"):
        torch.ops.blade.quantized_conv2d_add(
            x, weight, scale, bias, [stride] * 2, [padding] * 2, [1, 1], 1, INPUT_RANGE,
            torch.zeros_like(onednn, dtype=torch.float32) if not uint8_result else
            torch.zeros(mine.shape, dtype=torch.int8), ADDED_RANGE,
            OUTPUT_RANGE if uint8_result else None, "hardswish")


@needs_depthwise
def test_depthwise_filters_follow_their_scales():
    """The depthwise kernel keeps one float copy of an int8 weight per weight; the
    per-channel scales apply after the sums, so the same weight with other scales gives
    results scaled alike."""
    x, weight, scale, bias = operands(1, 16, (8, 8), 16, 3, 9)
    weight = weight[:, :1].contiguous()
    zero = torch.zeros(16)

    def run(scales):
        return torch.ops.blade.quantized_conv2d(x, weight, scales, zero, [1, 1], [1, 1],
                                                [1, 1], 16, INPUT_RANGE, None, "none")
    once, twice = run(scale), run(scale * 2)
    torch.testing.assert_close(twice, once * 2, rtol=1e-5, atol=1e-5)


def test_amx_tiles_run_wherever_the_cpu_has_them():
    """On an AMX-INT8 CPU the kernel multiplies in its AMX tiles: Linux granted their state
    and they passed their start-up check (a failure there would quietly leave oneDNN's
    slower microkernel)."""
    if not {"amx_tile", "amx_int8", "avx512f", "avx512bw", "avx512vl"} <= _C.host_cpu_flags():
        pytest.skip("this CPU has no AMX")
    assert _C.amx_int8_runs()
    assert not _C.int8_conv_tiles_run()


@needs_kernel
@pytest.mark.parametrize("channels, size, out_channels, kernel, padding", [
    (20, (5, 7), 16, 1, 0),     # 35 rows (a pair of 16-row tiles, then 3 rows), 20 deep
    (68, (9, 9), 48, 1, 0),     # 68 deep: a second tile row reads 60 bytes past each pixel
    (132, (6, 11), 80, 3, 1),   # 9 taps of 132 deep; a column block of 16 after one of 64
    (64, (1, 1), 64, 1, 0),     # one row
])
def test_depths_of_no_multiple_of_64_give_the_real_convolution(
        channels, size, out_channels, kernel, padding, threads, multiply):
    """Depths that fill no whole 64-byte tile row and row counts of no whole tile, 1x1
    layers whose input is the one plane (the AMX tiles copy it with slack, since they read
    past a row's depth into what follows, which the weight's zero rows cancel): the real
    convolution, and within a step of oneDNN's."""
    x, weight, scale, bias = operands(1, channels, size, out_channels, kernel, channels)
    (mine, onednn), ran = run_both(lambda: torch.ops.blade.quantized_conv2d(
        x, weight, scale, bias, [1, 1], [padding] * 2, [1, 1], 1, INPUT_RANGE,
        OUTPUT_RANGE, "relu"))
    assert ran == [1, 0]
    assert_rounds_to(mine, reference(x, weight, scale, bias, 1, padding), onednn)


@needs_kernel
@pytest.mark.parametrize("channels, out_channels", [(960, 240), (32, 120), (16, 72)])
def test_a_squeeze_excitations_1x1_gives_one_threads_bytes_split_in_two(channels,
                                                                       out_channels):
    """A 1x1 over one pixel has too few products to share: it runs on the calling thread
    (waking the other cost more than it saved), with the same bytes as split in two."""
    x, weight, scale, bias = operands(1, channels, (1, 1), out_channels, 1, 3)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    results = []
    try:
        for serial_products in (-1, 0):  # the default (one thread), then always split
            _C.set_int8_conv_serial_products(serial_products)
            calls = _C.int8_conv_calls()
            results.append(torch.ops.blade.quantized_conv2d(
                x, weight, scale, bias, [1, 1], [0, 0], [1, 1], 1, INPUT_RANGE,
                OUTPUT_RANGE, "relu"))
            assert _C.int8_conv_calls() == calls + 1
    finally:
        _C.set_int8_conv_serial_products(-1)
        torch.set_num_threads(before)
    assert torch.equal(results[0], results[1])
    assert_rounds_to(results[0], reference(x, weight, scale, bias, 1, 0))

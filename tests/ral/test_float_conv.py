"""Blade's own float convolutions (csrc/ral/float_conv.*): in bfloat16, as a bf16 engine runs
it on a CPU with AVX512-BF16 and no AMX (the float32 input rounded to bfloat16 into
stride-phase planes, bf16 pair products summed in float32), and in float32, as any engine's
float32 path tries it on an AVX-512 CPU or one with AVX2 and FMA; register tiles, bias and
ReLU in the registers, SiLU over each task's block after them.
Compared with a float64 convolution of the same (rounded) operands, which leaves only
float32 summation order between them."""
import pytest
import torch

import blade
from blade import _C
from helpers import assert_ran_compiled

needs_kernel = pytest.mark.skipif(not _C.bf16_conv_available(),
                                  reason="the kernel runs on AVX512-BF16 CPUs without AMX")
needs_f32_kernel = pytest.mark.skipif(not _C.f32_conv_available(),
                                      reason="the float32 kernel needs AVX2 and FMA")

# Each kind: its availability, the op, its call count, and how it rounds its operands.
KINDS = {
    "bf16": (_C.bf16_conv_available, _C.bf16_conv2d, _C.bf16_conv_calls,
             lambda t: t.bfloat16().double()),
    "f32": (_C.f32_conv_available, _C.f32_conv2d, _C.f32_conv_calls, lambda t: t.double()),
}


@pytest.fixture(params=list(KINDS))
def kind(request):
    available, conv, calls, rounded = KINDS[request.param]
    if not available():
        pytest.skip(f"the {request.param} kernel does not run on this CPU")
    return conv, calls, rounded


def reference(x, weight, bias, stride, padding, relu, rounded=lambda t: t.bfloat16().double(),
              silu=False, hardswish=False):
    out = torch.nn.functional.conv2d(rounded(x), rounded(weight),
                                     None if bias is None else bias.double(), stride, padding)
    if hardswish:
        return torch.nn.functional.hardswish(out)
    return torch.nn.functional.silu(out) if silu else out.clamp_min(0) if relu else out


@pytest.mark.parametrize("shape", [
    # batch, channels, height, width, out channels, kernel, stride, padding
    (1, 3, 23, 21, 64, 7, 2, 3),     # a stem: 3 channels (bf16: one zero channel), phases
    (2, 5, 9, 8, 70, 3, 1, 1),       # odd channels; a partial second column block
    (1, 64, 14, 14, 130, 1, 1, 0),   # a 1x1 (more input than weight): bf16 rows in turn
    (2, 32, 25, 21, 40, 1, 1, 0),    # the same over several images and row blocks
    (1, 64, 3, 3, 256, 1, 1, 0),     # a 1x1 with more weight than input: rounded first
    (1, 33, 11, 10, 64, 3, 2, 1),    # stride 2 with padding
    (1, 16, 7, 7, 16, 5, 1, 2),      # a 5x5 (even and odd columns apart in the pack)
    (3, 8, 6, 9, 20, 3, 2, 0),       # several images, no padding: the input as it is, strided
    (1, 128, 8, 8, 64, 1, 2, 0),     # a strided 1x1 (a projection shortcut)
    (1, 7, 5, 4, 9, 3, 3, 2),        # stride 3: the walk steps 3 pixels of the padded image
    (2, 32, 12, 10, 40, 1, 2, 0),    # a strided 1x1 of more input than weight
    (2, 8, 10, 10, 24, 2, 2, 0),     # a 2x2 stride-2 downsampling
    (1, 12, 9, 12, 16, 4, 2, 1),     # a 4x4 filter at stride 2
    (1, 8, 8, 7, 16, 3, 2, 2),       # padding 2 at stride 2: taps read the next row's
    (1, 240, 1, 1, 960, 1, 1, 0),    # a squeeze-excitation's: one pixel
    (1, 96, 7, 7, 192, 1, 1, 0),     # 3 column blocks of 49 rows: rows split for the threads
    # kernel (rows, columns), stride and padding differing between the two axes
    (1, 6, 9, 10, 12, (3, 1), (2, 1), (1, 0)),  # a row stride, shared padding's extra row
    (1, 6, 9, 10, 12, (1, 3), (1, 2), (0, 1)),  # a column stride only
    (2, 4, 7, 8, 8, (5, 7), (2, 1), (2, 3)),    # a 5 x 7 filter: stride-phase planes
    (1, 4, 6, 6, 8, (3, 3), (1, 1), (3, 3)),    # padding as wide as the filter: no sharing
    (1, 5, 2, 2, 8, (2, 2), (3, 3), (0, 0)),    # stride past the filter
])
@pytest.mark.parametrize("activation", ["none", "relu", "silu", "hardswish"])
def test_convolution_matches_the_rounded_reference(kind, shape, activation):
    conv, conv_calls, rounded = kind
    n, c, h, w, o, k, s, p = shape
    k, s, p = [v if isinstance(v, tuple) else (v, v) for v in (k, s, p)]
    relu, silu, hardswish = (activation == name for name in ("relu", "silu", "hardswish"))
    torch.manual_seed(0)
    x, weight, bias = torch.randn(n, c, h, w), torch.randn(o, c, *k), torch.randn(o)
    calls = conv_calls()
    got = conv(x, weight, bias, list(s), list(p), relu, silu=silu, hardswish=hardswish)
    assert conv_calls() == calls + 1
    want = reference(x, weight, bias, list(s), list(p), relu, rounded, silu, hardswish)
    assert got.shape == want.shape
    assert float((got.double() - want).abs().max()) < 1e-5 * float(want.abs().max())


@pytest.mark.parametrize("shape", [
    (2, 24, 9, 11, 72, 1, 1, 0),     # a 1x1: a full and a partial column block
    (1, 16, 12, 12, 16, 3, 2, 1),    # stride 2 with padding: planes
    (1, 240, 1, 1, 960, 1, 1, 0),    # one pixel
    (1, 3, 23, 21, 64, 7, 2, 3),     # a stem
])
@pytest.mark.parametrize("activation", ["none", "relu", "silu", "hardswish"])
def test_a_tensor_added_before_the_activation(kind, shape, activation):
    """A residual connection added in the tiles' registers after the bias, before the
    activation: act((conv + bias) + added), and NaN in what is added reaches exactly its
    own result (ReLU keeps it)."""
    conv, _, rounded = kind
    n, c, h, w, o, k, s, p = shape
    relu, silu, hardswish = (activation == name for name in ("relu", "silu", "hardswish"))
    torch.manual_seed(1)
    x, weight, bias = torch.randn(n, c, h, w), torch.randn(o, c, k, k), torch.randn(o)
    plain = conv(x, weight, bias, [s, s], [p, p], False)
    added = torch.randn(plain.shape) * 4
    added[0, o - 1, 0, 0] = float("nan")
    got = conv(x, weight, bias, [s, s], [p, p], relu, silu=silu, hardswish=hardswish,
               added=added)
    summed = reference(x, weight, bias, [s, s], [p, p], False, rounded) + added.double()
    want = torch.nn.functional.hardswish(summed) if hardswish else \
        torch.nn.functional.silu(summed) if silu else summed.clamp_min(0) if relu else summed
    assert got.shape == want.shape
    assert torch.equal(got.isnan(), want.isnan()) and int(got.isnan().sum()) == 1
    finite = want.isfinite()
    assert float((got.double() - want)[finite].abs().max()) < \
        1e-5 * float(want[finite].abs().max())
    with pytest.raises(RuntimeError, match="the tensor added must be float32"):
        conv(x, weight, bias, [s, s], [p, p], relu, added=added[:, :1])


def test_a_tensor_added_to_a_deep_1x1_in_slices_of_depth(kind):
    """Sliced by depth, the earlier slices' partial sums go through the result: the tensor
    is added once, after the last slice."""
    conv, _, rounded = kind
    torch.manual_seed(2)
    x = torch.randn(1, 4000, 10, 10)
    weight, bias = torch.randn(192, 4000, 1, 1) * 0.05, torch.randn(192)
    added = torch.randn(1, 192, 10, 10)
    sliced = _C.depth_sliced_conv_calls()
    got = conv(x, weight, bias, [1, 1], [0, 0], True, added=added)
    assert _C.depth_sliced_conv_calls() == sliced + 1
    want = (reference(x, weight, bias, [1, 1], [0, 0], False, rounded) +
            added.double()).clamp_min(0)
    assert float((got.double() - want).abs().max()) < 1e-5 * float(want.abs().max())


@pytest.mark.parametrize("shape", [
    (2, 144, 14, 13, 40, 1),    # rows taken in turn, each image by its own scale
    (1, 96, 7, 7, 320, 1),      # more weight than input: the scaled planes made first
    (2, 64, 9, 9, 24, 2),       # a strided 1x1: its planes too
    (1, 4000, 6, 6, 192, 1),    # a deep 1x1 in slices of its depth
])
def test_an_input_scaled_per_image_and_channel(kind, shape):
    """A squeeze-excitation's scale of the input, one value per image and channel, taken as
    the input is copied: the convolution of the scaled input (bfloat16: the product
    rounded). A filter that pads its input (planes of their own) refuses it."""
    conv, _, rounded = kind
    n, c, h, w, o, s = shape
    torch.manual_seed(3)
    x, weight, bias = torch.randn(n, c, h, w), torch.randn(o, c, 1, 1), torch.randn(o)
    scale = torch.rand(n, c) * 2
    got = conv(x, weight, bias, [s, s], [0, 0], True, input_scale=scale)
    want = reference(x * scale[:, :, None, None], weight, bias, [s, s], [0, 0], True, rounded)
    assert float((got.double() - want).abs().max()) < 1e-5 * float(want.abs().max())
    with pytest.raises(RuntimeError, match="an input scale needs an input read as its plane"):
        conv(x, torch.randn(o, c, 3, 3), bias, [1, 1], [1, 1], True, input_scale=scale)
    with pytest.raises(RuntimeError, match="the input scale must be float32"):
        conv(x, weight, bias, [s, s], [0, 0], True, input_scale=scale[:, :-1])


@pytest.mark.parametrize("channels, out_channels, size", [
    (4000, 192, 10),   # 3 slices of the depth (bfloat16's half as wide: 2)
    (5001, 130, 7),    # an odd depth (bf16: a zero channel), the last block's 2 of 64
    (3072, 768, 11),   # a transformer's second FFN matmul's depth and width
])
def test_deep_1x1_in_slices_of_depth_is_the_one_pass_sum(kind, channels, out_channels,
                                                         size):
    """A 1x1 layer with more weight than input and a depth whose weight rows and input
    columns overflow L2 together runs in slices of its depth, each adding to the sums the
    slices before it stored: bit for bit the sums of one pass, which the same images among
    many (more input than weight: one pass over rows) give."""
    conv, _, rounded = kind
    torch.manual_seed(channels)
    x = torch.randn(1, channels, size, size)
    weight, bias = torch.randn(out_channels, channels, 1, 1) * 0.05, torch.randn(out_channels)
    sliced = _C.depth_sliced_conv_calls()
    got = conv(x, weight, bias, [1, 1], [0, 0], True)
    assert _C.depth_sliced_conv_calls() == sliced + 1
    many = conv(x.repeat(64, 1, 1, 1), weight, bias, [1, 1], [0, 0], True)
    assert _C.depth_sliced_conv_calls() == sliced + 1
    assert torch.equal(got, many[:1])
    want = reference(x, weight, bias, [1, 1], [0, 0], True, rounded)
    assert float((got.double() - want).abs().max()) < 1e-5 * float(want.abs().max())


@pytest.mark.parametrize("channels, out_channels, rows", [
    (768, 3072, 8),    # BERT-base's first FFN matmul over 8 tokens
    (3072, 768, 11),   # its second, over 11
    (1001, 200, 7),    # an odd depth, a last slice and a last block's 8 of 64 short
])
def test_few_rows_stream_their_weight_in_slices_of_depth(kind, channels, out_channels, rows):
    """A float32 1x1 layer of between one and two tiles of rows (a linear layer over 7 to
    11 tokens), its weight far larger than them, runs each block in slices of its depth:
    the same sums bit for bit as an image of twice the rows gives (not streamed; in one pass
    or the deep layers' slices, whose sums are one pass's), the tensor added and SiLU
    applied once, after the last slice; two images of those rows each stream alike.
    bfloat16's tiles run such a layer in one pass."""
    conv, _, rounded = kind
    torch.manual_seed(rows)
    x = torch.randn(1, channels, 1, rows)
    weight, bias = torch.randn(out_channels, channels, 1, 1) * 0.05, torch.randn(out_channels)
    added = torch.randn(1, out_channels, 1, rows)
    sliced = _C.depth_sliced_conv_calls()
    got = conv(x, weight, bias, [1, 1], [0, 0], False, silu=True, added=added)
    assert _C.depth_sliced_conv_calls() == sliced + (conv is _C.f32_conv2d)
    twice = conv(torch.cat([x, x], 2), weight, bias, [1, 1], [0, 0], False, silu=True,
                 added=torch.cat([added, added], 2))
    assert torch.equal(got, twice[:, :, :1]) and torch.equal(got, twice[:, :, 1:])
    # Two images of those rows: each image's rows streamed alike.
    sliced = _C.depth_sliced_conv_calls()
    two = conv(x.repeat(2, 1, 1, 1), weight, bias, [1, 1], [0, 0], False, silu=True,
               added=added.repeat(2, 1, 1, 1))
    assert _C.depth_sliced_conv_calls() == sliced + (conv is _C.f32_conv2d)
    assert torch.equal(got, two[:1]) and torch.equal(got, two[1:])
    want = torch.nn.functional.silu(reference(x, weight, bias, [1, 1], [0, 0], False, rounded)
                                    + added.double())
    assert float((got.double() - want).abs().max()) < 1e-5 * float(want.abs().max())


def test_convolution_of_empty_sizes(kind):
    """No input channels: an empty sum, so the bias alone (and its ReLU); no images:
    nothing."""
    conv = kind[0]
    bias = torch.tensor([1.5, -2.0, 0.25])
    for relu in (False, True):
        got = conv(torch.randn(2, 0, 5, 4), torch.randn(3, 0, 3, 3), bias, [1, 1],
                             [1, 1], relu)
        want = (bias.clamp_min(0) if relu else bias).view(1, 3, 1, 1).expand(2, 3, 5, 4)
        torch.testing.assert_close(got, want)
    got = conv(torch.randn(2, 0, 5, 4), torch.randn(3, 0, 3, 3), bias, [1, 1], [1, 1], False,
               silu=True)
    torch.testing.assert_close(got, torch.nn.functional.silu(bias).view(1, 3, 1, 1)
                               .expand(2, 3, 5, 4))
    got = conv(torch.randn(0, 4, 5, 5), torch.randn(3, 4, 3, 3), None, [1, 1],
                         [1, 1], False)
    assert got.shape == (0, 3, 5, 5)


def test_convolution_without_bias_and_past_the_kept_planes(kind):
    """No bias; planes larger than a thread keeps between calls (made for the call)."""
    conv, _, rounded = kind
    torch.manual_seed(0)
    x, weight = torch.randn(1, 64, 260, 260), torch.randn(8, 64, 3, 3)
    got = conv(x, weight, None, [1, 1], [1, 1], False)
    want = reference(x, weight, None, [1, 1], [1, 1], False, rounded)
    assert float((got.double() - want).abs().max()) < 1e-5 * float(want.abs().max())


def test_convolution_keeps_nan_and_infinities(kind):
    """A NaN input gives NaN outputs where its taps reach, ReLU and SiLU keep it (torch's
    NaN), and an infinite one gives infinities (or NaN where signs meet, and SiLU's of
    -inf), as eager does."""
    conv, _, rounded = kind
    torch.manual_seed(0)
    x, weight, bias = torch.randn(1, 8, 6, 6), torch.randn(4, 8, 3, 3), torch.randn(4)
    x[0, 2, 1, 1] = float("nan")
    x[0, 5, 4, 4] = float("inf")
    for relu, silu in ((False, False), (True, False), (False, True)):
        got = conv(x, weight, bias, [1, 1], [1, 1], relu, silu=silu)
        want = reference(x, weight, bias, [1, 1], [1, 1], relu, rounded, silu)
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.isinf(), want.isinf())
        finite = want.isfinite()
        assert float((got.double() - want)[finite].abs().max()) < \
            1e-5 * float(want[finite].abs().max())


@needs_f32_kernel
def test_silu_and_hardswish_match_torch_over_their_whole_range():
    """The float32 kernel's SiLU and hardswish (AVX-512's or AVX2's, over each task's block
    after the tiles) of values from -120 to 100, through an identity 1x1 convolution, with
    row tails of every length: within 2 float32 ulps of torch's (SiLU: -0 for a tiny value
    below -80)."""
    eye = torch.eye(24).view(24, 24, 1, 1)
    x = torch.linspace(-120.0, 100.0, 24 * 7 * 13).view(1, 24, 7, 13)
    for channels in (24, 17, 9, 3):  # vector tails of the activation's rows
        part, weight = x[:, :channels].contiguous(), eye[:channels, :channels].contiguous()
        got = _C.f32_conv2d(part, weight, None, [1, 1], [0, 0], False, silu=True)
        torch.testing.assert_close(got, torch.nn.functional.silu(part), rtol=2.5e-7,
                                   atol=1e-30)
        got = _C.f32_conv2d(part, weight, None, [1, 1], [0, 0], False, hardswish=True)
        torch.testing.assert_close(got, torch.nn.functional.hardswish(part), rtol=2.5e-7,
                                   atol=0)


@pytest.mark.parametrize("name", list(KINDS))
def test_convolution_refuses_mismatched_operands(name):
    available, conv = KINDS[name][:2]
    if not available():
        pytest.skip(f"the {name} kernel does not run on this CPU")
    with pytest.raises(RuntimeError, match=rf"{name}_conv2d: float32 x \[N, C, H, W\]"):
        conv(torch.randn(1, 4, 5, 5), torch.randn(8, 3, 3, 3), None, [1, 1],
                       [1, 1], False)
    for stride in ([1, 1], [2, 2]):  # with stride 2 the output size alone would pass
        with pytest.raises(RuntimeError, match="does not fit the padded input"):
            conv(torch.randn(1, 4, 2, 2), torch.randn(8, 4, 5, 5), None, stride,
                           [0, 0], False)
        with pytest.raises(RuntimeError, match="does not fit the padded input"):
            conv(torch.randn(1, 4, 2, 2), torch.randn(8, 4, 3, 3), None, stride,
                           [0, 0], False)
    with pytest.raises(RuntimeError, match="the bias needs 8 float32 values"):
        conv(torch.randn(1, 4, 5, 5), torch.randn(8, 4, 3, 3), torch.randn(7),
                       [1, 1], [1, 1], False)


@needs_kernel
def test_bf16_engine_convolves_with_blades_kernel(request):
    """A bf16 engine's convolutions (trials off: bfloat16 runs) go through the kernel: a
    ResNet-like block with a strided 3x3, a 1x1 projection and a residual stays within
    bfloat16's error of eager."""
    _C.set_kernel_trials(False)
    request.addfinalizer(lambda: _C.set_kernel_trials(True))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(24, 48, 3, stride=2, padding=1)
            self.conv2 = torch.nn.Conv2d(48, 48, 3, padding=1)
            self.project = torch.nn.Conv2d(24, 48, 1, stride=2)

        def forward(self, x):
            return torch.relu(self.conv2(torch.relu(self.conv1(x))) + self.project(x))

    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(2, 24, 15, 15)
    half = blade.optimize(model, (x,), blade.Config(precision="bf16"))
    calls = _C.bf16_conv_calls()
    with torch.no_grad():
        got = half(x)
        want = model.double()(x.double())
    assert _C.bf16_conv_calls() == calls + 3
    assert_ran_compiled(half)
    assert float((got.double() - want).abs().max()) < 2e-2 * float(want.abs().max())


@needs_kernel
def test_bf16_engine_multiplies_linear_layers_with_blades_kernel(request):
    """A bf16 engine's linear layers are 1x1 convolutions of their rows by each weight's
    pack, made once for every row count: a dynamic engine serves other row counts with it
    (trials off: with them, a row count may keep the float32 path)."""
    _C.set_kernel_trials(False)
    request.addfinalizer(lambda: _C.set_kernel_trials(True))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(63, 130), torch.nn.GELU(),
                                torch.nn.Linear(130, 33)).eval()  # an odd depth: padded
    half = blade.optimize(model, (torch.randn(7, 63),),
                          blade.Config(precision="bf16", dynamic=True))
    with torch.no_grad():
        for rows in (7, 1, 12, 100):
            x = torch.randn(rows, 63)
            calls = _C.bf16_conv_calls()
            got = half(x)
            assert _C.bf16_conv_calls() == calls + 2
            want = model.double()(x.double())
            model.float()
            assert float((got.double() - want).abs().max()) < 2e-2 * float(want.abs().max())
    report = assert_ran_compiled(half)
    assert report.clusters[0].packed_weights == 2, str(report)


@needs_f32_kernel
def test_float32_engine_tries_blades_kernel_and_matches_eager_on_every_call():
    """A float32 engine's dense convolutions of one group that Winograd's does not take
    (here a strided 3x3 stem, 1x1 ones of stride 1 and a strided 1x1) try Blade's float32
    kernel against oneDNN's on their first calls: the kernel runs, every call's result
    (whichever kernel ran it) matches eager, and the trials name it."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 24, 3, stride=2, padding=1)
            self.expand = torch.nn.Conv2d(24, 80, 1)
            self.project = torch.nn.Conv2d(80, 24, 1, bias=False)
            self.down = torch.nn.Conv2d(24, 48, 1, stride=2)

        def forward(self, x):
            x = torch.relu(self.stem(x))
            return self.down(self.project(torch.relu(self.expand(x))) + x)

    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(2, 3, 31, 29)
    calls = _C.f32_conv_calls()  # before optimize: its check of the engine is a first call
    engine = blade.optimize(model, (x,))
    with torch.no_grad():
        want = model(x)
        for _ in range(_C.kernel_trial_calls() + 1):  # the trials' calls and a kept one
            torch.testing.assert_close(engine(x), want, rtol=1e-4, atol=1e-4)
    assert _C.f32_conv_calls() >= calls + 3 * 4  # each trial's first call and 3 timed
    report = assert_ran_compiled(engine)
    choices = [line for cluster in report.clusters for line in cluster.kernel_choices]
    assert sum("Blade float32" in line for line in choices) == 4, choices
    assert any("[24, 3, 3, 3]" in line and "Blade float32" in line for line in choices), \
        choices


class TwoLinears(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(40, 96)
        self.down = torch.nn.Linear(96, 24, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


@needs_f32_kernel
@pytest.mark.parametrize("rows, tried", [(3, False), (24, True)])
def test_float32_engine_tries_blades_kernel_for_linear_layers_past_a_few_rows(rows, tried):
    """A linear layer's rows are a 1 x rows image to the float32 kernel, its weight a 1x1
    filter: past the few rows few_rows_gemm streams, the engine tries the kernel against
    oneDNN's, and every call's result matches eager."""
    torch.manual_seed(0)
    model, x = TwoLinears().eval(), torch.randn(rows, 40)
    calls = _C.f32_conv_calls()
    engine = blade.optimize(model, (x,))
    with torch.no_grad():
        want = model(x)
        for _ in range(_C.kernel_trial_calls()):
            torch.testing.assert_close(engine(x), want, rtol=1e-4, atol=1e-4)
    assert (_C.f32_conv_calls() >= calls + 2 * 4) == tried
    report = assert_ran_compiled(engine)
    choices = [line for cluster in report.clusters for line in cluster.kernel_choices]
    assert sum("Blade float32" in line for line in choices) == (2 if tried else 0), choices


@needs_f32_kernel
def test_a_linear_layers_trial_settles_on_onednn_when_the_kernel_declines():
    """Turned off after its trial began, the float32 kernel declines: each such call counts
    as endless and runs oneDNN's, so the trial ends on oneDNN's kernel, results eager's."""
    torch.manual_seed(0)
    model, x = TwoLinears().eval(), torch.randn(24, 40)
    engine = blade.optimize(model, (x,))   # its check ran the trials' first calls
    try:
        _C.set_f32_conv_enabled(False)
        with torch.no_grad():
            want = model(x)
            for _ in range(_C.kernel_trial_calls()):
                torch.testing.assert_close(engine(x), want, rtol=1e-4, atol=1e-4)
    finally:
        _C.set_f32_conv_enabled(True)
    choices = [line for cluster in assert_ran_compiled(engine).clusters
               for line in cluster.kernel_choices]
    assert len(choices) == 2 and all(line.endswith("-> oneDNN") for line in choices), choices

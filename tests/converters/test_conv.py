"""Convolution and pooling: conv2d through PyTorch's kernels (RAL), each dtype, two shapes."""
import pytest
import torch

import blade
from blade import _C
from helpers import (TOLERANCE, Lambda, assert_ran_compiled, assert_same_values, ir_before,
                     random_tensor, run_compiled)

TRACE = blade.Config(allow_tracing=True)
DTYPES = [torch.float32, torch.float64]
F = torch.nn.functional
# Winograd's F(4x4, 3x3) transforms run on AVX-512F only (winograd.cpp).
HAS_AVX512F = _C.missing_cpu_features("avx512f") == ""

CONVS = {
    "plain": dict(),
    "stride_padding": dict(stride=2, padding=1),
    "dilation": dict(padding=2, dilation=2),
    "groups": dict(groups=2, padding=(1, 0)),
    "depthwise": dict(groups=4, padding=1),
}
SHAPES = [(2, 4, 9, 9), (1, 4, 6, 11)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=["square", "wide"])
@pytest.mark.parametrize("name", sorted(CONVS))
def test_conv2d(name, shape, dtype):
    torch.manual_seed(0)
    kwargs = CONVS[name]
    conv = torch.nn.Conv2d(4, 8, 3, **kwargs).to(dtype).eval()
    x = random_tensor(shape, dtype)
    rtol, atol = TOLERANCE[dtype]
    # Scripted (aten::conv2d), then traced (aten::_convolution).
    _, report = run_compiled(conv, (x,), rtol=rtol, atol=max(atol, 1e-4))
    assert report.clusters[0].library_calls == 1
    run_compiled(conv, (x,), TRACE, rtol=rtol, atol=max(atol, 1e-4))


def test_conv2d_without_bias_and_asymmetric_padding_through_pad():
    torch.manual_seed(0)
    weight = torch.randn(6, 3, 2, 2)
    x = torch.randn(2, 3, 7, 7)
    fn = Lambda(lambda x: F.conv2d(F.relu(x), weight, stride=(1, 2)))
    _, report = run_compiled(fn, (x,), TRACE, atol=1e-4)
    assert report.clusters[0].library_calls == 1


def test_conv_bn_relu_block_compiles_to_one_cluster():
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU()).eval()
    block[1].running_mean.uniform_(-1, 1)
    block[1].running_var.uniform_(0.5, 2)
    _, report = run_compiled(block, (torch.randn(2, 3, 10, 10),), atol=1e-4)
    assert len(report.clusters) == 1 and report.coverage == 1.0


def test_conv3d_is_refused_by_the_validator():
    # Alone, it would only be a call of PyTorch's own kernel: the report says why it is no
    # more than that.
    conv = torch.nn.Conv3d(2, 2, 3).eval()
    optimized = blade.optimize(conv, (torch.randn(1, 2, 5, 5, 5),), TRACE)
    reasons = blade.report(optimized).unsupported["aten::_convolution"].reasons
    assert any("only 2-d convolution" in r and "PyTorch's own kernel" in r
               for r in reasons), reasons


POOLS = {
    "max_pool": lambda x: F.max_pool2d(x, 3, stride=2, padding=1),
    "avg_pool": lambda x: F.avg_pool2d(x, 2),
    "avg_pool_stride": lambda x: F.avg_pool2d(x, 3, stride=1, padding=1),
    "adaptive_avg_pool": lambda x: F.adaptive_avg_pool2d(x, (1, 1)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (1, 2, 6, 10)], ids=["square", "wide"])
@pytest.mark.parametrize("name", sorted(POOLS))
def test_pooling(name, shape, dtype):
    torch.manual_seed(0)
    rtol, atol = TOLERANCE[dtype]
    run_compiled(Lambda(POOLS[name]), (random_tensor(shape, dtype),), TRACE, rtol=rtol,
                 atol=atol)


def _matches_eager_at_each_batch(optimized, model, sizes, batches, rtol, atol):
    """`optimized` (one dynamic engine, compiled with no error) equals eager for inputs of
    each batch size, every call running the engine's code."""
    with torch.no_grad():
        for batch in batches:
            x = torch.randn(batch, *sizes)
            torch.testing.assert_close(optimized(x), model(x), rtol=rtol, atol=atol)
    report = blade.report(optimized)
    assert not report.compile_errors, str(report)
    assert report.clusters[0].calls == len(batches), str(report)
    assert report.runtime_fallbacks == 0, str(report)


@pytest.mark.parametrize("name", sorted(POOLS))
def test_pooling_of_a_dynamic_batch(name):
    """StableHLO lowers window reductions of static size only; Blade's own loops
    (python/blade/codegen/linalg/pooling.py) take a varying batch, with padding, strides and both the
    max and the sum (average) combiners."""
    torch.manual_seed(0)
    model = Lambda(POOLS[name])
    optimized = blade.optimize(model, (torch.randn(2, 3, 8, 8),),
                               blade.Config(allow_tracing=True, dynamic_dims={0: [0]}))
    report = blade.report(optimized)
    assert report.coverage == 1.0 and not report.compile_errors, str(report)
    _matches_eager_at_each_batch(optimized, model, (3, 8, 8), (1, 5), rtol=1e-5, atol=1e-6)


def test_pooling_of_a_dynamic_image_size():
    """Height and width vary: max and average pooling compile, and so does global average
    pooling (adaptive to 1 x 1, decomposed into a mean); ceil_mode (Torch-MLIR would give
    it the floor mode's output size) and other adaptive pooling (a window that follows the
    image size) stay in TorchScript, named in the report, and the rest still compiles."""
    torch.manual_seed(0)
    for pool, compiled in ((lambda x: F.max_pool2d(x, 3, stride=2, padding=1), True),
                           (lambda x: F.avg_pool2d(x, 3, stride=2, padding=1,
                                                   count_include_pad=False), True),
                           (lambda x: F.max_pool2d(x, 3, stride=2, ceil_mode=True), False),
                           (lambda x: F.adaptive_avg_pool2d(x, 1), True),
                           (lambda x: F.adaptive_avg_pool2d(x, (2, 3)), False)):
        model = Lambda(lambda x, pool=pool: pool(torch.relu(x) * 2.0))
        optimized = blade.optimize(model, (torch.randn(2, 3, 8, 8),),
                                   blade.Config(allow_tracing=True, dynamic=True))
        report = blade.report(optimized)
        assert len(report.clusters) == 1 and not report.compile_errors, str(report)
        if compiled:
            assert report.coverage == 1.0, str(report)
        else:
            reasons = [r for op in report.unsupported.values() for r in op.reasons]
            assert any("dynamic image size is not compiled" in r for r in reasons), reasons
        with torch.no_grad():
            for shape in ((1, 3, 9, 9), (3, 3, 16, 16)):
                x = torch.randn(shape)
                torch.testing.assert_close(optimized(x), model(x), rtol=1e-5, atol=1e-6)
        report = blade.report(optimized)
        assert report.clusters[0].calls == 2 and report.runtime_fallbacks == 0, str(report)


@pytest.mark.parametrize("pool, exact, partial", [
    (lambda x: F.max_pool2d(x, 3, stride=2, ceil_mode=True), (1, 2, 9, 7), (2, 3, 8, 8)),
    (lambda x: F.avg_pool2d(x, 3, stride=2, ceil_mode=True), (1, 2, 9, 7), (2, 3, 8, 8)),
    (lambda x: F.max_pool2d(x, 2, padding=1, ceil_mode=True), (2, 3, 8, 8), (1, 2, 9, 7))],
    ids=["max", "avg", "padded"])
def test_ceil_mode_pooling(pool, exact, partial):
    """Where ceil_mode adds a last window over the input's end, the window is padded
    explicitly (frontend/pools.py: Torch-MLIR would pad it on both sides, shifting every
    window) and the pool compiles; where it adds none, the pool compiles as it is."""
    model = Lambda(pool)
    for shape in (exact, partial):
        torch.manual_seed(0)
        x = torch.randn(shape)
        optimized = blade.optimize(model, (x,), TRACE)
        with torch.no_grad():
            torch.testing.assert_close(optimized(x), model(x), rtol=1e-5, atol=1e-6)
        report = assert_ran_compiled(optimized)
        assert report.coverage == 1.0 and not report.compile_errors, str(report)


class StridedPool(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)

    def forward(self, x):
        return F.max_pool2d(torch.relu(self.conv(x)), 2)


def test_sizes_that_round_alike_stay_dynamic():
    """From 12x12 and from 14x14 (the first resized copy) a stride-2 convolution and a 2x2
    pool both give 3x3: the output size must still follow the input's (the second, about
    doubled copy tells them apart), or other sizes would get a 3x3 result."""
    torch.manual_seed(0)
    model = StridedPool().eval()
    optimized = blade.optimize(model, (torch.randn(2, 8, 12, 12),), blade.Config(dynamic=True))
    with torch.no_grad():
        for shape in ((1, 8, 17, 17), (2, 8, 9, 9), (2, 8, 16, 16), (2, 8, 12, 12)):
            x = torch.randn(shape)
            torch.testing.assert_close(optimized(x), model(x), rtol=1e-5, atol=1e-5)
    report = blade.report(optimized)
    assert report.clusters[0].calls == 4 and report.runtime_fallbacks == 0, str(report)


class Stem(torch.nn.Module):
    """A ResNet stem: strided conv, BatchNorm, ReLU, padded max pool, a residual block and
    global average pooling into a linear head."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 7, stride=2, padding=3)
        self.bn = torch.nn.BatchNorm2d(16)
        self.pool = torch.nn.MaxPool2d(3, 2, 1)
        self.conv2 = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn(self.conv1(x))))
        x = torch.relu(self.conv2(x)) + x
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def test_stem_pools_channels_last(tmp_path):
    """The max pool between the convolutions runs on NHWC data (the transposes sink through
    it), and the global average pool takes the residual add into its loops."""
    torch.manual_seed(0)
    model = Stem().eval()
    config = blade.Config(dump_dir=str(tmp_path))
    run_compiled(model, (torch.randn(2, 3, 32, 32),), config, rtol=1e-4, atol=1e-4)
    linalg = ir_before(tmp_path, "write-slices-in-place")
    assert "tensor<2x18x18x16xf32>" in linalg      # the pool's padded input, NHWC
    assert "tensor<2x16x18x18xf32>" not in linalg
    assert "linalg.pooling" not in linalg
    # Both pools' window loops run outside the channel loop (contiguous in NHWC, so the
    # innermost loop vectorizes) rather than inside it.
    assert linalg.count('"reduction", "reduction", "parallel"]') == 2, linalg
    assert '"parallel", "reduction", "reduction"]' not in linalg, linalg


def test_stem_with_a_dynamic_batch_compiles_whole():
    torch.manual_seed(0)
    model = Stem().eval()
    optimized = blade.optimize(model, (torch.randn(2, 3, 32, 32),),
                               blade.Config(dynamic_dims={0: [0]}))
    report = blade.report(optimized)
    assert report.coverage == 1.0 and len(report.clusters) == 1, str(report)
    assert report.clusters[0].library_calls == 3, str(report)   # two convolutions, the head
    with torch.no_grad():
        for batch in (1, 3, 8):
            x = torch.randn(batch, 3, 32, 32)
            torch.testing.assert_close(optimized(x), model(x), rtol=1e-4, atol=1e-4)
    report = blade.report(optimized)
    assert report.clusters[0].calls == 3 and report.runtime_fallbacks == 0, str(report)


class ResidualConvs(torch.nn.Module):
    """Two conv+bias+relu blocks and a residual add: NCHW in, NCHW out."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.b(torch.relu(self.a(x)))) + x
        return y, torch.sigmoid(y) * 2.0


def test_convolutions_run_channels_last_and_transposes_cancel(tmp_path):
    torch.manual_seed(0)
    model = ResidualConvs().eval()
    x = torch.randn(2, 8, 10, 12)
    config = blade.Config(dump_dir=str(tmp_path))
    optimized, report = run_compiled(model, (x,), config, rtol=1e-4, atol=1e-4)
    assert report.clusters[0].library_calls == 2, str(report)
    linalg = ir_before(tmp_path, "write-slices-in-place")
    # Both convolutions take and give NHWC data; between them, bias, relu and the residual
    # run on NHWC too, so the only layout changes are the input's and the two outputs'.
    # Each convolution takes its bias and ReLU along as its own bias and post-op.
    assert linalg.count('blade.library_call = "conv2d_nhwc_bias"') == 2, linalg
    assert linalg.count("blade.activation = 1") == 2, linalg
    stablehlo = ir_before(tmp_path, "channels-last")
    assert "stablehlo.transpose" not in stablehlo   # the rewrite happens after this stage
    with torch.no_grad():  # weights prepared once (channels_last copies) serve every call
        for _ in range(3):
            x = torch.randn(2, 8, 10, 12)
            for got, want in zip(optimized(x), model(x)):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert blade.report(optimized).runtime_fallbacks == 0


def test_convolutions_of_dynamic_size_run_channels_last(tmp_path):
    torch.manual_seed(0)
    model = ResidualConvs().eval()
    optimized = blade.optimize(model, (torch.randn(2, 8, 10, 12),),
                               blade.Config(dynamic=True, dump_dir=str(tmp_path)))
    linalg = ir_before(tmp_path, "write-slices-in-place")
    # As with static sizes: NHWC convolutions with their bias and ReLU as post-ops, the
    # residual on NHWC data, and no shape.assuming region left to split the loops.
    assert linalg.count('blade.library_call = "conv2d_nhwc_bias"') == 2, linalg
    assert linalg.count("blade.activation = 1") == 2, linalg
    assert "shape.assuming" not in linalg
    with torch.no_grad():
        for shape in ((1, 8, 5, 7), (3, 8, 10, 12), (2, 8, 1, 9)):
            x = torch.randn(shape)
            for got, want in zip(optimized(x), model(x)):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    report = blade.report(optimized)
    assert report.clusters[0].calls == 3 and report.runtime_fallbacks == 0, str(report)


class Epilogues(torch.nn.Module):
    """Convolutions whose bias and ReLU the kernel takes, or only the bias, or neither."""

    def __init__(self):
        super().__init__()
        self.relu_only_user = torch.nn.Conv2d(4, 6, 3, padding=1)
        self.biased_twice = torch.nn.Conv2d(6, 6, 1)
        self.no_relu = torch.nn.Conv2d(6, 6, 3, padding=1)
        self.unbiased = torch.nn.Conv2d(6, 6, 3, padding=1, bias=False)

    def forward(self, x, other):
        a = torch.relu(self.relu_only_user(x))
        b = self.biased_twice(a)           # conv + bias read by the ReLU and by the sum
        c = torch.relu(b) + b
        d = torch.sigmoid(self.no_relu(c))
        return torch.relu(self.unbiased(d) + other)    # `other` is no per-channel bias


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bias_and_relu_run_inside_the_convolution(dtype, tmp_path):
    torch.manual_seed(0)
    model = Epilogues().to(dtype).eval()
    x, other = random_tensor((2, 4, 7, 9), dtype), random_tensor((2, 6, 7, 9), dtype)
    rtol, atol = TOLERANCE[dtype]
    _, report = run_compiled(model, (x, other), blade.Config(dump_dir=str(tmp_path)),
                             rtol=rtol, atol=max(atol, 1e-4))
    assert report.clusters[0].library_calls == 4, str(report)
    linalg = ir_before(tmp_path, "write-slices-in-place")
    assert linalg.count('blade.library_call = "conv2d_nhwc_bias"') == 3, linalg
    assert linalg.count('blade.library_call = "conv2d_nhwc"') == 1, linalg
    assert linalg.count("blade.activation = 1") == 1, linalg    # only the first one's ReLU


class ActivatedConvolutions(torch.nn.Module):
    """An MBConv's convolutions, each followed by the activation (SiLU, or MobileNetV3's
    hardswish): a 1x1 expansion, 3x3 and strided 5x5 depthwise ones, a dense 3x3 (oneDNN's
    or Winograd's, the activation after it), and a 1x1 whose biased sum something besides
    its activation reads (the activation stays a loop)."""

    def __init__(self, activation):
        super().__init__()
        self.activation = activation
        self.expand = torch.nn.Conv2d(8, 24, 1)
        self.depthwise3 = torch.nn.Conv2d(24, 24, 3, padding=1, groups=24)
        self.depthwise5 = torch.nn.Conv2d(24, 24, 5, stride=2, padding=2, groups=24)
        self.dense = torch.nn.Conv2d(24, 16, 3, padding=1)
        self.shared = torch.nn.Conv2d(16, 16, 1)

    def forward(self, x):
        act = self.activation
        y = act(self.depthwise5(act(self.depthwise3(act(self.expand(x))))))
        z = self.shared(act(self.dense(y)))
        return act(z) + z


def _five_library_calls(model, x, dynamic, tmp_path):
    """`model` optimized from `x` (matching eager, compiled, as run_compiled checks) into
    one cluster of 5 library calls: (the optimized model, its IR before
    write-slices-in-place)."""
    rtol, atol = TOLERANCE[x.dtype]
    config = blade.Config(dump_dir=str(tmp_path), dynamic=dynamic)
    optimized, report = run_compiled(model, (x,), config, rtol=rtol, atol=max(atol, 1e-4))
    assert report.clusters[0].library_calls == 5, str(report)
    return optimized, ir_before(tmp_path, "write-slices-in-place")


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation, code", [(torch.nn.functional.silu, 2),
                                              (torch.nn.functional.hardswish, 3)],
                         ids=["silu", "hardswish"])
def test_activation_runs_inside_the_convolution(activation, code, dtype, dynamic, tmp_path):
    """float32 convolutions take their SiLU or hardswish as their post-op (activation 2 or
    3); a float64 one keeps it as loops. Either way the results are eager's, and Blade's own
    kernels ran (the float32 tiles, or the depthwise kernel, where the CPU has AVX-512)."""
    torch.manual_seed(0)
    model = ActivatedConvolutions(activation).to(dtype).eval()
    x = random_tensor((2, 8, 12, 10), dtype) * 3
    rtol, atol = TOLERANCE[dtype]
    calls = _C.f32_conv_calls()
    optimized, linalg = _five_library_calls(model, x, dynamic, tmp_path)
    fused = 4 if dtype == torch.float32 else 0
    assert linalg.count(f"blade.activation = {code}") == fused, linalg
    assert linalg.count('blade.library_call = "conv2d_nhwc_bias"') == 5, linalg
    with torch.no_grad():
        for shape in ((2, 8, 12, 10), (1, 8, 7, 9)) if dynamic else ((2, 8, 12, 10),):
            x = random_tensor(shape, dtype) * 3
            torch.testing.assert_close(optimized(x), model(x), rtol=rtol, atol=max(atol, 1e-4))
    assert blade.report(optimized).runtime_fallbacks == 0
    if dtype == torch.float32 and _C.f32_conv_available():
        assert _C.f32_conv_calls() > calls


def _matches_eager_through_the_trials(optimized, model, shapes, dtype, calls, blades_kernel):
    """Eager's results on inputs of each shape, through a float32 engine's kernel trials and
    a decided call; no run-time fallback; Blade's float32 tiles ran (since `calls`) exactly
    where `blades_kernel` (float32 on an AVX-512 CPU)."""
    rtol, atol = TOLERANCE[dtype]
    with torch.no_grad():
        for shape in shapes:
            x = random_tensor(shape, dtype)
            for _ in range(_C.kernel_trial_calls() + 1 if dtype == torch.float32 else 1):
                torch.testing.assert_close(optimized(x), model(x), rtol=rtol,
                                           atol=max(atol, 1e-4))
    assert blade.report(optimized).runtime_fallbacks == 0
    if dtype == torch.float32 and _C.f32_conv_available():
        assert (_C.f32_conv_calls() > calls) == blades_kernel


class ResidualBlocks(torch.nn.Module):
    """ResNet's bottleneck ends (a 1x1 and its batch norm, plus the block's input or a
    strided projection of it, then ReLU) and an inverted residual's (a 1x1 projection plus
    its input, no activation): each sum is its convolution's epilogue."""

    def __init__(self):
        super().__init__()
        self.reduce = torch.nn.Conv2d(16, 8, 1)
        self.expand = torch.nn.Conv2d(8, 16, 1, bias=False)
        self.expand_norm = torch.nn.BatchNorm2d(16)
        self.project = torch.nn.Conv2d(16, 32, 1, stride=2)
        self.widen = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.narrow = torch.nn.Conv2d(32, 32, 1)

    def forward(self, x):
        y = torch.relu(self.expand_norm(self.expand(torch.relu(self.reduce(x)))) + x)
        z = torch.relu(self.widen(y) + self.project(y))
        return self.narrow(z) + z


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("blades_kernel", [True, False], ids=["blade", "library"])
def test_residual_adds_run_inside_the_convolution(dtype, dynamic, blades_kernel, request,
                                                  tmp_path):
    """Each residual sum (and its ReLU) is the epilogue of the convolution it follows:
    `conv2d_nhwc_bias_add`, no loop over the sum. Blade's float32 tiles add it in their
    registers; the libraries' kernels (float64, or the float32 kernel off, as without
    AVX-512) are followed by the sum and the activation. The results are eager's."""
    if not blades_kernel:
        _C.set_f32_conv_enabled(False)
        request.addfinalizer(lambda: _C.set_f32_conv_enabled(True))
    torch.manual_seed(0)
    model = ResidualBlocks().to(dtype).eval()
    with torch.no_grad():
        model.expand_norm.running_mean.uniform_(-1, 1)
        model.expand_norm.running_var.uniform_(0.5, 2)
    x = random_tensor((2, 16, 10, 9), dtype)
    calls = _C.f32_conv_calls()
    optimized, linalg = _five_library_calls(model, x, dynamic, tmp_path)
    assert linalg.count('blade.library_call = "conv2d_nhwc_bias_add"') == 3, linalg
    main = linalg.split("func.func private")[0]
    assert main.count("linalg.generic") == 2, main  # the layout's two transposes alone
    shapes = ((2, 16, 10, 9), (1, 16, 7, 12)) if dynamic else ((2, 16, 10, 9),)
    _matches_eager_through_the_trials(optimized, model, shapes, dtype, calls, blades_kernel)


class SqueezeExcitationBlocks(torch.nn.Module):
    """Two MBConv blocks' ends: a depthwise convolution's SiLU output scaled by its
    squeeze-excitation (global average pool, two 1x1s, sigmoid), then the 1x1 projection,
    plus the block's input in the second."""

    def __init__(self):
        super().__init__()
        self.depthwise = torch.nn.Conv2d(24, 24, 3, padding=1, groups=24)
        self.squeeze = torch.nn.Conv2d(24, 6, 1)
        self.excite = torch.nn.Conv2d(6, 24, 1)
        self.project = torch.nn.Conv2d(24, 24, 1)
        self.project_again = torch.nn.Conv2d(24, 24, 1)

    def scaled(self, x):
        y = F.silu(self.depthwise(x))
        return y * torch.sigmoid(self.excite(F.silu(self.squeeze(y.mean((2, 3), True)))))

    def forward(self, x):
        x = self.project(self.scaled(x))
        return self.project_again(self.scaled(x)) + x


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("blades_kernel", [True, False], ids=["blade", "library"])
def test_squeeze_excitation_scales_run_inside_the_projection(dtype, dynamic, blades_kernel,
                                                             request, tmp_path):
    """The scale of a squeeze-excitation (per image and channel) is the input scale of the
    1x1 projection it feeds (`conv2d_nhwc_bias_scaled`, `_scaled_add` with the residual),
    which Blade's float32 tiles apply as they copy their rows and the libraries' kernels
    read as a scaled copy: eager's results, each image with its own scale."""
    if not blades_kernel:
        _C.set_f32_conv_enabled(False)
        request.addfinalizer(lambda: _C.set_f32_conv_enabled(True))
    torch.manual_seed(0)
    model = SqueezeExcitationBlocks().to(dtype).eval()
    x = random_tensor((2, 24, 9, 10), dtype)
    rtol, atol = TOLERANCE[dtype]
    config = blade.Config(dump_dir=str(tmp_path), dynamic=dynamic)
    calls = _C.f32_conv_calls()
    optimized, report = run_compiled(model, (x,), config, rtol=rtol, atol=max(atol, 1e-4))
    linalg = ir_before(tmp_path, "write-slices-in-place")
    assert linalg.count('blade.library_call = "conv2d_nhwc_bias_scaled"') == 1, linalg
    assert linalg.count('blade.library_call = "conv2d_nhwc_bias_scaled_add"') == 1, linalg
    shapes = ((2, 24, 9, 10), (3, 24, 6, 7)) if dynamic else ((2, 24, 9, 10),)
    _matches_eager_through_the_trials(optimized, model, shapes, dtype, calls, blades_kernel)


class UpsampleAndConcatenate(torch.nn.Module):
    """A U-Net decoder step: nearest upsampling of the coarse features, concatenated with
    the skip connection, into a convolution."""

    def __init__(self, factor):
        super().__init__()
        self.factor = factor
        self.down = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.up = torch.nn.Conv2d(16, 4, 3, padding=1)

    def forward(self, x):
        coarse = torch.relu(self.down(x))
        up = F.interpolate(coarse, scale_factor=self.factor, mode="nearest")
        up = up[:, :, :x.size(2), :x.size(3)]
        return self.up(torch.cat([x, up], 1))


@pytest.mark.parametrize("factor", [2.0, (2.0, 3.0), 2.5])
def test_nearest_upsampling_compiles(factor):
    """Upsampling by whole factors is a broadcast and a reshape, other factors a gather of
    PyTorch's source pixels (layout_decompositions.py), so the decoder step is one
    cluster."""
    torch.manual_seed(0)
    model = UpsampleAndConcatenate(factor).eval()
    x = torch.randn(2, 8, 12, 12)
    optimized, report = run_compiled(model, (x,), rtol=1e-4, atol=1e-5)
    assert report.coverage == 1.0 and len(report.clusters) == 1, str(report)
    assert report.decomposed.get("aten::upsample_nearest2d.vec") == 1, str(report)


def test_nearest_upsampling_with_a_dynamic_batch():
    torch.manual_seed(0)
    model = UpsampleAndConcatenate(2.0).eval()
    optimized = blade.optimize(model, (torch.randn(2, 8, 12, 12),),
                               blade.Config(dynamic_dims={0: [0]}))
    assert blade.report(optimized).coverage == 1.0, str(blade.report(optimized))
    _matches_eager_at_each_batch(optimized, model, (8, 12, 12), (1, 3), rtol=1e-4, atol=1e-5)


def test_upsampling_and_concatenation_stay_channels_last(tmp_path):
    """The transposes back to NCHW sink through the upsampling's reshapes and broadcast and
    through the concatenation (along C, the last NHWC dim), so the decoder step runs on
    NHWC data between its convolutions: no NCHW copy of the skip connection, no loop that
    reads one layout and writes the other."""
    torch.manual_seed(0)
    model = UpsampleAndConcatenate(2.0).eval()
    run_compiled(model, (torch.randn(2, 8, 12, 12),), blade.Config(dump_dir=str(tmp_path)),
                 rtol=1e-4, atol=1e-5)
    linalg = ir_before(tmp_path, "write-slices-in-place")
    assert "tensor<2x12x12x16xf32>" in linalg          # the concatenation, NHWC
    assert "tensor<2x6x2x6x2x8xf32>" in linalg         # the upsampling's broadcast, NHWC
    for nchw in ("tensor<2x16x12x12xf32>", "tensor<2x8x6x2x6x2xf32>", "tensor<2x8x6x6xf32>"):
        assert nchw not in linalg, nchw


class ReshapesAfterConvolutions(torch.nn.Module):
    """Reshapes of channels_last convolution results that a transpose can sink through
    (a channel split into groups, a size-1 dim inserted, a flatten of 1 x 1 features) and
    one it cannot (a flatten of C, H and W, which NHWC stores in another order)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.pool = torch.nn.Conv2d(8, 8, 5)
        self.fc = torch.nn.Linear(8 * 5 * 5, 3)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        groups = y.reshape(y.size(0), 2, 4, 5, 5).sum(1) * 2.0
        unit = y.unsqueeze(2) + 1.0
        head = self.pool(y).flatten(1)
        return groups, unit, head, self.fc(y.flatten(1))


def test_reshapes_of_channels_last_values_keep_their_values():
    torch.manual_seed(0)
    optimized, report = run_compiled(ReshapesAfterConvolutions().eval(),
                                     (torch.randn(2, 4, 5, 5),), rtol=1e-4, atol=1e-5)
    assert report.coverage == 1.0 and len(report.clusters) == 1, str(report)


class WinogradAndDirect(torch.nn.Module):
    """A 3x3 stride-1 convolution (Winograd's) with ReLU, then a strided one (oneDNN's, with
    Blade's float32 kernel off);
    a 3x3 convolution with few channels (oneDNN's: the transforms would cost more than the
    GEMMs save)."""

    def __init__(self):
        super().__init__()
        self.same = torch.nn.Conv2d(48, 64, 3, padding=1)
        self.down = torch.nn.Conv2d(64, 64, 3, stride=2, padding=1)
        self.narrow = torch.nn.Conv2d(64, 16, 3, padding=1)

    def forward(self, x):
        return self.narrow(self.down(torch.relu(self.same(x))))


def run_logging_onednn(capfd, optimized, x):
    """optimized(x), and the convolutions oneDNN ran for it (its verbose log's lines)."""
    capfd.readouterr()
    with torch.no_grad(), torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
        y = optimized(x)
    log = capfd.readouterr().out
    return y, [line for line in log.splitlines() if ",exec," in line and "convolution" in line]


@pytest.mark.parametrize("activation, post_op", [(torch.nn.SiLU(), "eltwise_swish"),
                                                  (torch.nn.Hardswish(), "eltwise_hardswish")],
                         ids=["silu", "hardswish"])
def test_onednn_applies_silu_and_hardswish_as_its_post_op(activation, post_op, capfd):
    """A convolution only oneDNN runs (grouped) takes a following SiLU or hardswish as
    oneDNN's own post-op, over its blocks of results in cache, not as a pass over the
    whole result after it: eager's values, NaN, infinities and large negatives included."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2),
                                activation).eval()
    x = torch.randn(2, 8, 9, 11) * 4
    x[0, 0, 0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    x[1, :, 4, 4] = -1000.0
    optimized = blade.optimize(model, (x,))
    for _ in range(2):
        y, executed = run_logging_onednn(capfd, optimized, x)
        assert len(executed) == 1 and post_op in executed[0], executed
        with torch.no_grad():
            want = model(x)
        assert torch.equal(y.isnan(), want.isnan())
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert_ran_compiled(optimized)


def test_3x3_convolutions_time_winograd_against_onednn_and_keep_the_faster(capfd, request):
    """The stride-1 3x3 convolution that both algorithms take runs Winograd's on its first
    call (it never reaches oneDNN: the verbose log shows only the other two) and oneDNN's
    direct one on the next, then each on its turns until timed three times; then it stays
    with one, the other's weight copy is freed (the report's prepared copies: 4 during the
    trial, 3 after), and every call matches eager, at odd sizes (edge tiles) and under a
    dynamic batch. Blade's float32 kernel, which would try the other two, is off (as on a
    CPU without AVX-512)."""
    _C.set_f32_conv_enabled(False)
    request.addfinalizer(lambda: _C.set_f32_conv_enabled(True))
    torch.manual_seed(0)
    model = WinogradAndDirect().eval()
    for config in (None, blade.Config(dynamic_dims={0: [0]})):
        x = torch.randn(2, 48, 9, 7)
        optimized = blade.optimize(model, (x,), config)
        direct, copies = [], []
        for _ in range(_C.kernel_trial_calls() + 4):  # the trial's calls, then 4 decided
            y, executed = run_logging_onednn(capfd, optimized, x)
            direct.append(any("ic48" in line for line in executed))
            assert len(executed) == 2 + direct[-1], executed
            assert any("sh2" in line for line in executed), executed
            assert any("oc16" in line for line in executed), executed
            with torch.no_grad():
                torch.testing.assert_close(y, model(x), rtol=1e-4, atol=1e-5)
            copies.append(blade.report(optimized).clusters[0].packed_weights)
        assert False in direct and True in direct, direct
        assert len(set(direct[-4:])) == 1, direct  # decided
        assert max(copies) == 4 and copies[-1] == 3, copies
        assert_ran_compiled(optimized)
    with torch.no_grad():
        for batch in (1, 3):
            y = torch.randn(batch, 48, 9, 7)
            torch.testing.assert_close(optimized(y), model(y), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not HAS_AVX512F, reason="F(4x4, 3x3) needs AVX-512")
def test_winograd_takes_4x4_tiles_on_large_images_and_2x2_on_small(request):
    """One dynamic engine's 3x3 convolution runs Winograd's F(4x4, 3x3) on a 24 x 24 image
    (36 tiles of 4x4) and F(2x2, 3x3) on a 10 x 10 one (4x4 tiles would overhang it) on
    their trials' turns, every call within 1e-5 of the largest output of the float64
    convolution (F(4x4, 3x3)'s transforms scale by up to 8, so its roundings are coarser
    than F(2x2, 3x3)'s), inf and NaN where eager has them."""
    _C.set_f32_conv_enabled(False)
    request.addfinalizer(lambda: _C.set_f32_conv_enabled(True))
    torch.manual_seed(0)
    model = torch.nn.Conv2d(48, 64, 3, padding=1).eval()
    optimized = blade.optimize(model, (torch.randn(1, 48, 24, 24),), blade.Config(dynamic=True))
    for size, tile in ((24, 4), (10, 2)):
        x = torch.relu(torch.randn(1, 48, size, size))
        x[0, 5, size // 2, 3] = float("inf")
        with torch.no_grad():
            want = model.double()(x.double())
            model.float()
        finite = want.isfinite()
        calls = _C.winograd_calls(tile)
        for _ in range(_C.kernel_trial_calls()):
            with torch.no_grad():
                y = optimized(x)
            assert torch.equal(y.isnan(), want.isnan()) and torch.equal(y.isinf(), want.isinf())
            error = (y.double() - want)[finite].abs().max() / want[finite].abs().max()
            assert error < 1e-5, (size, float(error))
        assert _C.winograd_calls(tile) > calls, tile
    assert_ran_compiled(optimized)


def test_winograd_4x4_turned_off_keeps_2x2_tiles(request):
    """blade.set_winograd_4x4(False) keeps the 24 x 24 image's convolution on F(2x2, 3x3)
    (within 1e-6 of the largest float64 output) for an engine already made, and True gives
    it F(4x4, 3x3) back on AVX-512 CPUs."""
    _C.set_f32_conv_enabled(False)
    request.addfinalizer(lambda: _C.set_f32_conv_enabled(True))
    request.addfinalizer(lambda: blade.set_winograd_4x4(True))
    torch.manual_seed(0)
    model = torch.nn.Conv2d(48, 64, 3, padding=1).eval()
    x = torch.randn(1, 48, 24, 24)
    optimized = blade.optimize(model, (x,))
    with torch.no_grad():
        want = model.double()(x.double())
        model.float()
    for enabled in (False, True):
        blade.set_winograd_4x4(enabled)
        calls = {tile: _C.winograd_calls(tile) for tile in (2, 4)}
        for _ in range(_C.kernel_trial_calls()):
            with torch.no_grad():
                error = (optimized(x).double() - want).abs().max() / want.abs().max()
            assert error < (1e-5 if enabled else 1e-6), (enabled, float(error))
        big = enabled and HAS_AVX512F
        assert _C.winograd_calls(4) > calls[4] if big else _C.winograd_calls(4) == calls[4]
        assert _C.winograd_calls(2) == calls[2] if big else _C.winograd_calls(2) > calls[2]
    assert_ran_compiled(optimized)


class TwoSame(torch.nn.Module):
    """Two 3x3 stride-1 convolutions in a row, each Winograd's or oneDNN's."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Conv2d(48, 64, 3, padding=1)
        self.second = torch.nn.Conv2d(64, 64, 3, padding=1)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


def test_neighbouring_layers_time_onednn_on_different_calls(capfd, request):
    """After the call that prepares both kernels, a trial times oneDNN's kernel on its own
    turns: the two layers never run oneDNN's convolution on the same call (each runs
    Winograd's while the other times oneDNN's), each runs oneDNN's at least three times,
    and both have decided after kernel_trial_calls() calls."""
    _C.set_f32_conv_enabled(False)
    request.addfinalizer(lambda: _C.set_f32_conv_enabled(True))
    torch.manual_seed(0)
    model, x = TwoSame().eval(), torch.randn(1, 48, 12, 12)
    optimized = blade.optimize(model, (x,))
    layers = []
    for _ in range(_C.kernel_trial_calls()):
        y, executed = run_logging_onednn(capfd, optimized, x)
        layers.append({key for key in ("ic48", "ic64") if any(key in line for line in executed)})
        with torch.no_grad():
            torch.testing.assert_close(y, model(x), rtol=1e-4, atol=1e-5)
    assert layers[0] == {"ic48", "ic64"}, layers  # each kernel's untimed first call
    assert all(len(ran) < 2 for ran in layers[1:]), layers
    assert all(sum(key in ran for ran in layers[1:]) >= 3 for key in ("ic48", "ic64")), layers
    choices = assert_ran_compiled(optimized).clusters[0].kernel_choices
    assert len(choices) == 2 and "undecided" not in str(choices), choices


class Pointwise(torch.nn.Module):
    """Two 1x1 convolutions, one with a bias and a ReLU: oneDNN's or MKL's sgemm each."""

    def __init__(self):
        super().__init__()
        self.expand = torch.nn.Conv2d(32, 48, 1)
        self.project = torch.nn.Conv2d(48, 16, 1, bias=False)

    def forward(self, x):
        return self.project(torch.relu(self.expand(x)))


def test_1x1_convolutions_time_mkl_against_onednn_and_match_eager_every_call(capfd, request):
    """Without Blade's float32 kernel (as on a CPU without AVX-512), a 1x1 convolution runs
    the plain-weight GEMM on the first call (no oneDNN convolution in the verbose log: MKL's
    sgemm on the weight as it is, or on an AVX-512 CPU blocked_gemm on its [K, N] copy) and
    oneDNN's on the next, each then timed on its turns, then keeps one and frees
    the other's copy; every call matches eager, NaN kept by the ReLU."""
    _C.set_f32_conv_enabled(False)
    request.addfinalizer(lambda: _C.set_f32_conv_enabled(True))
    torch.manual_seed(0)
    model = Pointwise().eval()
    x = torch.randn(2, 32, 9, 7)
    optimized = blade.optimize(model, (x,))
    x[1, 5, 4, 3] = float("nan")
    onednn, copies = [], []
    for _ in range(_C.kernel_trial_calls() + 4):
        y, executed = run_logging_onednn(capfd, optimized, x)
        onednn.append(len(executed))
        with torch.no_grad():
            assert_same_values(y, model(x), rtol=1e-4, atol=1e-5)
        copies.append(blade.report(optimized).clusters[0].packed_weights)
    assert 0 in onednn[:4] and 2 in onednn[:4], onednn  # both kernels tried
    assert len(set(onednn[-4:])) == 1, onednn  # decided
    if _C.blocked_gemm_available():  # each kernel has its copy; the winner's stays
        assert max(copies) == 4 and copies[-1] == 2, copies
    else:
        assert max(copies) == 2 and copies[-1] == onednn[-1], copies  # MKL's winners: no copy
    assert_ran_compiled(optimized)


class ConvBiasRelu(torch.nn.Module):
    def __init__(self, channels, outputs):
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, outputs, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x))


@pytest.mark.parametrize("channels", [8, 64], ids=["onednn", "winograd"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=str)
def test_inf_and_nan_inputs_give_eagers_inf_and_nan(channels, value):
    """One non-finite input value: eager's direct convolution gives +-inf (or NaN where
    infinities of both signs meet) in the outputs whose window holds it, and the ReLU keeps
    NaN. Winograd's transforms subtracted inf from inf (NaN in every output of the tiles
    around it), and oneDNN's ReLU post-op turned NaN into 0."""
    torch.manual_seed(0)
    model = ConvBiasRelu(channels, channels).eval()
    x = torch.randn(2, channels, 12, 10)
    optimized = blade.optimize(model, (x,))
    with torch.no_grad():
        for position in ((0, 1, 5, 5), (1, channels - 1, 11, 9), (0, 0, 0, 0)):
            y = x.clone()
            y[position] = value
            assert_same_values(optimized(y), model(y), rtol=1e-4, atol=1e-4)
    assert_ran_compiled(optimized)


def test_convolution_results_are_made_in_the_engine_buffers(request):
    """oneDNN's float32 convolution writes its output in the buffer the engine allocated
    for it (offered to PyTorch's allocator), rather than zeroing the buffer and adding into
    it or copying a fresh output there; the ReLU after it still keeps NaN. (Trials off:
    oneDNN's kernels on every call.)"""
    from blade import _C

    _C.set_kernel_trials(False)
    request.addfinalizer(lambda: _C.set_kernel_trials(True))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)).eval()
    x = torch.randn(1, 8, 16, 16)
    optimized, report = run_compiled(model, (x,), atol=1e-4)
    engine = getattr(optimized, report.clusters[0].name)
    x[0, 2, 5, 5] = float("nan")
    placed, copied = _C.settled_result_counts()
    with torch.no_grad():
        [got] = engine.run_code([x])
    placed_now, copied_now = _C.settled_result_counts()
    assert (placed_now - placed, copied_now - copied) == (2, 0)
    with torch.no_grad():
        [expected] = engine.run_subgraph([x])
    assert got.isnan().any()
    assert_same_values(got, expected, atol=1e-4)


class Depthwise(torch.nn.Module):
    def __init__(self, channels, kernel, stride, dilation, bias):
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, channels, kernel, stride,
                                    dilation * (kernel // 2), dilation, groups=channels,
                                    bias=bias)

    def forward(self, x):
        return torch.relu(self.conv(x))


@pytest.mark.skipif(not _C.blocked_gemm_available(), reason="this CPU lacks AVX-512F: "
                    "depthwise convolutions run oneDNN's only")
@pytest.mark.parametrize("channels, kernel, stride, dilation, bias, size",
                         [(24, 3, 1, 1, True, (13, 11)), (40, 5, 2, 1, False, (13, 11)),
                          (16, 3, 2, 2, True, (13, 11)), (37, 5, 1, 1, True, (13, 11)),
                          (48, 5, 1, 1, False, (7, 7)), (32, 5, 1, 1, True, (4, 9)),
                          (20, 3, 1, 1, True, (2, 17)), (16, 5, 2, 2, True, (9, 6))])
def test_depthwise_convolutions_time_blades_kernel_and_match_eager(channels, kernel, stride,
                                                                   dilation, bias, size):
    """A 3x3 or 5x5 depthwise convolution runs Blade's kernel (depthwise_conv.h) on its first
    call and alternates with oneDNN's until both are timed: every call matches eager (edges,
    strides, dilation, a channel count off the 16-lane blocks, images smaller than the
    filter's reach, rows with four pixels inside and with fewer, a NaN kept by the ReLU),
    and the trial lists both kernels' times."""
    torch.manual_seed(channels)
    model = Depthwise(channels, kernel, stride, dilation, bias).eval()
    x = torch.randn(2, channels, *size)
    optimized = blade.optimize(model, (x,))
    x[1, 5, min(6, size[0] - 1), min(3, size[1] - 1)] = float("nan")
    with torch.no_grad():
        for _ in range(_C.kernel_trial_calls()):
            assert_same_values(optimized(x), model(x), rtol=1e-4, atol=1e-5)
    report = assert_ran_compiled(optimized)
    choices = report.clusters[0].kernel_choices
    assert len(choices) == 1 and " ms, Blade depthwise " in choices[0] and \
        "Blade depthwise untimed" not in choices[0], choices


class Conv1dStack(torch.nn.Module):
    """1-d convolutions as a sequence model has them: padded, strided, dilated, grouped."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Conv1d(24, 32, 5, padding=2)
        self.strided = torch.nn.Conv1d(32, 32, 3, stride=2, padding=1)
        self.dilated = torch.nn.Conv1d(32, 48, 3, padding=2, dilation=2, bias=False)
        self.grouped = torch.nn.Conv1d(48, 48, 3, padding=1, groups=4)

    def forward(self, x):
        y = torch.relu(self.strided(torch.relu(self.first(x))))
        return self.grouped(torch.relu(self.dilated(y)))


@pytest.mark.parametrize("shape", [(2, 24, 101), (24, 37)], ids=["batched", "unbatched"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_conv1d_runs_as_a_2d_convolution(shape, dynamic, tmp_path):
    """Each aten::conv1d becomes a conv2d over the input with a dim of 1 inserted, which
    the 2-d convolutions' library calls run (a 1-d one compiled as loops of its own, several
    times slower than eager); dynamic lengths too."""
    torch.manual_seed(0)
    model = Conv1dStack().eval()
    x = torch.randn(shape)
    optimized = blade.optimize(model, (x,), blade.Config(dynamic=dynamic, dump_dir=str(tmp_path)))
    longer = torch.randn(*shape[:-1], shape[-1] + 13)
    for inputs in ([x, longer] if dynamic else [x]):
        with torch.no_grad():
            assert_same_values(optimized(inputs), model(inputs), 1e-4, 1e-4)
    report = assert_ran_compiled(optimized)
    assert report.coverage == 1.0 and report.guard_fallbacks == 0, str(report)
    assert report.decomposed.get("aten::conv1d") == 4, str(report)
    module = ir_before(tmp_path, "lower-library-calls")
    assert module.count("blade.library_call = \"conv2d") >= 3, module

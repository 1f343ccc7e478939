"""Ops that move elements (padding by reflection or replication, diagonals, channel
shuffles, prims' collapse) and eval-mode random ops, compiled through decompositions
(Torch-MLIR lowers none of them): compared with eager, and compiled whole."""
import pytest
import torch

import blade
from helpers import Lambda, assert_ran_compiled, compiled_whole, ir_before

TRACE = blade.Config(allow_tracing=True)
aten = torch.ops.aten


def _compiled_whole(fn, *inputs):
    return compiled_whole(fn, inputs, rtol=0, atol=0)[1]


PADS = [
    ("reflection_pad1d", (2, 5, 9), [3, 4]),
    ("reflection_pad1d", (9, 6), [5, 0]),
    ("reflection_pad2d", (1, 2, 7, 8), [2, 3, 6, 1]),
    ("reflection_pad2d", (2, 6, 6), [0, 0, 0, 5]),
    ("reflection_pad3d", (1, 2, 4, 5, 6), [1, 2, 3, 0, 1, 3]),
    ("reflection_pad2d", (1, 2, 7, 8), [-1, 2, 0, -2]),
    ("replication_pad1d", (2, 5, 9), [3, 5]),
    ("replication_pad2d", (1, 3, 4, 5), [4, 0, 2, 6]),
    ("replication_pad3d", (1, 2, 4, 5, 6), [3, 5, 7, 0, 1, 2]),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_padding_matches_eager(dtype):
    inputs = tuple(torch.arange(torch.Size(shape).numel(), dtype=dtype).reshape(shape)
                   for _, shape, _ in PADS)

    def fn(*xs):
        return tuple(getattr(aten, op)(x, padding) * 2 for (op, _, padding), x in zip(PADS, xs))

    report = compiled_whole(fn, inputs, rtol=0, atol=0)[1]
    assert {f"aten::{op}" for op, _, _ in PADS} <= set(report.decomposed), str(report)


@pytest.mark.parametrize("mode", ["reflect", "circular"])
def test_padding_copies_slices_not_elements(mode, tmp_path):
    """Reflect and circular padding join slices of the input (cat): no gather of computed
    positions, which ran element by element, several times slower than eager."""
    model = Lambda(lambda x: torch.nn.functional.pad(x, (3, 2, 1, 3), mode=mode) + 1)
    x = torch.randn(1, 4, 12, 10)
    optimized = blade.optimize(model, (x,), blade.Config(allow_tracing=True,
                                                         dump_dir=str(tmp_path)))
    torch.testing.assert_close(optimized(x), model(x), rtol=0, atol=0)
    assert assert_ran_compiled(optimized).coverage == 1.0
    module = ir_before(tmp_path, "lower-gathers")
    assert "stablehlo.gather" not in module and "stablehlo.concatenate" in module, module


def test_reflection_padding_as_large_as_the_input_raises_as_in_eager():
    model = Lambda(lambda x: aten.reflection_pad1d(x, [1, 2]) + 1)
    optimized = blade.optimize(model, (torch.randn(2, 4),), TRACE)
    with pytest.raises(RuntimeError, match="[Pp]adding size should be less"):
        model(torch.randn(2, 2))
    with pytest.raises(RuntimeError, match="[Pp]adding size should be less"):
        optimized(torch.randn(2, 2))


def test_nn_padding_modules_in_a_cnn_compile_whole():
    model = torch.nn.Sequential(torch.nn.ReflectionPad2d(2), torch.nn.Conv2d(3, 4, 5),
                                torch.nn.ReplicationPad2d((1, 0, 2, 1)), torch.nn.ReLU())
    x = torch.randn(1, 3, 16, 16)
    optimized = blade.optimize(model.eval(), (x,))
    torch.testing.assert_close(optimized(x), model(x), rtol=1e-4, atol=1e-5)
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops, str(report)


@pytest.mark.parametrize("diagonal", [0, 2, -1, 7, -9])
def test_diag_of_a_vector_and_of_a_matrix(diagonal):
    v = torch.arange(1, 6, dtype=torch.float32)
    m = torch.arange(30, dtype=torch.float32).reshape(5, 6)
    _compiled_whole(lambda v, m: (aten.diag(v, diagonal) + 1, aten.diag(m, diagonal) + 1),
                    v, m)


@pytest.mark.parametrize("offset,dim1,dim2", [(0, -2, -1), (1, -2, -1), (-2, 0, 2),
                                              (1, 3, 1)])
def test_diag_embed(offset, dim1, dim2):
    x = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) - 5
    _compiled_whole(lambda x: aten.diag_embed(x, offset, dim1, dim2) * 3, x)


def test_channel_shuffle_collapse_and_eval_random_ops():
    x = torch.randn(2, 6, 3, 4)
    noise = torch.rand(2, 6, 3, 4)

    def fn(x, noise):
        out, mask = aten.native_dropout(x, 0.3, False)
        slope, kept = aten.rrelu_with_noise_functional(x, noise, 0.1, 0.3, False)
        return (aten.channel_shuffle(x, 3), torch.ops.prims.collapse(x, 1, 2), out, mask,
                aten.rrelu(x, 0.2, 0.4, False), slope, kept)

    _compiled_whole(fn, x, noise)


F = torch.nn.functional


def test_pools_in_ceil_mode_with_divisor_override_and_unbatched_compile_whole():
    # Ceil mode's partial last windows and divisor_override become explicit padding and a
    # constant map of divisors (frontend/pools.py); unbatched images a batch of one.
    torch.manual_seed(0)
    x, x1, x3 = torch.randn(2, 3, 10, 11), torch.randn(2, 3, 10), torch.randn(1, 2, 7, 8, 9)
    weight = torch.randn(4, 2, 3, 3)

    def fn(x, x1, x3):
        return (F.max_pool2d(x, 3, 2, ceil_mode=True), F.max_pool2d(x, 3, 2, 1, ceil_mode=True),
                F.avg_pool2d(x, 3, 2, ceil_mode=True),
                F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                F.avg_pool2d(x, 3, 2, 1, ceil_mode=True),
                F.avg_pool2d(x, [2, 3], [3, 2], divisor_override=4),
                F.max_pool1d(x1, 3, 2, ceil_mode=True), F.avg_pool1d(x1, 3, 2, 1, ceil_mode=True),
                F.max_pool3d(x3, 2, 2, ceil_mode=True), F.max_pool2d(x, 2, 2, 0, 2, ceil_mode=True),
                F.avg_pool2d(x[0], 2), F.max_pool2d(x[1], 3, 2, 1),
                F.adaptive_avg_pool2d(x[0], [5, 11]), F.conv2d(x[0, :2], weight, padding=1))

    compiled_whole(fn, (x, x1, x3))


def test_adaptive_pools_of_any_size_compile_whole_with_eagers_indices():
    # Windows of unequal sizes (10 -> 4), a NaN in a max window (PyTorch gives the last
    # NaN's index), 1-3 spatial dims, unbatched input, global pooling.
    torch.manual_seed(0)
    x, x1, x3 = torch.randn(2, 3, 10, 11), torch.randn(2, 3, 10), torch.randn(1, 2, 7, 8, 9)
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = float("nan")
    x1[1, 1, 4] = float("inf")

    def fn(x, x1, x3):
        return (F.adaptive_avg_pool2d(x, [4, 3]), F.adaptive_avg_pool2d(x, 1),
                F.adaptive_avg_pool2d(x, [5, 11]), F.adaptive_avg_pool1d(x1, 3),
                F.adaptive_avg_pool3d(x3, [3, 5, 4]),
                *F.adaptive_max_pool2d(x, [4, 3], return_indices=True),
                *F.adaptive_max_pool1d(x1, 4, return_indices=True),
                *F.adaptive_max_pool3d(x3, [2, 3, 4], return_indices=True),
                F.adaptive_max_pool2d(x[0], [3, 3]))

    compiled_whole(fn, (x, x1, x3))


def test_interpolate_nearest_and_linear_of_any_size_compile_whole():
    # PyTorch's source positions and weights (float32 arithmetic, as its kernels), scale
    # factors given or recomputed, align_corners, 1-d and 2-d, float64 and float16.
    torch.manual_seed(0)
    x, x1 = torch.randn(2, 3, 7, 9), torch.randn(2, 3, 10)

    def fn(x, x1):
        return (F.interpolate(x, size=(11, 5)), F.interpolate(x, scale_factor=2) + 1,
                F.interpolate(x, scale_factor=1.7), F.interpolate(x, scale_factor=(0.6, 2.3)),
                F.interpolate(x, size=(11, 20), mode="bilinear"),
                F.interpolate(x, size=(11, 20), mode="bilinear", align_corners=True),
                F.interpolate(x, scale_factor=1.5, mode="bilinear"),
                F.interpolate(x, scale_factor=0.5, mode="bilinear", recompute_scale_factor=True),
                F.interpolate(x, size=(1, 1), mode="bilinear", align_corners=True),
                F.interpolate(x1, size=17), F.interpolate(x1, scale_factor=1.3, mode="linear"),
                F.interpolate(x1, size=4, mode="linear", align_corners=True),
                F.interpolate(x.double(), size=(11, 20), mode="bilinear"),
                F.interpolate(x.half(), size=(5, 13), mode="bilinear"),
                # Twice the size: shifted slices, not gathers (_linear_double).
                F.interpolate(x, scale_factor=2, mode="bilinear"),
                F.interpolate(x, size=(14, 18), mode="bilinear"),
                F.interpolate(x.double(), scale_factor=(2, 2), mode="bilinear"),
                F.interpolate(x[..., :2], scale_factor=2, mode="bilinear"),
                F.interpolate(x1, scale_factor=2, mode="linear"))

    optimized, _ = compiled_whole(fn, (x, x1), atol=2e-6)
    for got, want in zip(optimized(x, x1)[:4], fn(x, x1)[:4]):
        assert torch.equal(got, want)   # nearest: a gather or a broadcast, exact


def test_doubling_bilinear_upsampling_reads_slices_not_gathers(tmp_path):
    """Twice the size (align_corners=False) is shifted slices of the input, weighted and
    interleaved: no gather, which along the last dim ran element by element."""
    model = Lambda(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear") + 1)
    x = torch.randn(1, 8, 12, 16)
    optimized = blade.optimize(model, (x,), blade.Config(allow_tracing=True,
                                                         dump_dir=str(tmp_path)))
    torch.testing.assert_close(optimized(x), model(x), rtol=1e-6, atol=1e-6)
    assert assert_ran_compiled(optimized).coverage == 1.0
    assert "stablehlo.gather" not in ir_before(tmp_path, "lower-gathers")


def test_max_pool3d_with_indices_compiles_whole_with_eagers_indices():
    # Padding (masked out, never an index), dilation, ceil mode, a NaN, -inf windows and
    # ties (the first index).
    torch.manual_seed(0)
    x = torch.randn(1, 2, 7, 8, 9)
    x[0, 0, 1, 1, 1] = float("nan")
    x[0, 1, 2:4, 2:4, 2:4] = float("-inf")
    ones = torch.ones(1, 2, 5, 5, 5)

    def fn(x, ones):
        return (*F.max_pool3d(x, 2, return_indices=True),
                *F.max_pool3d(x, 3, 2, 1, return_indices=True),
                *F.max_pool3d(x, [2, 3, 2], [1, 2, 3], [1, 1, 0], [2, 1, 1],
                              return_indices=True, ceil_mode=True),
                *F.max_pool3d(ones, 2, 1, return_indices=True))

    compiled_whole(fn, (x, ones))


def test_edge_cases_give_eagers_answers():
    # Circular padding with a negative pad (PyTorch crops, then wraps: the op is kept),
    # nearest resampling of float64 in float64 arithmetic (2 -> 82: float32's scale
    # would read the wrong pixel), diag_embed of an empty vector with an offset.
    x = torch.arange(6.0).reshape(1, 1, 6)
    image = torch.arange(4, dtype=torch.float64).reshape(1, 1, 2, 2)
    empty = torch.zeros(0)

    def fn(x, image, empty):
        return (F.pad(x, (-1, 2), mode="circular") + 1, F.interpolate(image, size=(82, 82)) + 1,
                torch.diag_embed(empty, 1) + 1)

    model = Lambda(fn)
    optimized = blade.optimize(model, (x, image, empty), TRACE)
    for got, want in zip(optimized(x, image, empty), model(x, image, empty)):
        assert got.shape == want.shape and torch.equal(got, want), (got, want)

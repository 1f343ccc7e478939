"""GEMMs of a few rows by a weight read as it is (csrc/ral/few_rows_gemm.*): the runtime's
own loop, which an engine's kernel trials time against oneDNN's convolution for such rows
(a squeeze-excitation layer, a classifier, a decoder's token)."""
import pytest
import torch

import blade
from blade import _C
from helpers import assert_ran_compiled, assert_same_values

needs_loop = pytest.mark.skipif(not _C.few_rows_gemm_available(),
                                reason="this CPU lacks AVX-512F: MKL's sgemm serves instead")


@needs_loop
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("cols, depth", [(1, 1), (3, 15), (4, 16), (9, 17), (37, 100),
                                         (260, 960)])
def test_few_rows_gemm_is_the_product(rows, cols, depth):
    """Every row count, whole and partial groups of four columns, depths below, at and past
    16 lanes; within float32 rounding of a double-precision product."""
    torch.manual_seed(rows * 1000 + cols)
    x, w = torch.randn(rows, depth), torch.randn(cols, depth)
    got = _C.few_rows_gemm(x, w)
    want = x.double() @ w.double().T
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * depth ** 0.5)


@needs_loop
def test_few_rows_gemm_keeps_inf_and_nan():
    x, w = torch.ones(2, 20), torch.ones(5, 20)
    x[0, 3], w[2, 19] = float("nan"), float("inf")
    got = _C.few_rows_gemm(x, w)
    want = x @ w.T
    assert_same_values(got, want)


@needs_loop
def test_few_rows_gemm_names_what_it_does_not_take():
    with pytest.raises(RuntimeError, match=r"few_rows_gemm: does not run here or for 5 rows"):
        _C.few_rows_gemm(torch.randn(5, 8), torch.randn(3, 8))
    with pytest.raises(RuntimeError, match=r"x \[rows, K\] and w \[N, K\] float32"):
        _C.few_rows_gemm(torch.randn(2, 8), torch.randn(3, 7))


class SqueezeExcitation(torch.nn.Module):
    """MobileNetV3's squeeze-excitation: 1x1 convolutions of one pixel per image."""

    def __init__(self, channels=96, squeezed=24):
        super().__init__()
        self.down = torch.nn.Conv2d(channels, squeezed, 1)
        self.up = torch.nn.Conv2d(squeezed, channels, 1)
        self.head = torch.nn.Linear(channels, 10)

    def forward(self, x):
        scale = torch.nn.functional.adaptive_avg_pool2d(x, 1)
        scale = torch.sigmoid(self.up(torch.relu(self.down(scale))))
        return self.head((x * scale).mean((2, 3)))


@pytest.mark.parametrize("batch", [1, 3])
def test_single_pixel_convolutions_and_linears_match_eager_through_their_trials(batch):
    """A few rows by a weight: each call of the trials (for the linear layer the runtime's
    loop, or MKL's sgemm without AVX-512F; for the 1x1 convolutions Blade's float32 kernel
    on AVX-512; against oneDNN's) and after them matches eager, and the report lists each
    trial with the kernel it kept."""
    torch.manual_seed(batch)
    model = SqueezeExcitation().eval()
    x = torch.randn(batch, 96, 7, 7)
    optimized = blade.optimize(model, (x,))
    with torch.no_grad():
        for _ in range(_C.kernel_trial_calls()):
            torch.testing.assert_close(optimized(x), model(x), rtol=1e-4, atol=1e-5)
    report = assert_ran_compiled(optimized)
    choices = report.clusters[0].kernel_choices
    assert len(choices) == 3, choices  # down, up and head
    kept = ("-> oneDNN", "-> plain-weight GEMM", "-> Blade float32")
    assert all(line.endswith(kept) for line in choices), choices
    assert "weight [24, 96, 1, 1], input [%d, 96, 1, 1]: oneDNN " % batch in choices[0], choices
    assert "kernel trials: 3 weights and input sizes, kept " in str(report), str(report)

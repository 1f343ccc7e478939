"""Blade's int8 matrix-vector product (csrc/ral/int8_gemv.*): blade::quantized_linear of at
most 4 rows by Blade's kernel, which streams the weight (more rows, and GELU post-ops, run
the convolution kernel: test_int8_linear.py). Compared with the float64 reference and with
oneDNN's result."""
import pytest
import torch

from blade import _C
from helpers import assert_int8_linear_result, int8_linear_reference, run_both

needs_kernel = pytest.mark.skipif(not _C.int8_conv_available(),
                                  reason="this CPU lacks AVX-512 VNNI, AMX-INT8 and AVX2")
# The largest weight magnitude the int8 kernels take here (AVX2's pair sums: 64).
LIMIT = _C.int8_weight_limit() or 127

INPUT_RANGE = torch.tensor([0.02, 7.0])    # scale, zero point
OUTPUT_RANGE = torch.tensor([0.05, 3.0])


@pytest.fixture(autouse=True)
def oneDNN_back_on():
    yield
    _C.set_int8_conv_enabled(True)


@needs_kernel
@pytest.mark.parametrize("rows, k, n", [
    (1, 2048, 1000),   # a ResNet's classifier: blocks of 16 columns and a partial one
    (4, 96, 40),       # the most rows it takes
    (3, 30, 17),       # K no multiple of 4: rows padded; one column past a block
    (2, 5, 1),         # one column
])
@pytest.mark.parametrize("uint8_input", [False, True])
@pytest.mark.parametrize("uint8_result, post_op", [(False, "none"), (False, "relu"),
                                                   (True, "relu")])
def test_few_rows_match_the_reference_and_onednn(rows, k, n, uint8_input, uint8_result,
                                                 post_op):
    gen = torch.Generator().manual_seed(rows * 1000 + k)
    q = torch.randint(0, 256, (rows, k), dtype=torch.uint8, generator=gen)
    real = (q.double() - INPUT_RANGE[1]) * INPUT_RANGE[0]
    weight = torch.randint(-LIMIT, LIMIT + 1, (n, k), dtype=torch.int8, generator=gen)
    scale = torch.rand(n, generator=gen) * 0.01 + 0.001
    bias = torch.randn(n, generator=gen)
    # A float input a third of a step from the values it stands for rounds back to them.
    x = q.view(torch.int8) if uint8_input else \
        (real + (torch.rand(real.shape, generator=gen) - 0.5) * (2 / 3) * INPUT_RANGE[0]).float()
    (mine, onednn), ran = run_both(lambda: torch.ops.blade.quantized_linear(
        x, weight, scale, bias, INPUT_RANGE, OUTPUT_RANGE if uint8_result else None, post_op))
    assert ran == [1, 0]
    want = int8_linear_reference(real, weight, scale, bias, post_op)
    assert_int8_linear_result(mine, onednn, want, OUTPUT_RANGE if uint8_result else None)


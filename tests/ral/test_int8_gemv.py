"""Blade's int8 matrix-vector product (csrc/ral/int8_gemv.*): blade::quantized_linear of at
most 4 rows by Blade's kernel, which streams the weight; more rows, and GELU post-ops, run
oneDNN's. Compared with the float64 reference and with oneDNN's result."""
import pytest
import torch

from blade import _C
from helpers import run_both

needs_vnni = pytest.mark.skipif(not _C.int8_conv_available(),
                                reason="this CPU lacks AVX-512 VNNI and AMX-INT8")

INPUT_RANGE = torch.tensor([0.02, 7.0])    # scale, zero point
OUTPUT_RANGE = torch.tensor([0.05, 3.0])


@pytest.fixture(autouse=True)
def oneDNN_back_on():
    yield
    _C.set_int8_conv_enabled(True)


@needs_vnni
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
    weight = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    scale = torch.rand(n, generator=gen) * 0.01 + 0.001
    bias = torch.randn(n, generator=gen)
    # A float input a third of a step from the values it stands for rounds back to them.
    x = q.view(torch.int8) if uint8_input else \
        (real + (torch.rand(real.shape, generator=gen) - 0.5) * (2 / 3) * INPUT_RANGE[0]).float()
    (mine, onednn), ran = run_both(lambda: torch.ops.blade.quantized_linear(
        x, weight, scale, bias, INPUT_RANGE, OUTPUT_RANGE if uint8_result else None, post_op))
    assert ran == [1, 0]
    want = real @ (weight.double() * scale.double().unsqueeze(1)).t() + bias.double()
    if post_op == "relu":
        want = torch.relu(want)
    if uint8_result:
        step, zero_point = OUTPUT_RANGE[0].item(), OUTPUT_RANGE[1].item()
        got = (mine.view(torch.uint8).double() - zero_point) * step
        clamped = want.clamp(min=-zero_point * step, max=(255 - zero_point) * step)
        assert (got - clamped).abs().max() <= 0.5 * step + 1e-4
        assert (mine.view(torch.uint8).int() - onednn.view(torch.uint8).int()).abs().max() <= 1
    else:
        torch.testing.assert_close(mine.double(), want, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(mine, onednn, rtol=1e-5, atol=1e-4)


@needs_vnni
def test_more_rows_and_gelu_run_onednns():
    weight = torch.randint(-127, 128, (24, 32), dtype=torch.int8)
    scale, bias = torch.rand(24) * 0.01, torch.randn(24)
    for rows, post_op in ((5, "none"), (1, "gelu")):
        before = _C.int8_conv_calls()
        torch.ops.blade.quantized_linear(torch.randn(rows, 32), weight, scale, bias,
                                         INPUT_RANGE, None, post_op)
        assert _C.int8_conv_calls() == before

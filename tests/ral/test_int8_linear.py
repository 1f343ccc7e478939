"""blade::quantized_linear of more rows than the matrix-vector product takes, and with GELU:
Blade's int8 convolution kernel (csrc/ral/int8_conv.*) runs it as a 1x1 convolution whose
pixels are the rows, GELU's two forms in its epilogue. Compared with the float64 reference
and with oneDNN's result (helpers.run_both)."""
import math

import pytest
import torch

import blade
from blade import _C
from helpers import (assert_int8_linear_result, assert_ran_compiled, int8_linear_reference,
                     run_both)

needs_kernel = pytest.mark.skipif(not _C.int8_conv_available(),
                                  reason="this CPU lacks AVX-512 VNNI, AMX-INT8 and AVX2")
# The largest weight magnitude the int8 kernels take here (AVX2's pair sums: 64).
LIMIT = _C.int8_weight_limit() or 127

INPUT_RANGE = torch.tensor([0.02, 7.0])    # scale, zero point
OUTPUT_RANGE = torch.tensor([0.05, 120.0])


@pytest.fixture(autouse=True)
def tiles_back_on():
    yield
    _C.set_int8_conv_tiles(True)


@pytest.fixture(params=["tiles", "microkernel"])
def multiply(request):
    """Blade's register tiles, or (on AMX-INT8 CPUs) its AMX tiles or (elsewhere) oneDNN's
    brgemm microkernel, with Blade's epilogue, where each runs here."""
    _C.set_int8_conv_tiles(request.param == "tiles")
    if _C.int8_conv_tiles_run() != (request.param == "tiles"):
        pytest.skip(f"the {request.param} do not run on this CPU")
    return request.param


@needs_kernel
@pytest.mark.parametrize("rows, k, n", [
    (2, 40, 24),        # few rows, which GELU sends here rather than to the matrix-vector
    (5, 32, 24),        # one row past the matrix-vector product's
    (128, 96, 200),     # a sequence: whole tiles of 6 rows and a tail; a partial column block
    (37, 30, 64),       # K no multiple of 4
    (30, 48, 16),       # one vector of outputs: two tiles of 12 rows and a tail of 6
    (64, 32, 100),      # a last block of 36 outputs: tiles of 3 vectors
])
@pytest.mark.parametrize("post_op", ["none", "relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("uint8_result", [False, True])
def test_many_rows_match_the_reference_and_onednn(rows, k, n, post_op, uint8_result,
                                                  multiply):
    gen = torch.Generator().manual_seed(rows * 1000 + k)
    q = torch.randint(0, 256, (1, rows, k), dtype=torch.uint8, generator=gen)
    real = (q.double() - INPUT_RANGE[1]) * INPUT_RANGE[0]
    weight = torch.randint(-LIMIT, LIMIT + 1, (n, k), dtype=torch.int8, generator=gen)
    # Scales that spread the sums over a few units, where GELU bends.
    scale = (torch.rand(n, generator=gen) + 0.5) * 0.02 / math.sqrt(k)
    bias = torch.randn(n, generator=gen)
    (mine, onednn), ran = run_both(lambda: torch.ops.blade.quantized_linear(
        q.view(torch.int8), weight, scale, bias, INPUT_RANGE,
        OUTPUT_RANGE if uint8_result else None, post_op))
    assert ran == [1, 0]
    assert mine.shape == (1, rows, n)
    want = int8_linear_reference(real, weight, scale, bias, post_op)
    assert_int8_linear_result(mine, onednn, want, OUTPUT_RANGE if uint8_result else None)


@needs_kernel
@pytest.mark.parametrize("post_op", ["gelu", "gelu_tanh"])
def test_gelu_along_its_whole_curve(post_op, multiply):
    """Every uint8 input of one feature, by 16 channels whose scales spread the sums over
    [-8, 8]: GELU in float32 results is within float32 rounding of the float64 reference
    (the gate's cubics per segment, from both sides of zero and past the table's end)."""
    q = torch.arange(256, dtype=torch.uint8).reshape(256, 1).repeat(1, 4)
    weight = torch.full((16, 4), 127, dtype=torch.int8)
    scale = 8 / (128 * 0.02 * 127 * 4) * torch.arange(1, 17) / 16
    got = torch.ops.blade.quantized_linear(q.view(torch.int8), weight, scale, None,
                                           torch.tensor([0.02, 128.0]), None, post_op)
    sums = ((q.double() - 128) * 0.02) @ (weight.double() * scale.double()[:, None]).T
    assert float(sums.min()) < -7.9 and float(sums.max()) > 7.8
    want = torch.nn.functional.gelu(sums, approximate="tanh" if post_op == "gelu_tanh"
                                    else "none")
    torch.testing.assert_close(got.double(), want, rtol=0, atol=3e-6)


@needs_kernel
def test_gelu_of_extreme_sums():
    """Sums far past the gate's table give x or 0 (within float32 rounding of x: the gate's
    last cubic stops an ulp short of 1), and NaN comes out of a NaN bias."""
    weight = torch.full((16, 8), 127, dtype=torch.int8)
    weight[8:] = -127
    q = torch.full((6, 8), 255, dtype=torch.uint8)
    bias = torch.zeros(16)
    bias[3] = float("nan")
    for post_op in ("gelu", "gelu_tanh"):
        got = torch.ops.blade.quantized_linear(q.view(torch.int8), weight, torch.ones(16),
                                               bias, INPUT_RANGE, None, post_op)
        big = (255 - 7) * 0.02 * 127 * 8
        assert torch.isnan(got[:, 3]).all()
        keep = [c for c in range(16) if c != 3]
        want = torch.tensor([big if c < 8 else 0.0 for c in keep]).expand(6, -1)
        torch.testing.assert_close(got[:, keep], want, rtol=1e-6, atol=big * 1e-6)


@needs_kernel
def test_an_int8_engine_times_its_linear_layers_against_onednns():
    """In an engine each linear layer of many rows is a kernel trial, Blade's kernel against
    oneDNN's; either way the output is the layer's within int8's error."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(),
                                torch.nn.Linear(1024, 256)).eval()   # past q.MIN_MACS
    x = torch.randn(128, 512)
    int8 = blade.optimize(model, (x,), blade.Config(precision="int8", calibration=[x]))
    with torch.no_grad():
        want = model(x)
        for _ in range(_C.kernel_trial_calls()):
            got = int8(x)
    report = assert_ran_compiled(int8)
    lines = [line for c in report.clusters for line in c.kernel_choices]
    assert sorted(line.split(", input")[0] for line in lines) == \
        ["weight [1024, 512]", "weight [256, 1024]"], lines
    assert all(line.endswith(("-> Blade int8", "-> oneDNN")) for line in lines), lines
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert float(cosine) > 0.999

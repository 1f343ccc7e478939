"""uint8, int8 and int16 compile like the wider integers: uint8 stays unsigned in the
compiled code (comparisons, conversions to float and wider ints, division), every narrow
type wraps around as eager's does, and a uint8 image is normalized inside the engine."""
import pytest
import torch

import blade
from helpers import Lambda, compiled_whole

NARROW = [torch.uint8, torch.int8, torch.int16]


def nonzero(y):
    return torch.where(y == 0, torch.ones_like(y), y)


OPS = {
    "add_wraps": lambda x, y: x + y,
    "mul_wraps": lambda x, y: x * y - y,
    "compare": lambda x, y: (x > y) | (x == 200),
    "to_float": lambda x, y: x.to(torch.float32) * 0.5 - y.to(torch.float32),
    "to_int64": lambda x, y: x.to(torch.int64) * 1000 + y,
    "floor_divide": lambda x, y: x // nonzero(y),
    "remainder": lambda x, y: x % nonzero(y),
    "extremes": lambda x, y: torch.maximum(x, y).amax(dim=1) - y.amin(dim=1),
    "sum": lambda x, y: x.sum(dim=-1) + y.sum(),
    "where_transpose": lambda x, y: torch.where(x.t() > 100, x.t(), y.t()).contiguous(),
}


def sample(dtype):
    info = torch.iinfo(dtype)
    torch.manual_seed(0)
    # The whole range: values past 127 are where unsigned and signed bytes differ.
    return tuple(torch.randint(info.min, info.max + 1, (6, 40), dtype=torch.int64).to(dtype)
                 for _ in range(2))


@pytest.mark.parametrize("dtype", NARROW, ids=[str(d)[6:] for d in NARROW])
@pytest.mark.parametrize("name", sorted(OPS))
def test_narrow_integer_ops_compile_exactly(name, dtype):
    compiled_whole(OPS[name], sample(dtype), rtol=0, atol=0)


@pytest.mark.parametrize("low, high", [(0, 128), (128, 256)], ids=["under-128", "over-127"])
def test_uint8_extremes_over_values_on_one_side_of_128(low, high):
    """Torch-MLIR starts uint8 max and min from the signed extremes (128 and 127): compiled
    with such inputs, the engine must still give the max of values all under 128 and the min
    of values all over 127, on other inputs than the example's too."""
    def fn(x):
        return x.amax(dim=1), x.amin(dim=(1, 2)), torch.max(x, 2)[1]

    torch.manual_seed(0)
    make = lambda: torch.randint(low, high, (3, 5, 6), dtype=torch.uint8)  # noqa: E731
    optimized, _ = compiled_whole(fn, (make(),), rtol=0, atol=0)
    for _ in range(3):
        x = make()
        for got, want in zip(optimized(x), fn(x)):
            assert torch.equal(got, want)


def test_max_pooling_of_bytes_stays_torchscript_without_crashing():
    # Torch-MLIR's conversion of max_pool2d/3d on 8-bit integers crashes the process: the
    # probe never asks it (blade.partition.torch_mlir_probe), the op runs as TorchScript.
    class Pool(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.max_pool2d(x, 2) + 1

    x = torch.randint(0, 256, (2, 3, 6, 6), dtype=torch.uint8)
    optimized = blade.optimize(Pool(), (x,))
    assert torch.equal(optimized(x), Pool()(x))
    report = blade.report(optimized)
    assert "aten::max_pool2d" in report.unsupported, str(report)
    assert report.compiled_ops == 1, str(report)


def test_a_uint8_image_is_normalized_and_quantized_back_in_one_engine():
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)

    def fn(image):
        x = (image.to(torch.float32) / 255.0 - mean) / std
        y = torch.relu(x * 1.5)
        return x, (y.clamp(0.0, 1.0) * 255.0).round().to(torch.uint8)

    image = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    optimized, report = compiled_whole(fn, (image,), rtol=1e-6, atol=1e-6)
    assert len(report.clusters) == 1 and "uint8[2,3,16,16]" in report.clusters[0].inputs, \
        str(report)
    # An image of other values through the same engine.
    other = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    got, want = optimized(other), fn(other)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-6)
    assert torch.equal(got[1], want[1])


def test_a_dynamic_batch_of_uint8_images():
    def fn(image):
        return image.to(torch.float32).mean(dim=(2, 3)) / 255.0

    model = Lambda(fn)
    optimized = blade.optimize(model, (torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8),),
                               blade.Config(allow_tracing=True, dynamic_dims={0: [0]}))
    for batch in (1, 2, 5):
        image = torch.randint(0, 256, (batch, 3, 8, 8), dtype=torch.uint8)
        torch.testing.assert_close(optimized(image), fn(image), rtol=1e-6, atol=1e-6)
    report = blade.report(optimized)
    assert report.compiled_ops == report.total_ops and report.runtime_fallbacks == 0, \
        str(report)

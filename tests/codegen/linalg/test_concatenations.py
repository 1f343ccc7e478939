"""Concatenations as copies into slices of one buffer (python/blade/codegen/linalg/concatenations.py):
equal to eager at static and run-time sizes, with no per-element select left in the code,
and a loop nest that computes an operand writing straight into its slice."""
import re

import pytest
import torch
import torch.nn.functional as F

import blade
from helpers import ir_before, Lambda, run_compiled

TRACE = blade.Config(allow_tracing=True)


def _main(text: str) -> str:
    """The text of func @main in a dumped stage."""
    start = text.index("func.func @main")
    return text[start:text.index("\n  }\n", start)]


def test_concatenation_has_no_select_per_element(tmp_path):
    """Three computed operands along the middle dim: one buffer, each operand's loop nest
    writing its slice, and no compare-and-branch per element."""
    model = Lambda(lambda x, y: torch.cat([x * 2.0, torch.tanh(y), x - 1.0], dim=1) + 1.0)
    inputs = (torch.randn(4, 5, 33), torch.randn(4, 7, 33))
    run_compiled(model, inputs, blade.Config(allow_tracing=True, dump_dir=str(tmp_path)))
    linalg = ir_before(tmp_path, "write-slices-in-place")
    assert linalg.count("tensor.insert_slice") == 3, linalg
    assert "scf.if" not in linalg, linalg


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool], ids=str)
def test_concatenation_along_a_dynamic_dim(dtype):
    """A KV cache's append: both operands of independent run-time lengths, the offset of
    the second slice computed at run time."""
    def make(length):
        t = torch.randn(2, length, 8) * 3
        return t.to(dtype) if dtype != torch.bool else t > 0
    model = Lambda(lambda past, new: torch.cat([past, new], dim=1).flip(2))
    config = blade.Config(allow_tracing=True, dynamic_dims={0: [1], 1: [1]})
    optimized = blade.optimize(model, (make(5), make(3)), config)
    sizes = [(5, 3), (1, 1), (17, 4), (0, 6)]
    with torch.no_grad():
        for past, new in sizes:
            inputs = (make(past), make(new))
            assert torch.equal(optimized(*inputs), model(*inputs)), (past, new)
    report = blade.report(optimized)
    assert report.clusters[0].calls == len(sizes) and report.runtime_fallbacks == 0, \
        str(report)


class Decoder(torch.nn.Module):
    """A U-Net decoder step: the skip connection and x2 nearest upsampled coarse features
    concatenated along C, convolved."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.down = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.out = torch.nn.Conv2d(24, 4, 3, padding=1)

    def forward(self, x):
        skip = torch.relu(self.inner(x))
        up = F.interpolate(torch.relu(self.down(skip)), scale_factor=2.0, mode="nearest")
        return self.out(torch.cat([skip, up], 1))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic_batch"])
def test_upsampling_is_written_into_its_slice_channels_last(dynamic, tmp_path):
    """The upsampling's loop nest computes NHWC rows of the concatenation in place (one
    loop over the collapsed sizes, its input read at h // 2, w // 2), so the only copy
    left is the skip connection's, from the convolution's output; with a dynamic batch
    too, whose reshapes and broadcasts the transposes to NCHW sink through as well."""
    torch.manual_seed(0)
    model = Decoder().eval()
    config = blade.Config(dump_dir=str(tmp_path), dynamic_dims={0: [0]} if dynamic else None)
    x = torch.randn(2, 4, 12, 12)
    optimized, report = run_compiled(model, (x,), config, rtol=1e-4, atol=1e-5)
    assert report.coverage == 1.0 and len(report.clusters) == 1, str(report)
    batch = "?" if dynamic else "2"
    linalg = ir_before(tmp_path, "write-slices-in-place")
    assert f"tensor<{batch}x12x12x24xf32>" in linalg            # the concatenation, NHWC
    assert f"tensor<{batch}x24x12x12xf32>" not in linalg        # no NCHW copy of it
    main = _main(ir_before(tmp_path, "mark-out-params"))
    assert main.count("memref.copy") == 1, main
    assert re.search(r"linalg.generic [^\n]*outs\(%subview[_0-9]* ", main), main
    if dynamic:
        with torch.no_grad():
            for size in (1, 3):
                y = torch.randn(size, 4, 12, 12)
                torch.testing.assert_close(optimized(y), model(y), rtol=1e-4, atol=1e-5)

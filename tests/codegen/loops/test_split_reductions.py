"""split_reductions: a global pooling's sum over an image becomes per-row sums that
parallel.py shares among the threads, then a small serial sum; other reductions are left
as they are. End to end, a squeeze-excitation block gives eager's results on any thread
count with the pooling's rows in a parallel loop."""
import re

import pytest
import torch
from torch_mlir import ir

import blade
from blade.codegen.loops.split_reductions import split_reductions
from helpers import ir_before, run_compiled

# A [1, H, W, C] -> [1, 1, 1, C] sum as reduce_window lowers a global pooling: unit output
# loops d0..d2, the window's d3, d4 (reductions), the channels d5.
POOL = """
#in = affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1 * {h} + d3, d2 * {w} + d4, d5)>
#win = affine_map<(d0, d1, d2, d3, d4, d5) -> (d3, d4)>
#out = affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1, d2, d5)>
func.func @main(%x: memref<1x{h}x{w}x{c}xf32>, %window: memref<{h}x{w}xf32>,
                %out: memref<1x1x1x{c}xf32>) {{
  linalg.generic {{indexing_maps = [#in, #win, #out],
                  iterator_types = ["parallel", "parallel", "parallel", "reduction",
                                    "reduction", "parallel"]}}
      ins(%x, %window : memref<1x{h}x{w}x{c}xf32>, memref<{h}x{w}xf32>)
      outs(%out : memref<1x1x1x{c}xf32>) {{
  ^bb0(%v: f32, %unused: f32, %acc: f32):
    %sum = arith.{op} %acc, %v {fastmath} : f32
    linalg.yield %sum : f32
  }}
  return
}}
"""
REASSOC = "fastmath<reassoc,contract>"


def rewrite(h=14, w=14, c=480, op="addf", fastmath=REASSOC):
    with ir.Context(), ir.Location.unknown():
        module = ir.Module.parse(POOL.format(h=h, w=w, c=c, op=op, fastmath=fastmath))
        count = split_reductions(module.body.operations[0])
        assert module.operation.verify()
        return count, str(module)


def test_a_pooling_sums_its_rows_in_a_parallel_loop_then_adds_them():
    count, text = rewrite()
    assert count == 1, text
    assert "memref.alloc() : memref<14x1x1x1x480xf32>" in text, text
    # The per-row sums: the rows' loop first and parallel, the window's columns summed.
    assert 'iterator_types = ["parallel", "reduction", "parallel"]' in text, text
    # Their sum into the output: over the rows, serial.
    assert 'iterator_types = ["reduction", "parallel", "parallel", "parallel", "parallel"]' \
        in text, text
    assert "linalg.fill" in text, text


@pytest.mark.parametrize("kwargs, why", [
    ({"h": 4, "w": 4, "c": 64}, "too small to share"),
    ({"op": "maximumf"}, "not a sum"),
    ({"fastmath": ""}, "the order of its additions is fixed"),
])
def test_other_reductions_are_left_alone(kwargs, why):
    count, text = rewrite(**kwargs)
    assert count == 0, why


def test_a_sum_over_rows_alone_stays_serial():
    # Its partial sums would be a copy of its input.
    count, _ = rewrite(h=512, w=1, c=1024)
    assert count == 0


class SqueezeExcitation(torch.nn.Module):
    def __init__(self, channels=96):
        super().__init__()
        self.depthwise = torch.nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
        self.squeeze = torch.nn.Conv2d(channels, channels // 4, 1)
        self.excite = torch.nn.Conv2d(channels // 4, channels, 1)

    def forward(self, x):
        y = torch.nn.functional.hardswish(self.depthwise(x))
        scale = torch.nn.functional.adaptive_avg_pool2d(y, 1)
        scale = torch.nn.functional.hardsigmoid(self.excite(torch.relu(self.squeeze(scale))))
        return y * scale


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_squeeze_excitation_block_matches_eager_with_its_pooling_parallel(threads,
                                                                            tmp_path):
    torch.manual_seed(0)
    model = SqueezeExcitation().eval()
    x = torch.randn(1, 96, 28, 28)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        run_compiled(model, (x,), blade.Config(dump_dir=str(tmp_path)), rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(previous)
    # The pooling's per-row sums went out of main as a parallel task over the 28 rows.
    outlined = ir_before(tmp_path, "lower-library-calls")
    task = re.search(r"func\.func private @blade_task_\d+\([^\n]*"
                     r"memref<28x1x1x1x96xf32> \{llvm\.noalias\}\) "
                     r"attributes \{blade\.parallel_task\}", outlined)
    assert task is not None, outlined

"""loop_order.order_loops: a transposing loop nest walks the 2-d block both sides are
contiguous along innermost, and still computes what eager does."""
import torch
from torch_mlir import ir

import blade
from blade.codegen.loops.loop_order import order_loops
from helpers import Lambda, run_compiled

NHWC_TO_NCHW = """
#nhwc = affine_map<(d0, d1, d2, d3) -> (d0, d2, d3, d1)>
#id = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
func.func @main(%a: memref<4x56x56x64xf32>, %b: memref<4x56x56x64xf32>,
                %out: memref<4x64x56x56xf32>) {
  linalg.generic {indexing_maps = [#nhwc, #nhwc, #id],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%a, %b : memref<4x56x56x64xf32>, memref<4x56x56x64xf32>)
      outs(%out : memref<4x64x56x56xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %s = arith.addf %x, %y : f32
    linalg.yield %s : f32
  }
  return
}
"""


def test_the_inputs_contiguous_loop_moves_just_inside_the_outputs():
    with ir.Context(), ir.Location.unknown():
        module = ir.Module.parse(NHWC_TO_NCHW)
        main = module.body.operations[0]
        assert order_loops(main) == 1
        text = str(module)
        assert order_loops(main) == 0          # already in order: nothing moves again
    # loops are now (n, h, c, w): the inputs read (n, h, w, c), the output (n, c, h, w)
    assert "affine_map<(d0, d1, d2, d3) -> (d0, d1, d3, d2)>" in text, text
    assert "affine_map<(d0, d1, d2, d3) -> (d0, d2, d1, d3)>" in text, text


def add_to_channels_first(a, b):
    return (a * 2.0 + b).permute(0, 3, 1, 2).contiguous()


def test_a_transposed_add_matches_eager():
    torch.manual_seed(0)
    inputs = (torch.randn(4, 24, 40, 64), torch.randn(4, 24, 40, 64))
    run_compiled(Lambda(add_to_channels_first), inputs, blade.Config(allow_tracing=True))

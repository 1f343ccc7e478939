"""codegen/loops/loop_order.py: the loop an input is contiguous along runs just inside the
output's innermost loop (NHWC data written as NCHW: loops N, H, C, W)."""
from ir_runner import check_pass, run_pass

NHWC_TO_NCHW = """
#in = affine_map<(d0, d1, d2, d3) -> (d0, d2, d3, d1)>
#out = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
func.func @main(%arg0: memref<1x56x56x64xf32> {llvm.noalias}, %arg1: memref<1x64x56x56xf32> {llvm.noalias}) {
  linalg.generic {indexing_maps = [#in, #out], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%arg0 : memref<1x56x56x64xf32>) outs(%arg1 : memref<1x64x56x56xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.addf %in, %in : f32
    linalg.yield %0 : f32
  }
  return
}
"""


def test_the_input_channel_loop_moves_inside_the_output_rows():
    # Loops become (N, H, C, W): the input (N, H, W, C) is read as (d0, d1, d3, d2) and the
    # output (N, C, H, W) written as (d0, d2, d1, d3).
    check_pass(NHWC_TO_NCHW + """
    // CHECK: affine_map<(d0, d1, d2, d3) -> (d0, d1, d3, d2)>
    // CHECK: affine_map<(d0, d1, d2, d3) -> (d0, d2, d1, d3)>
    """, "order-loops")


def test_a_loop_nest_in_one_layout_is_left_alone():
    same = NHWC_TO_NCHW.replace("(d0, d2, d3, d1)>", "(d0, d1, d2, d3)>").replace(
        "memref<1x56x56x64xf32>", "memref<1x64x56x56xf32>")
    result, _ = run_pass(same, "order-loops")
    assert "(d0, d2, d1, d3)" not in result, result

"""codegen/stablehlo/slices.py: an elementwise op read only by a slice is computed on the
slice: the slice moves above it."""
from ir_runner import check_pass, run_pass

ADD_THEN_SLICE = """
func.func @main(%arg0: tensor<4x16xf32>, %arg1: tensor<f32>) -> tensor<4x8xf32> {
  %1 = stablehlo.broadcast_in_dim %arg1, dims = [] : (tensor<f32>) -> tensor<4x16xf32>
  %2 = stablehlo.add %arg0, %1 : tensor<4x16xf32>
  %3 = stablehlo.slice %2 [0:4, 0:8] : (tensor<4x16xf32>) -> tensor<4x8xf32>
  return %3 : tensor<4x8xf32>
}
"""


def test_the_slice_moves_above_the_add_and_its_broadcast_narrows():
    check_pass(ADD_THEN_SLICE + """
    // CHECK: [[S:%[0-9]+]] = stablehlo.slice %arg0 [0:4, 0:8]
    // CHECK: [[B:%[0-9]+]] = stablehlo.broadcast_in_dim %arg1, dims = [] : (tensor<f32>) -> tensor<4x8xf32>
    // CHECK: stablehlo.add [[S]], [[B]] : tensor<4x8xf32>
    // CHECK-NOT: tensor<4x16xf32>) -> tensor<4x8xf32>
    """, "sink-slices")


def test_an_add_that_something_else_reads_whole_keeps_its_slice_below():
    text = ADD_THEN_SLICE.replace("-> tensor<4x8xf32> {", "-> (tensor<4x8xf32>, tensor<4x16xf32>) {") \
        .replace("return %3 : tensor<4x8xf32>", "return %3, %2 : tensor<4x8xf32>, tensor<4x16xf32>")
    result, _ = run_pass(text, "sink-slices")
    assert "stablehlo.slice %arg0" not in result, result

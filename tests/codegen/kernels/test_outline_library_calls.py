"""codegen/kernels/library_calls.py `outline`: matmuls and convolutions move into private
functions marked as RAL kernel calls, with what feeds or follows them that the kernel
takes along."""
from ir_runner import check_pass, run_pass

MATMUL_RELU = """
func.func @main(%arg0: tensor<4x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<4x8xf32> {
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<4x8xf32>
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>
  %1 = stablehlo.maximum %0, %cst : tensor<4x8xf32>
  return %1 : tensor<4x8xf32>
}
"""

CONV_NHWC = """
func.func @main(%arg0: tensor<1x8x8x3xf32>, %arg1: tensor<8x3x3x3xf32>, %arg2: tensor<8xf32>) -> tensor<1x8x8x8xf32> {
  %0 = stablehlo.convolution(%arg0, %arg1) dim_numbers = [b, 0, 1, f]x[o, i, 0, 1]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x8x3xf32>, tensor<8x3x3x3xf32>) -> tensor<1x8x8x8xf32>
  %1 = stablehlo.reshape %arg2 : (tensor<8xf32>) -> tensor<8x1x1xf32>
  %2 = stablehlo.transpose %1, dims = [1, 2, 0] : (tensor<8x1x1xf32>) -> tensor<1x1x8xf32>
  %3 = stablehlo.broadcast_in_dim %2, dims = [1, 2, 3] : (tensor<1x1x8xf32>) -> tensor<1x8x8x8xf32>
  %4 = stablehlo.add %0, %3 : tensor<1x8x8x8xf32>
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<1x8x8x8xf32>
  %5 = stablehlo.maximum %4, %cst : tensor<1x8x8x8xf32>
  return %5 : tensor<1x8x8x8xf32>
}
"""


def test_a_matmul_becomes_a_call_of_a_function_marked_for_the_kernel():
    compilation = check_pass(MATMUL_RELU + """
    // CHECK: [[MM:%[0-9]+]] = call @blade_library_call_0(%arg0, %arg1)
    // CHECK: stablehlo.maximum [[MM]]
    // CHECK: func.func private @blade_library_call_0
    // CHECK-SAME: blade.library_call = "matmul"
    // CHECK: stablehlo.dot_general
    """, "outline-library-calls")
    assert compilation.statistics.library_calls == 1
    assert compilation.statistics.fused_attention == 0


def test_a_convolution_takes_its_bias_and_relu_along():
    compilation = check_pass(CONV_NHWC + """
    // CHECK: call @blade_library_call_0(%arg0, %arg1, %arg2)
    // CHECK-NOT: stablehlo.maximum
    // CHECK: func.func private @blade_library_call_0
    // CHECK-SAME: blade.library_call = "conv2d_nhwc_bias"
    // CHECK-SAME: blade.relu = 1
    """, "outline-library-calls")
    assert compilation.statistics.library_calls == 1


def test_elementwise_code_is_left_alone():
    result, compilation = run_pass("""
    func.func @main(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
      %0 = stablehlo.multiply %a, %a : tensor<4x8xf32>
      return %0 : tensor<4x8xf32>
    }
    """, "outline-library-calls")
    assert "blade_library_call" not in result and compilation.statistics.library_calls == 0


SORT_DESCENDING = """
func.func @main(%arg0: tensor<3x5xf32>) -> (tensor<3x5xf32>, tensor<3x5xi64>) {
  %0 = stablehlo.iota dim = 1 : tensor<3x5xi64>
  %1:2 = "stablehlo.sort"(%arg0, %0) <{dimension = 1 : i64, is_stable = false}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>, %c: tensor<i64>, %d: tensor<i64>):
    %2 = stablehlo.compare GT, %a, %b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %2 : tensor<i1>
  }) : (tensor<3x5xf32>, tensor<3x5xi64>) -> (tensor<3x5xf32>, tensor<3x5xi64>)
  return %1#0, %1#1 : tensor<3x5xf32>, tensor<3x5xi64>
}
"""


def test_a_sort_as_torch_mlir_lowers_it_becomes_a_call_of_the_sort_kernel():
    compilation = check_pass(SORT_DESCENDING + """
    // CHECK: [[S:%[0-9]+]]:2 = call @blade_library_call_0(%arg0)
    // CHECK-NOT: stablehlo.sort
    // CHECK-NOT: stablehlo.iota
    // CHECK: return [[S]]#0, [[S]]#1
    // A declaration whose operand is only read (bufferization then keeps its buffer
    // unwritten until the call), defined when library calls are lowered.
    // CHECK: func.func private @blade_library_call_0(tensor<3x5xf32> {bufferization.access = "read"})
    // CHECK-SAME: blade.descending = 1
    // CHECK-SAME: blade.dimension = 1
    // CHECK-SAME: blade.k = 0
    // CHECK-SAME: blade.library_call = "sort"
    // CHECK-SAME: blade.stable = 0
    // CHECK-NOT: {
    """, "outline-library-calls")
    assert compilation.statistics.library_calls == 1


def test_a_sort_of_another_comparator_stays():
    # Comparing the indices too (a lexicographic sort) is not PyTorch's sort.
    other = SORT_DESCENDING.replace("%2 = stablehlo.compare GT, %a, %b",
                                    "%2 = stablehlo.compare GT, %c, %d").replace(
        "(tensor<f32>, tensor<f32>) -> tensor<i1>", "(tensor<i64>, tensor<i64>) -> tensor<i1>")
    result, compilation = run_pass(other, "outline-library-calls")
    assert "stablehlo.sort" in result and compilation.statistics.library_calls == 0


def test_a_sort_whose_results_are_only_sliced_to_their_first_k_is_a_topk():
    # aten::topk(x, 2, largest=True) as Torch-MLIR lowers it.
    topk = SORT_DESCENDING.replace(
        "return %1#0, %1#1 : tensor<3x5xf32>, tensor<3x5xi64>",
        "%3 = stablehlo.slice %1#0 [0:3, 0:2] : (tensor<3x5xf32>) -> tensor<3x2xf32>\n"
        "  %4 = stablehlo.slice %1#1 [0:3, 0:2] : (tensor<3x5xi64>) -> tensor<3x2xi64>\n"
        "  return %3, %4 : tensor<3x2xf32>, tensor<3x2xi64>").replace(
        "-> (tensor<3x5xf32>, tensor<3x5xi64>) {", "-> (tensor<3x2xf32>, tensor<3x2xi64>) {")
    check_pass(topk + """
    // CHECK: [[S:%[0-9]+]]:2 = call @blade_library_call_0(%arg0) : (tensor<3x5xf32>) -> (tensor<3x2xf32>, tensor<3x2xi64>)
    // CHECK-NOT: stablehlo.slice
    // CHECK: return [[S]]#0, [[S]]#1
    // CHECK: blade.k = 2
    """, "outline-library-calls")
    # A slice of another part (the last two) keeps the whole sort.
    result, _ = run_pass(topk.replace("[0:3, 0:2]", "[0:3, 3:5]"), "outline-library-calls")
    assert "blade.k = 0" in result and "stablehlo.slice" in result

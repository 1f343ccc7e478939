"""codegen/stablehlo: channels-last convolutions (layouts.py) and splat folding
(folding.py), each on a small StableHLO function."""
from ir_runner import check_pass, run_pass

# A convolution with a bias, a ReLU and a 2x2 max pooling, in NCHW, as Torch-MLIR gives it.
CONV_NCHW = """
func.func @main(%arg0: tensor<1x3x8x8xf32>, %arg1: tensor<8x3x3x3xf32>, %arg2: tensor<8xf32>) -> tensor<1x8x4x4xf32> {
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<1x8x8x8xf32>
  %cst_0 = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %0 = stablehlo.convolution(%arg0, %arg1) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x8x8xf32>, tensor<8x3x3x3xf32>) -> tensor<1x8x8x8xf32>
  %1 = stablehlo.reshape %arg2 : (tensor<8xf32>) -> tensor<8x1x1xf32>
  %2 = stablehlo.broadcast_in_dim %1, dims = [1, 2, 3] : (tensor<8x1x1xf32>) -> tensor<1x8x8x8xf32>
  %3 = stablehlo.add %0, %2 : tensor<1x8x8x8xf32>
  %4 = stablehlo.maximum %3, %cst : tensor<1x8x8x8xf32>
  %5 = "stablehlo.reduce_window"(%4, %cst_0) <{padding = dense<0> : tensor<4x2xi64>, window_dilations = array<i64: 1, 1, 1, 1>, window_dimensions = array<i64: 1, 1, 2, 2>, window_strides = array<i64: 1, 1, 2, 2>}> ({
  ^bb0(%arg3: tensor<f32>, %arg4: tensor<f32>):
    %6 = stablehlo.maximum %arg3, %arg4 : tensor<f32>
    stablehlo.return %6 : tensor<f32>
  }) : (tensor<1x8x8x8xf32>, tensor<f32>) -> tensor<1x8x4x4xf32>
  return %5 : tensor<1x8x4x4xf32>
}
"""


def test_channels_last_convolves_nhwc_and_transposes_back_after_the_pooling():
    check_pass(CONV_NCHW + """
    // CHECK: stablehlo.transpose %arg0, dims = [0, 2, 3, 1]
    // CHECK: stablehlo.convolution({{.*}}) dim_numbers = [b, 0, 1, f]x[o, i, 0, 1]->[b, 0, 1, f]
    // CHECK-NOT: dims = [0, 3, 1, 2]
    // CHECK: "stablehlo.reduce_window"
    // CHECK-SAME: window_dimensions = array<i64: 1, 2, 2, 1>
    // CHECK: stablehlo.transpose {{%[0-9]+}}, dims = [0, 3, 1, 2]
    // CHECK-NEXT: return
    """, "channels-last")


def test_channels_last_leaves_a_model_without_convolutions_alone():
    text = """
    func.func @main(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
      %0 = stablehlo.add %a, %a : tensor<4x8xf32>
      return %0 : tensor<4x8xf32>
    }
    """
    result, _ = run_pass(text, "channels-last")
    assert "transpose" not in result, result


def test_fold_splat_constants_folds_converts_and_reshapes_of_splats():
    # LayerNorm's element count and epsilon arrive as integer and f64 splats converted at
    # run time; folded, the fusion reads them as scalars.
    check_pass("""
    func.func @main(%arg0: tensor<4x1xf32>) -> tensor<4x1xf32> {
      %cst_0 = arith.constant dense<16> : tensor<1xi64>
      %2 = stablehlo.convert %cst_0 : (tensor<1xi64>) -> tensor<1xf32>
      %3 = stablehlo.reshape %2 : (tensor<1xf32>) -> tensor<f32>
      %4 = stablehlo.broadcast_in_dim %3, dims = [] : (tensor<f32>) -> tensor<4x1xf32>
      %5 = stablehlo.divide %arg0, %4 : tensor<4x1xf32>
      return %5 : tensor<4x1xf32>
    }
    // CHECK: [[C:%[a-z0-9_]+]] = stablehlo.constant dense<1.600000e+01> : tensor<4x1xf32>
    // CHECK-NOT: stablehlo.convert
    // CHECK: stablehlo.divide %arg0, [[C]]
    """, "fold-splat-constants")


def test_fold_splat_constants_keeps_converts_of_other_values():
    result, _ = run_pass("""
    func.func @main(%arg0: tensor<4xi64>) -> tensor<4xf32> {
      %0 = stablehlo.convert %arg0 : (tensor<4xi64>) -> tensor<4xf32>
      return %0 : tensor<4xf32>
    }
    """, "fold-splat-constants")
    assert "stablehlo.convert" in result, result


REDUCE = """
func.func @main(%arg0: tensor<SHAPE>) -> tensor<RESULT> {
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %0 = stablehlo.reduce(%arg0 init: %cst) applies stablehlo.add across dimensions = [DIMS] : (tensor<SHAPE>, tensor<f32>) -> tensor<RESULT>
  return %0 : tensor<RESULT>
}
"""


def test_a_reduce_over_no_dims_applies_its_computation_once():
    check_pass(REDUCE.replace("SHAPE", "f32").replace("RESULT", "f32").replace("DIMS", "") + """
    // CHECK-NOT: stablehlo.reduce
    // CHECK: [[I:%[0-9]+]] = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<f32>
    // CHECK: stablehlo.add [[I]], %arg0
    """, "simplify-degenerate-reductions")


def test_a_reduce_of_an_empty_tensor_is_its_init_and_others_are_left_alone():
    check_pass(REDUCE.replace("SHAPE", "0x3xf32").replace("RESULT", "3xf32")
               .replace("DIMS", "0") + """
    // CHECK-NOT: stablehlo.reduce
    // CHECK: [[I:%[0-9]+]] = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<3xf32>
    // CHECK: return [[I]]
    """, "simplify-degenerate-reductions")
    result, _ = run_pass(REDUCE.replace("SHAPE", "2x3xf32").replace("RESULT", "3xf32")
                         .replace("DIMS", "0"), "simplify-degenerate-reductions")
    assert "stablehlo.reduce" in result, result

"""codegen/stablehlo/shape_assumptions.py: what a dynamic engine guarantees about its
shapes, written into the StableHLO of `x.reshape(-1, 4) + 1` times the same view (x of a
dynamic batch), as Torch-MLIR gives it."""
from ir_runner import check_pass, run_pass

BEFORE_DROP = """
func.func @main(%arg0: tensor<?x8xf32>, %arg1: tensor<f64>) -> tensor<?x4xf32> {
  %cst = stablehlo.constant dense<1.000000e+00> : tensor<f64>
  %c4_i64 = arith.constant 4 : i64
  %0 = shape.shape_of %arg0 : tensor<?x8xf32> -> tensor<2xindex>
  %1 = shape.num_elements %0 : tensor<2xindex> -> index
  %2 = arith.index_cast %1 : index to i64
  %3 = arith.divui %2, %c4_i64 : i64
  %from_elements = tensor.from_elements %3, %c4_i64 : tensor<2xi64>
  %4 = stablehlo.dynamic_reshape %arg0, %from_elements : (tensor<?x8xf32>, tensor<2xi64>) -> tensor<?x4xf32>
  %5 = stablehlo.convert %cst : (tensor<f64>) -> tensor<f32>
  %6 = shape.shape_of %4 : tensor<?x4xf32> -> tensor<2xindex>
  %7 = stablehlo.dynamic_broadcast_in_dim %4, %6, dims = [0, 1] : (tensor<?x4xf32>, tensor<2xindex>) -> tensor<?x4xf32>
  %8 = stablehlo.dynamic_broadcast_in_dim %5, %6, dims = [] : (tensor<f32>, tensor<2xindex>) -> tensor<?x4xf32>
  %9 = stablehlo.add %7, %8 : tensor<?x4xf32>
  %10 = shape.shape_of %9 : tensor<?x4xf32> -> tensor<2xindex>
  %11 = shape.cstr_broadcastable %10, %6 : tensor<2xindex>, tensor<2xindex>
  %12 = shape.assuming %11 -> (tensor<?x4xf32>) {
    %13 = shape.broadcast %10, %6 : tensor<2xindex>, tensor<2xindex> -> tensor<2xindex>
    %14 = stablehlo.dynamic_broadcast_in_dim %9, %13, dims = [0, 1] : (tensor<?x4xf32>, tensor<2xindex>) -> tensor<?x4xf32>
    %15 = stablehlo.dynamic_broadcast_in_dim %4, %13, dims = [0, 1] : (tensor<?x4xf32>, tensor<2xindex>) -> tensor<?x4xf32>
    %16 = stablehlo.multiply %14, %15 : tensor<?x4xf32>
    shape.assuming_yield %16 : tensor<?x4xf32>
  }
  return %12 : tensor<?x4xf32>
}
"""

BEFORE_ANNOTATE = """
func.func @main(%arg0: tensor<?x8xf32>, %arg1: tensor<f64>) -> tensor<?x4xf32> {
  %cst = stablehlo.constant dense<1.000000e+00> : tensor<f64>
  %c4_i64 = arith.constant 4 : i64
  %0 = shape.shape_of %arg0 : tensor<?x8xf32> -> tensor<2xindex>
  %1 = shape.num_elements %0 : tensor<2xindex> -> index
  %2 = arith.index_cast %1 : index to i64
  %3 = arith.divui %2, %c4_i64 : i64
  %from_elements = tensor.from_elements %3, %c4_i64 : tensor<2xi64>
  %4 = stablehlo.dynamic_reshape %arg0, %from_elements : (tensor<?x8xf32>, tensor<2xi64>) -> tensor<?x4xf32>
  %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %5 = shape.shape_of %4 : tensor<?x4xf32> -> tensor<2xindex>
  %6 = stablehlo.dynamic_broadcast_in_dim %cst_0, %5, dims = [] : (tensor<f32>, tensor<2xindex>) -> tensor<?x4xf32>
  %7 = stablehlo.add %4, %6 : tensor<?x4xf32>
  %8 = stablehlo.multiply %7, %4 : tensor<?x4xf32>
  return %8 : tensor<?x4xf32>
}
"""

BEFORE_RESHAPE = """
func.func @main(%arg0: tensor<?x8xf32>, %arg1: tensor<f64>) -> tensor<?x4xf32> {
  %cst = stablehlo.constant dense<1.000000e+00> : tensor<f64>
  %c4_i64 = arith.constant 4 : i64
  %0 = shape.shape_of %arg0 : tensor<?x8xf32> -> tensor<2xindex>
  %1 = shape.num_elements %0 : tensor<2xindex> -> index
  %2 = arith.index_cast %1 : index to i64
  %3 = arith.divui %2, %c4_i64 : i64
  %from_elements = tensor.from_elements %3, %c4_i64 : tensor<2xi64>
  %4 = stablehlo.dynamic_reshape %arg0, %from_elements : (tensor<?x8xf32>, tensor<2xi64>) -> tensor<?x4xf32>
  %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %5 = shape.shape_of %4 : tensor<?x4xf32> -> tensor<2xindex>
  %6 = stablehlo.dynamic_broadcast_in_dim %cst_0, %5, dims = [] {known_expanding_dimensions = array<i64>, known_nonexpanding_dimensions = array<i64>} : (tensor<f32>, tensor<2xindex>) -> tensor<?x4xf32>
  %7 = stablehlo.add %4, %6 : tensor<?x4xf32>
  %8 = stablehlo.multiply %7, %4 : tensor<?x4xf32>
  return %8 : tensor<?x4xf32>
}
"""


def test_broadcasts_that_keep_their_operands_shape_go():
    check_pass(BEFORE_DROP + """
    // CHECK: [[VIEW:%[0-9]+]] = stablehlo.dynamic_reshape
    // CHECK-NOT: stablehlo.dynamic_broadcast_in_dim [[VIEW]]
    // CHECK: stablehlo.add [[VIEW]],
    // CHECK: stablehlo.multiply {{%[0-9]+}}, [[VIEW]]
    """, "drop-identity-broadcasts")


def test_broadcasts_are_annotated_with_the_dims_they_stretch():
    check_pass(BEFORE_ANNOTATE + """
    // CHECK: stablehlo.dynamic_broadcast_in_dim
    // CHECK-SAME: known_expanding_dimensions = array<i64>, known_nonexpanding_dimensions = array<i64>
    """, "annotate-broadcasts")


def test_a_dynamic_reshape_becomes_a_collapse_and_an_expansion():
    check_pass(BEFORE_RESHAPE + """
    // CHECK-NOT: stablehlo.dynamic_reshape
    // CHECK: [[FLAT:%[a-z0-9_]+]] = tensor.collapse_shape %arg0 {{\\[\\[}}0, 1]] : tensor<?x8xf32> into tensor<?xf32>
    // CHECK: tensor.expand_shape [[FLAT]] {{\\[\\[}}0, 1]] output_shape [{{%[0-9]+}}, 4] : tensor<?xf32> into tensor<?x4xf32>
    """, "lower-dynamic-reshapes")


def test_static_functions_are_left_alone():
    static = """
    func.func @main(%a: tensor<4x8xf32>) -> tensor<2x16xf32> {
      %0 = stablehlo.reshape %a : (tensor<4x8xf32>) -> tensor<2x16xf32>
      return %0 : tensor<2x16xf32>
    }
    """
    for name in ("drop-identity-broadcasts", "annotate-broadcasts", "lower-dynamic-reshapes"):
        result, _ = run_pass(static, name)
        assert "stablehlo.reshape %arg0" in result and "collapse_shape" not in result, result

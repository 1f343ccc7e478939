// RUN: blade-opt --pass annotate-broadcasts %s | FileCheck %s
// Broadcasts are annotated with the dims they stretch.

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

// CHECK: stablehlo.dynamic_broadcast_in_dim
// CHECK-SAME: known_expanding_dimensions = array<i64>, known_nonexpanding_dimensions = array<i64>

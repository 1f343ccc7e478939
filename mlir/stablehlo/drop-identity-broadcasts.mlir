// RUN: blade-opt --pass drop-identity-broadcasts %s | FileCheck %s
// x.reshape(-1, 4) + 1 times the same view, x of a dynamic batch: broadcasts that keep
// their operand's shape go.

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

// CHECK: [[VIEW:%[0-9]+]] = stablehlo.dynamic_reshape
// CHECK-NOT: stablehlo.dynamic_broadcast_in_dim [[VIEW]]
// CHECK: stablehlo.add [[VIEW]],
// CHECK: stablehlo.multiply {{%[0-9]+}}, [[VIEW]]

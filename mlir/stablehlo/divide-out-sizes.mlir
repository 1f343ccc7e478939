// RUN: blade-opt --pass divide-out-sizes %s | FileCheck %s
// A flatten's size is the product of the dims it merges, not the element count divided
// by the others (an empty batch would divide by zero).

func.func @main(%arg0: tensor<?x4x4xf32>, %arg1: tensor<i64>) -> tensor<?x16xf32> {
  %c0 = arith.constant 0 : index
  %dim = tensor.dim %arg0, %c0 : tensor<?x4x4xf32>
  %0 = arith.index_cast %dim : index to i64
  %1 = shape.shape_of %arg0 : tensor<?x4x4xf32> -> tensor<3xindex>
  %2 = shape.num_elements %1 : tensor<3xindex> -> index
  %3 = arith.index_cast %2 : index to i64
  %4 = arith.divui %3, %0 : i64
  %from_elements = tensor.from_elements %0, %4 : tensor<2xi64>
  %5 = stablehlo.dynamic_reshape %arg0, %from_elements : (tensor<?x4x4xf32>, tensor<2xi64>) -> tensor<?x16xf32>
  %6 = stablehlo.convert %arg1 : (tensor<i64>) -> tensor<f32>
  %7 = shape.shape_of %5 : tensor<?x16xf32> -> tensor<2xindex>
  %8 = stablehlo.dynamic_broadcast_in_dim %5, %7, dims = [0, 1] : (tensor<?x16xf32>, tensor<2xindex>) -> tensor<?x16xf32>
  %9 = stablehlo.dynamic_broadcast_in_dim %6, %7, dims = [] : (tensor<f32>, tensor<2xindex>) -> tensor<?x16xf32>
  %10 = stablehlo.multiply %8, %9 : tensor<?x16xf32>
  return %10 : tensor<?x16xf32>
}

// CHECK-NOT: arith.divui
// CHECK: tensor.dim %arg0, %c1
// CHECK: arith.muli
// CHECK: tensor.dim %arg0, %c2
// CHECK: arith.muli
// CHECK: stablehlo.dynamic_reshape %arg0

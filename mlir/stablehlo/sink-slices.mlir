// RUN: blade-opt --pass sink-slices %s | FileCheck %s
// An elementwise op read only by a slice is computed on the slice: the slice moves above
// the add, and the add's broadcast narrows.

func.func @main(%arg0: tensor<4x16xf32>, %arg1: tensor<f32>) -> tensor<4x8xf32> {
  %1 = stablehlo.broadcast_in_dim %arg1, dims = [] : (tensor<f32>) -> tensor<4x16xf32>
  %2 = stablehlo.add %arg0, %1 : tensor<4x16xf32>
  %3 = stablehlo.slice %2 [0:4, 0:8] : (tensor<4x16xf32>) -> tensor<4x8xf32>
  return %3 : tensor<4x8xf32>
}

// CHECK: [[S:%[0-9]+]] = stablehlo.slice %arg0 [0:4, 0:8]
// CHECK: [[B:%[0-9]+]] = stablehlo.broadcast_in_dim %arg1, dims = [] : (tensor<f32>) -> tensor<4x8xf32>
// CHECK: stablehlo.add [[S]], [[B]] : tensor<4x8xf32>
// CHECK-NOT: tensor<4x16xf32>) -> tensor<4x8xf32>

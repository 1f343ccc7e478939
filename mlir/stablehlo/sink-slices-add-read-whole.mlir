// RUN: blade-opt --pass sink-slices %s | FileCheck %s
// An add that something else reads whole keeps its slice below.

func.func @main(%arg0: tensor<4x16xf32>, %arg1: tensor<f32>) -> (tensor<4x8xf32>, tensor<4x16xf32>) {
  %1 = stablehlo.broadcast_in_dim %arg1, dims = [] : (tensor<f32>) -> tensor<4x16xf32>
  %2 = stablehlo.add %arg0, %1 : tensor<4x16xf32>
  %3 = stablehlo.slice %2 [0:4, 0:8] : (tensor<4x16xf32>) -> tensor<4x8xf32>
  return %3, %2 : tensor<4x8xf32>, tensor<4x16xf32>
}

// CHECK-NOT: stablehlo.slice %arg0

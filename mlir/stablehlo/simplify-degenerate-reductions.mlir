// RUN: blade-opt --pass simplify-degenerate-reductions %s | FileCheck %s
// A reduce over no dims applies its computation once.

func.func @main(%arg0: tensor<f32>) -> tensor<f32> {
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %0 = stablehlo.reduce(%arg0 init: %cst) applies stablehlo.add across dimensions = [] : (tensor<f32>, tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}

// CHECK-NOT: stablehlo.reduce
// CHECK: [[I:%[0-9]+]] = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<f32>
// CHECK: stablehlo.add [[I]], %arg0

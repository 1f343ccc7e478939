// RUN: blade-opt --pass simplify-degenerate-reductions %s | FileCheck %s
// A reduce of a tensor with elements over some dims is left alone.

func.func @main(%arg0: tensor<2x3xf32>) -> tensor<3xf32> {
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %0 = stablehlo.reduce(%arg0 init: %cst) applies stablehlo.add across dimensions = [0] : (tensor<2x3xf32>, tensor<f32>) -> tensor<3xf32>
  return %0 : tensor<3xf32>
}

// CHECK: stablehlo.reduce

// RUN: blade-opt --pass drop-identity-broadcasts %s | FileCheck %s --implicit-check-not=collapse_shape
// A function of static shapes is left alone.

func.func @main(%a: tensor<4x8xf32>) -> tensor<2x16xf32> {
  %0 = stablehlo.reshape %a : (tensor<4x8xf32>) -> tensor<2x16xf32>
  return %0 : tensor<2x16xf32>
}

// CHECK: stablehlo.reshape %arg0

// RUN: blade-opt --pass fold-splat-constants %s | FileCheck %s
// A convert of anything but a splat stays.

func.func @main(%arg0: tensor<4xi64>) -> tensor<4xf32> {
  %0 = stablehlo.convert %arg0 : (tensor<4xi64>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// CHECK: stablehlo.convert

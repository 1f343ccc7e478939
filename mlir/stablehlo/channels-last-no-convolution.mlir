// RUN: blade-opt --pass channels-last %s | FileCheck %s
// A function without convolutions is left alone.

func.func @main(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.add %a, %a : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// CHECK-NOT: transpose

// RUN: blade-opt --pass outline-library-calls %s | FileCheck %s
// Elementwise code is left alone.

func.func @main(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.multiply %a, %a : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// CHECK-NOT: blade_library_call

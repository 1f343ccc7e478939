// RUN: blade-opt --pass outline-library-calls %s | FileCheck %s
// A matmul becomes a call of a function marked for the matmul kernel.

func.func @main(%arg0: tensor<4x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<4x8xf32> {
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<4x8xf32>
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>
  %1 = stablehlo.maximum %0, %cst : tensor<4x8xf32>
  return %1 : tensor<4x8xf32>
}

// CHECK: [[MM:%[0-9]+]] = call @blade_library_call_0(%arg0, %arg1)
// CHECK: stablehlo.maximum [[MM]]
// CHECK: func.func private @blade_library_call_0
// CHECK-SAME: blade.library_call = "matmul"
// CHECK: stablehlo.dot_general

// RUN: blade-opt --pass outline-library-calls %s | FileCheck %s
// A matmul of dynamic size: the function's body only allocates the result (the kernel
// takes its place later), so its operands are marked read, or bufferization would let a
// write into an operand's buffer land before the call.

func.func @main(%arg0: tensor<?x16xf32>, %arg1: tensor<16x8xf32>) -> tensor<?x8xf32> {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<?x16xf32>, tensor<16x8xf32>) -> tensor<?x8xf32>
  return %0 : tensor<?x8xf32>
}

// CHECK: call @blade_library_call_0(%arg0, %arg1)
// CHECK: func.func public @blade_library_call_0(
// CHECK-SAME: {bufferization.access = "read"}
// CHECK-SAME: {bufferization.access = "read"}
// CHECK-SAME: blade.library_call = "matmul"
// CHECK: tensor.empty

// RUN: blade-opt --pass lower-library-calls %s | FileCheck %s
// A matmul's function body becomes one call of the RAL's matmul kernel.

func.func @main(%arg0: memref<4x16xf32>, %arg1: memref<16x8xf32>, %arg2: memref<4x8xf32>) {
  call @blade_library_call_0(%arg0, %arg1, %arg2) : (memref<4x16xf32>, memref<16x8xf32>, memref<4x8xf32>) -> ()
  return
}
func.func private @blade_library_call_0(%arg0: memref<4x16xf32>, %arg1: memref<16x8xf32>, %arg2: memref<4x8xf32>) attributes {blade.library_call = "matmul", blade.transpose_b = 0 : i64} {
  %cst = arith.constant 0.000000e+00 : f32
  linalg.fill ins(%cst : f32) outs(%arg2 : memref<4x8xf32>)
  linalg.matmul ins(%arg0, %arg1 : memref<4x16xf32>, memref<16x8xf32>) outs(%arg2 : memref<4x8xf32>)
  return
}

// CHECK: func.func private @blade_ral_matmul_f32(memref<*xf32>, memref<*xf32>, memref<*xf32>, i64)
// CHECK: func.func private @blade_library_call_0
// CHECK-NOT: linalg.matmul
// CHECK: [[A:%[a-z0-9_]+]] = memref.cast %arg0 : memref<4x16xf32> to memref<*xf32>
// CHECK: call @blade_ral_matmul_f32([[A]],
// CHECK-NEXT: return

// RUN: blade-opt --pass lower-library-calls %s | FileCheck %s
// A kernel call is defined with its number, and the table of calls is embedded.

func.func @main(%arg0: memref<4xf32>) -> memref<4xf32> {
  %0 = call @blade_kernel_0(%arg0) : (memref<4xf32>) -> memref<4xf32>
  return %0 : memref<4xf32>
}
func.func private @blade_kernel_0(memref<4xf32> {bufferization.access = "read"}) -> memref<4xf32> attributes {blade.call = 0 : i64, blade.kernel_call = "aten::cumprod float32 float32 T0 i0 N", blade.library_call = "kernel_call"}

// CHECK: func.func private @blade_ral_kernel_call_2(i64, memref<*xi8>, memref<*xi8>)
// CHECK: [[RESULT:%.+]] = memref.alloc() : memref<4xf32>
// CHECK: builtin.unrealized_conversion_cast {{.*}} : memref<*xf32> to memref<*xi8>
// CHECK: call @blade_ral_kernel_call_2(%c0_i64,
// CHECK: return [[RESULT]]
// CHECK: llvm.mlir.global internal constant @blade_kernel_calls_text("aten::cumprod float32 float32 T0 i0 N\00")
// CHECK: llvm.func @blade_kernel_calls() -> !llvm.ptr

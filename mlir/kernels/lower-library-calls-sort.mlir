// RUN: blade-opt --pass lower-library-calls %s | FileCheck %s
// A sort stays a declaration through bufferization; lowering defines it on results it
// allocates (a dynamic size from the same dim of its operand) and returns: its values
// and indices reach the kernel with their own element types.

func.func @main(%arg0: memref<?x5xi32>) -> (memref<?x5xi32>, memref<?x5xi64>) {
  %0:2 = call @blade_library_call_0(%arg0) : (memref<?x5xi32>) -> (memref<?x5xi32>, memref<?x5xi64>)
  return %0#0, %0#1 : memref<?x5xi32>, memref<?x5xi64>
}
func.func private @blade_library_call_0(memref<?x5xi32> {bufferization.access = "read"}) -> (memref<?x5xi32>, memref<?x5xi64>) attributes {blade.library_call = "sort", blade.dimension = 1 : i64, blade.descending = 0 : i64, blade.stable = 1 : i64, blade.k = 0 : i64}

// CHECK: func.func private @blade_ral_sort_i32(memref<*xi32>, memref<*xi32>, memref<*xi64>, i64, i64, i64, i64)
// CHECK: func.func private @blade_library_call_0(%arg0: memref<?x5xi32>
// CHECK: [[ROWS:%.+]] = memref.dim %arg0, %c0
// CHECK: [[VALUES:%.+]] = memref.alloc([[ROWS]]) : memref<?x5xi32>
// CHECK: [[INDICES:%.+]] = memref.alloc({{.*}}) : memref<?x5xi64>
// CHECK: memref.cast [[INDICES]] : memref<?x5xi64> to memref<*xi64>
// CHECK: call @blade_ral_sort_i32(
// CHECK: return [[VALUES]], [[INDICES]]

// RUN: blade-opt --pass free-after-last-use %s | FileCheck %s
// Each intermediate is freed after its last use; %b is last read through its view %v.

func.func private @step(memref<8xf32>, memref<8xf32>)
func.func private @make(memref<8xf32>) -> memref<8xf32>
func.func @main(%in: memref<8xf32>, %out: memref<8xf32>) {
  %a = memref.alloc() : memref<8xf32>
  call @step(%in, %a) : (memref<8xf32>, memref<8xf32>) -> ()
  %b = memref.alloc() : memref<8xf32>
  call @step(%a, %b) : (memref<8xf32>, memref<8xf32>) -> ()
  %v = memref.collapse_shape %b [[0]] : memref<8xf32> into memref<8xf32>
  %c = memref.alloc() : memref<8xf32>
  call @step(%v, %c) : (memref<8xf32>, memref<8xf32>) -> ()
  call @step(%c, %out) : (memref<8xf32>, memref<8xf32>) -> ()
  memref.dealloc %a : memref<8xf32>
  memref.dealloc %b : memref<8xf32>
  memref.dealloc %c : memref<8xf32>
  return
}

// CHECK: call @step(%arg0, [[A:%[a-z_0-9]+]])
// CHECK: call @step([[A]], [[B:%[a-z_0-9]+]])
// CHECK-NEXT: memref.dealloc [[A]]
// CHECK: call @step([[V:%[a-z_0-9]+]], [[C:%[a-z_0-9]+]])
// CHECK-NEXT: memref.dealloc [[B]]
// CHECK-NEXT: call @step([[C]], %arg1)
// CHECK-NEXT: memref.dealloc [[C]]
// CHECK-NEXT: return

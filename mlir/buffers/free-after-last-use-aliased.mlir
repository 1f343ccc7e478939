// RUN: blade-opt --pass free-after-last-use %s | FileCheck %s
// @make's result may be %a itself: %a is freed where it was, at the end, after the
// last call that reads @make's result.

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
  %m = call @make(%a) : (memref<8xf32>) -> memref<8xf32>
  call @step(%c, %out) : (memref<8xf32>, memref<8xf32>) -> ()
  call @step(%m, %out) : (memref<8xf32>, memref<8xf32>) -> ()
  memref.dealloc %a : memref<8xf32>
  memref.dealloc %b : memref<8xf32>
  memref.dealloc %c : memref<8xf32>
  return
}

// CHECK: func.func @main
// CHECK-NOT: memref.dealloc %alloc : memref<8xf32>
// CHECK: call @step(%0
// CHECK: memref.dealloc %alloc : memref<8xf32>
// CHECK-NOT: call @step(%0

// RUN: blade-opt --pass write-outputs-in-place %s | FileCheck %s
// The loop nest writes into the out-param: the buffer it filled and its copy go.

func.func @main(%a: memref<8xf32>, %out: memref<8xf32>) {
  %t = memref.alloc() : memref<8xf32>
  linalg.copy ins(%a : memref<8xf32>) outs(%t : memref<8xf32>)
  memref.copy %t, %out : memref<8xf32> to memref<8xf32>
  return
}

// CHECK: linalg.copy ins(%arg0 : memref<8xf32>) outs(%arg1 : memref<8xf32>)
// CHECK-NOT: memref.alloc
// CHECK-NOT: memref.copy

// RUN: blade-opt --pass show-main %s | FileCheck %s
// main is public again after buffer-results-to-out-params.

func.func private @main(%a: memref<8xf32>, %out: memref<8xf32>) {
  %t = memref.alloc() : memref<8xf32>
  linalg.copy ins(%a : memref<8xf32>) outs(%t : memref<8xf32>)
  memref.copy %t, %out : memref<8xf32> to memref<8xf32>
  return
}

// CHECK: func.func @main(

// RUN: blade-opt --pass mark-out-params %s | FileCheck %s
// Every memref argument of main, out-params included, is noalias.

func.func @main(%a: memref<8xf32>, %out: memref<8xf32>) {
  %t = memref.alloc() : memref<8xf32>
  linalg.copy ins(%a : memref<8xf32>) outs(%t : memref<8xf32>)
  memref.copy %t, %out : memref<8xf32> to memref<8xf32>
  return
}

// CHECK: func.func @main(%arg0: memref<8xf32> {llvm.noalias}, %arg1: memref<8xf32> {llvm.noalias})

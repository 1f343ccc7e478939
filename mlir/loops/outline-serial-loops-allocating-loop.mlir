// RUN: blade-opt --pass outline-serial-loops %s | FileCheck %s --implicit-check-not=blade_loop
// A loop that allocates stays in main.

func.func @main(%arg0: memref<4xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  scf.for %i = %c0 to %c4 step %c1 {
    %tmp = memref.alloc() : memref<4xf32>
    memref.copy %arg0, %tmp : memref<4xf32> to memref<4xf32>
    memref.dealloc %tmp : memref<4xf32>
  }
  return
}

// CHECK: scf.for

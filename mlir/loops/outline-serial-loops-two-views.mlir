// RUN: blade-opt --pass outline-serial-loops %s | FileCheck %s --implicit-check-not=blade_loop
// A loop through two views of one buffer stays in main: its function could not mark the
// two noalias, and LLVM would stop vectorizing it.

func.func @main(%arg0: memref<16xf32> {llvm.noalias}) {
  %a = memref.subview %arg0[0] [8] [1] : memref<16xf32> to memref<8xf32, strided<[1]>>
  %b = memref.subview %arg0[8] [8] [1]
      : memref<16xf32> to memref<8xf32, strided<[1], offset: 8>>
  memref.copy %a, %b : memref<8xf32, strided<[1]>> to memref<8xf32, strided<[1], offset: 8>>
  return
}

// CHECK: memref.copy %subview

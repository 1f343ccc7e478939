// RUN: blade-opt --pass merge-identical-functions %s | FileCheck %s --implicit-check-not=@blade_loop_2
// codegen/loops/serial.py's functions, each loop a group of its own: the repeated loop
// merges, the others stay.

llvm.func @blade_loop_0(%p: !llvm.ptr) {
  %v = llvm.load %p : !llvm.ptr -> f32
  %r = llvm.fmul %v, %v : f32
  llvm.store %r, %p : f32, !llvm.ptr
  llvm.return
}
llvm.func @blade_loop_1(%p: !llvm.ptr) {
  %v = llvm.load %p : !llvm.ptr -> f32
  %r = llvm.fadd %v, %v : f32
  llvm.store %r, %p : f32, !llvm.ptr
  llvm.return
}
llvm.func @blade_loop_2(%p: !llvm.ptr) {
  %v = llvm.load %p : !llvm.ptr -> f32
  %r = llvm.fmul %v, %v : f32
  llvm.store %r, %p : f32, !llvm.ptr
  llvm.return
}
llvm.func @main(%p: !llvm.ptr) {
  llvm.call @blade_loop_0(%p) : (!llvm.ptr) -> ()
  llvm.call @blade_loop_1(%p) : (!llvm.ptr) -> ()
  llvm.call @blade_loop_2(%p) : (!llvm.ptr) -> ()
  llvm.return
}

// CHECK: llvm.func @blade_loop_0(
// CHECK: llvm.func @blade_loop_1(
// CHECK: llvm.func @main(
// CHECK-NEXT: llvm.call @blade_loop_0(
// CHECK-NEXT: llvm.call @blade_loop_1(
// CHECK-NEXT: llvm.call @blade_loop_0(

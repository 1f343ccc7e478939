// RUN: blade-opt --pass compile-main-unoptimized %s | FileCheck %s
// A straight-line main is compiled unoptimized.

llvm.func @blade_loop_0(!llvm.ptr)
llvm.func @main(%p: !llvm.ptr) {
  llvm.call @blade_loop_0(%p) : (!llvm.ptr) -> ()
  llvm.return
}

// CHECK: passthrough = ["optnone", "noinline"]

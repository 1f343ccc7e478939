// RUN: blade-opt --pass compile-main-unoptimized %s | FileCheck %s
// A main that branches is compiled as any function.

llvm.func @main(%p: !llvm.ptr, %c: i1) {
  llvm.cond_br %c, ^bb1, ^bb2
^bb1:
  llvm.return
^bb2:
  llvm.return
}

// CHECK-NOT: passthrough = ["optnone", "noinline"]

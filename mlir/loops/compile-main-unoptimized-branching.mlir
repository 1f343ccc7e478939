// RUN: blade-opt --pass compile-main-unoptimized %s | FileCheck %s
// A main that loops (a branch back to an earlier block) is compiled as any function.

llvm.func @main(%p: !llvm.ptr, %c: i1) {
  llvm.br ^bb1
^bb1:
  llvm.cond_br %c, ^bb1, ^bb2
^bb2:
  llvm.return
}

// CHECK-NOT: passthrough = ["optnone", "noinline"]

// RUN: blade-opt --pass compile-main-unoptimized %s | FileCheck %s
// A main whose branches only go forward (the conditional frees of a main that allocates
// its outputs) has no loop: it is compiled unoptimized.

llvm.func @free(!llvm.ptr)
llvm.func @main(%p: !llvm.ptr, %c: i1) {
  llvm.cond_br %c, ^bb1, ^bb2
^bb1:
  llvm.call @free(%p) : (!llvm.ptr) -> ()
  llvm.br ^bb2
^bb2:
  llvm.return
}

// CHECK: passthrough = ["optnone", "noinline"]

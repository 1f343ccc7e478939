// RUN: blade-opt --pass define-parallel-launchers %s | FileCheck %s
// No launchers without parallel tasks.

llvm.func @main() {
  llvm.return
}
llvm.func @_mlir_ciface_main(%a: !llvm.ptr, %b: !llvm.ptr) {
  llvm.call @main() : () -> ()
  llvm.return
}

// CHECK-NOT: blade_ral_parallel_for

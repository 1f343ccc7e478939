// RUN: blade-opt --pass define-entry-point --option num_buffers=1 --option returns_outputs=true %s | FileCheck %s
// With returned outputs, blade_entry reads one more pointer first.

llvm.func @main() {
  llvm.return
}
llvm.func @_mlir_ciface_main(%a: !llvm.ptr, %b: !llvm.ptr) {
  llvm.call @main() : () -> ()
  llvm.return
}

// CHECK: llvm.func @blade_entry
// CHECK: llvm.getelementptr {{%[a-z0-9]+}}[1]
// CHECK-NOT: llvm.getelementptr {{%[a-z0-9]+}}[2]
// CHECK: llvm.call @_mlir_ciface_main

// RUN: blade-opt --pass define-entry-point --option num_buffers=2 %s | FileCheck %s
// blade_entry unpacks one descriptor pointer per argument (main's C interface as
// convert-func-to-llvm leaves it, two memref arguments).

llvm.func @main() {
  llvm.return
}
llvm.func @_mlir_ciface_main(%a: !llvm.ptr, %b: !llvm.ptr) {
  llvm.call @main() : () -> ()
  llvm.return
}

// CHECK: llvm.func @blade_entry([[ARGS:%[a-z0-9]+]]: !llvm.ptr)
// CHECK: llvm.getelementptr [[ARGS]][0] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr
// CHECK: [[A:%[0-9]+]] = llvm.load
// CHECK: llvm.getelementptr [[ARGS]][1]
// CHECK: [[B:%[0-9]+]] = llvm.load
// CHECK-NOT: llvm.getelementptr [[ARGS]][2]
// CHECK: llvm.call @_mlir_ciface_main([[A]], [[B]])

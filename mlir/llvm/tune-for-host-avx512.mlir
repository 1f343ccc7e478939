// RUN: blade-opt --pass tune-for-host --option avx512=true %s | FileCheck %s
// With AVX-512, main asks for 512-bit vectors.

llvm.func @main() {
  llvm.return
}
llvm.func @_mlir_ciface_main(%a: !llvm.ptr, %b: !llvm.ptr) {
  llvm.call @main() : () -> ()
  llvm.return
}

// CHECK: llvm.func @main() attributes {prefer_vector_width = "512", reciprocal_estimates = "divf:1,vec-divf:1"}

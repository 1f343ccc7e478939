// RUN: blade-opt --pass tune-for-host --option avx512=false %s | FileCheck %s --implicit-check-not=prefer_vector_width
// Without AVX-512, no vector width is asked for; reciprocal estimates are.

llvm.func @main() {
  llvm.return
}
llvm.func @_mlir_ciface_main(%a: !llvm.ptr, %b: !llvm.ptr) {
  llvm.call @main() : () -> ()
  llvm.return
}

// CHECK: reciprocal_estimates

// RUN: blade-opt --pass approximate-math %s | FileCheck %s --implicit-check-not=llvm.intr.ldexp
// libm's exp becomes a polynomial; without AVX-512, no ldexp scales it.

#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%arg0: memref<64x512xf32> {llvm.noalias}, %arg1: memref<64x512xf32> {llvm.noalias}) {
  linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%arg0 : memref<64x512xf32>) outs(%arg1 : memref<64x512xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = math.exp %in : f32
    linalg.yield %0 : f32
  }
  return
}

// CHECK: linalg.generic
// CHECK-NOT: math.exp
// CHECK: arith.mulf
// CHECK: linalg.yield

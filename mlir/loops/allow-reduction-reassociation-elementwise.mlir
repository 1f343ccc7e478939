// RUN: blade-opt --pass allow-reduction-reassociation %s | FileCheck %s
// An elementwise loop's adds are untouched.

#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%arg0: memref<64x512xf32> {llvm.noalias}, %arg1: memref<64x512xf32> {llvm.noalias}) {
  linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%arg0 : memref<64x512xf32>) outs(%arg1 : memref<64x512xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.addf %in, %in : f32
    linalg.yield %0 : f32
  }
  return
}

// CHECK-NOT: reassoc

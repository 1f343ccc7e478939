// RUN: blade-opt --pass allow-reduction-reassociation %s | FileCheck %s
// A reduction's adds may reassociate.

#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d0)>
func.func @main(%arg0: memref<64x512xf32> {llvm.noalias}, %arg1: memref<64xf32> {llvm.noalias}) {
  linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%arg0 : memref<64x512xf32>) outs(%arg1 : memref<64xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.addf %in, %out : f32
    linalg.yield %0 : f32
  }
  return
}

// CHECK: arith.addf {{%[a-z0-9_]+}}, {{%[a-z0-9_]+}} fastmath<reassoc> : f32

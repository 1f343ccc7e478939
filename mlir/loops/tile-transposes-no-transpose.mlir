// RUN: blade-opt --pass tile-transposes %s | FileCheck %s
// A loop nest that transposes nothing is left alone.

#map = affine_map<(d0, d1) -> (d0, d1)>
#map2 = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%arg0: memref<64x64xf32> {llvm.noalias}, %arg2: memref<64x64xf32> {llvm.noalias}) {
  %cst = arith.constant 1.000000e+00 : f32
  linalg.generic {indexing_maps = [#map, #map2], iterator_types = ["parallel", "parallel"]} ins(%arg0 : memref<64x64xf32>) outs(%arg2 : memref<64x64xf32>) {
  ^bb0(%in: f32, %out: f32):
    %1 = arith.addf %in, %cst : f32
    linalg.yield %1 : f32
  }
  return
}

// CHECK-NOT: vector.transpose

// RUN: blade-opt --pass allow-reciprocal %s | FileCheck %s
// A division may multiply by the reciprocal.

#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%arg0: memref<64x64xf32> {llvm.noalias}, %arg1: memref<64x64xf32> {llvm.noalias}, %arg2: memref<64x64xf32> {llvm.noalias}) {
  %cst = arith.constant 1.000000e+00 : f32
  linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%arg0, %arg1 : memref<64x64xf32>, memref<64x64xf32>) outs(%arg2 : memref<64x64xf32>) {
  ^bb0(%in: f32, %d: f32, %out: f32):
    %0 = arith.addf %d, %cst : f32
    %1 = arith.divf %in, %0 : f32
    linalg.yield %1 : f32
  }
  return
}

// CHECK: arith.divf {{%[a-z0-9_]+}}, {{%[a-z0-9_]+}} fastmath<arcp> : f32

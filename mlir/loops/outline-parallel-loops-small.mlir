// RUN: blade-opt --pass outline-parallel-loops %s | FileCheck %s
// Small loops stay serial in main.

#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d0)>
func.func @main(%arg0: memref<4x8xf32> {llvm.noalias}, %arg1: memref<4xf32> {llvm.noalias}) {
  linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%arg0 : memref<4x8xf32>) outs(%arg1 : memref<4xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.addf %in, %out : f32
    linalg.yield %0 : f32
  }
  return
}

// CHECK-NOT: blade_launch

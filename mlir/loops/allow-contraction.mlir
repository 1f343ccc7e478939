// RUN: blade-opt --pass allow-contraction %s | FileCheck %s
// Float adds, subtracts and multiplies in loop bodies may fuse into FMAs.

#map = affine_map<(d0) -> (d0)>
func.func @main(%a: memref<8xf32>, %b: memref<8xf32>, %out: memref<8xf32>) {
  linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel"]}
      ins(%a, %b : memref<8xf32>, memref<8xf32>) outs(%out : memref<8xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %p, %x : f32
    linalg.yield %s : f32
  }
  return
}

// CHECK: arith.mulf {{.*}} fastmath<contract>
// CHECK: arith.addf {{.*}} fastmath<contract>

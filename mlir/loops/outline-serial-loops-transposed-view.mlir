// RUN: blade-opt --pass outline-serial-loops %s | FileCheck %s --implicit-check-not=blade_loop
// A transposed view is no view root_buffer sees through: it may alias what the loop
// writes, so no function could mark the two noalias; the loop stays in main.

#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%arg0: memref<4x4xf32> {llvm.noalias}) {
  %t = memref.transpose %arg0 (d0, d1) -> (d1, d0)
      : memref<4x4xf32> to memref<4x4xf32, strided<[1, 4]>>
  linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%t : memref<4x4xf32, strided<[1, 4]>>) outs(%arg0 : memref<4x4xf32>) {
  ^bb0(%in: f32, %out: f32):
    linalg.yield %in : f32
  }
  return
}

// CHECK: linalg.generic

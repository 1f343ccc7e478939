// RUN: blade-opt --pass record-noalias-arguments --print-handed-on %s | FileCheck %s
// Two rank-2 memrefs: 3 + 2 * 2 words each, both noalias, handed on to
// mark-noalias-pointers.

#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%arg0: memref<64x512xf32> {llvm.noalias}, %arg1: memref<64x512xf32> {llvm.noalias}) {
  linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%arg0 : memref<64x512xf32>) outs(%arg1 : memref<64x512xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = math.exp %in : f32
    linalg.yield %0 : f32
  }
  return
}

// CHECK: // handed on: noalias={'main': [(7, True), (7, True)]}

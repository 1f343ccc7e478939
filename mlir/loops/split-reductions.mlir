// RUN: blade-opt --pass split-reductions %s | FileCheck %s
// A global pooling's sum, [1, 14, 14, 480] -> [1, 1, 1, 480], as reduce_window lowers it:
// per-row sums into a [14, 1, 1, 1, 480] buffer over the non-unit loops (rows parallel,
// columns summed), then their sum over the rows into the output.

#in = affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1 * 14 + d3, d2 * 14 + d4, d5)>
#win = affine_map<(d0, d1, d2, d3, d4, d5) -> (d3, d4)>
#out = affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1, d2, d5)>
func.func @main(%x: memref<1x14x14x480xf32> {llvm.noalias}, %window: memref<14x14xf32> {llvm.noalias}, %out: memref<1x1x1x480xf32> {llvm.noalias}) {
  linalg.generic {indexing_maps = [#in, #win, #out], iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction", "parallel"]} ins(%x, %window : memref<1x14x14x480xf32>, memref<14x14xf32>) outs(%out : memref<1x1x1x480xf32>) {
  ^bb0(%v: f32, %unused: f32, %acc: f32):
    %0 = arith.addf %acc, %v fastmath<reassoc,contract> : f32
    linalg.yield %0 : f32
  }
  return
}

// CHECK: #[[IN:.*]] = affine_map<(d0, d1, d2) -> (0, d0, d1, d2)>
// CHECK: #[[ROWS:.*]] = affine_map<(d0, d1, d2) -> (d0, 0, 0, 0, d2)>
// CHECK: %[[PARTIAL:.*]] = memref.alloc() : memref<14x1x1x1x480xf32>
// CHECK: linalg.fill ins(%{{.*}} : f32) outs(%[[PARTIAL]] : memref<14x1x1x1x480xf32>)
// CHECK: linalg.generic {indexing_maps = [#[[IN]], #{{.*}}, #[[ROWS]]], iterator_types = ["parallel", "reduction", "parallel"]}
// CHECK: linalg.generic {{.*}} iterator_types = ["reduction", "parallel", "parallel", "parallel", "parallel"]} ins(%[[PARTIAL]] : memref<14x1x1x1x480xf32>) outs(%{{.*}} : memref<1x1x1x480xf32>)

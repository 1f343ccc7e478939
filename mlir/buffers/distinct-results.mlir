// RUN: blade-opt --pass distinct-results %s | FileCheck %s
// A value main returns twice is copied: each result gets a buffer of its own.

#map = affine_map<(d0) -> (d0)>
func.func @main(%a: tensor<8xf32>, %b: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>) {
  %e = tensor.empty() : tensor<8xf32>
  %m = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel"]}
      ins(%a, %b : tensor<8xf32>, tensor<8xf32>) outs(%e : tensor<8xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %p = arith.mulf %x, %y : f32
    linalg.yield %p : f32
  } -> tensor<8xf32>
  %e2 = tensor.empty() : tensor<8xf32>
  %r = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel"]}
      ins(%m : tensor<8xf32>) outs(%e2 : tensor<8xf32>) {
  ^bb0(%x: f32, %o: f32):
    %s = arith.addf %x, %x : f32
    linalg.yield %s : f32
  } -> tensor<8xf32>
  return %r, %r : tensor<8xf32>, tensor<8xf32>
}

// CHECK: = linalg.generic
// CHECK: [[R:%[0-9]+]] = linalg.generic
// CHECK: [[COPY:%[0-9]+]] = bufferization.alloc_tensor() copy([[R]])
// CHECK: return [[R]], [[COPY]]

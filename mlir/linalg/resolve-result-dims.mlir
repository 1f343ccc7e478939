// RUN: blade-opt --pass resolve-result-dims %s | FileCheck %s
// A dynamic size read from a loop nest's result, or from an expand_shape of it, is read
// from its source instead (the nest's init, the expand_shape's output size): the bias
// add's result keeps one use, so elementwise fusion can take it into the transpose.

#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d1)>
#map2 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#map3 = affine_map<(d0, d1, d2) -> (d1, d0, d2)>
// CHECK-LABEL: func.func @main
func.func @main(%arg0: tensor<?x768xf32>, %arg1: tensor<768xf32>) -> tensor<12x?x64xf32> {
  %c0 = arith.constant 0 : index
  %dim = tensor.dim %arg0, %c0 : tensor<?x768xf32>
  // CHECK: %[[INIT:.*]] = tensor.empty
  %0 = tensor.empty(%dim) : tensor<?x768xf32>
  // CHECK: %[[SUM:.*]] = linalg.generic
  %1 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel"]} ins(%arg0, %arg1 : tensor<?x768xf32>, tensor<768xf32>) outs(%0 : tensor<?x768xf32>) {
  ^bb0(%in: f32, %in_0: f32, %out: f32):
    %4 = arith.addf %in, %in_0 : f32
    linalg.yield %4 : f32
  } -> tensor<?x768xf32>
  // CHECK: %[[ROWS:.*]] = tensor.dim %[[INIT]], %c0
  %dim_1 = tensor.dim %1, %c0 : tensor<?x768xf32>
  // CHECK: %[[HEADS:.*]] = tensor.expand_shape %[[SUM]] {{.*}} output_shape [%[[ROWS]], 12, 64]
  %expanded = tensor.expand_shape %1 [[0], [1, 2]] output_shape [%dim_1, 12, 64] : tensor<?x768xf32> into tensor<?x12x64xf32>
  // CHECK-NOT: tensor.dim %[[HEADS]]
  %dim_2 = tensor.dim %expanded, %c0 : tensor<?x12x64xf32>
  // CHECK: tensor.empty(%[[ROWS]]) : tensor<12x?x64xf32>
  %2 = tensor.empty(%dim_2) : tensor<12x?x64xf32>
  %3 = linalg.generic {indexing_maps = [#map2, #map3], iterator_types = ["parallel", "parallel", "parallel"]} ins(%expanded : tensor<?x12x64xf32>) outs(%2 : tensor<12x?x64xf32>) {
  ^bb0(%in: f32, %out: f32):
    linalg.yield %in : f32
  } -> tensor<12x?x64xf32>
  return %3 : tensor<12x?x64xf32>
}

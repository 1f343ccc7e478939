// RUN: blade-opt --pass write-slices-in-place %s | FileCheck %s
// A nearest upsampling's broadcast loop runs over the collapsed sizes, so that it can be
// written straight into its slice of the concatenation.

#map = affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1, d2, 0, d4, 0)>
#map1 = affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1, d2, d3, d4, d5)>
#map2 = affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1, 0, d3, 0, d5)>
func.func @main(%arg0: tensor<1x2x4x4xf32>) -> tensor<1x4x8x8xf32> {
  %expanded = tensor.expand_shape %arg0 [[0], [1], [2], [3, 4, 5]] output_shape [1, 2, 4, 1, 4, 1] : tensor<1x2x4x4xf32> into tensor<1x2x4x1x4x1xf32>
  %0 = tensor.empty() : tensor<1x2x4x2x4x2xf32>
  %1 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "parallel"]} ins(%expanded : tensor<1x2x4x1x4x1xf32>) outs(%0 : tensor<1x2x4x2x4x2xf32>) {
  ^bb0(%in: f32, %out: f32):
    linalg.yield %in : f32
  } -> tensor<1x2x4x2x4x2xf32>
  %collapsed = tensor.collapse_shape %1 [[0], [1], [2, 3], [4, 5]] : tensor<1x2x4x2x4x2xf32> into tensor<1x2x8x8xf32>
  %expanded_0 = tensor.expand_shape %arg0 [[0], [1], [2, 3], [4, 5]] output_shape [1, 2, 1, 4, 1, 4] : tensor<1x2x4x4xf32> into tensor<1x2x1x4x1x4xf32>
  %2 = tensor.empty() : tensor<1x2x2x4x2x4xf32>
  %3 = linalg.generic {indexing_maps = [#map2, #map1], iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "parallel"]} ins(%expanded_0 : tensor<1x2x1x4x1x4xf32>) outs(%2 : tensor<1x2x2x4x2x4xf32>) {
  ^bb0(%in: f32, %out: f32):
    linalg.yield %in : f32
  } -> tensor<1x2x2x4x2x4xf32>
  %collapsed_1 = tensor.collapse_shape %3 [[0], [1], [2, 3], [4, 5]] : tensor<1x2x2x4x2x4xf32> into tensor<1x2x8x8xf32>
  %4 = tensor.empty() : tensor<1x4x8x8xf32>
  %inserted_slice = tensor.insert_slice %collapsed into %4[0, 0, 0, 0] [1, 2, 8, 8] [1, 1, 1, 1] : tensor<1x2x8x8xf32> into tensor<1x4x8x8xf32>
  %inserted_slice_2 = tensor.insert_slice %collapsed_1 into %inserted_slice[0, 2, 0, 0] [1, 2, 8, 8] [1, 1, 1, 1] : tensor<1x2x8x8xf32> into tensor<1x4x8x8xf32>
  return %inserted_slice_2 : tensor<1x4x8x8xf32>
}

// CHECK: affine_map<(d0, d1, d2, d3) -> (d0, d1, d2 floordiv 2, 0, d3 floordiv 2, 0)>
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel", "parallel", "parallel"]{{.*}}outs({{%[0-9]+}} : tensor<1x2x8x8xf32>)

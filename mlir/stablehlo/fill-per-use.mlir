// RUN: blade-opt --pass fill-per-use %s | FileCheck %s
// A zero fill shared by LayerNorm's two reductions is repeated per use.

#map = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#map1 = affine_map<(d0, d1, d2) -> (d0, d1)>
#map2 = affine_map<(d0, d1) -> (d0, d1)>
#map3 = affine_map<(d0, d1) -> (d0, 0)>
func.func @main(%arg0: tensor<4x16xf32>) -> tensor<4x16xf32> {
  %cst = arith.constant 9.99999974E-6 : f32
  %cst_0 = arith.constant 1.600000e+01 : f32
  %cst_1 = arith.constant 0.000000e+00 : f32
  %0 = tensor.empty() : tensor<4xf32>
  %expanded = tensor.expand_shape %0 [[0, 1]] output_shape [4, 1] : tensor<4xf32> into tensor<4x1xf32>
  %1 = linalg.fill ins(%cst_1 : f32) outs(%expanded : tensor<4x1xf32>) -> tensor<4x1xf32>
  %expanded_2 = tensor.expand_shape %arg0 [[0, 1], [2]] output_shape [4, 1, 16] : tensor<4x16xf32> into tensor<4x1x16xf32>
  %2 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "parallel", "reduction"]} ins(%expanded_2 : tensor<4x1x16xf32>) outs(%1 : tensor<4x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %7 = arith.addf %out, %in : f32
    linalg.yield %7 : f32
  } -> tensor<4x1xf32>
  %3 = tensor.empty() : tensor<4x16xf32>
  %4 = linalg.generic {indexing_maps = [#map2, #map3, #map2], iterator_types = ["parallel", "parallel"]} ins(%arg0, %2 : tensor<4x16xf32>, tensor<4x1xf32>) outs(%3 : tensor<4x16xf32>) {
  ^bb0(%in: f32, %in_4: f32, %out: f32):
    %7 = arith.divf %in_4, %cst_0 : f32
    %8 = arith.subf %in, %7 : f32
    linalg.yield %8 : f32
  } -> tensor<4x16xf32>
  %expanded_3 = tensor.expand_shape %4 [[0, 1], [2]] output_shape [4, 1, 16] : tensor<4x16xf32> into tensor<4x1x16xf32>
  %5 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "parallel", "reduction"]} ins(%expanded_3 : tensor<4x1x16xf32>) outs(%1 : tensor<4x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %7 = arith.mulf %in, %in : f32
    %8 = arith.addf %out, %7 : f32
    linalg.yield %8 : f32
  } -> tensor<4x1xf32>
  %6 = linalg.generic {indexing_maps = [#map2, #map3, #map2], iterator_types = ["parallel", "parallel"]} ins(%4, %5 : tensor<4x16xf32>, tensor<4x1xf32>) outs(%3 : tensor<4x16xf32>) {
  ^bb0(%in: f32, %in_4: f32, %out: f32):
    %7 = arith.divf %in_4, %cst_0 : f32
    %8 = arith.addf %7, %cst : f32
    %9 = math.rsqrt %8 : f32
    %10 = arith.mulf %in, %9 : f32
    linalg.yield %10 : f32
  } -> tensor<4x16xf32>
  return %6 : tensor<4x16xf32>
}

// CHECK: [[SHARED:%[0-9]+]] = linalg.fill
// CHECK: [[OWN:%[0-9]+]] = linalg.fill
// CHECK-NEXT: linalg.generic {{.*}}"reduction"]} {{.*}}outs([[OWN]] :
// CHECK: linalg.generic {{.*}}"reduction"]} {{.*}}outs([[SHARED]] :

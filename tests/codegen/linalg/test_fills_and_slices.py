"""Before bufferization: a zero fill shared by reductions is repeated per use
(codegen/stablehlo/folding.py `fill_per_use`), and a nearest upsampling's broadcast loop
is rewritten over the collapsed sizes, so it can be written straight into its slice of a
concatenation (codegen/linalg/concatenations.py `write_slices_in_place`)."""
from ir_runner import check_pass

LAYER_NORM = """
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
"""

UPSAMPLE_AND_CONCATENATE = """
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
"""


def test_each_reduction_gets_its_own_fill():
    check_pass(LAYER_NORM + """
    // CHECK: [[SHARED:%[0-9]+]] = linalg.fill
    // CHECK: [[OWN:%[0-9]+]] = linalg.fill
    // CHECK-NEXT: linalg.generic {{.*}}"reduction"]} {{.*}}outs([[OWN]] :
    // CHECK: linalg.generic {{.*}}"reduction"]} {{.*}}outs([[SHARED]] :
    """, "fill-per-use")


def test_the_upsampling_loop_runs_over_the_collapsed_sizes():
    check_pass(UPSAMPLE_AND_CONCATENATE + """
    // CHECK: affine_map<(d0, d1, d2, d3) -> (d0, d1, d2 floordiv 2, 0, d3 floordiv 2, 0)>
    // CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel", "parallel", "parallel"]{{.*}}outs({{%[0-9]+}} : tensor<1x2x8x8xf32>)
    """, "write-slices-in-place")

// RUN: blade-opt --pass lower-gathers %s | FileCheck %s
// A gather of partial slices is left to StableHLO.

func.func @main(%arg0: tensor<5x4xf32>, %arg1: tensor<3xi64>) -> tensor<3x2xf32> {
  %0 = "stablehlo.gather"(%arg0, %arg1) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 2>}> : (tensor<5x4xf32>, tensor<3xi64>) -> tensor<3x2xf32>
  return %0 : tensor<3x2xf32>
}

// CHECK: stablehlo.gather

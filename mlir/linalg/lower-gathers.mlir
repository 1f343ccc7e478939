// RUN: blade-opt --pass lower-gathers %s | FileCheck %s
// A gather of whole rows reads its index, checks it and extracts.

func.func @main(%arg0: tensor<5x4xf32>, %arg1: tensor<3xi64>) -> tensor<3x4xf32> {
  %0 = "stablehlo.gather"(%arg0, %arg1) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 4>}> : (tensor<5x4xf32>, tensor<3xi64>) -> tensor<3x4xf32>
  return %0 : tensor<3x4xf32>
}

// CHECK-NOT: stablehlo.gather
// CHECK: linalg.generic
// CHECK: arith.index_cast
// CHECK: call @blade_ral_index_out_of_range
// CHECK: tensor.extract %arg0

// RUN: blade-opt --pass lower-scatters %s | FileCheck %s
// A scatter of another update computation is left to StableHLO.

func.func @main(%arg0: tensor<5x6xf32>, %arg1: tensor<4x1xi64>, %arg2: tensor<4x6xf32>) -> tensor<5x6xf32> {
  %0 = "stablehlo.scatter"(%arg0, %arg1, %arg2) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %s = stablehlo.divide %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) : (tensor<5x6xf32>, tensor<4x1xi64>, tensor<4x6xf32>) -> tensor<5x6xf32>
  return %0 : tensor<5x6xf32>
}

// CHECK: stablehlo.scatter

// RUN: blade-opt --pass lower-scatters %s | FileCheck %s
// A scatter-add is a loop nest over the updates that checks each index.

func.func @main(%arg0: tensor<5x6xf32>, %arg1: tensor<4x1xi64>, %arg2: tensor<4x6xf32>) -> tensor<5x6xf32> {
  %0 = "stablehlo.scatter"(%arg0, %arg1, %arg2) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %s = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) : (tensor<5x6xf32>, tensor<4x1xi64>, tensor<4x6xf32>) -> tensor<5x6xf32>
  return %0 : tensor<5x6xf32>
}

// CHECK-NOT: stablehlo.scatter
// CHECK: scf.for {{.*}} iter_args([[T:%[a-z0-9_]+]] = %arg0)
// CHECK: scf.for
// CHECK: tensor.extract %arg1
// CHECK: arith.cmpi slt
// CHECK: scf.if
// CHECK: tensor.extract
// CHECK: tensor.extract %arg2
// CHECK-NEXT: arith.addf
// CHECK-NEXT: tensor.insert
// CHECK: } else {
// CHECK-NEXT: arith.index_cast
// CHECK: call @blade_ral_index_out_of_range
// CHECK: func.func private @blade_ral_index_out_of_range

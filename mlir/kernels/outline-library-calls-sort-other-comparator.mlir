// RUN: blade-opt --pass outline-library-calls %s | FileCheck %s
// Comparing the indices too (a lexicographic sort) is not PyTorch's sort: it stays.

func.func @main(%arg0: tensor<3x5xf32>) -> (tensor<3x5xf32>, tensor<3x5xi64>) {
  %0 = stablehlo.iota dim = 1 : tensor<3x5xi64>
  %1:2 = "stablehlo.sort"(%arg0, %0) <{dimension = 1 : i64, is_stable = false}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>, %c: tensor<i64>, %d: tensor<i64>):
    %2 = stablehlo.compare GT, %c, %d, FLOAT : (tensor<i64>, tensor<i64>) -> tensor<i1>
    stablehlo.return %2 : tensor<i1>
  }) : (tensor<3x5xf32>, tensor<3x5xi64>) -> (tensor<3x5xf32>, tensor<3x5xi64>)
  return %1#0, %1#1 : tensor<3x5xf32>, tensor<3x5xi64>
}

// CHECK: stablehlo.sort

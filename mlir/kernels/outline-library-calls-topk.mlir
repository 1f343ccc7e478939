// RUN: blade-opt --pass outline-library-calls %s | FileCheck %s
// aten::topk(x, 2, largest=True) as Torch-MLIR lowers it: a sort whose results are only
// sliced to their first k is a top-k.

func.func @main(%arg0: tensor<3x5xf32>) -> (tensor<3x2xf32>, tensor<3x2xi64>) {
  %0 = stablehlo.iota dim = 1 : tensor<3x5xi64>
  %1:2 = "stablehlo.sort"(%arg0, %0) <{dimension = 1 : i64, is_stable = false}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>, %c: tensor<i64>, %d: tensor<i64>):
    %2 = stablehlo.compare GT, %a, %b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %2 : tensor<i1>
  }) : (tensor<3x5xf32>, tensor<3x5xi64>) -> (tensor<3x5xf32>, tensor<3x5xi64>)
  %3 = stablehlo.slice %1#0 [0:3, 0:2] : (tensor<3x5xf32>) -> tensor<3x2xf32>
  %4 = stablehlo.slice %1#1 [0:3, 0:2] : (tensor<3x5xi64>) -> tensor<3x2xi64>
  return %3, %4 : tensor<3x2xf32>, tensor<3x2xi64>
}

// CHECK: [[S:%[0-9]+]]:2 = call @blade_library_call_0(%arg0) : (tensor<3x5xf32>) -> (tensor<3x2xf32>, tensor<3x2xi64>)
// CHECK-NOT: stablehlo.slice
// CHECK: return [[S]]#0, [[S]]#1
// CHECK: blade.k = 2

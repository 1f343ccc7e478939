// RUN: blade-opt --pass lower-concatenations %s | FileCheck %s
// A concatenation becomes slices inserted into one tensor.

func.func @main(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> tensor<4x16xf32> {
  %0 = stablehlo.concatenate %a, %b, dim = 1 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x16xf32>
  return %0 : tensor<4x16xf32>
}

// CHECK-NOT: stablehlo.concatenate
// CHECK: [[E:%[0-9]+]] = tensor.empty() : tensor<4x16xf32>
// CHECK: [[F:%[a-z0-9_]+]] = tensor.insert_slice %arg0 into [[E]][0, 0] [4, 8] [1, 1]
// CHECK: tensor.insert_slice %arg1 into [[F]][0, 8] [4, 8] [1, 1]

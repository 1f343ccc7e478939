// RUN: blade-opt --pass drop-identity-broadcasts %s | FileCheck %s
// A dynamic_reshape to its operand's own sizes (an attention's last product, as the
// importer reshapes it before the heads' transpose) goes, with the sizes built for it;
// one to sizes that merely have its type stays.

func.func @main(%arg0: tensor<1x12x?x64xf32>, %n: i64) -> (tensor<1x?x12x64xf32>, tensor<1x12x?x64xf32>) {
  %c2 = arith.constant 2 : index
  %c1_i64 = arith.constant 1 : i64
  %c12_i64 = arith.constant 12 : i64
  %c64_i64 = arith.constant 64 : i64
  %0 = stablehlo.exponential %arg0 : tensor<1x12x?x64xf32>
  %dim = tensor.dim %0, %c2 : tensor<1x12x?x64xf32>
  %1 = arith.index_cast %dim : index to i64
  %from_elements = tensor.from_elements %c1_i64, %c12_i64, %1, %c64_i64 : tensor<4xi64>
  %2 = stablehlo.dynamic_reshape %0, %from_elements : (tensor<1x12x?x64xf32>, tensor<4xi64>) -> tensor<1x12x?x64xf32>
  %3 = stablehlo.transpose %2, dims = [0, 2, 1, 3] : (tensor<1x12x?x64xf32>) -> tensor<1x?x12x64xf32>
  %other = tensor.from_elements %c1_i64, %c12_i64, %n, %c64_i64 : tensor<4xi64>
  %4 = stablehlo.dynamic_reshape %0, %other : (tensor<1x12x?x64xf32>, tensor<4xi64>) -> tensor<1x12x?x64xf32>
  return %3, %4 : tensor<1x?x12x64xf32>, tensor<1x12x?x64xf32>
}

// CHECK: [[EXP:%[0-9]+]] = stablehlo.exponential %arg0
// CHECK-NOT: tensor.dim
// CHECK: stablehlo.transpose [[EXP]], dims = [0, 2, 1, 3]
// CHECK: stablehlo.dynamic_reshape [[EXP]]

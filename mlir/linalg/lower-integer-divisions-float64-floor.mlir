// RUN: blade-opt --pass lower-integer-divisions %s | FileCheck %s
// Torch-MLIR's float64 floor division of integers becomes an exact integer one.

func.func @main(%a: tensor<3xi64>, %b: tensor<3xi64>) -> tensor<3xi64> {
  %0 = stablehlo.convert %a : (tensor<3xi64>) -> tensor<3xf64>
  %1 = stablehlo.convert %b : (tensor<3xi64>) -> tensor<3xf64>
  %2 = stablehlo.divide %0, %1 : tensor<3xf64>
  %3 = stablehlo.floor %2 : tensor<3xf64>
  %4 = stablehlo.convert %3 : (tensor<3xf64>) -> tensor<3xi64>
  return %4 : tensor<3xi64>
}

// CHECK: [[G:%[0-9]+]] = linalg.generic
// CHECK: call @blade_ral_division_by_zero()
// CHECK: arith.divsi
// CHECK: arith.remsi
// CHECK: arith.xori
// CHECK: arith.extui
// CHECK: arith.subi
// CHECK: return [[G]]

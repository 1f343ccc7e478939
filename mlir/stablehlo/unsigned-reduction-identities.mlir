// RUN: blade-opt --pass unsigned-reduction-identities %s | FileCheck %s
// Max and min of unsigned integers start from 0 and 255, not from Torch-MLIR's signed
// extremes.

func.func @main(%arg0: tensor<3x5xui8>) -> (tensor<3xui8>, tensor<3xui8>, tensor<3xi8>) {
  %c = stablehlo.constant dense<128> : tensor<ui8>
  %0 = stablehlo.reduce(%arg0 init: %c) applies stablehlo.maximum across dimensions = [1] : (tensor<3x5xui8>, tensor<ui8>) -> tensor<3xui8>
  %c_0 = stablehlo.constant dense<127> : tensor<ui8>
  %1 = stablehlo.reduce(%arg0 init: %c_0) applies stablehlo.minimum across dimensions = [1] : (tensor<3x5xui8>, tensor<ui8>) -> tensor<3xui8>
  %2 = stablehlo.bitcast_convert %arg0 : (tensor<3x5xui8>) -> tensor<3x5xi8>
  %c_1 = stablehlo.constant dense<-128> : tensor<i8>
  %3 = stablehlo.reduce(%2 init: %c_1) applies stablehlo.maximum across dimensions = [1] : (tensor<3x5xi8>, tensor<i8>) -> tensor<3xi8>
  return %0, %1, %3 : tensor<3xui8>, tensor<3xui8>, tensor<3xi8>
}

// CHECK: [[ZERO:%[a-z0-9_]+]] = stablehlo.constant dense<0> : tensor<ui8>
// CHECK: stablehlo.reduce(%arg0 init: [[ZERO]]) applies stablehlo.maximum
// CHECK: [[TOP:%[a-z0-9_]+]] = stablehlo.constant dense<255> : tensor<ui8>
// CHECK: stablehlo.reduce(%arg0 init: [[TOP]]) applies stablehlo.minimum
// The signed max keeps its signed start.
// CHECK: [[LOW:%[a-z0-9_]+]] = stablehlo.constant dense<-128> : tensor<i8>
// CHECK: stablehlo.reduce(%{{[0-9]+}} init: [[LOW]]) applies stablehlo.maximum

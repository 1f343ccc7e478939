// RUN: blade-opt --pass signless-boundaries %s | FileCheck %s
// A signless main is left alone.

func.func @main(%arg0: tensor<4x8xi8>, %arg1: tensor<4x8xf32>) -> (tensor<4x8xi8>, tensor<4x8xf32>) {
  %c = stablehlo.constant dense<3> : tensor<4x8xi8>
  %0 = stablehlo.add %arg0, %c : tensor<4x8xi8>
  %1 = stablehlo.convert %arg0 : (tensor<4x8xi8>) -> tensor<4x8xf32>
  %2 = stablehlo.add %1, %arg1 : tensor<4x8xf32>
  return %0, %2 : tensor<4x8xi8>, tensor<4x8xf32>
}

// CHECK-NOT: bitcast_convert

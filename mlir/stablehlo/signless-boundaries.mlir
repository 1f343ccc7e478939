// RUN: blade-opt --pass signless-boundaries %s | FileCheck %s
// main takes and returns uint8 tensors as signless i8, converted bit for bit at its
// boundary.

func.func @main(%arg0: tensor<4x8xui8>, %arg1: tensor<4x8xf32>) -> (tensor<4x8xui8>, tensor<4x8xf32>) {
  %c = stablehlo.constant dense<3> : tensor<4x8xui8>
  %0 = stablehlo.add %arg0, %c : tensor<4x8xui8>
  %1 = stablehlo.convert %arg0 : (tensor<4x8xui8>) -> tensor<4x8xf32>
  %2 = stablehlo.add %1, %arg1 : tensor<4x8xf32>
  return %0, %2 : tensor<4x8xui8>, tensor<4x8xf32>
}

// CHECK: func.func @main(%arg0: tensor<4x8xi8>, %arg1: tensor<4x8xf32>) -> (tensor<4x8xi8>, tensor<4x8xf32>)
// CHECK-NEXT: [[U:%[0-9]+]] = stablehlo.bitcast_convert %arg0 : (tensor<4x8xi8>) -> tensor<4x8xui8>
// CHECK: stablehlo.add [[U]]
// CHECK: stablehlo.convert [[U]] : (tensor<4x8xui8>) -> tensor<4x8xf32>
// CHECK: [[S:%[0-9]+]] = stablehlo.bitcast_convert %{{[0-9]+}} : (tensor<4x8xui8>) -> tensor<4x8xi8>
// CHECK: return [[S]], %{{[0-9]+}} : tensor<4x8xi8>, tensor<4x8xf32>

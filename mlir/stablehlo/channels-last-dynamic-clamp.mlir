// RUN: blade-opt --pass channels-last %s | FileCheck %s
// A dynamic convolution, a clamp to scalar bounds (ReLU6) and a scalar multiply: the
// multiply's broadcast asks the clamp's shape, which is asked of the clamp's operand of its
// own rank (the convolution's, permuted), never of a scalar bound.

func.func @main(%arg0: tensor<?x3x?x?xf32>, %arg1: tensor<8x3x3x3xf32>) -> tensor<?x8x?x?xf32> {
  %low = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %high = stablehlo.constant dense<6.000000e+00> : tensor<f32>
  %half = stablehlo.constant dense<5.000000e-01> : tensor<f32>
  %0 = stablehlo.convolution(%arg0, %arg1) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<?x3x?x?xf32>, tensor<8x3x3x3xf32>) -> tensor<?x8x?x?xf32>
  %1 = stablehlo.clamp %low, %0, %high : (tensor<f32>, tensor<?x8x?x?xf32>, tensor<f32>) -> tensor<?x8x?x?xf32>
  %2 = shape.shape_of %1 : tensor<?x8x?x?xf32> -> tensor<4xindex>
  %3 = stablehlo.dynamic_broadcast_in_dim %half, %2, dims = [] : (tensor<f32>, tensor<4xindex>) -> tensor<?x8x?x?xf32>
  %4 = stablehlo.multiply %1, %3 : tensor<?x8x?x?xf32>
  return %4 : tensor<?x8x?x?xf32>
}

// CHECK: [[CONV:%.+]] = stablehlo.convolution({{.*}}) dim_numbers = [b, 0, 1, f]x[o, i, 0, 1]->[b, 0, 1, f]
// CHECK-NOT: shape.shape_of %cst
// CHECK: shape.shape_of [[CONV]] : tensor<?x?x?x8xf32> -> tensor<4xindex>
// CHECK-NOT: shape.shape_of %cst
// CHECK: return

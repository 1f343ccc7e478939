// RUN: blade-opt --pass outline-library-calls %s | FileCheck %s
// A 1x1 convolution whose input is scaled per image and channel (a squeeze-excitation's
// [N, 1, 1, C] broadcast over the pixels) takes the scaling along: its function's
// operands are the unscaled data, the weight, the bias and the scale
// (conv2d_nhwc_bias_scaled); the multiply goes into it.

func.func @main(%arg0: tensor<2x8x8x8xf32>, %arg1: tensor<4x8x1x1xf32>, %arg2: tensor<4xf32>, %arg3: tensor<2x1x1x8xf32>) -> tensor<2x8x8x4xf32> {
  %0 = stablehlo.broadcast_in_dim %arg3, dims = [0, 1, 2, 3] : (tensor<2x1x1x8xf32>) -> tensor<2x8x8x8xf32>
  %1 = stablehlo.multiply %arg0, %0 : tensor<2x8x8x8xf32>
  %2 = stablehlo.convolution(%1, %arg1) dim_numbers = [b, 0, 1, f]x[o, i, 0, 1]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x8x8x8xf32>, tensor<4x8x1x1xf32>) -> tensor<2x8x8x4xf32>
  %3 = stablehlo.reshape %arg2 : (tensor<4xf32>) -> tensor<4x1x1xf32>
  %4 = stablehlo.transpose %3, dims = [1, 2, 0] : (tensor<4x1x1xf32>) -> tensor<1x1x4xf32>
  %5 = stablehlo.broadcast_in_dim %4, dims = [1, 2, 3] : (tensor<1x1x4xf32>) -> tensor<2x8x8x4xf32>
  %6 = stablehlo.add %2, %5 : tensor<2x8x8x4xf32>
  return %6 : tensor<2x8x8x4xf32>
}

// CHECK: call @blade_library_call_0(%arg0, %arg1, %arg2, %arg3)
// CHECK-NOT: stablehlo.multiply
// CHECK: func.func private @blade_library_call_0
// CHECK-SAME: blade.library_call = "conv2d_nhwc_bias_scaled"
// CHECK: stablehlo.broadcast_in_dim
// CHECK: stablehlo.multiply
// CHECK: stablehlo.convolution

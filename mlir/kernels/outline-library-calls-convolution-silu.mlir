// RUN: blade-opt --pass outline-library-calls %s | FileCheck %s
// A float32 convolution's function takes its bias and SiLU (logistic(v) * v) along.

func.func @main(%arg0: tensor<1x8x8x3xf32>, %arg1: tensor<8x3x1x1xf32>, %arg2: tensor<8xf32>) -> tensor<1x8x8x8xf32> {
  %0 = stablehlo.convolution(%arg0, %arg1) dim_numbers = [b, 0, 1, f]x[o, i, 0, 1]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x8x3xf32>, tensor<8x3x1x1xf32>) -> tensor<1x8x8x8xf32>
  %1 = stablehlo.reshape %arg2 : (tensor<8xf32>) -> tensor<8x1x1xf32>
  %2 = stablehlo.transpose %1, dims = [1, 2, 0] : (tensor<8x1x1xf32>) -> tensor<1x1x8xf32>
  %3 = stablehlo.broadcast_in_dim %2, dims = [1, 2, 3] : (tensor<1x1x8xf32>) -> tensor<1x8x8x8xf32>
  %4 = stablehlo.add %0, %3 : tensor<1x8x8x8xf32>
  %5 = stablehlo.logistic %4 : tensor<1x8x8x8xf32>
  %6 = stablehlo.multiply %5, %4 : tensor<1x8x8x8xf32>
  return %6 : tensor<1x8x8x8xf32>
}

// CHECK: call @blade_library_call_0(%arg0, %arg1, %arg2)
// CHECK-NOT: stablehlo.logistic
// CHECK-NOT: stablehlo.multiply
// CHECK: func.func private @blade_library_call_0
// CHECK-SAME: blade.activation = 2
// CHECK-SAME: blade.library_call = "conv2d_nhwc_bias"
// CHECK: stablehlo.logistic
// CHECK: stablehlo.multiply

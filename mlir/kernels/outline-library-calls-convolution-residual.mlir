// RUN: blade-opt --pass outline-library-calls %s | FileCheck %s
// A convolution's function takes its bias, the residual tensor added after it and the
// ReLU along (conv2d_nhwc_bias_add, the tensor its 4th operand); a second convolution's
// sum with a broadcast (a tensor no residual connection gives) stays a loop.

func.func @main(%arg0: tensor<1x8x8x8xf32>, %arg1: tensor<8x8x1x1xf32>, %arg2: tensor<8xf32>, %arg3: tensor<1x1x1x8xf32>) -> tensor<1x8x8x8xf32> {
  %0 = stablehlo.convolution(%arg0, %arg1) dim_numbers = [b, 0, 1, f]x[o, i, 0, 1]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x8x8xf32>, tensor<8x8x1x1xf32>) -> tensor<1x8x8x8xf32>
  %1 = stablehlo.reshape %arg2 : (tensor<8xf32>) -> tensor<8x1x1xf32>
  %2 = stablehlo.transpose %1, dims = [1, 2, 0] : (tensor<8x1x1xf32>) -> tensor<1x1x8xf32>
  %3 = stablehlo.broadcast_in_dim %2, dims = [1, 2, 3] : (tensor<1x1x8xf32>) -> tensor<1x8x8x8xf32>
  %4 = stablehlo.add %0, %3 : tensor<1x8x8x8xf32>
  %5 = stablehlo.add %arg0, %4 : tensor<1x8x8x8xf32>
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<1x8x8x8xf32>
  %6 = stablehlo.maximum %5, %cst : tensor<1x8x8x8xf32>
  %7 = stablehlo.convolution(%6, %arg1) dim_numbers = [b, 0, 1, f]x[o, i, 0, 1]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x8x8xf32>, tensor<8x8x1x1xf32>) -> tensor<1x8x8x8xf32>
  %8 = stablehlo.add %7, %3 : tensor<1x8x8x8xf32>
  %9 = stablehlo.broadcast_in_dim %arg3, dims = [0, 1, 2, 3] : (tensor<1x1x1x8xf32>) -> tensor<1x8x8x8xf32>
  %10 = stablehlo.add %8, %9 : tensor<1x8x8x8xf32>
  return %10 : tensor<1x8x8x8xf32>
}

// CHECK: %[[FIRST:.*]] = call @blade_library_call_0(%arg0, %arg1, %arg2, %arg0)
// CHECK-NOT: stablehlo.maximum
// CHECK: %[[SECOND:.*]] = call @blade_library_call_1(%[[FIRST]], %arg1, %arg2)
// CHECK: stablehlo.broadcast_in_dim %arg3
// CHECK: stablehlo.add %[[SECOND]]
// CHECK: func.func private @blade_library_call_1
// CHECK-SAME: blade.activation = 0
// CHECK-SAME: blade.library_call = "conv2d_nhwc_bias"
// CHECK: func.func private @blade_library_call_0
// CHECK-SAME: blade.activation = 1
// CHECK-SAME: blade.library_call = "conv2d_nhwc_bias_add"
// CHECK: stablehlo.add
// CHECK: stablehlo.add
// CHECK: stablehlo.maximum

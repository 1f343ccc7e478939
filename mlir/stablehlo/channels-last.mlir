// RUN: blade-opt --pass channels-last %s | FileCheck %s
// A convolution with a bias, a ReLU and a 2x2 max pooling, in NCHW, as Torch-MLIR gives
// it: it convolves NHWC and transposes back after the pooling.

func.func @main(%arg0: tensor<1x3x8x8xf32>, %arg1: tensor<8x3x3x3xf32>, %arg2: tensor<8xf32>) -> tensor<1x8x4x4xf32> {
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<1x8x8x8xf32>
  %cst_0 = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %0 = stablehlo.convolution(%arg0, %arg1) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x8x8xf32>, tensor<8x3x3x3xf32>) -> tensor<1x8x8x8xf32>
  %1 = stablehlo.reshape %arg2 : (tensor<8xf32>) -> tensor<8x1x1xf32>
  %2 = stablehlo.broadcast_in_dim %1, dims = [1, 2, 3] : (tensor<8x1x1xf32>) -> tensor<1x8x8x8xf32>
  %3 = stablehlo.add %0, %2 : tensor<1x8x8x8xf32>
  %4 = stablehlo.maximum %3, %cst : tensor<1x8x8x8xf32>
  %5 = "stablehlo.reduce_window"(%4, %cst_0) <{padding = dense<0> : tensor<4x2xi64>, window_dilations = array<i64: 1, 1, 1, 1>, window_dimensions = array<i64: 1, 1, 2, 2>, window_strides = array<i64: 1, 1, 2, 2>}> ({
  ^bb0(%arg3: tensor<f32>, %arg4: tensor<f32>):
    %6 = stablehlo.maximum %arg3, %arg4 : tensor<f32>
    stablehlo.return %6 : tensor<f32>
  }) : (tensor<1x8x8x8xf32>, tensor<f32>) -> tensor<1x8x4x4xf32>
  return %5 : tensor<1x8x4x4xf32>
}

// CHECK: stablehlo.transpose %arg0, dims = [0, 2, 3, 1]
// CHECK: stablehlo.convolution({{.*}}) dim_numbers = [b, 0, 1, f]x[o, i, 0, 1]->[b, 0, 1, f]
// CHECK-NOT: dims = [0, 3, 1, 2]
// CHECK: "stablehlo.reduce_window"
// CHECK-SAME: window_dimensions = array<i64: 1, 2, 2, 1>
// CHECK: stablehlo.transpose {{%[0-9]+}}, dims = [0, 3, 1, 2]
// CHECK-NEXT: return

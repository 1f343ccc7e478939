// RUN: blade-opt --pass lower-reduce-windows %s | FileCheck %s
// Max pooling becomes a fill and one loop nest, the channel loop innermost for NHWC data.

func.func @main(%arg0: tensor<1x8x8x8xf32>) -> tensor<1x4x4x8xf32> {
  %cst = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %0 = "stablehlo.reduce_window"(%arg0, %cst) <{padding = dense<0> : tensor<4x2xi64>, window_dilations = array<i64: 1, 1, 1, 1>, window_dimensions = array<i64: 1, 2, 2, 1>, window_strides = array<i64: 1, 2, 2, 1>}> ({
  ^bb0(%arg3: tensor<f32>, %arg4: tensor<f32>):
    %4 = stablehlo.maximum %arg3, %arg4 : tensor<f32>
    stablehlo.return %4 : tensor<f32>
  }) : (tensor<1x8x8x8xf32>, tensor<f32>) -> tensor<1x4x4x8xf32>
  return %0 : tensor<1x4x4x8xf32>
}

// CHECK-NOT: stablehlo.reduce_window
// CHECK: linalg.fill
// CHECK: linalg.generic
// CHECK-SAME: iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction", "parallel"]
// CHECK: arith.maximumf

// RUN: blade-opt --pass fold-splat-constants %s | FileCheck %s
// LayerNorm's element count and epsilon arrive as integer and f64 splats converted at
// run time; folded, the fusion reads them as scalars.

func.func @main(%arg0: tensor<4x1xf32>) -> tensor<4x1xf32> {
  %cst_0 = arith.constant dense<16> : tensor<1xi64>
  %2 = stablehlo.convert %cst_0 : (tensor<1xi64>) -> tensor<1xf32>
  %3 = stablehlo.reshape %2 : (tensor<1xf32>) -> tensor<f32>
  %4 = stablehlo.broadcast_in_dim %3, dims = [] : (tensor<f32>) -> tensor<4x1xf32>
  %5 = stablehlo.divide %arg0, %4 : tensor<4x1xf32>
  return %5 : tensor<4x1xf32>
}

// CHECK: [[C:%[a-z0-9_]+]] = stablehlo.constant dense<1.600000e+01> : tensor<4x1xf32>
// CHECK-NOT: stablehlo.convert
// CHECK: stablehlo.divide %arg0, [[C]]

// RUN: blade-opt --pass stablehlo-refine-shapes %s | FileCheck %s
// Two kernel calls (torch.ops.aten.uniform) feeding a correlation, as Torch-MLIR lowered
// torch-mlir's e2e UniformNoCorrelationModule: the module StableHLO's pass alone crashed
// on. The declarations stay declared and main is refined.

func.func @main(%arg0: tensor<1000xf64>) -> tensor<i64> {
  %cst = arith.constant dense<1.000000e-03> : tensor<1xf64>
  %cst_0 = arith.constant dense<999> : tensor<1xi64>
  %cst_1 = arith.constant dense<1000> : tensor<1xi64>
  %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f64>
  %c = stablehlo.constant dense<2> : tensor<i64>
  %c_3 = stablehlo.constant dense<1> : tensor<i64>
  %0 = call @blade_kernel_0(%arg0) : (tensor<1000xf64>) -> tensor<1000xf64>
  %1 = call @blade_kernel_1(%arg0) : (tensor<1000xf64>) -> tensor<1000xf64>
  %2 = stablehlo.reshape %0 : (tensor<1000xf64>) -> tensor<1x1000xf64>
  %3 = stablehlo.reshape %1 : (tensor<1000xf64>) -> tensor<1x1000xf64>
  %4 = stablehlo.concatenate %2, %3, dim = 0 : (tensor<1x1000xf64>, tensor<1x1000xf64>) -> tensor<2x1000xf64>
  %5 = stablehlo.reduce(%4 init: %cst_2) applies stablehlo.add across dimensions = [1] : (tensor<2x1000xf64>, tensor<f64>) -> tensor<2xf64>
  %6 = stablehlo.reshape %5 : (tensor<2xf64>) -> tensor<2x1xf64>
  %7 = stablehlo.convert %cst_1 : (tensor<1xi64>) -> tensor<1xf64>
  %8 = stablehlo.reshape %7 : (tensor<1xf64>) -> tensor<f64>
  %9 = stablehlo.broadcast_in_dim %8, dims = [] : (tensor<f64>) -> tensor<2x1xf64>
  %10 = stablehlo.divide %6, %9 : tensor<2x1xf64>
  %11 = stablehlo.broadcast_in_dim %10, dims = [0, 1] : (tensor<2x1xf64>) -> tensor<2x1000xf64>
  %12 = stablehlo.subtract %4, %11 : tensor<2x1000xf64>
  %13 = stablehlo.transpose %12, dims = [1, 0] : (tensor<2x1000xf64>) -> tensor<1000x2xf64>
  %14 = stablehlo.dot %12, %13 : (tensor<2x1000xf64>, tensor<1000x2xf64>) -> tensor<2x2xf64>
  %15 = stablehlo.convert %cst_0 : (tensor<1xi64>) -> tensor<1xf64>
  %16 = stablehlo.reshape %15 : (tensor<1xf64>) -> tensor<f64>
  %17 = stablehlo.broadcast_in_dim %16, dims = [] : (tensor<f64>) -> tensor<2x2xf64>
  %18 = stablehlo.divide %14, %17 : tensor<2x2xf64>
  %19 = stablehlo.slice %18 [0:1, 0:2] : (tensor<2x2xf64>) -> tensor<1x2xf64>
  %20 = stablehlo.reshape %19 : (tensor<1x2xf64>) -> tensor<2xf64>
  %21 = stablehlo.slice %20 [1:2] : (tensor<2xf64>) -> tensor<1xf64>
  %22 = stablehlo.reshape %21 : (tensor<1xf64>) -> tensor<f64>
  %23 = stablehlo.slice %20 [0:1] : (tensor<2xf64>) -> tensor<1xf64>
  %24 = stablehlo.reshape %23 : (tensor<1xf64>) -> tensor<f64>
  %25 = stablehlo.slice %18 [1:2, 0:2] : (tensor<2x2xf64>) -> tensor<1x2xf64>
  %26 = stablehlo.reshape %25 : (tensor<1x2xf64>) -> tensor<2xf64>
  %27 = stablehlo.slice %26 [1:2] : (tensor<2xf64>) -> tensor<1xf64>
  %28 = stablehlo.reshape %27 : (tensor<1xf64>) -> tensor<f64>
  %29 = stablehlo.multiply %24, %28 : tensor<f64>
  %30 = stablehlo.sqrt %29 : tensor<f64>
  %31 = stablehlo.divide %22, %30 : tensor<f64>
  %32 = stablehlo.abs %31 : tensor<f64>
  %33 = stablehlo.convert %cst : tensor<1xf64>
  %34 = stablehlo.reshape %33 : (tensor<1xf64>) -> tensor<f64>
  %35 = stablehlo.compare LT, %32, %34, FLOAT : (tensor<f64>, tensor<f64>) -> tensor<i1>
  %36 = stablehlo.broadcast_in_dim %c_3, dims = [] : (tensor<i64>) -> tensor<i64>
  %37 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i64>) -> tensor<i64>
  %38 = stablehlo.select %35, %36, %37 : tensor<i1>, tensor<i64>
  return %38 : tensor<i64>
}
func.func private @blade_kernel_0(tensor<1000xf64>) -> tensor<1000xf64> attributes {blade.kernel_call = "aten::uniform float64 float64 T0 f0x0.0p+0 f0x1.0p+0 N"}
func.func private @blade_kernel_1(tensor<1000xf64>) -> tensor<1000xf64> attributes {blade.kernel_call = "aten::uniform float64 float64 T0 f0x0.0p+0 f0x1.0p+0 N"}

// CHECK: func.func @main
// CHECK: call @blade_kernel_0(%arg0)
// CHECK: call @blade_kernel_1(%arg0)
// CHECK: func.func private @blade_kernel_0(tensor<1000xf64>) -> tensor<1000xf64> attributes {blade.kernel_call =
// CHECK-NOT: ub.poison
// CHECK: func.func private @blade_kernel_1(tensor<1000xf64>) -> tensor<1000xf64> attributes {blade.kernel_call =
// CHECK-NOT: ub.poison

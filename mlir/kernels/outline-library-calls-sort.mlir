// RUN: blade-opt --pass outline-library-calls %s | FileCheck %s
// A sort as Torch-MLIR lowers it (the values and an iota of indices, compared on the
// values) becomes a call of the sort kernel.

func.func @main(%arg0: tensor<3x5xf32>) -> (tensor<3x5xf32>, tensor<3x5xi64>) {
  %0 = stablehlo.iota dim = 1 : tensor<3x5xi64>
  %1:2 = "stablehlo.sort"(%arg0, %0) <{dimension = 1 : i64, is_stable = false}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>, %c: tensor<i64>, %d: tensor<i64>):
    %2 = stablehlo.compare GT, %a, %b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %2 : tensor<i1>
  }) : (tensor<3x5xf32>, tensor<3x5xi64>) -> (tensor<3x5xf32>, tensor<3x5xi64>)
  return %1#0, %1#1 : tensor<3x5xf32>, tensor<3x5xi64>
}

// CHECK: [[S:%[0-9]+]]:2 = call @blade_library_call_0(%arg0)
// CHECK-NOT: stablehlo.sort
// CHECK-NOT: stablehlo.iota
// CHECK: return [[S]]#0, [[S]]#1
// A declaration whose operand is only read (bufferization then keeps its buffer
// unwritten until the call), defined when library calls are lowered.
// CHECK: func.func private @blade_library_call_0(tensor<3x5xf32> {bufferization.access = "read"})
// CHECK-SAME: blade.descending = 1
// CHECK-SAME: blade.dimension = 1
// CHECK-SAME: blade.k = 0
// CHECK-SAME: blade.library_call = "sort"
// CHECK-SAME: blade.stable = 0
// CHECK-NOT: {

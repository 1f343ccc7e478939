// RUN: blade-opt --pass lower-dynamic-reverses %s | FileCheck %s
// A dynamic reverse reads element size - 1 - i.

func.func @main(%arg0: tensor<?x?xf32>) -> tensor<?x?xf32> {
  %0 = stablehlo.reverse %arg0, dims = [0] : tensor<?x?xf32>
  return %0 : tensor<?x?xf32>
}

// CHECK-NOT: stablehlo.reverse
// CHECK: linalg.generic
// CHECK: linalg.index 0
// CHECK: arith.subi
// CHECK: tensor.extract %arg0

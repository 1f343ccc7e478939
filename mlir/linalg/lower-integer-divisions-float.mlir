// RUN: blade-opt --pass lower-integer-divisions %s | FileCheck %s --implicit-check-not=division_by_zero
// A float division is left alone.

func.func @main(%a: tensor<?x4xf32>, %b: tensor<?x4xf32>) -> tensor<?x4xf32> {
  %0 = stablehlo.divide %a, %b : tensor<?x4xf32>
  return %0 : tensor<?x4xf32>
}

// CHECK: stablehlo.divide

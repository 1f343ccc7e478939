// RUN: blade-opt --pass lower-integer-divisions %s | FileCheck %s
// An integer remainder by minus one is zero.

func.func @main(%a: tensor<?x4xi32>, %b: tensor<?x4xi32>) -> tensor<?x4xi32> {
  %0 = stablehlo.remainder %a, %b : tensor<?x4xi32>
  return %0 : tensor<?x4xi32>
}

// CHECK-NOT: stablehlo.remainder
// CHECK: call @blade_ral_division_by_zero()
// CHECK: [[R:%[a-z0-9_]+]] = arith.remsi
// CHECK: arith.select {{%[a-z0-9_]+}}, %c0_i32, [[R]]

// RUN: blade-opt --pass lower-integer-divisions %s | FileCheck %s
// An integer division reports a zero divisor and never divides by zero or minus one.

func.func @main(%a: tensor<?x4xi32>, %b: tensor<?x4xi32>) -> tensor<?x4xi32> {
  %0 = stablehlo.divide %a, %b : tensor<?x4xi32>
  return %0 : tensor<?x4xi32>
}

// CHECK-NOT: stablehlo.divide
// CHECK: tensor.dim %arg0, %c0
// CHECK: linalg.generic
// CHECK: ^bb0([[A:%[a-z0-9_]+]]: i32, [[B:%[a-z0-9_]+]]: i32
// CHECK: [[Z:%[a-z0-9_]+]] = arith.cmpi eq, [[B]], %c0_i32
// CHECK: scf.if [[Z]]
// CHECK-NEXT: call @blade_ral_division_by_zero()
// CHECK: [[M:%[a-z0-9_]+]] = arith.cmpi eq, [[B]], %c-1_i32
// CHECK: [[U:%[a-z0-9_]+]] = arith.ori [[Z]], [[M]]
// CHECK: [[S:%[a-z0-9_]+]] = arith.select [[U]], %c1_i32, [[B]]
// CHECK: [[N:%[a-z0-9_]+]] = arith.subi %c0_i32, [[A]]
// CHECK: [[Q:%[a-z0-9_]+]] = arith.divsi [[A]], [[S]]
// CHECK: [[R:%[a-z0-9_]+]] = arith.select [[M]], [[N]], [[Q]]
// CHECK: linalg.yield [[R]]
// CHECK: func.func private @blade_ral_division_by_zero()

// RUN: blade-opt --pass divide-out-sizes %s | FileCheck %s
// A division that is no flatten stays.

func.func @main(%a: i64, %b: i64) -> i64 {
  %0 = arith.divui %a, %b : i64
  return %0 : i64
}

// CHECK: arith.divui

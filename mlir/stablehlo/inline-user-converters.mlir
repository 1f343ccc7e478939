// RUN: blade-opt --pass inline-user-converters --user-calls %S/inline-user-converters.py %s | FileCheck %s
// The importer left a call of a private declaration for a node a user converter lowers
// (inline-user-converters.py); the converter builds its body, which is inlined.

func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = call @blade_user_0(%a) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func private @blade_user_0(tensor<4xf32>) -> tensor<4xf32>

// CHECK: func.func @main(%arg0: tensor<4xf32>)
// CHECK-NEXT: [[SUM:%[0-9]+]] = stablehlo.add %arg0, %arg0
// CHECK-NEXT: return [[SUM]]
// CHECK-NOT: blade_user_0

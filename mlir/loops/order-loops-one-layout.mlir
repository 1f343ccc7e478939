// RUN: blade-opt --pass order-loops %s | FileCheck %s
// A loop nest in one layout is left alone.

#in = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#out = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
func.func @main(%arg0: memref<1x64x56x56xf32> {llvm.noalias}, %arg1: memref<1x64x56x56xf32> {llvm.noalias}) {
  linalg.generic {indexing_maps = [#in, #out], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%arg0 : memref<1x64x56x56xf32>) outs(%arg1 : memref<1x64x56x56xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.addf %in, %in : f32
    linalg.yield %0 : f32
  }
  return
}

// CHECK-NOT: (d0, d2, d1, d3)

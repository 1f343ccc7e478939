// RUN: blade-opt --pass order-loops %s | FileCheck %s
// NHWC data written as NCHW: the loops become (N, H, C, W), the input (N, H, W, C) read
// as (d0, d1, d3, d2) and the output (N, C, H, W) written as (d0, d2, d1, d3).

#in = affine_map<(d0, d1, d2, d3) -> (d0, d2, d3, d1)>
#out = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
func.func @main(%arg0: memref<1x56x56x64xf32> {llvm.noalias}, %arg1: memref<1x64x56x56xf32> {llvm.noalias}) {
  linalg.generic {indexing_maps = [#in, #out], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%arg0 : memref<1x56x56x64xf32>) outs(%arg1 : memref<1x64x56x56xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.addf %in, %in : f32
    linalg.yield %0 : f32
  }
  return
}

// CHECK: affine_map<(d0, d1, d2, d3) -> (d0, d1, d3, d2)>
// CHECK: affine_map<(d0, d1, d2, d3) -> (d0, d2, d1, d3)>

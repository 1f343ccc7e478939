// RUN: blade-opt --pass outline-parallel-loops --print-handed-on %s | FileCheck %s
// A large loop over rows becomes parallel task 0.

#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d0)>
func.func @main(%arg0: memref<256x512xf32> {llvm.noalias}, %arg1: memref<256xf32> {llvm.noalias}) {
  linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%arg0 : memref<256x512xf32>) outs(%arg1 : memref<256xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.addf %in, %out : f32
    linalg.yield %0 : f32
  }
  return
}

// CHECK: func.func private @blade_task_0(%arg0: index, %arg1: index
// CHECK: memref.subview %arg2[%arg0, 0]
// CHECK: linalg.generic
// CHECK: func.func private @blade_launch_0(memref<256x512xf32>, memref<256xf32>)
// CHECK: func.func @main
// CHECK-NEXT: call @blade_launch_0(%arg0, %arg1)
// CHECK-NEXT: return
// CHECK: // handed on: parallel_tasks=[{'index': 0,

// RUN: blade-opt --pass outline-serial-loops %s | FileCheck %s
// A padding fill, a copy into a view of the padded buffer and a max over rows: loop nests
// of main's own buffers, read through main's constant, become functions with noalias
// buffers.

#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d0)>
func.func @main(%arg0: memref<8x16xf32> {llvm.noalias}, %arg1: memref<10xf32> {llvm.noalias}) {
  %cst = arith.constant 0xFF800000 : f32
  %alloc = memref.alloc() : memref<10x16xf32>
  linalg.fill ins(%cst : f32) outs(%alloc : memref<10x16xf32>)
  %view = memref.subview %alloc[1, 0] [8, 16] [1, 1]
      : memref<10x16xf32> to memref<8x16xf32, strided<[16, 1], offset: 16>>
  memref.copy %arg0, %view : memref<8x16xf32> to memref<8x16xf32, strided<[16, 1], offset: 16>>
  linalg.fill ins(%cst : f32) outs(%arg1 : memref<10xf32>)
  linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]}
      ins(%alloc : memref<10x16xf32>) outs(%arg1 : memref<10xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.maximumf %in, %out : f32
    linalg.yield %0 : f32
  }
  memref.dealloc %alloc : memref<10x16xf32>
  return
}

// CHECK: func.func private @blade_loop_0(%arg0: memref<10x16xf32> {llvm.noalias})
// CHECK-NEXT: arith.constant 0xFF800000
// CHECK-NEXT: linalg.fill
// CHECK: func.func private @blade_loop_1(%arg0: memref<8x16xf32> {llvm.noalias},
// CHECK-SAME: %arg1: memref<8x16xf32, strided<[16, 1], offset: 16>> {llvm.noalias})
// CHECK-NEXT: memref.copy %arg0, %arg1
// CHECK: func.func private @blade_loop_3(%arg0: memref<10x16xf32> {llvm.noalias},
// CHECK-SAME: %arg1: memref<10xf32> {llvm.noalias})
// CHECK: arith.maximumf
// CHECK: func.func @main
// CHECK: memref.alloc
// CHECK-NEXT: call @blade_loop_0(%alloc)
// CHECK-NEXT: memref.subview
// CHECK-NEXT: call @blade_loop_1(%arg0, %subview)
// CHECK-NEXT: call @blade_loop_2(%arg1)
// CHECK-NEXT: call @blade_loop_3(%alloc, %arg1)
// CHECK-NEXT: memref.dealloc
// CHECK-NEXT: return

// RUN: blade-opt --pass emit-c-interface %s | FileCheck %s
// main gets a C interface, which blade_entry calls.

#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%arg0: memref<64x512xf32> {llvm.noalias}, %arg1: memref<64x512xf32> {llvm.noalias}) {
  linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%arg0 : memref<64x512xf32>) outs(%arg1 : memref<64x512xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = math.exp %in : f32
    linalg.yield %0 : f32
  }
  return
}

// CHECK: func.func @main({{.*}}) attributes {llvm.emit_c_interface}

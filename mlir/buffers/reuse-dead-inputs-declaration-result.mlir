// RUN: blade-opt --pass reuse-dead-inputs %s | FileCheck %s --implicit-check-not="outs(%0"
// As far as bufferization knows, the declaration's result may alias its operand (a
// kernel call's weight): writing into it would copy every operand before the call.

#map = affine_map<(d0) -> (d0)>
func.func private @kernel(tensor<8xf32> {bufferization.access = "read"}) -> tensor<8xf32>
func.func @main(%a: tensor<8xf32>) -> tensor<8xf32> {
  %k = call @kernel(%a) : (tensor<8xf32>) -> tensor<8xf32>
  %e = tensor.empty() : tensor<8xf32>
  %r = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel"]}
      ins(%k : tensor<8xf32>) outs(%e : tensor<8xf32>) {
  ^bb0(%x: f32, %o: f32):
    %s = arith.addf %x, %x : f32
    linalg.yield %s : f32
  } -> tensor<8xf32>
  return %r : tensor<8xf32>
}

// CHECK: tensor.empty

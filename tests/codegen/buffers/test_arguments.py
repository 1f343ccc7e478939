"""codegen/buffers/arguments.py: main's arguments before and after bufferization."""
from ir_runner import check_pass, run_pass

ELEMENTWISE = """
#map = affine_map<(d0) -> (d0)>
func.func @main(%a: tensor<8xf32>, %b: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>) {
  %e = tensor.empty() : tensor<8xf32>
  %m = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel"]}
      ins(%a, %b : tensor<8xf32>, tensor<8xf32>) outs(%e : tensor<8xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %p = arith.mulf %x, %y : f32
    linalg.yield %p : f32
  } -> tensor<8xf32>
  %e2 = tensor.empty() : tensor<8xf32>
  %r = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel"]}
      ins(%m : tensor<8xf32>) outs(%e2 : tensor<8xf32>) {
  ^bb0(%x: f32, %o: f32):
    %s = arith.addf %x, %x : f32
    linalg.yield %s : f32
  } -> tensor<8xf32>
  return %r, %r : tensor<8xf32>, tensor<8xf32>
}
"""


def test_mark_arguments_makes_inputs_read_only_and_noalias():
    check_pass(ELEMENTWISE + """
    // CHECK: func.func @main(%arg0: tensor<8xf32> {bufferization.writable = false, llvm.noalias}, %arg1: tensor<8xf32> {bufferization.writable = false, llvm.noalias})
    """, "mark-arguments")


def test_reuse_dead_inputs_writes_over_the_product_that_dies():
    # The add reads the product %m only: it writes its result over it, not into %e2.
    check_pass(ELEMENTWISE + """
    // CHECK: [[M:%[0-9]+]] = linalg.generic
    // CHECK: linalg.generic {{.*}} ins([[M]] : tensor<8xf32>) outs([[M]] : tensor<8xf32>)
    """, "reuse-dead-inputs")


def test_reuse_dead_inputs_leaves_arguments_alone():
    # The product's inputs are main's arguments, whose buffers must not be written.
    text, _ = run_pass(ELEMENTWISE, "reuse-dead-inputs")
    assert "outs(%arg0" not in text and "outs(%arg1" not in text, text


DECLARED_CALL = """
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
"""


def test_reuse_dead_inputs_does_not_write_over_a_declarations_result():
    # As far as bufferization knows, the declaration's result may alias its operand (a
    # kernel call's weight): writing into it would copy every operand before the call.
    text, _ = run_pass(DECLARED_CALL, "reuse-dead-inputs")
    assert "outs(%0" not in text and "outs(%0 :" not in text, text
    assert "tensor.empty" in text, text


def test_distinct_results_copies_a_value_returned_twice():
    check_pass(ELEMENTWISE + """
    // CHECK: = linalg.generic
    // CHECK: [[R:%[0-9]+]] = linalg.generic
    // CHECK: [[COPY:%[0-9]+]] = bufferization.alloc_tensor() copy([[R]])
    // CHECK: return [[R]], [[COPY]]
    """, "distinct-results")


def test_distinct_results_leaves_distinct_results_alone():
    text, _ = run_pass(ELEMENTWISE.replace("return %r, %r", "return %r, %m"), "distinct-results")
    assert "alloc_tensor" not in text, text


OUT_PARAM = """
func.func @main(%a: memref<8xf32>, %out: memref<8xf32>) {
  %t = memref.alloc() : memref<8xf32>
  linalg.copy ins(%a : memref<8xf32>) outs(%t : memref<8xf32>)
  memref.copy %t, %out : memref<8xf32> to memref<8xf32>
  return
}
"""


def test_write_outputs_in_place_drops_the_copy_into_the_out_param():
    check_pass(OUT_PARAM + """
    // CHECK: linalg.copy ins(%arg0 : memref<8xf32>) outs(%arg1 : memref<8xf32>)
    // CHECK-NOT: memref.alloc
    // CHECK-NOT: memref.copy
    """, "write-outputs-in-place")


def test_mark_out_params_marks_every_memref_noalias():
    check_pass(OUT_PARAM + """
    // CHECK: func.func @main(%arg0: memref<8xf32> {llvm.noalias}, %arg1: memref<8xf32> {llvm.noalias})
    """, "mark-out-params")


def test_hide_main_makes_main_private_for_the_out_param_pass():
    check_pass(OUT_PARAM + """
    // CHECK: func.func private @main(
    """, "hide-main")


def test_show_main_makes_main_public_again():
    text, _ = run_pass(OUT_PARAM.replace("func.func @main", "func.func private @main"),
                       "show-main")
    assert "func.func @main(" in text, text

"""codegen/loops and kernels `lower`: rewrites of bufferized loop nests, each on a small
memref function."""
from ir_runner import check_pass, run_pass

EXP_LOOP = """
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%arg0: memref<64x512xf32> {llvm.noalias}, %arg1: memref<64x512xf32> {llvm.noalias}) {
  linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%arg0 : memref<64x512xf32>) outs(%arg1 : memref<64x512xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = math.exp %in : f32
    linalg.yield %0 : f32
  }
  return
}
"""

ROW_SUM = """
#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d0)>
func.func @main(%arg0: memref<64x512xf32> {llvm.noalias}, %arg1: memref<64xf32> {llvm.noalias}) {
  linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%arg0 : memref<64x512xf32>) outs(%arg1 : memref<64xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.addf %in, %out : f32
    linalg.yield %0 : f32
  }
  return
}
"""


def test_approximate_math_replaces_libm_exp_with_a_polynomial():
    check_pass(EXP_LOOP + """
    // CHECK: linalg.generic
    // CHECK-NOT: math.exp
    // CHECK: arith.mulf
    // CHECK: linalg.yield
    """, "approximate-math")


def test_approximate_math_scales_by_ldexp_only_where_the_host_has_avx512():
    with_scalef, _ = run_pass(EXP_LOOP, "approximate-math", avx512=True)
    without, _ = run_pass(EXP_LOOP, "approximate-math", avx512=False)
    assert "llvm.intr.ldexp" in with_scalef and "llvm.intr.ldexp" not in without


def test_reductions_may_reassociate_and_elementwise_loops_are_untouched():
    check_pass(ROW_SUM + """
    // CHECK: arith.addf {{%[a-z0-9_]+}}, {{%[a-z0-9_]+}} fastmath<reassoc> : f32
    """, "allow-reduction-reassociation")
    result, _ = run_pass(EXP_LOOP.replace("math.exp %in", "arith.addf %in, %in"),
                         "allow-reduction-reassociation")
    assert "reassoc" not in result, result


def test_large_row_loops_become_parallel_tasks():
    compilation = check_pass(ROW_SUM.replace("64x512", "256x512").replace("64xf32", "256xf32") + """
    // CHECK: func.func private @blade_task_0(%arg0: index, %arg1: index
    // CHECK: memref.subview %arg2[%arg0, 0]
    // CHECK: linalg.generic
    // CHECK: func.func private @blade_launch_0(memref<256x512xf32>, memref<256xf32>)
    // CHECK: func.func @main
    // CHECK-NEXT: call @blade_launch_0(%arg0, %arg1)
    // CHECK-NEXT: return
    """, "outline-parallel-loops")
    assert compilation.statistics.parallel_loops == 1
    assert compilation.parallel_tasks[0]["index"] == 0


def test_small_loops_stay_serial_in_main():
    result, compilation = run_pass(ROW_SUM.replace("64x512", "4x8").replace("64xf32", "4xf32"),
                                   "outline-parallel-loops")
    assert "blade_launch" not in result and compilation.statistics.parallel_loops == 0


def test_lower_library_calls_replaces_the_body_with_one_kernel_call():
    check_pass("""
    func.func @main(%arg0: memref<4x16xf32>, %arg1: memref<16x8xf32>, %arg2: memref<4x8xf32>) {
      call @blade_library_call_0(%arg0, %arg1, %arg2) : (memref<4x16xf32>, memref<16x8xf32>, memref<4x8xf32>) -> ()
      return
    }
    func.func private @blade_library_call_0(%arg0: memref<4x16xf32>, %arg1: memref<16x8xf32>, %arg2: memref<4x8xf32>) attributes {blade.library_call = "matmul", blade.transpose_b = 0 : i64} {
      %cst = arith.constant 0.000000e+00 : f32
      linalg.fill ins(%cst : f32) outs(%arg2 : memref<4x8xf32>)
      linalg.matmul ins(%arg0, %arg1 : memref<4x16xf32>, memref<16x8xf32>) outs(%arg2 : memref<4x8xf32>)
      return
    }
    // CHECK: func.func private @blade_ral_matmul_f32(memref<*xf32>, memref<*xf32>, memref<*xf32>, i64)
    // CHECK: func.func private @blade_library_call_0
    // CHECK-NOT: linalg.matmul
    // CHECK: [[A:%[a-z0-9_]+]] = memref.cast %arg0 : memref<4x16xf32> to memref<*xf32>
    // CHECK: call @blade_ral_matmul_f32([[A]],
    // CHECK-NEXT: return
    """, "lower-library-calls")


def test_a_sorts_values_and_indices_reach_the_kernel_with_their_own_element_types():
    # A sort stays a declaration through bufferization; lowering defines it on results it
    # allocates (a dynamic size from the same dim of its operand) and returns.
    check_pass("""
    func.func @main(%arg0: memref<?x5xi32>) -> (memref<?x5xi32>, memref<?x5xi64>) {
      %0:2 = call @blade_library_call_0(%arg0) : (memref<?x5xi32>) -> (memref<?x5xi32>, memref<?x5xi64>)
      return %0#0, %0#1 : memref<?x5xi32>, memref<?x5xi64>
    }
    func.func private @blade_library_call_0(memref<?x5xi32> {bufferization.access = "read"}) -> (memref<?x5xi32>, memref<?x5xi64>) attributes {blade.library_call = "sort", blade.dimension = 1 : i64, blade.descending = 0 : i64, blade.stable = 1 : i64, blade.k = 0 : i64}
    // CHECK: func.func private @blade_ral_sort_i32(memref<*xi32>, memref<*xi32>, memref<*xi64>, i64, i64, i64, i64)
    // CHECK: func.func private @blade_library_call_0(%arg0: memref<?x5xi32>
    // CHECK: [[ROWS:%.+]] = memref.dim %arg0, %c0
    // CHECK: [[VALUES:%.+]] = memref.alloc([[ROWS]]) : memref<?x5xi32>
    // CHECK: [[INDICES:%.+]] = memref.alloc({{.*}}) : memref<?x5xi64>
    // CHECK: memref.cast [[INDICES]] : memref<?x5xi64> to memref<*xi64>
    // CHECK: call @blade_ral_sort_i32(
    // CHECK: return [[VALUES]], [[INDICES]]
    """, "lower-library-calls")


def test_a_kernel_call_is_defined_with_its_number_and_the_table_embedded():
    check_pass("""
    func.func @main(%arg0: memref<4xf32>) -> memref<4xf32> {
      %0 = call @blade_kernel_0(%arg0) : (memref<4xf32>) -> memref<4xf32>
      return %0 : memref<4xf32>
    }
    func.func private @blade_kernel_0(memref<4xf32> {bufferization.access = "read"}) -> memref<4xf32> attributes {blade.call = 0 : i64, blade.kernel_call = "aten::cumprod float32 float32 T0 i0 N", blade.library_call = "kernel_call"}
    // CHECK: func.func private @blade_ral_kernel_call_2(i64, memref<*xi8>, memref<*xi8>)
    // CHECK: [[RESULT:%.+]] = memref.alloc() : memref<4xf32>
    // CHECK: builtin.unrealized_conversion_cast {{.*}} : memref<*xf32> to memref<*xi8>
    // CHECK: call @blade_ral_kernel_call_2(%c0_i64,
    // CHECK: return [[RESULT]]
    // CHECK: llvm.mlir.global internal constant @blade_kernel_calls_text("aten::cumprod float32 float32 T0 i0 N\\00")
    // CHECK: llvm.func @blade_kernel_calls() -> !llvm.ptr
    """, "lower-library-calls")


def test_emit_c_interface_marks_main():
    check_pass(EXP_LOOP + """
    // CHECK: func.func @main({{.*}}) attributes {llvm.emit_c_interface}
    """, "emit-c-interface")


def test_record_noalias_arguments_hands_on_each_memrefs_words():
    _, compilation = run_pass(EXP_LOOP, "record-noalias-arguments")
    # Two rank-2 memrefs: 3 + 2 * 2 words each, both noalias.
    assert compilation.noalias == {"main": [(7, True), (7, True)]}

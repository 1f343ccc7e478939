"""codegen/loops: divisions that may use a reciprocal (approximations.allow_reciprocal) and
transposing loop nests as vector tiles (tiled_transpose.py)."""
from ir_runner import check_pass, run_pass

DIVIDE = """
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%arg0: memref<64x64xf32> {llvm.noalias}, %arg1: memref<64x64xf32> {llvm.noalias}, %arg2: memref<64x64xf32> {llvm.noalias}) {
  %cst = arith.constant 1.000000e+00 : f32
  linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%arg0, %arg1 : memref<64x64xf32>, memref<64x64xf32>) outs(%arg2 : memref<64x64xf32>) {
  ^bb0(%in: f32, %d: f32, %out: f32):
    %0 = arith.addf %d, %cst : f32
    %1 = arith.divf %in, %0 : f32
    linalg.yield %1 : f32
  }
  return
}
"""

TRANSPOSE_ADD = """
#map = affine_map<(d0, d1) -> (d1, d0)>
#map2 = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%arg0: memref<64x64xf32> {llvm.noalias}, %arg2: memref<64x64xf32> {llvm.noalias}) {
  %cst = arith.constant 1.000000e+00 : f32
  linalg.generic {indexing_maps = [#map, #map2], iterator_types = ["parallel", "parallel"]} ins(%arg0 : memref<64x64xf32>) outs(%arg2 : memref<64x64xf32>) {
  ^bb0(%in: f32, %out: f32):
    %1 = arith.addf %in, %cst : f32
    linalg.yield %1 : f32
  }
  return
}
"""


def test_a_division_may_multiply_by_the_reciprocal():
    check_pass(DIVIDE + """
    // CHECK: arith.divf {{%[a-z0-9_]+}}, {{%[a-z0-9_]+}} fastmath<arcp> : f32
    """, "allow-reciprocal")


def test_a_division_by_a_square_root_keeps_its_exact_division():
    # LLVM would turn it into the reciprocal square root estimate: NaN at 0, inf.
    result, _ = run_pass(DIVIDE.replace("%0 = arith.addf %d, %cst : f32",
                                        "%0 = math.sqrt %d : f32"), "allow-reciprocal")
    assert "arcp" not in result, result


def test_a_transposing_loop_nest_runs_on_8x8_tiles():
    compilation = check_pass(TRANSPOSE_ADD + """
    // CHECK: scf.for
    // CHECK: step %c8
    // CHECK-COUNT-8: vector.load %arg0
    // CHECK: vector.transpose
    // CHECK: vector.store
    // CHECK-NOT: linalg.generic
    """, "tile-transposes")
    assert compilation.statistics.tiled_transposes == 1


def test_a_loop_nest_that_transposes_nothing_is_left_alone():
    result, compilation = run_pass(TRANSPOSE_ADD.replace("(d1, d0)", "(d0, d1)"),
                                   "tile-transposes")
    assert "vector.transpose" not in result and compilation.statistics.tiled_transposes == 0

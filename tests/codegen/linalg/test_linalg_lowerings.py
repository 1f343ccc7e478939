"""codegen/linalg: StableHLO ops Blade lowers to linalg itself (gathers.py, scatters.py,
concatenations.py), each on a small StableHLO function."""
from ir_runner import check_pass, run_pass

GATHER_ROWS = """
func.func @main(%arg0: tensor<5x4xf32>, %arg1: tensor<3xi64>) -> tensor<3x4xf32> {
  %0 = "stablehlo.gather"(%arg0, %arg1) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 4>}> : (tensor<5x4xf32>, tensor<3xi64>) -> tensor<3x4xf32>
  return %0 : tensor<3x4xf32>
}
"""


def test_a_gather_of_whole_rows_reads_its_index_checks_it_and_extracts():
    check_pass(GATHER_ROWS + """
    // CHECK-NOT: stablehlo.gather
    // CHECK: linalg.generic
    // CHECK: arith.index_cast
    // CHECK: call @blade_ral_index_out_of_range
    // CHECK: tensor.extract %arg0
    """, "lower-gathers")


def test_a_gather_of_partial_slices_is_left_to_stablehlo():
    result, _ = run_pass(GATHER_ROWS.replace("slice_sizes = array<i64: 1, 4>",
                                             "slice_sizes = array<i64: 1, 2>")
                         .replace("-> tensor<3x4xf32>", "-> tensor<3x2xf32>")
                         .replace("return %0 : tensor<3x4xf32>", "return %0 : tensor<3x2xf32>"),
                         "lower-gathers")
    assert "stablehlo.gather" in result, result


def test_a_dynamic_reverse_reads_size_minus_one_minus_i():
    check_pass("""
    func.func @main(%arg0: tensor<?x?xf32>) -> tensor<?x?xf32> {
      %0 = stablehlo.reverse %arg0, dims = [0] : tensor<?x?xf32>
      return %0 : tensor<?x?xf32>
    }
    // CHECK-NOT: stablehlo.reverse
    // CHECK: linalg.generic
    // CHECK: linalg.index 0
    // CHECK: arith.subi
    // CHECK: tensor.extract %arg0
    """, "lower-dynamic-reverses")


def test_a_concatenation_becomes_slices_inserted_into_one_tensor():
    check_pass("""
    func.func @main(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> tensor<4x16xf32> {
      %0 = stablehlo.concatenate %a, %b, dim = 1 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x16xf32>
      return %0 : tensor<4x16xf32>
    }
    // CHECK-NOT: stablehlo.concatenate
    // CHECK: [[E:%[0-9]+]] = tensor.empty() : tensor<4x16xf32>
    // CHECK: [[F:%[a-z0-9_]+]] = tensor.insert_slice %arg0 into [[E]][0, 0] [4, 8] [1, 1]
    // CHECK: tensor.insert_slice %arg1 into [[F]][0, 8] [4, 8] [1, 1]
    """, "lower-concatenations")


SCATTER_ADD_ROWS = """
func.func @main(%arg0: tensor<5x6xf32>, %arg1: tensor<4x1xi64>, %arg2: tensor<4x6xf32>) -> tensor<5x6xf32> {
  %0 = "stablehlo.scatter"(%arg0, %arg1, %arg2) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %s = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) : (tensor<5x6xf32>, tensor<4x1xi64>, tensor<4x6xf32>) -> tensor<5x6xf32>
  return %0 : tensor<5x6xf32>
}
"""


def test_a_scatter_add_is_a_loop_nest_over_the_updates_that_checks_each_index():
    check_pass(SCATTER_ADD_ROWS + """
    // CHECK-NOT: stablehlo.scatter
    // CHECK: scf.for {{.*}} iter_args([[T:%[a-z0-9_]+]] = %arg0)
    // CHECK: scf.for
    // CHECK: tensor.extract %arg1
    // CHECK: arith.cmpi slt
    // CHECK: scf.if
    // CHECK: tensor.extract
    // CHECK: tensor.extract %arg2
    // CHECK-NEXT: arith.addf
    // CHECK-NEXT: tensor.insert
    // CHECK: } else {
    // CHECK-NEXT: arith.index_cast
    // CHECK: call @blade_ral_index_out_of_range
    // CHECK: func.func private @blade_ral_index_out_of_range
    """, "lower-scatters")


def test_a_scatter_of_another_update_computation_is_left_to_stablehlo():
    dividing = SCATTER_ADD_ROWS.replace("stablehlo.add %a, %b", "stablehlo.divide %a, %b")
    result, _ = run_pass(dividing, "lower-scatters")
    assert "stablehlo.scatter" in result, result



INTEGER_DIVISION = """
func.func @main(%a: tensor<?x4xi32>, %b: tensor<?x4xi32>) -> tensor<?x4xi32> {
  %0 = stablehlo.OP %a, %b : tensor<?x4xi32>
  return %0 : tensor<?x4xi32>
}
"""


def test_an_integer_division_reports_a_zero_divisor_and_never_divides_by_zero_or_minus_one():
    check_pass(INTEGER_DIVISION.replace("OP", "divide") + """
    // CHECK-NOT: stablehlo.divide
    // CHECK: tensor.dim %arg0, %c0
    // CHECK: linalg.generic
    // CHECK: ^bb0([[A:%[a-z0-9_]+]]: i32, [[B:%[a-z0-9_]+]]: i32
    // CHECK: [[Z:%[a-z0-9_]+]] = arith.cmpi eq, [[B]], %c0_i32
    // CHECK: scf.if [[Z]]
    // CHECK-NEXT: call @blade_ral_division_by_zero()
    // CHECK: [[M:%[a-z0-9_]+]] = arith.cmpi eq, [[B]], %c-1_i32
    // CHECK: [[U:%[a-z0-9_]+]] = arith.ori [[Z]], [[M]]
    // CHECK: [[S:%[a-z0-9_]+]] = arith.select [[U]], %c1_i32, [[B]]
    // CHECK: [[N:%[a-z0-9_]+]] = arith.subi %c0_i32, [[A]]
    // CHECK: [[Q:%[a-z0-9_]+]] = arith.divsi [[A]], [[S]]
    // CHECK: [[R:%[a-z0-9_]+]] = arith.select [[M]], [[N]], [[Q]]
    // CHECK: linalg.yield [[R]]
    // CHECK: func.func private @blade_ral_division_by_zero()
    """, "lower-integer-divisions")


def test_an_integer_remainder_is_zero_by_minus_one_and_float_division_is_left_alone():
    check_pass(INTEGER_DIVISION.replace("OP", "remainder") + """
    // CHECK-NOT: stablehlo.remainder
    // CHECK: call @blade_ral_division_by_zero()
    // CHECK: [[R:%[a-z0-9_]+]] = arith.remsi
    // CHECK: arith.select {{%[a-z0-9_]+}}, %c0_i32, [[R]]
    """, "lower-integer-divisions")
    result, _ = run_pass(INTEGER_DIVISION.replace("OP", "divide").replace("i32", "f32"),
                         "lower-integer-divisions")
    assert "stablehlo.divide" in result and "division_by_zero" not in result, result


def test_torch_mlirs_float64_floor_division_of_integers_becomes_an_exact_integer_one():
    check_pass("""
    func.func @main(%a: tensor<3xi64>, %b: tensor<3xi64>) -> tensor<3xi64> {
      %0 = stablehlo.convert %a : (tensor<3xi64>) -> tensor<3xf64>
      %1 = stablehlo.convert %b : (tensor<3xi64>) -> tensor<3xf64>
      %2 = stablehlo.divide %0, %1 : tensor<3xf64>
      %3 = stablehlo.floor %2 : tensor<3xf64>
      %4 = stablehlo.convert %3 : (tensor<3xf64>) -> tensor<3xi64>
      return %4 : tensor<3xi64>
    }
    // CHECK: [[G:%[0-9]+]] = linalg.generic
    // CHECK: call @blade_ral_division_by_zero()
    // CHECK: arith.divsi
    // CHECK: arith.remsi
    // CHECK: arith.xori
    // CHECK: arith.extui
    // CHECK: arith.subi
    // CHECK: return [[G]]
    """, "lower-integer-divisions")

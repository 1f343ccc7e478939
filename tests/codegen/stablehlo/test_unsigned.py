"""codegen/stablehlo/unsigned.py: `signless_boundaries` (main takes and returns uint8 tensors
as signless i8, converted bit for bit at its boundary, so that StableHLO's lowering to
linalg, which makes every ui8 inside an i8 it remembers as unsigned, leaves no cast behind)
and `unsigned_reduction_identities` (max and min of unsigned integers start from 0 and 255,
not from Torch-MLIR's signed extremes)."""
from ir_runner import check_pass, run_pass

UNSIGNED = """
func.func @main(%arg0: tensor<4x8xui8>, %arg1: tensor<4x8xf32>) -> (tensor<4x8xui8>, tensor<4x8xf32>) {
  %c = stablehlo.constant dense<3> : tensor<4x8xui8>
  %0 = stablehlo.add %arg0, %c : tensor<4x8xui8>
  %1 = stablehlo.convert %arg0 : (tensor<4x8xui8>) -> tensor<4x8xf32>
  %2 = stablehlo.add %1, %arg1 : tensor<4x8xf32>
  return %0, %2 : tensor<4x8xui8>, tensor<4x8xf32>
}
"""


def test_unsigned_arguments_and_results_become_signless_at_mains_boundary():
    check_pass(UNSIGNED + """
    // CHECK: func.func @main(%arg0: tensor<4x8xi8>, %arg1: tensor<4x8xf32>) -> (tensor<4x8xi8>, tensor<4x8xf32>)
    // CHECK-NEXT: [[U:%[0-9]+]] = stablehlo.bitcast_convert %arg0 : (tensor<4x8xi8>) -> tensor<4x8xui8>
    // CHECK: stablehlo.add [[U]]
    // CHECK: stablehlo.convert [[U]] : (tensor<4x8xui8>) -> tensor<4x8xf32>
    // CHECK: [[S:%[0-9]+]] = stablehlo.bitcast_convert %{{[0-9]+}} : (tensor<4x8xui8>) -> tensor<4x8xi8>
    // CHECK: return [[S]], %{{[0-9]+}} : tensor<4x8xi8>, tensor<4x8xf32>
    """, "signless-boundaries")


def test_a_signless_main_is_left_alone():
    signless = UNSIGNED.replace("ui8", "i8")
    result, _ = run_pass(signless, "signless-boundaries")
    assert "bitcast_convert" not in result


REDUCTIONS = """
func.func @main(%arg0: tensor<3x5xui8>) -> (tensor<3xui8>, tensor<3xui8>, tensor<3xi8>) {
  %c = stablehlo.constant dense<128> : tensor<ui8>
  %0 = stablehlo.reduce(%arg0 init: %c) applies stablehlo.maximum across dimensions = [1] : (tensor<3x5xui8>, tensor<ui8>) -> tensor<3xui8>
  %c_0 = stablehlo.constant dense<127> : tensor<ui8>
  %1 = stablehlo.reduce(%arg0 init: %c_0) applies stablehlo.minimum across dimensions = [1] : (tensor<3x5xui8>, tensor<ui8>) -> tensor<3xui8>
  %2 = stablehlo.bitcast_convert %arg0 : (tensor<3x5xui8>) -> tensor<3x5xi8>
  %c_1 = stablehlo.constant dense<-128> : tensor<i8>
  %3 = stablehlo.reduce(%2 init: %c_1) applies stablehlo.maximum across dimensions = [1] : (tensor<3x5xi8>, tensor<i8>) -> tensor<3xi8>
  return %0, %1, %3 : tensor<3xui8>, tensor<3xui8>, tensor<3xi8>
}
"""


def test_unsigned_max_and_min_start_from_the_unsigned_identities():
    check_pass(REDUCTIONS + """
    // CHECK: [[ZERO:%[a-z0-9_]+]] = stablehlo.constant dense<0> : tensor<ui8>
    // CHECK: stablehlo.reduce(%arg0 init: [[ZERO]]) applies stablehlo.maximum
    // CHECK: [[TOP:%[a-z0-9_]+]] = stablehlo.constant dense<255> : tensor<ui8>
    // CHECK: stablehlo.reduce(%arg0 init: [[TOP]]) applies stablehlo.minimum
    // The signed max keeps its signed start.
    // CHECK: [[LOW:%[a-z0-9_]+]] = stablehlo.constant dense<-128> : tensor<i8>
    // CHECK: stablehlo.reduce(%{{[0-9]+}} init: [[LOW]]) applies stablehlo.maximum
    """, "unsigned-reduction-identities")

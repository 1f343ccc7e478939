"""codegen/stablehlo/unsigned.py `signless_boundaries`: main takes and returns uint8 tensors
as signless i8, converted bit for bit at its boundary, so that StableHLO's lowering to
linalg (which makes every ui8 inside an i8 it remembers as unsigned) leaves no cast behind."""
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

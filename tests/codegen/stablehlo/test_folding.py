"""folding.fold_splat_constants: converts, reshapes and broadcasts of splat constants
become constants, each value cast as `stablehlo.convert` casts it."""
from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo as stablehlo

from blade.codegen.stablehlo.folding import fold_splat_constants

MODULE = """
func.func @main() -> (tensor<4x1xf32>, tensor<2xi32>, tensor<2xi1>, tensor<3xf32>,
                      tensor<2xi32>, tensor<2xi8>) {
  %count = arith.constant dense<768> : tensor<1xi64>
  %as_float = stablehlo.convert %count : (tensor<1xi64>) -> tensor<1xf32>
  %scalar = stablehlo.reshape %as_float : (tensor<1xf32>) -> tensor<f32>
  %rows = stablehlo.broadcast_in_dim %scalar, dims = [] : (tensor<f32>) -> tensor<4x1xf32>
  %negative = stablehlo.constant dense<-2.7> : tensor<2xf32>
  %truncated = stablehlo.convert %negative : (tensor<2xf32>) -> tensor<2xi32>
  %flag = stablehlo.convert %negative : (tensor<2xf32>) -> tensor<2xi1>
  %nan = stablehlo.constant dense<0x7FC00000> : tensor<2xf32>
  %nan_int = stablehlo.convert %nan : (tensor<2xf32>) -> tensor<2xi32>
  %big = arith.constant dense<300> : tensor<2xi64>
  %wrapped = stablehlo.convert %big : (tensor<2xi64>) -> tensor<2xi8>
  %mixed = stablehlo.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
  %kept = stablehlo.convert %mixed : (tensor<3xf32>) -> tensor<3xf32>
  return %rows, %truncated, %flag, %kept, %nan_int, %wrapped
      : tensor<4x1xf32>, tensor<2xi32>, tensor<2xi1>, tensor<3xf32>, tensor<2xi32>, tensor<2xi8>
}
"""


def test_splat_chains_fold_and_other_constants_stay():
    with ir.Context() as context:
        stablehlo.register_dialect(context)
        module = ir.Module.parse(MODULE)
        assert fold_splat_constants(module) == 5
        text = str(module)
    assert "dense<7.680000e+02> : tensor<4x1xf32>" in text
    assert "dense<-2> : tensor<2xi32>" in text         # toward zero, as convert rounds
    assert "dense<true> : tensor<2xi1>" in text
    # left to run: a non-splat constant, NaN to an integer, a value out of i8's range
    assert text.count("stablehlo.convert") == 3

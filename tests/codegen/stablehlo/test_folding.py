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


MATH = """
func.func @main(%arg0: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<2xf32>,
                                            tensor<2xf32>, tensor<2xbf16>, tensor<3xf32>,
                                            tensor<2xi32>) {
  %two = stablehlo.constant dense<2.0> : tensor<4x8xf32>
  %root = stablehlo.rsqrt %two : tensor<4x8xf32>
  %half = stablehlo.constant dense<0.5> : tensor<4x8xf32>
  %both = stablehlo.multiply %root, %half : tensor<4x8xf32>
  %scaled = stablehlo.multiply %arg0, %both : tensor<4x8xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<2xf32>
  %inf = stablehlo.rsqrt %zero : tensor<2xf32>
  %minus = stablehlo.constant dense<-1.0> : tensor<2xf32>
  %nan = stablehlo.log %minus : tensor<2xf32>
  %b = stablehlo.constant dense<3.0> : tensor<2xbf16>
  %third = stablehlo.divide %b, %b : tensor<2xbf16>
  %mixed = stablehlo.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
  %kept = stablehlo.exponential %mixed : tensor<3xf32>
  %i = stablehlo.constant dense<3> : tensor<2xi32>
  %int = stablehlo.multiply %i, %i : tensor<2xi32>
  return %scaled, %both, %inf, %nan, %third, %kept, %int
      : tensor<4x8xf32>, tensor<4x8xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xbf16>,
        tensor<3xf32>, tensor<2xi32>
}
"""


def test_float_math_of_splats_folds_and_the_rest_stays():
    """GELU's rsqrt(2) (and what multiplies it) over a whole activation folds to one splat,
    each result rounded to its element type, infinities and NaN as the ops give them;
    math of a non-splat constant, of a value, or on integers is left to run."""
    with ir.Context() as context:
        stablehlo.register_dialect(context)
        module = ir.Module.parse(MATH)
        assert fold_splat_constants(module) == 5
        text = str(module)
    assert "dense<0.353553385> : tensor<4x8xf32>" in text   # float32(0.5 / sqrt(2))
    assert "dense<0x7F800000> : tensor<2xf32>" in text      # rsqrt(0) = inf
    assert "dense<0x7FC00000> : tensor<2xf32>" in text      # log(-1) = NaN
    assert "dense<1.000000e+00> : tensor<2xbf16>" in text
    assert "stablehlo.multiply %arg0" in text
    assert "stablehlo.rsqrt" not in text and "stablehlo.log" not in text
    assert text.count("stablehlo.exponential") == 1 and "stablehlo.multiply %c" in text

"""Elementwise arithmetic, activations, math functions, selection and comparisons."""
from ..dtypes import BOOL, F32, FLOAT_SAME, FLOAT_TO_BOOL, DtypeRule
from . import builtin

# The second operand may be an integer tensor (tracing records Python scalars as 0-d int64
# tensors); type promotion makes the result float32.
builtin(["aten::add.Tensor", "aten::sub.Tensor", "aten::mul.Tensor", "aten::div.Tensor",
         "aten::rsub.Tensor"], DtypeRule(args={"other": ("float32", "int64"), "*": F32}))

builtin([
    "aten::add.Scalar", "aten::sub.Scalar", "aten::mul.Scalar", "aten::div.Scalar",
    "aten::rsub.Scalar",
    "aten::relu", "aten::sigmoid", "aten::tanh", "aten::gelu", "aten::exp", "aten::log",
    "aten::sqrt", "aten::rsqrt", "aten::neg", "aten::abs", "aten::erf", "aten::silu",
    "aten::pow.Tensor_Scalar", "aten::pow.Tensor_Tensor", "aten::reciprocal",
    "aten::maximum", "aten::minimum", "aten::clamp",
], FLOAT_SAME)

builtin(["aten::where.self"], DtypeRule(args={"condition": BOOL, "*": F32}))
builtin(["aten::masked_fill.Scalar", "aten::masked_fill.Tensor"],
        DtypeRule(args={"mask": BOOL, "*": F32}))

builtin([
    "aten::gt.Tensor", "aten::lt.Tensor", "aten::ge.Tensor", "aten::le.Tensor",
    "aten::eq.Tensor", "aten::ne.Tensor", "aten::gt.Scalar", "aten::lt.Scalar",
    "aten::ge.Scalar", "aten::le.Scalar", "aten::eq.Scalar", "aten::ne.Scalar",
], FLOAT_TO_BOOL)

"""Elementwise arithmetic, activations, math functions, selection, comparisons and casts."""
from blade.partition.dtypes import (ALL, ANY_RESULT, BOOL, BOOL_SAME, FLOATS, NUMERIC_SAME,
                                    NUMERIC_TO_BOOL, DtypeRule)
from blade.partition.converters.registration import builtin

# Arithmetic: PyTorch's type promotion applies (an int64 0-d `other`, as tracing records
# Python scalars, with a float32 `self` gives float32).
builtin([
    "aten::add.Tensor", "aten::sub.Tensor", "aten::mul.Tensor", "aten::rsub.Tensor",
    "aten::add.Scalar", "aten::sub.Scalar", "aten::mul.Scalar", "aten::rsub.Scalar",
    "aten::maximum", "aten::minimum", "aten::relu", "aten::neg", "aten::abs",
    "aten::clamp", "aten::clamp.Tensor", "aten::clamp_min", "aten::clamp_max",
], NUMERIC_SAME)

# Division and the float math family: float dtypes (true division of integers gives float,
# which the table does not claim).
builtin([
    "aten::div.Tensor", "aten::div.Scalar", "aten::div.Tensor_mode",
    "aten::sigmoid", "aten::tanh", "aten::gelu", "aten::exp", "aten::expm1", "aten::log",
    "aten::log1p", "aten::log2", "aten::sqrt", "aten::rsqrt", "aten::erf", "aten::silu",
    "aten::sin", "aten::cos", "aten::atan", "aten::sinh", "aten::cosh", "aten::floor",
    "aten::ceil", "aten::round", "aten::sign", "aten::reciprocal", "aten::hardswish",
    "aten::hardsigmoid", "aten::hardtanh", "aten::leaky_relu", "aten::elu", "aten::relu6",
    "aten::pow.Tensor_Scalar", "aten::pow.Tensor_Tensor", "aten::lerp.Scalar",
], DtypeRule(args={"other": FLOATS + ("int64",), "*": FLOATS}))

builtin(["aten::where.self", "aten::where.ScalarOther", "aten::where.ScalarSelf"],
        DtypeRule(args={"condition": BOOL, "*": ALL}))
builtin(["aten::masked_fill.Scalar", "aten::masked_fill.Tensor"],
        DtypeRule(args={"mask": BOOL, "*": ALL}))

builtin([
    "aten::gt.Tensor", "aten::lt.Tensor", "aten::ge.Tensor", "aten::le.Tensor",
    "aten::eq.Tensor", "aten::ne.Tensor", "aten::gt.Scalar", "aten::lt.Scalar",
    "aten::ge.Scalar", "aten::le.Scalar", "aten::eq.Scalar", "aten::ne.Scalar",
], NUMERIC_TO_BOOL)
builtin(["aten::isinf", "aten::isnan"], DtypeRule(args={"*": FLOATS}, result="bool"))
builtin(["aten::logical_and", "aten::logical_or", "aten::logical_xor"],
        DtypeRule(args={"*": ALL}, result="bool"))
builtin(["aten::logical_not"], DtypeRule(args={"*": ALL}, result="bool"))
builtin(["aten::bitwise_and.Tensor", "aten::bitwise_or.Tensor", "aten::bitwise_xor.Tensor",
         "aten::bitwise_not", "aten::__and__.Tensor", "aten::__or__.Tensor"], BOOL_SAME)

# Casts (a cast to another dtype is `_to_copy` once types are known: simplify.fresh_casts).
builtin(["aten::to.dtype", "aten::to.other", "aten::type_as", "aten::to.dtype_layout",
         "aten::_to_copy"], ANY_RESULT)

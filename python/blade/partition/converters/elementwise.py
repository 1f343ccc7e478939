"""Elementwise arithmetic, activations, math functions, selection, comparisons and casts."""
from typing import Optional

from blade.dtypes import (ALL, ANY_RESULT, BOOL, BOOL_SAME, FLOATS, NUMERIC_SAME,
                                    NUMERIC_TO_BOOL, DtypeRule)
from blade.partition.converters.registration import builtin
from blade.dtypes import define
from blade.partition.registry import BUILTIN_PRIORITY, REGISTRY, Converter

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

# Casts (a cast to another dtype is `_to_copy` once types are known: typed_rewrites.fresh_casts).
builtin(["aten::to.dtype", "aten::to.other", "aten::type_as", "aten::to.dtype_layout",
         "aten::_to_copy"], ANY_RESULT)

# fmod: Torch-MLIR lowers a float fmod as a - b * trunc(a / b), which rounds a / b (wrong by
# up to a whole b once the quotient passes float32's 2**24, NaN where b is inf). Floats go
# to StableHLO's exact remainder (C's fmod); integers to Torch-MLIR's lowering (whose zero
# divisors codegen/linalg/integer_division.py reports).
define(["aten::fmod.Tensor"], NUMERIC_SAME)


def _float_result(node) -> Optional[str]:
    dtype = node.output().type().dtype()
    return None if dtype is not None and dtype.is_floating_point else \
        "integers take Torch-MLIR's lowering"


def _exact_fmod(ctx):
    from torch_mlir import ir  # not at import: a model whose code is all cached needs none

    result = ir.RankedTensorType(ctx.result_types[0])
    operands = []
    for x in ctx.operands:
        t = ir.RankedTensorType(x.type)
        if t.element_type != result.element_type:
            x = ctx.op("stablehlo.convert", [x],
                       ir.RankedTensorType.get(t.shape, result.element_type))
        if t.shape != result.shape:
            if not result.has_static_shape:
                raise ValueError(f"fmod broadcasts {t} to the dynamic shape {result}, "
                                 "which this converter does not")
            dims = ", ".join(str(d) for d in range(result.rank - t.rank, result.rank))
            x = ctx.op("stablehlo.broadcast_in_dim", [x], result,
                       {"broadcast_dimensions": f"array<i64{': ' + dims if dims else ''}>"})
        operands.append(x)
    return ctx.op("stablehlo.remainder", operands, result)


REGISTRY.register(Converter("aten::fmod.Tensor", lower=_exact_fmod, validator=_float_result,
                            priority=BUILTIN_PRIORITY + 1))
REGISTRY.register(Converter("aten::fmod.Tensor"))

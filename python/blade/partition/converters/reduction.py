"""Reductions over dims, softmax and the normalizations built from them."""
from blade.partition.dtypes import FLOATS, NUMERIC, DtypeRule
from blade.partition.registry import constant_arguments
from blade.partition.converters.registration import builtin

FLOAT_REDUCTION = DtypeRule(args={"*": FLOATS})


def _no_dtype_cast(node):
    """The optional `dtype` argument must be None: a cast inside a reduction is not lowered."""
    dtype = constant_arguments(node).get("dtype")
    if dtype is not None:
        return f"the dtype argument is {dtype}, only None is supported"
    return None


builtin(["aten::sum.dim_IntList", "aten::sum", "aten::cumsum"],
        DtypeRule(args={"*": NUMERIC}), validator=_no_dtype_cast)
builtin(["aten::mean.dim", "aten::mean", "aten::softmax.int", "aten::log_softmax.int"],
        FLOAT_REDUCTION, validator=_no_dtype_cast)
builtin(["aten::amax", "aten::amin"], DtypeRule(args={"*": NUMERIC}))
builtin(["aten::var.dim", "aten::var.correction", "aten::std.dim", "aten::std.correction",
         "aten::linalg_vector_norm", "aten::norm.ScalarOpt_dim"],
        FLOAT_REDUCTION)

# var_mean gives a tuple; a cluster returns its two tensors.
builtin(["aten::var_mean.correction", "aten::var_mean.dim"], FLOAT_REDUCTION)

# Normalizations (inference form: running statistics are constants after freezing).
builtin(["aten::layer_norm", "aten::batch_norm", "aten::group_norm"], FLOAT_REDUCTION)

"""Reductions over dims, and the normalizations built from them."""
import torch

from ..dtypes import FLOAT_SAME
from . import builtin


def _no_dtype_cast(node):
    """The optional `dtype` argument must be None: a cast inside a reduction is not lowered."""
    arguments = torch._C.parse_schema(node.schema()).arguments
    for arg, value in zip(arguments, node.inputs()):
        if arg.name == "dtype" and value.toIValue() is not None:
            return f"the dtype argument is {value.toIValue()}, only None is supported"
    return None


builtin(["aten::sum.dim_IntList", "aten::mean.dim", "aten::softmax.int",
         "aten::log_softmax.int"], FLOAT_SAME, validator=_no_dtype_cast)
builtin(["aten::amax", "aten::amin"], FLOAT_SAME)

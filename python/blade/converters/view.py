"""View-like ops. They move no data by themselves, so they do not count as compute ops."""
from ..dtypes import DtypeRule
from . import builtin

ANY_DTYPE = DtypeRule(args={"*": ("float32", "float64", "float16", "bfloat16", "int64",
                                  "int32", "bool")})

builtin([
    "aten::view", "aten::reshape", "aten::permute", "aten::transpose.int", "aten::unsqueeze",
    "aten::squeeze.dim", "aten::squeeze", "aten::expand", "aten::contiguous",
    "aten::flatten.using_ints", "aten::t",
], ANY_DTYPE, compute=False)

# List plumbing (e.g. the operands of cat); it may only join a cluster with its users.
builtin(["prim::ListConstruct"], ANY_DTYPE, compute=False)

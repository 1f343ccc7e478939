"""Shape, view, indexing and joining ops, and tensor factories.

Pure views move no data by themselves, so they do not count as compute ops.
"""
from blade.dtypes import ALL, ANY_RESULT, DtypeRule, INDICES
from blade.partition.converters.registration import builtin

ANY_DTYPE = DtypeRule(args={"*": ALL})

builtin([
    "aten::view", "aten::reshape", "aten::permute", "aten::transpose.int", "aten::unsqueeze",
    "aten::squeeze.dim", "aten::squeeze", "aten::expand", "aten::expand_as",
    "aten::contiguous", "aten::flatten.using_ints", "aten::unflatten.int", "aten::t",
    "aten::slice.Tensor", "aten::select.int", "aten::narrow", "aten::view_as",
    "aten::reshape_as",
], ANY_DTYPE, compute=False)

# List plumbing (the operands of cat, the pieces of split); it only joins a cluster together
# with its producer or users.
builtin(["prim::ListConstruct", "prim::ListUnpack"], ANY_DTYPE, compute=False)

# Sizes computed at run time (dynamic shapes): `size()` of a dynamic dim and int arithmetic
# on it, feeding reshapes and factories in the same cluster. Only such chains are accepted:
# the registry takes an int argument that is not a constant only from these.
builtin(["aten::size.int", "aten::mul.int", "aten::add.int", "aten::sub.int",
         "aten::floordiv.int", "aten::neg.int"], ANY_DTYPE, compute=False)
# Floats computed from such sizes, e.g. an attention scale 1 / sqrt(q.size(-1)) with a
# dynamic head dim: the compiled code computes them too, and an elementwise op takes one
# as its scalar (csrc/passes/duplicate_shape_arithmetic.cpp lists the same schemas).
# (Torch-MLIR has no lowering of pow or of sqrt of a float: `d ** -0.5`, `d ** 0.5` and
# `d ** -1.0` of an int are decomposed into these, other powers stay out.)
builtin(["aten::Float.int", "aten::Float.Scalar", "aten::sqrt.int", "aten::div.int",
         "aten::div.float", "aten::mul.float", "aten::mul.int_float", "aten::mul.float_int",
         "aten::add.float", "aten::sub.float"], ANY_DTYPE, compute=False)

# Ops that copy data.
builtin(["aten::cat", "aten::stack", "aten::repeat", "aten::split.Tensor",
         "aten::split_with_sizes", "aten::chunk", "aten::unbind.int", "aten::clone",
         "aten::flip", "aten::roll", "aten::tril", "aten::triu", "aten::slice_scatter",
         "aten::select_scatter"], ANY_DTYPE)
builtin(["aten::index_select", "aten::gather"], DtypeRule(args={"index": INDICES, "*": ALL}))
builtin(["aten::embedding"], DtypeRule(args={"indices": INDICES, "*": ALL}))

# Factories: no tensor operands, the dtype is an argument.
builtin(["aten::arange", "aten::arange.start", "aten::arange.start_step", "aten::full",
         "aten::zeros", "aten::ones", "aten::zeros_like", "aten::ones_like",
         "aten::full_like", "aten::new_zeros", "aten::new_ones"], ANY_RESULT)

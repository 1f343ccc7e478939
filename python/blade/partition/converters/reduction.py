"""Reductions over dims, softmax and the normalizations built from them."""
from blade.dtypes import FLOATS, NUMERIC, DtypeRule
from blade.graph_queries import constant_arguments
from blade.partition.converters.registration import builtin

FLOAT_REDUCTION = DtypeRule(args={"*": FLOATS})


def _no_dtype_cast(node):
    """The optional `dtype` argument must be None: a cast inside a reduction is not lowered."""
    dtype = constant_arguments(node).get("dtype")
    if dtype is not None:
        return f"the dtype argument is {dtype}, only None is supported"
    return None


# Scans along more elements than this call PyTorch's kernel (a kernel call, inside the
# engine): Torch-MLIR lowers a cumsum as a window reduction, in time quadratic in the
# scanned length, where the kernel's scan is linear (benchmarks/ measure where they cross).
LONGEST_COMPILED_SCAN = 256


def _short_scan(node):
    why = _no_dtype_cast(node)
    if why is not None:
        return why
    t = node.inputsAt(0).type()
    dim = constant_arguments(node).get("dim")
    if t.dim() is None or not isinstance(dim, int) or t.dim() == 0:
        return None
    length = t.symbolic_sizes()[dim]
    if length > LONGEST_COMPILED_SCAN:
        return (f"a scan along {length} elements: compiled, it takes time quadratic in the "
                f"length (up to {LONGEST_COMPILED_SCAN} are compiled)")
    return None


builtin(["aten::sum.dim_IntList", "aten::sum"], DtypeRule(args={"*": NUMERIC}),
        validator=_no_dtype_cast)
builtin(["aten::cumsum"], DtypeRule(args={"*": NUMERIC}), validator=_short_scan)
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

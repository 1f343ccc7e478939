"""Matrix products. They are compiled as calls into PyTorch's own CPU kernels through the
RAL (python/blade/codegen/kernels/matmul.py), with their elementwise neighbours
compiled around them."""
from blade.dtypes import FLOATS, DtypeRule
from blade.partition.converters.registration import builtin

builtin(["aten::linear", "aten::matmul", "aten::mm", "aten::bmm", "aten::addmm",
         "aten::baddbmm"], DtypeRule(args={"*": FLOATS}))

"""The linalg ops Blade builds, from Torch-MLIR's generated classes alone.

`torch_mlir.dialects.linalg` also loads the OpDSL and defines every named linalg op from its
YAML description: 0.06 s of a process's first compile, for ops Blade never builds (it
builds generic ops and fills). Imported as `linalg`, this module offers the same names.

Example:
    >>> from blade.codegen import linalg_ops as linalg
    >>> linalg.GenericOp, linalg.IteratorType.parallel
"""
from torch_mlir import ir
from torch_mlir.dialects._linalg_enum_gen import IteratorType, _iteratortypeenum
from torch_mlir.dialects._linalg_ops_gen import FillOp, GenericOp, IndexOp, YieldOp

__all__ = ["GenericOp", "IndexOp", "IteratorType", "YieldOp", "fill", "iterator_attribute"]


def fill(value, outs):
    """`linalg.fill` of tensor or memref `outs[0]` with scalar `value`, of its element type
    (no cast is made); the filled tensor (a memref's: None)."""
    target = outs[0]
    element = ir.ShapedType(target.type).element_type
    if value.type != element:
        raise ValueError(f"linalg.fill of a {target.type} with a {value.type}")
    tensor = isinstance(target.type, ir.RankedTensorType)
    op = FillOp([target.type] if tensor else [], [value], [target])
    block = op.regions[0].blocks.append(value.type, element)
    with ir.InsertionPoint(block):
        YieldOp([block.arguments[0]])
    return op.result if tensor else None


def iterator_attribute(kind, context):
    """The `#linalg.iterator_type<...>` attribute of `kind` (IteratorType)."""
    return _iteratortypeenum(kind, context)

"""Row gathers (index_select, embedding, indexing by a tensor) as linalg loops Blade
writes itself.

Torch-MLIR lowers these ops to `stablehlo.gather` when every size is static, and to
`stablehlo.dynamic_gather` otherwise, with the slice sizes as an operand computed at run
time. StableHLO's linalg lowering takes only the first (so in a dynamic engine the op was
left unconverted and its node stayed in TorchScript), and clamps an index outside the
table into it, where PyTorch raises an error: a wrong answer instead of an error.
`lower_gathers` rewrites each gather of either kind that takes whole slices along one
indexed dim d (slice sizes 1 at d and the operand's own size elsewhere, which is how
Torch-MLIR writes all three ops) as

    out = linalg.generic over the result's dims, reading indices[batch dims]:
              i = indices[b]; if i is outside [0, size(operand, d)): report it to the RAL
              out[r] = operand[offset dims of r, with clamp(i) at d]

A reported index makes the engine call run its TorchScript fallback, whose op raises
PyTorch's own error; the clamp keeps the read inside the table meanwhile.

`stablehlo.reverse` (flip) of a dynamic size is left unconverted too;
`lower_dynamic_reverses` writes it as out[r] = operand[r with size(d) - 1 - r_d at each
reversed dim d].
"""
from typing import Optional

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo as stablehlo
from torch_mlir.dialects import arith, func, scf, tensor

from blade.codegen import linalg_ops as linalg

from blade.codegen.ir_queries import defining_op, ops_named


# The RAL function a gather calls with an index outside its table (csrc/ral/ral_kernels.h):
# the engine call then falls back to TorchScript, whose op raises PyTorch's error.
OUT_OF_RANGE = "blade_ral_index_out_of_range"


def _constant_int(value) -> Optional[int]:
    op = defining_op(value)
    if op is None or op.name != "arith.constant":
        return None
    attr = op.attributes["value"]
    return ir.IntegerAttr(attr).value if isinstance(attr, ir.IntegerAttr) else None


def _is_size_of(value, operand, dim: int, static_size: Optional[int]) -> bool:
    """Whether `value` (an i64 slice size) is the size of `operand`'s dim `dim`."""
    if static_size is not None:
        return _constant_int(value) == static_size
    cast = defining_op(value)
    if cast is None or cast.name != "arith.index_cast":
        return False
    size = defining_op(cast.operands[0])
    return size is not None and size.name == "tensor.dim" and \
        size.operands[0] == operand and _constant_int(size.operands[1]) == dim


def _whole_slices(op, dim: int) -> bool:
    """Whether the gather's slice sizes are 1 at `dim` and whole elsewhere."""
    operand = op.operands[0]
    operand_type = ir.RankedTensorType(operand.type)
    if op.name == "stablehlo.gather":            # static sizes, as an attribute
        sizes = list(ir.DenseI64ArrayAttr(op.attributes["slice_sizes"]))
        return len(sizes) == operand_type.rank and all(
            size == 1 if d == dim else
            not operand_type.is_dynamic_dim(d) and size == operand_type.shape[d]
            for d, size in enumerate(sizes))
    sizes = defining_op(op.operands[2])
    if sizes is None or sizes.name != "tensor.from_elements" or \
            len(sizes.operands) != operand_type.rank:
        return False
    for d, size in enumerate(sizes.operands):
        if d == dim:
            if _constant_int(size) != 1:
                return False
            continue
        static = None if operand_type.is_dynamic_dim(d) else operand_type.shape[d]
        if not _is_size_of(size, operand, d, static):
            return False
    return True


def _lower_gather(op) -> bool:
    """Builds the loop nest computing `op` before it and replaces it; False, leaving it,
    when `op` is not a gather of whole slices along one dim (see the module docstring)."""
    numbers = stablehlo.GatherDimensionNumbers(op.attributes["dimension_numbers"])
    collapsed = list(numbers.collapsed_slice_dims)
    index_map = list(numbers.start_index_map)
    offset_dims = list(numbers.offset_dims)
    operand_type = ir.RankedTensorType(op.operands[0].type)
    indices_type = ir.RankedTensorType(op.operands[1].type)
    result_type = ir.RankedTensorType(op.results[0].type)
    if list(numbers.operand_batching_dims) or len(index_map) != 1 or \
            collapsed != index_map or numbers.index_vector_dim != indices_type.rank or \
            not isinstance(indices_type.element_type, ir.IntegerType):
        return False
    dim = index_map[0]
    batch_dims = [r for r in range(result_type.rank) if r not in offset_dims]
    kept = [d for d in range(operand_type.rank) if d != dim]
    if len(offset_dims) != len(kept) or len(batch_dims) != indices_type.rank or \
            not _whole_slices(op, dim):
        return False
    x, indices = op.operands[0], op.operands[1]
    element = result_type.element_type
    index = ir.IndexType.get()
    i64 = ir.IntegerType.get_signless(64)
    with ir.InsertionPoint(op), op.location:
        rows = tensor.DimOp(x, arith.ConstantOp(index, dim).result).result
        one = arith.ConstantOp(index, 1).result
        zero = arith.ConstantOp(index, 0).result
        last = arith.SubIOp(rows, one).result
        sizes = []
        for r in range(result_type.rank):
            if not result_type.is_dynamic_dim(r):
                sizes.append(result_type.shape[r])
                continue
            source, source_dim = (indices, batch_dims.index(r)) if r in batch_dims else \
                (x, kept[offset_dims.index(r)])
            sizes.append(tensor.DimOp(source, arith.ConstantOp(index, source_dim).result).result)
        empty = tensor.EmptyOp(sizes, element).result
        rank = result_type.rank
        maps = [ir.AffineMap.get(rank, 0, [ir.AffineDimExpr.get(r) for r in batch_dims]),
                ir.AffineMap.get_identity(rank)]
        generic = linalg.GenericOp(
            [result_type], [indices], [empty],
            ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]),
            ir.ArrayAttr.get([linalg.iterator_attribute(linalg.IteratorType.parallel,
                                                        op.context)] * rank))
        block = generic.regions[0].blocks.append(indices_type.element_type, element)
        with ir.InsertionPoint(block):
            i = arith.IndexCastOp(index, block.arguments[0]).result
            below = arith.CmpIOp(arith.CmpIPredicate.slt, i, zero).result
            above = arith.CmpIOp(arith.CmpIPredicate.sgt, i, last).result
            outside = scf.IfOp(arith.OrIOp(below, above).result)
            with ir.InsertionPoint(outside.then_block):
                func.CallOp([], ir.FlatSymbolRefAttr.get(OUT_OF_RANGE),
                            [arith.IndexCastOp(i64, i).result,
                             arith.IndexCastOp(i64, rows).result])
                scf.YieldOp([])
            row = arith.MinSIOp(arith.MaxSIOp(i, zero).result, last).result
            reads = [row if d == dim else linalg.IndexOp(offset_dims[kept.index(d)]).result
                     for d in range(operand_type.rank)]
            linalg.YieldOp([tensor.ExtractOp(x, reads).result])
    op.results[0].replace_all_uses_with(generic.result)
    op.erase()
    return True


def lower_gathers(module) -> int:
    """Rewrites each `stablehlo.gather` and `stablehlo.dynamic_gather` this module takes
    (see its docstring) in place; returns how many were rewritten."""
    rewritten = 0
    with module.context, ir.Location.unknown():
        for name in ("stablehlo.gather", "stablehlo.dynamic_gather"):
            for op in ops_named(module, name):
                rewritten += _lower_gather(op)
        if rewritten:
            declare_out_of_range(module)
    return rewritten


def declare_out_of_range(module) -> None:
    """Declares the RAL's OUT_OF_RANGE function in `module`, once (gathers and scatters
    both call it)."""
    if OUT_OF_RANGE in ir.SymbolTable(module.operation):
        return
    with ir.InsertionPoint(module.body):
        i64 = ir.IntegerType.get_signless(64)
        func.FuncOp(OUT_OF_RANGE, ([i64, i64], []), visibility="private")


def _lower_reverse(op) -> bool:
    """Builds the loop nest computing a reverse of dynamic size before it and replaces it;
    False for a static one, which StableHLO's lowering takes."""
    t = ir.RankedTensorType(op.results[0].type)
    if t.has_static_shape:
        return False
    dims = list(ir.DenseI64ArrayAttr(op.attributes["dimensions"]))
    x = op.operands[0]
    index = ir.IndexType.get()
    with ir.InsertionPoint(op), op.location:
        one = arith.ConstantOp(index, 1).result
        sizes, lasts = [], {}
        for d in range(t.rank):
            size = tensor.DimOp(x, arith.ConstantOp(index, d).result).result \
                if t.is_dynamic_dim(d) or d in dims else None
            if d in dims:
                lasts[d] = arith.SubIOp(size, one).result
            sizes.append(size if t.is_dynamic_dim(d) else t.shape[d])
        empty = tensor.EmptyOp(sizes, t.element_type).result
        generic = linalg.GenericOp(
            [t], [], [empty], ir.ArrayAttr.get([ir.AffineMapAttr.get(
                ir.AffineMap.get_identity(t.rank))]),
            ir.ArrayAttr.get([linalg.iterator_attribute(linalg.IteratorType.parallel,
                                                        op.context)] * t.rank))
        block = generic.regions[0].blocks.append(t.element_type)
        with ir.InsertionPoint(block):
            reads = []
            for d in range(t.rank):
                position = linalg.IndexOp(d).result
                reads.append(arith.SubIOp(lasts[d], position).result if d in dims
                             else position)
            linalg.YieldOp([tensor.ExtractOp(x, reads).result])
    op.results[0].replace_all_uses_with(generic.result)
    op.erase()
    return True


def lower_dynamic_reverses(module) -> int:
    """Rewrites each `stablehlo.reverse` of dynamic size in place (see the module
    docstring); returns how many were rewritten."""
    rewritten = 0
    with module.context, ir.Location.unknown():
        for op in ops_named(module, "stablehlo.reverse"):
            rewritten += _lower_reverse(op)
    return rewritten

"""Scatters (index_put, scatter, scatter_add, slice_scatter, select_scatter)
as loops Blade writes itself.

Torch-MLIR lowers all of these to `stablehlo.scatter`, which StableHLO's linalg lowering
does not take (the op was left unconverted and bufferization failed on it). `lower_scatters`
rewrites each scatter with one input and no batching dims, whose update computation is one
of replace, keep, add, multiply, subtract, maximum, minimum, and, or, as a serial loop nest
over the updates that carries the result tensor (it starts as the operand; bufferization
writes in place where the operand is not read again):

    for u in updates' index space:
        i = the operand index: indices[u's scatter dims, k] at scattered_dims_to_operand_dims[k],
            plus u's window dims at the operand's window dims
        if i is inside the operand: out[i] = combine(out[i], updates[u])
        else: report it to the RAL (the call runs its TorchScript fallback, whose op raises
              PyTorch's error or, for a negative index, wraps it as PyTorch does)

Serial order is what makes repeated indices right for accumulating scatters, and gives the
last update for replacing ones with repeated indices (PyTorch leaves that order undefined).
"""
from typing import Callable, List, Optional

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo as stablehlo
from torch_mlir.dialects import arith, func, scf, tensor

from blade.codegen.ir_queries import ops_named
from blade.codegen.linalg.gathers import OUT_OF_RANGE, declare_out_of_range

# Update computations by StableHLO op: arith's op for floats, signed and unsigned integers
# (None: not for that kind of type).
_COMBINERS = {
    "stablehlo.add": (arith.AddFOp, arith.AddIOp, arith.AddIOp),
    "stablehlo.multiply": (arith.MulFOp, arith.MulIOp, arith.MulIOp),
    "stablehlo.subtract": (arith.SubFOp, arith.SubIOp, arith.SubIOp),
    "stablehlo.maximum": (arith.MaximumFOp, arith.MaxSIOp, arith.MaxUIOp),
    "stablehlo.minimum": (arith.MinimumFOp, arith.MinSIOp, arith.MinUIOp),
    "stablehlo.and": (None, arith.AndIOp, arith.AndIOp),
    "stablehlo.or": (None, arith.OrIOp, arith.OrIOp),
}

Combine = Callable[[ir.Value, ir.Value], ir.Value]


def _combiner(block, element) -> Optional[Combine]:
    """The update computation of the scatter's region as a function of (current, update)
    scalars, or None when it is not one of the simple forms above."""
    current, update = block.arguments[0], block.arguments[1]
    ops = list(block.operations)
    returned = ops[-1].operands[0] if ops[-1].name == "stablehlo.return" and \
        len(ops[-1].operands) == 1 else None
    if returned is None:
        return None
    if len(ops) == 1:
        if returned == update:
            return lambda cur, upd: upd
        if returned == current:
            return lambda cur, upd: cur
        return None
    if len(ops) != 2 or ops[0].name not in _COMBINERS or ops[0].results[0] != returned:
        return None
    lhs, rhs = ops[0].operands[0], ops[0].operands[1]
    if {lhs, rhs} != {current, update} or lhs == rhs:
        return None
    if isinstance(element, ir.FloatType):
        kind = 0
    elif isinstance(element, ir.IntegerType):
        kind = 2 if element.is_unsigned else 1
    else:
        return None
    build = _COMBINERS[ops[0].name][kind]
    if build is None:
        return None
    current_first = lhs == current
    return lambda cur, upd: build(cur, upd).result if current_first else build(upd, cur).result


def _lower_scatter(op) -> bool:
    """Builds the loop nest computing `op` before it and replaces it; False, leaving it,
    when it is not a scatter this pass takes (see the module docstring)."""
    if len(op.operands) != 3 or len(op.results) != 1:
        return False
    numbers = stablehlo.ScatterDimensionNumbers(op.attributes["scatter_dimension_numbers"])
    if list(numbers.input_batching_dims) or list(numbers.scatter_indices_batching_dims):
        return False
    operand, indices, updates = op.operands
    operand_type = ir.RankedTensorType(operand.type)
    indices_type = ir.RankedTensorType(indices.type)
    updates_type = ir.RankedTensorType(updates.type)
    if not isinstance(indices_type.element_type, ir.IntegerType):
        return False
    combine = _combiner(op.regions[0].blocks[0], operand_type.element_type)
    if combine is None:
        return False
    window_dims = list(numbers.update_window_dims)
    inserted = list(numbers.inserted_window_dims)
    to_operand = list(numbers.scattered_dims_to_operand_dims)
    vector_dim = numbers.index_vector_dim
    scatter_dims = [d for d in range(updates_type.rank) if d not in window_dims]
    window_operand_dims = [d for d in range(operand_type.rank) if d not in inserted]
    if len(window_operand_dims) != len(window_dims):
        return False
    index = ir.IndexType.get()
    i64 = ir.IntegerType.get_signless(64)
    with ir.InsertionPoint(op), op.location:
        zero = arith.ConstantOp(index, 0).result
        one = arith.ConstantOp(index, 1).result
        operand_sizes = [tensor.DimOp(operand, arith.ConstantOp(index, d).result).result
                         for d in range(operand_type.rank)]
        update_sizes = [tensor.DimOp(updates, arith.ConstantOp(index, d).result).result
                        for d in range(updates_type.rank)]
        positions = [arith.ConstantOp(index, k).result for k in range(len(to_operand))]

        def body(carried, ivs: List[ir.Value]) -> ir.Value:
            """One update: the result tensor after it."""
            batch = [ivs[d] for d in scatter_dims]
            start = {}
            for k, operand_dim in enumerate(to_operand):
                read = list(batch)
                if vector_dim < indices_type.rank:
                    read.insert(vector_dim, positions[k])
                start[operand_dim] = arith.IndexCastOp(
                    index, tensor.ExtractOp(indices, read).result).result
            target = []
            for d in range(operand_type.rank):
                value = start.get(d, zero)
                if d in window_operand_dims:
                    window = ivs[window_dims[window_operand_dims.index(d)]]
                    value = window if d not in start else arith.AddIOp(value, window).result
                target.append(value)
            inside = None
            for d in sorted(start):
                fits = arith.AndIOp(
                    arith.CmpIOp(arith.CmpIPredicate.sge, target[d], zero).result,
                    arith.CmpIOp(arith.CmpIPredicate.slt, target[d], operand_sizes[d]).result
                ).result
                inside = fits if inside is None else arith.AndIOp(inside, fits).result
            if inside is None:  # no index read: always inside
                return _update(carried, target, updates, ivs, combine)
            branch = scf.IfOp(inside, [carried.type], has_else=True)
            with ir.InsertionPoint(branch.then_block):
                scf.YieldOp([_update(carried, target, updates, ivs, combine)])
            with ir.InsertionPoint(branch.else_block):
                outside = min(start)  # reported; the fallback raises PyTorch's error
                func.CallOp([], ir.FlatSymbolRefAttr.get(OUT_OF_RANGE),
                            [arith.IndexCastOp(i64, target[outside]).result,
                             arith.IndexCastOp(i64, operand_sizes[outside]).result])
                scf.YieldOp([carried])
            return branch.results[0]

        def nest(carried, ivs: List[ir.Value]) -> ir.Value:
            if len(ivs) == updates_type.rank:
                return body(carried, ivs)
            loop = scf.ForOp(zero, update_sizes[len(ivs)], one, [carried])
            with ir.InsertionPoint(loop.body):
                scf.YieldOp([nest(loop.inner_iter_args[0], ivs + [loop.induction_variable])])
            return loop.results[0]

        result = nest(operand, [])
    op.results[0].replace_all_uses_with(result)
    op.erase()
    return True


def _update(carried, target, updates, ivs, combine: Combine) -> ir.Value:
    current = tensor.ExtractOp(carried, target).result
    new = combine(current, tensor.ExtractOp(updates, ivs).result)
    return tensor.InsertOp(new, carried, target).result


def lower_scatters(module) -> int:
    """Rewrites each `stablehlo.scatter` this module takes (see its docstring) in place;
    returns how many were rewritten."""
    rewritten = 0
    with module.context, ir.Location.unknown():
        for op in ops_named(module, "stablehlo.scatter"):
            rewritten += _lower_scatter(op)
        if rewritten:
            declare_out_of_range(module)
    return rewritten

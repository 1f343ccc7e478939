"""Reductions that reduce nothing, written without `stablehlo.reduce`.

StableHLO's linalg lowering leaves these reduces unconverted (bufferization then fails on
them, and the cluster fell back): one over no dims (`sum(x, 0)` of a 0-d x, whose dim 0 is
the scalar itself), one over a dim of size 0 (the sum of an empty tensor) and one whose
result is empty. The first applies the update computation once, to the init value and
each element: `op(broadcast(init), x)`; the others are the init value everywhere. Only
reduces of one operand whose update computation is one binary op of its two arguments
are rewritten; the rest are left as they are.
"""
from torch_mlir import ir

from blade.codegen.ir_queries import ops_named


def _binary_body(op):
    """The update computation's op name and whether it takes (accumulator, element) in
    that order, or None."""
    block = op.regions[0].blocks[0]
    ops = list(block.operations)
    if len(ops) != 2 or ops[1].name != "stablehlo.return" or len(ops[0].operands) != 2 or \
            ops[1].operands[0] != ops[0].results[0]:
        return None
    accumulator, element = block.arguments[0], block.arguments[1]
    lhs, rhs = ops[0].operands
    if (lhs, rhs) == (accumulator, element):
        return ops[0].name, True
    if (lhs, rhs) == (element, accumulator):
        return ops[0].name, False
    return None


def _rewrite(op) -> bool:
    if len(op.operands) != 2 or len(op.results) != 1:
        return False
    operand, init = op.operands
    operand_type = ir.RankedTensorType(operand.type)
    result_type = ir.RankedTensorType(op.results[0].type)
    dims = list(ir.DenseI64ArrayAttr(op.attributes["dimensions"]))
    empty = any(not ir.ShapedType.is_dynamic_size(operand_type.shape[d]) and
                operand_type.shape[d] == 0 for d in dims) or \
        (result_type.has_static_shape and 0 in result_type.shape)
    if dims and not empty:
        return False
    body = _binary_body(op)
    if not dims and body is None:
        return False
    if not result_type.has_static_shape:
        return False
    with ir.InsertionPoint(op), op.location:
        filled = ir.Operation.create(
            "stablehlo.broadcast_in_dim", results=[result_type], operands=[init],
            attributes={"broadcast_dimensions": ir.DenseI64ArrayAttr.get([])}).result
        if dims:    # nothing to combine, or no result
            result = filled
        else:
            name, accumulator_first = body
            pair = [filled, operand] if accumulator_first else [operand, filled]
            result = ir.Operation.create(name, results=[result_type], operands=pair).result
    op.results[0].replace_all_uses_with(result)
    op.erase()
    return True


def simplify_degenerate_reductions(module) -> int:
    """Rewrites the reduces above in place; returns how many."""
    rewritten = 0
    with module.context, ir.Location.unknown():
        for op in ops_named(module, "stablehlo.reduce"):
            rewritten += _rewrite(op)
    return rewritten

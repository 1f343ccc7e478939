"""Slices move above the elementwise ops they take apart.

A fused QKV projection adds its bias to the whole [tokens, 3 * dim] product and then
slices it into q, k and v, each reshaped and transposed into heads:

    %qkv = add(dot, broadcast(bias))                %q = add(slice(dot), broadcast(slice(bias)))
    %q = slice(%qkv)[..., 0:768]          ==>       %k = add(slice(dot), broadcast(slice(bias)))
    %k = slice(%qkv)[..., 768:1536]                 ...

Before, the add is a loop nest of its own that writes the whole product once more, and the
slices are views of that copy. After, each slice of the product is a view of the matmul's
output, and the add fuses into the loop that consumes the slice (the transpose into heads),
so the bias costs no pass over memory of its own. The rewrite applies to an elementwise op
only when slices are all that read it and they take no element twice (no work is repeated),
and repeats up a chain of such ops.
"""
from typing import List, Optional

from torch_mlir import ir

from blade.codegen.ir_queries import as_operation, producer
from blade.codegen.stablehlo.layouts import ELEMENTWISE

_SLICE = "stablehlo.slice"


def _i64s(op, name: str) -> List[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes[name]))


def _ranges(op) -> List[tuple]:
    """(start, limit, stride) per dim of the static slice `op`."""
    return list(zip(_i64s(op, "start_indices"), _i64s(op, "limit_indices"),
                    _i64s(op, "strides")))


def _extents(ranges) -> List[int]:
    """The sizes a slice of these (start, limit, stride) ranges has."""
    return [max(0, (limit - start + stride - 1) // stride) for start, limit, stride in ranges]


def _slice_count(op) -> int:
    """How many elements the static slice `op` takes."""
    count = 1
    for extent in _extents(_ranges(op)):
        count *= extent
    return count


def _slices_only(op) -> Optional[List]:
    """The slices reading the result of elementwise `op`, when they are all its users and
    take at most its element count between them; None otherwise."""
    users = [as_operation(use.owner) for use in op.results[0].uses]
    if not users or any(user.name != _SLICE for user in users):
        return None
    shape = ir.RankedTensorType(op.results[0].type)
    if not shape.has_static_shape:
        return None
    total = 1
    for size in shape.shape:
        total *= size
    if sum(_slice_count(user) for user in users) > total:
        return None
    return users


def _sliced(value, like, result_type):
    """`value` (of the sliced op's shape) sliced as the slice `like`: a broadcast becomes a
    broadcast of a slice of its source (the bias row is sliced, not the broadcast tensor),
    anything else a slice of it."""
    ranges = _ranges(like)
    element = ir.RankedTensorType(value.type).element_type
    shape = list(ir.RankedTensorType(result_type).shape)
    broadcast = producer(value, "stablehlo.broadcast_in_dim")
    if broadcast is not None:
        source = broadcast.operands[0]
        source_shape = list(ir.RankedTensorType(source.type).shape)
        dims = list(ir.DenseI64ArrayAttr(broadcast.attributes["broadcast_dimensions"]))
        kept = [(0, 1, 1) if source_shape[k] == 1 else ranges[d] for k, d in enumerate(dims)]
        small = _slice(source, kept, element)
        return ir.Operation.create(
            "stablehlo.broadcast_in_dim",
            results=[ir.RankedTensorType.get(shape, element)], operands=[small],
            attributes={"broadcast_dimensions": broadcast.attributes["broadcast_dimensions"]}
        ).result
    return _slice(value, ranges, element)


def _slice(value, ranges, element):
    if all(start == 0 and limit == size and stride == 1 for (start, limit, stride), size
           in zip(ranges, ir.RankedTensorType(value.type).shape)):
        return value
    return ir.Operation.create(
        _SLICE, results=[ir.RankedTensorType.get(_extents(ranges), element)], operands=[value],
        attributes={"start_indices": ir.DenseI64ArrayAttr.get([r[0] for r in ranges]),
                    "limit_indices": ir.DenseI64ArrayAttr.get([r[1] for r in ranges]),
                    "strides": ir.DenseI64ArrayAttr.get([r[2] for r in ranges])}).result


def _sink(op) -> bool:
    slices = _slices_only(op)
    if slices is None:
        return False
    element = ir.RankedTensorType(op.results[0].type).element_type
    for user in slices:
        with ir.InsertionPoint(user), user.location:
            result_type = user.results[0].type
            operands = [_sliced(operand, user, result_type) for operand in op.operands]
            copy = ir.Operation.create(
                op.name, results=[ir.RankedTensorType.get(
                    ir.RankedTensorType(result_type).shape, element)],
                operands=operands,
                attributes={a.name: a.attr for a in op.attributes})
        user.results[0].replace_all_uses_with(copy.results[0])
        user.erase()
    op.erase()
    return True


def sink_slices(module, main) -> int:
    """The rewrite of the module docstring on function `main` (StableHLO, static shapes);
    returns how many elementwise ops were split into their slices.

    Example:
        >>> sink_slices(module, main)   # add(dot, bias) read by 3 slices -> 3 adds
        1
    """
    block = main.regions[0].blocks[0]
    count = 0
    with module.context:
        changed = True
        while changed:
            changed = False
            for op in reversed(list(block.operations)):
                if op.name in ELEMENTWISE and len(op.results) == 1 and _sink(op):
                    count += 1
                    changed = True
                    break
    return count

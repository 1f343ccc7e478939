"""Questions about MLIR values that several code generation steps ask (library calls,
attention, layouts, shape assumptions, pooling, gathers): which op produced a value, which
ops use it, and which ops have a name; the shape of a linalg loop nest (its outputs, its
iterators) and the strides of a memref type; and the cloning of ops those steps rebuild."""
from typing import List, Optional

from torch_mlir import ir

from blade.codegen.linalg_ops import IteratorType, iterator_attribute


def as_operation(op):
    """The generic Operation of an op view (ops compare equal only in that form)."""
    return op.operation if hasattr(op, "operation") else op


def defining_op(value):
    """The op that defines `value` (as an Operation), or None for a block argument."""
    owner = value.owner
    return None if isinstance(owner, ir.Block) else as_operation(owner)


# Ops that read only the shape of their operand, not its data.
SHAPE_QUERIES = ("shape.shape_of", "tensor.dim")


def only_data_user(value):
    """The one op that reads the data of `value` (shape queries aside), or None when no op
    or several do."""
    users = [as_operation(use.owner) for use in value.uses
             if as_operation(use.owner).name not in SHAPE_QUERIES]
    return users[0] if len(users) == 1 else None


def producer(value, name: str):
    """The op named `name` that defines `value`, or None (a block argument, another op).

    Example:
        >>> transpose = producer(operand, "stablehlo.transpose")
    """
    op = defining_op(value)
    return op if op is not None and op.name == name else None


def rank_of(value) -> int:
    """The rank of a value of shaped type (a tensor, a memref)."""
    return ir.ShapedType(value.type).rank


def i64_array(attr) -> List[int]:
    """The integers of a DenseI64ArrayAttr (a transpose's permutation, a broadcast's dims).

    Example:
        >>> i64_array(transpose.attributes["permutation"])
        [0, 2, 1]
    """
    return list(ir.DenseI64ArrayAttr(attr))


def output_count(op) -> int:
    """How many of a linalg structured op's operands are outputs (`outs`), the last ones."""
    return list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))[-1]




def parallel_loops(op) -> List[bool]:
    """Per loop of a linalg structured op, whether it is parallel (else it reduces)."""
    parallel = iterator_attribute(IteratorType.parallel, op.context)
    return [a == parallel for a in ir.ArrayAttr(op.attributes["iterator_types"])]


def all_parallel(op) -> bool:
    """Whether every loop of a linalg structured op is parallel (none reduces)."""
    return all(parallel_loops(op))


def dims_used(expr) -> List[int]:
    """The loop dims an affine expression reads, with repeats (`d0 * 2 + d0`: [0, 0])."""
    if isinstance(expr, ir.AffineDimExpr):
        return [expr.position]
    if isinstance(expr, ir.AffineBinaryExpr):
        return dims_used(expr.lhs) + dims_used(expr.rhs)
    return []


def strides_of(memref_type) -> Optional[List[int]]:
    """The strides of a memref type of identity or strided layout, some possibly dynamic;
    None for any other layout.

    Example:
        >>> strides_of(ir.MemRefType.parse("memref<4x8xf32>"))
        [8, 1]
    """
    try:
        return list(ir.MemRefType(memref_type).get_strides_and_offset()[0])
    except (ValueError, RuntimeError):
        return None


def map_dims(map_attr) -> Optional[List[Optional[int]]]:
    """Per result of an indexing map: its loop dim, or None for a constant; None when a
    result is anything else.

    Example:
        >>> map_dims(ir.AffineMapAttr.get(ir.AffineMap.get_permutation([2, 0, 1])))
        [2, 0, 1]
    """
    results = []
    for expr in ir.AffineMapAttr(map_attr).value.results:
        if isinstance(expr, ir.AffineDimExpr):
            results.append(expr.position)
        elif isinstance(expr, ir.AffineConstantExpr):
            results.append(None)
        else:
            return None
    return results


def identity_layout(memref_type) -> bool:
    """Whether a memref type has the identity (row-major, unstrided) layout."""
    layout = memref_type.layout
    return isinstance(layout, ir.AffineMapAttr) and \
        layout.value == ir.AffineMap.get_identity(memref_type.rank)


def loop_bounds(op, maps) -> List:
    """Per loop of linalg op `op` on memrefs (`maps` its indexing maps), where its extent
    is read: (operand index, position, size), the size static or
    ir.ShapedType.get_dynamic_size(); a static source is preferred. None for a loop no
    operand indexes by itself.

    Example:
        >>> loop_bounds(add, maps)   # ins(%a : memref<?x64xf32>, %b : memref<8x64xf32>)
        [(1, 0, 8), (0, 1, 64)]
    """
    loops = len(ir.ArrayAttr(op.attributes["iterator_types"]))
    bounds = [None] * loops
    dynamic = ir.ShapedType.get_dynamic_size()
    for index, (operand, map_attr) in enumerate(zip(op.operands, maps)):
        shape = ir.MemRefType(operand.type).shape
        for position, expr in enumerate(ir.AffineMapAttr(map_attr).value.results):
            if isinstance(expr, ir.AffineDimExpr):
                loop = expr.position
                if bounds[loop] is None or (bounds[loop][2] == dynamic and
                                            shape[position] != dynamic):
                    bounds[loop] = (index, position, shape[position])
    return bounds


def contiguous_loop(value, results) -> Optional[int]:
    """The loop along which `value` (a memref indexed by `results`, as map_dims gives them)
    is contiguous: the one indexing its last dim of size > 1, when that dim has unit stride.

    Example:
        >>> contiguous_loop(x, [0, 3, 1, 2])   # x: memref<4x64x56x56xf32>, read as NHWC
        2
    """
    t = ir.MemRefType(value.type)
    strides = strides_of(t)
    if strides is None:
        return None
    for dim in range(t.rank - 1, -1, -1):
        if t.shape[dim] == 1:
            continue
        return results[dim] if strides[dim] == 1 else None
    return None


_VIEW_OPS = ("memref.expand_shape", "memref.collapse_shape", "memref.subview", "memref.cast",
             "memref.reinterpret_cast")


def root_buffer(value):
    """The buffer a memref value views (through reshapes, subviews and casts).

    Example:
        >>> root_buffer(subview_of_alloc) == alloc
        True
    """
    while True:
        owner = value.owner
        if isinstance(owner, ir.Block):
            return value
        op = owner.operation if hasattr(owner, "operation") else owner
        if op.name not in _VIEW_OPS:
            return value
        value = op.operands[0]


def ops_named(module, name: str) -> list:
    """Every op named `name` in `module` (a module or an op, itself included), in walk
    order.

    Example:
        >>> reshapes = ops_named(module, "stablehlo.dynamic_reshape")
    """
    found = []

    def visit(op):
        if op.name == name:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def clone_ops(operations, mapping: dict) -> dict:
    """Clones `operations` in order at the current insertion point, each reading the clone
    of a value `mapping` maps (block arguments of the source, say, or earlier clones), in
    the ops of its regions too (a loop body reading a value defined before the loop);
    returns `mapping` with the results of every clone added."""
    for original in operations:
        copy = as_operation(original).clone()
        remap_operands(copy, mapping)
        mapping.update(zip(original.results, copy.results))
    return mapping


def remap_operands(op, mapping: dict) -> None:
    """Makes `op` and every op in its regions read `mapping[v]` wherever they read a
    value `v` that `mapping` has, in one walk."""
    def remap(inner):
        for i, operand in enumerate(inner.operands):
            if operand in mapping:
                inner.operands[i] = mapping[operand]
        return ir.WalkResult.ADVANCE

    as_operation(op).walk(remap)

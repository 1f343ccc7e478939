"""What a dynamic engine may assume about its shapes, written into the StableHLO.

Torch-MLIR lowers a broadcasting op on `?` dims defensively: a `shape.cstr_broadcastable`
check, a `shape.assuming` region, and `stablehlo.dynamic_broadcast_in_dim` ops that do not
know whether a `?` dim is stretched from 1. StableHLO's linalg lowering cannot make plain
loops of those, and the checks split fusion regions.

A Blade engine knows more. Its dynamic dims come from the example inputs resized, and
two dynamic dims that meet in a broadcast had equal sizes in every run (otherwise the
model itself failed on the resized inputs and the dims stayed static), so they share a
shape symbol and the engine's guard makes every call keep them equal (csrc/ral/
tensor_spec.h). Hence: every broadcast in a cluster is valid (the constraints are
removed by `remove-shape-constraints` in blade.codegen.pipeline), and an
operand dim is stretched exactly when it is a static 1 in a result dim that is not.
"""
import math

from torch_mlir import ir

from blade.codegen.ir_queries import ops_named, producer
from torch_mlir.dialects import arith, tensor


def annotate_broadcasts(module) -> int:
    """Marks each dynamic_broadcast_in_dim's expanding and non-expanding operand dims;
    returns how many ops were marked."""
    targets = ops_named(module, "stablehlo.dynamic_broadcast_in_dim")
    with module.context:
        for op in targets:
            operand = ir.RankedTensorType(op.operands[0].type)
            result = ir.RankedTensorType(op.results[0].type)
            mapping = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
            expanding, nonexpanding = [], []
            for i, target in enumerate(mapping):
                stretched = (not operand.is_dynamic_dim(i) and operand.shape[i] == 1 and
                             (result.is_dynamic_dim(target) or result.shape[target] != 1))
                (expanding if stretched else nonexpanding).append(i)
            op.attributes["known_expanding_dimensions"] = ir.DenseI64ArrayAttr.get(expanding)
            op.attributes["known_nonexpanding_dimensions"] = \
                ir.DenseI64ArrayAttr.get(nonexpanding)
    return len(targets)


def drop_identity_broadcasts(module) -> int:
    """Replaces each dynamic_broadcast_in_dim whose result has its operand's type, with the
    dims in order, by the operand: no dim of it is stretched (a static 1 stays a static 1),
    so under the assumptions above it copies nothing. Torch-MLIR wraps every operand of a
    broadcasting op of dynamic shape in one, which hides the producer of each operand from
    the rewrites that follow (layouts.py, attention.py). So does a dynamic_reshape whose
    sizes are provably its operand's own: replaced by the operand too. Returns how many
    were dropped."""
    dropped = 0
    with module.context:
        for op in ops_named(module, "stablehlo.dynamic_broadcast_in_dim"):
            operand, result = op.operands[0], op.results[0]
            dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
            if operand.type == result.type and dims == list(range(len(dims))):
                result.replace_all_uses_with(operand)
                op.erase()
                dropped += 1
        # A dynamic_reshape to its operand's own sizes (the importer's, after an attention's
        # last product) hides that product from the transpose after it (attention.py).
        for op in ops_named(module, "stablehlo.dynamic_reshape"):
            operand, result = op.operands[0], op.results[0]
            if operand.type != result.type:
                continue
            t = ir.RankedTensorType(result.type)
            passed = passed_through(operand, op.operands[1], t.rank)
            if any(t.is_dynamic_dim(d) and passed[d] != d for d in range(t.rank)):
                continue
            shape = op.operands[1]
            result.replace_all_uses_with(operand)
            op.erase()
            _erase_unused(shape)
            dropped += 1
    return dropped


# The ops that build a reshape's sizes: dropped with it when nothing else reads them.
_SIZE_OPS = ("tensor.from_elements", "arith.index_cast", "tensor.dim")


def _erase_unused(value) -> None:
    """Erases the op defining `value`, and then those of its operands, while each is one
    of _SIZE_OPS and nothing reads its result."""
    op = value.owner
    if isinstance(op, ir.Block):
        return
    op = op.operation if hasattr(op, "operation") else op
    if op.name not in _SIZE_OPS or any(True for _ in op.results[0].uses):
        return
    operands = list(op.operands)
    op.erase()
    for operand in operands:
        _erase_unused(operand)


def _constant_int(value):
    constant = producer(value, "arith.constant")
    return None if constant is None else ir.IntegerAttr(constant.attributes["value"]).value


def passed_through(source, shape, rank: int):
    """Per result dim of a `dynamic_reshape(source, shape)`, the source dim whose run-time
    size it provably has (`shape` is built from `tensor.dim(source, i)`, as the importer
    writes it for dims that keep their shape symbol), else None."""
    elements = producer(shape, "tensor.from_elements")
    if elements is None or len(elements.operands) != rank:
        return [None] * rank
    found = []
    for element in elements.operands:
        cast = producer(element, "arith.index_cast")
        size = producer(cast.operands[0] if cast is not None else element, "tensor.dim")
        found.append(None if size is None else
                     _dim_of(source, size.operands[0], _constant_int(size.operands[1])))
    return found


def _dim_of(source, value, dim):
    """The dim of `source` that has the size of `value`'s dim `dim`: the same dim of the
    same value, or a kept dim of the operand `source` was reduced from (a keepdim
    reduction's reshape names its sizes from the reduction's input). Else None."""
    if dim is None:
        return None
    if value == source:
        return dim
    reduce = producer(source, "stablehlo.reduce")
    if reduce is None or len(reduce.results) != 1 or reduce.operands[0] != value:
        return None
    reduced = list(ir.DenseI64ArrayAttr(reduce.attributes["dimensions"]))
    return None if dim in reduced else dim - sum(1 for r in reduced if r < dim)


def reassociation(source_dims, result_dims, passed):
    """Groups of source dims and of result dims, pairwise of equal element count, that
    turn a row-major reshape into a collapse and an expansion touching only the dims that
    change. `*_dims` are static sizes or None (dynamic); `passed[j]` is the source dim
    that result dim j is known to equal. None when the sizes do not prove a grouping."""
    groups_src, groups_res = [], []
    pending_src, pending_res = [], []
    i = j = 0
    n, m = len(source_dims), len(result_dims)
    while i < n and j < m:
        a, b = source_dims[i], result_dims[j]
        if (a is None and b is None and passed[j] == i) or \
                (a is not None and a == b):
            groups_src.append(pending_src + [i])
            groups_res.append(pending_res + [j])
            pending_src, pending_res = [], []
            i, j = i + 1, j + 1
            continue
        if a == 1:
            pending_src.append(i)
            i += 1
            continue
        if b == 1:
            pending_res.append(j)
            j += 1
            continue
        if a is None or b is None:
            return None
        group_src, group_res, left, right = [i], [j], a, b
        while left != right:
            if left < right:
                i += 1
                if i >= n or source_dims[i] is None:
                    return None
                group_src.append(i)
                left *= source_dims[i]
            else:
                j += 1
                if j >= m or result_dims[j] is None:
                    return None
                group_res.append(j)
                right *= result_dims[j]
        groups_src.append(pending_src + group_src)
        groups_res.append(pending_res + group_res)
        pending_src, pending_res = [], []
        i, j = i + 1, j + 1
    rest_src, rest_res = pending_src + list(range(i, n)), pending_res + list(range(j, m))
    if any(source_dims[d] != 1 for d in rest_src) or \
            any(result_dims[d] != 1 for d in rest_res) or not groups_src:
        return None
    groups_src[-1] += rest_src
    groups_res[-1] += rest_res
    return groups_src, groups_res


def lower_dynamic_reshapes(module) -> int:
    """Rewrites each `stablehlo.dynamic_reshape` (a view of dynamic size) as a collapse of
    its operand and an expansion to the result's sizes, read from the shape operand:
    StableHLO's linalg lowering leaves most dynamic reshapes unconverted. Dims that provably
    pass through unchanged (see `passed_through`) and static groups of equal element count
    are grouped apart, so a strided operand stays a view; otherwise the operand collapses
    to one dimension, which copies it unless it is contiguous. Returns how many were
    rewritten."""

    targets = ops_named(module, "stablehlo.dynamic_reshape")
    dynamic = ir.ShapedType.get_dynamic_size()
    rewritten = 0
    with module.context:
        index = ir.IndexType.get()
        i64 = ir.IntegerType.get_signless(64)

        def groups_attr(groups):
            return ir.ArrayAttr.get([ir.ArrayAttr.get(
                [ir.IntegerAttr.get(i64, d) for d in group]) for group in groups])

        def sizes_of(t):
            return [None if t.is_dynamic_dim(d) else t.shape[d] for d in range(t.rank)]

        for op in targets:
            source, shape = op.operands[0], op.operands[1]
            source_type = ir.RankedTensorType(source.type)
            result_type = ir.RankedTensorType(op.results[0].type)
            if result_type.rank == 0 or source_type.rank == 0:
                continue  # a scalar has no dynamic size; left to StableHLO
            source_dims, result_dims = sizes_of(source_type), sizes_of(result_type)
            grouping = reassociation(source_dims, result_dims,
                                     passed_through(source, shape, result_type.rank))
            if grouping is None:
                grouping = [list(range(source_type.rank))], [list(range(result_type.rank))]
            groups_src, groups_res = grouping
            with ir.InsertionPoint(op), op.location:
                collapsed = source
                if len(groups_src) != source_type.rank:
                    middle = []
                    for group in groups_src:
                        sizes = [source_dims[d] for d in group]
                        middle.append(dynamic if None in sizes else math.prod(sizes))
                    middle_type = ir.RankedTensorType.get(middle, source_type.element_type)
                    collapsed = tensor.CollapseShapeOp(middle_type, source,
                                                       groups_attr(groups_src)).result
                sizes = []
                for d in range(result_type.rank):
                    if result_dims[d] is not None:
                        continue
                    position = arith.ConstantOp(index, ir.IntegerAttr.get(index, d)).result
                    size = tensor.ExtractOp(shape, [position]).result
                    if not isinstance(size.type, ir.IndexType):
                        size = arith.IndexCastOp(index, size).result
                    sizes.append(size)
                static = [dynamic if s is None else s for s in result_dims]
                if len(groups_res) != result_type.rank:
                    result = tensor.ExpandShapeOp(result_type, collapsed,
                                                  groups_attr(groups_res), sizes,
                                                  static).result
                elif collapsed.type != result_type:
                    result = tensor.CastOp(result_type, collapsed).result
                else:
                    result = collapsed
            op.results[0].replace_all_uses_with(result)
            op.erase()
            rewritten += 1
    return rewritten


def _factors(value, op_name: str):
    """The operands of a tree of `op_name` ops (arith.muli) that computes `value`."""
    multiply = producer(value, op_name)
    if multiply is None:
        return [value]
    return _factors(multiply.operands[0], op_name) + _factors(multiply.operands[1], op_name)


def _size_of(value):
    """(tensor, dim) when `value` is `tensor.dim(tensor, dim)`, maybe index_cast; else None."""
    cast = producer(value, "arith.index_cast")
    size = producer(cast.operands[0] if cast is not None else value, "tensor.dim")
    if size is None:
        return None
    dim = _constant_int(size.operands[1])
    return None if dim is None else (size.operands[0], dim)


def _element_count_of(value):
    """The tensor whose element count `value` is (`num_elements(shape_of(t))`), else None."""
    cast = producer(value, "arith.index_cast")
    count = producer(cast.operands[0] if cast is not None else value, "shape.num_elements")
    shape = None if count is None else producer(count.operands[0], "shape.shape_of")
    return None if shape is None else shape.operands[0]


def divide_out_sizes(module) -> int:
    """Rewrites `numel(t) / (product of some of t's sizes)` as the product of t's other
    sizes. Torch-MLIR computes the size a flatten or a view by -1 infers that way, which
    divides by zero (SIGFPE) when another dim of t is 0 (an empty batch), where PyTorch
    gives the product of the dims merged. Returns how many divisions were rewritten."""

    rewritten = 0
    with module.context:
        index = ir.IndexType.get()
        for name in ("arith.divui", "arith.divsi"):
            for op in ops_named(module, name):
                source = _element_count_of(op.operands[0])
                if source is None:
                    continue
                source_type = ir.RankedTensorType(source.type)
                remaining = list(range(source_type.rank))
                for factor in _factors(op.operands[1], "arith.muli"):
                    size = _size_of(factor)
                    constant = _constant_int(factor)
                    if size is not None and size[0] == source and size[1] in remaining:
                        remaining.remove(size[1])
                        continue
                    static = [d for d in remaining if not source_type.is_dynamic_dim(d) and
                              source_type.shape[d] == constant]
                    if constant is None or not static:
                        remaining = None
                        break
                    remaining.remove(static[0])
                if remaining is None:
                    continue
                result_type = op.results[0].type
                with ir.InsertionPoint(op), op.location:
                    product = arith.ConstantOp(result_type,
                                               ir.IntegerAttr.get(result_type, 1)).result
                    for d in remaining:
                        position = arith.ConstantOp(index, ir.IntegerAttr.get(index, d)).result
                        size = tensor.DimOp(source, position).result
                        if size.type != result_type:
                            size = arith.IndexCastOp(result_type, size).result
                        product = arith.MulIOp(product, size).result
                op.results[0].replace_all_uses_with(product)
                op.erase()
                rewritten += 1
    return rewritten

"""Concatenations become copies into slices of one buffer.

StableHLO's linalg lowering makes `stablehlo.concatenate` one loop nest over the result
that picks its source per element: a compare and a branch for every element, which LLVM
cannot vectorize. A U-Net's skip concatenation (NHWC, along C) then costs more than the
upsampling that feeds it. Written as inserted slices instead,

    %cat = concatenate(%skip, %up) dim 3    ==>    %e = tensor.empty(...)
                                                   %0 = insert_slice %skip into %e[0,0,0,0]
                                                   %cat = insert_slice %up into %0[0,0,0,32]

each operand is one strided copy into its part of the buffer (memref.copy, which the RAL
does as memcpy of the runs both sides store contiguously), and an operand the engine
computes itself in a loop nest is written straight into its part: bufferization's empty
tensor elimination gives that loop nest the slice as its output, so it is not copied at all.
"""
from torch_mlir import ir
from torch_mlir.dialects import arith, tensor

from blade.codegen import linalg_ops as linalg

from blade.codegen.ir_queries import all_parallel, clone_ops, ops_named, producer


def _size(value, dim: int):
    """The extent of `value` along `dim`: an int when static, else a tensor.dim value."""
    shape = ir.RankedTensorType(value.type)
    if not shape.is_dynamic_dim(dim):
        return shape.shape[dim]
    return tensor.DimOp(value, _index(dim)).result


def _index(value):
    """`value` (an int or an index value) as an index value."""
    if isinstance(value, int):
        return arith.ConstantOp(ir.IndexType.get(), value).result
    return value


def _add(a, b):
    """a + b for ints or index values; ints stay ints."""
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    return arith.AddIOp(_index(a), _index(b)).result


def _split(values):
    """(dynamic operands, static list) as tensor.insert_slice takes mixed sizes."""
    dynamic = ir.ShapedType.get_dynamic_size()
    return ([v for v in values if not isinstance(v, int)],
            [v if isinstance(v, int) else dynamic for v in values])


def lower_concatenations(module) -> int:
    """Rewrites each `stablehlo.concatenate` of ranked tensors as a `tensor.empty` of the
    result's sizes and one `tensor.insert_slice` per operand at its running offset along
    the concatenated dim (dynamic extents read with tensor.dim). Returns how many were
    rewritten.

        >>> lower_concatenations(module)   # concatenate(%a, %b) dim 1 -> 2 insert_slices
        1
    """
    rewritten = 0
    with module.context:
        for op in ops_named(module, "stablehlo.concatenate"):
            result_type = ir.RankedTensorType(op.results[0].type)
            operands = list(op.operands)
            if not operands or any(not isinstance(v.type, ir.RankedTensorType)
                                   for v in operands):
                continue
            dim = ir.IntegerAttr(op.attributes["dimension"]).value
            rank = result_type.rank
            with ir.InsertionPoint(op), op.location:
                extents = [[_size(v, d) for d in range(rank)] for v in operands]
                total = 0
                for sizes in extents:
                    total = _add(total, sizes[dim])
                # Dims other than `dim` agree between operands (the op verified it), so
                # the first operand's extents serve where the result's type leaves a dim
                # dynamic.
                empty_sizes = [result_type.shape[d] if not result_type.is_dynamic_dim(d)
                               else _index(total if d == dim else extents[0][d])
                               for d in range(rank)]
                destination = tensor.EmptyOp(empty_sizes, result_type.element_type).result
                offset = 0
                for value, sizes in zip(operands, extents):
                    offsets = [offset if d == dim else 0 for d in range(rank)]
                    dynamic_offsets, static_offsets = _split(offsets)
                    dynamic_sizes, static_sizes = _split(sizes)
                    destination = tensor.InsertSliceOp(
                        value, destination, dynamic_offsets, dynamic_sizes, [],
                        static_offsets, static_sizes, [1] * rank).result
                    offset = _add(offset, sizes[dim])
            op.results[0].replace_all_uses_with(destination)
            op.erase()
            rewritten += 1
    return rewritten


def _single_use(value) -> bool:
    return len(list(value.uses)) == 1


def _group_exprs(groups, sizes):
    """Per dim of the uncollapsed loop space, its affine expression in the collapsed loops:
    dim d at position j of group g is (D_g floordiv inner) mod size_d, inner being the
    product of the sizes after it in the group (all static; the first may be dynamic)."""
    exprs = {}
    for g, group in enumerate(groups):
        collapsed = ir.AffineDimExpr.get(g)
        inner = 1
        for position in range(len(group) - 1, -1, -1):
            d = group[position]
            expr = collapsed if inner == 1 else \
                ir.AffineFloorDivExpr.get(collapsed, ir.AffineConstantExpr.get(inner))
            if position > 0:
                expr = ir.AffineModExpr.get(expr, ir.AffineConstantExpr.get(sizes[d]))
                inner *= sizes[d]
            exprs[d] = expr
    return exprs


def _collapse_into_generic(collapse) -> bool:
    """Replaces `collapse` (tensor.collapse_shape) of an all-parallel linalg.generic's
    fresh result by that generic over the collapsed sizes, its inputs indexed through
    floordiv/mod of the collapsed loops. False when it does not apply."""
    generic = producer(collapse.operands[0], "linalg.generic")
    if generic is None or len(generic.results) != 1 or not _single_use(generic.results[0]):
        return False
    if not all_parallel(generic):
        return False
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(generic.attributes["indexing_maps"])]
    output = generic.operands[len(generic.operands) - 1]
    empty = producer(output, "tensor.empty")
    if empty is None or maps[-1] != ir.AffineMap.get_identity(maps[-1].n_dims):
        return False
    if ops_named(generic, "linalg.index"):
        return False   # the body reads the uncollapsed loop indices
    if any(not isinstance(r, (ir.AffineDimExpr, ir.AffineConstantExpr))
           for m in maps[:-1] for r in m.results):
        return False   # an input indexed by an expression of several loops (a window)
    groups = [[ir.IntegerAttr(d).value for d in ir.ArrayAttr(group)]
              for group in ir.ArrayAttr(collapse.attributes["reassociation"])]
    source_type = ir.RankedTensorType(collapse.operands[0].type)
    if any(source_type.is_dynamic_dim(d) for group in groups for d in group[1:]):
        return False
    exprs = _group_exprs(groups, source_type.shape)
    result_type = ir.RankedTensorType(collapse.results[0].type)
    with ir.InsertionPoint(collapse), collapse.location:
        sizes = []
        for g, group in enumerate(groups):
            if not result_type.is_dynamic_dim(g):
                sizes.append(result_type.shape[g])
                continue
            extent = _size(output, group[0])
            for d in group[1:]:
                extent = arith.MulIOp(_index(extent), _index(source_type.shape[d])).result
            sizes.append(_index(extent))
        destination = tensor.EmptyOp(sizes, result_type.element_type).result
        new_maps = [ir.AffineMap.get(len(groups), 0, [exprs[r.position] if
                                                      isinstance(r, ir.AffineDimExpr) else r
                                                      for r in m.results])
                    for m in maps[:-1]]
        new_maps.append(ir.AffineMap.get_identity(len(groups)))
        inputs = list(generic.operands)[:-1]
        replacement = linalg.GenericOp(
            [result_type], inputs, [destination],
            ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in new_maps]),
            ir.ArrayAttr.get([ir.ArrayAttr(generic.attributes["iterator_types"])[0]] *
                             len(groups)))
        body = generic.regions[0].blocks[0]
        block = replacement.regions[0].blocks.append(*[a.type for a in body.arguments])
        with ir.InsertionPoint(block):
            clone_ops(list(body.operations), dict(zip(body.arguments, block.arguments)))
    collapse.results[0].replace_all_uses_with(replacement.results[0])
    collapse.erase()
    generic.erase()
    return True


def write_slices_in_place(module) -> int:
    """Makes each loop nest whose result is collapsed (a reshape of a broadcast: nearest
    upsampling) and then inserted into a concatenation compute the collapsed shape
    directly, so that bufferization's empty tensor elimination lets it write straight into
    its slice of the concatenation instead of into a buffer that is then copied. Returns
    how many were rewritten.

        >>> write_slices_in_place(module)   # insert_slice(collapse(generic)) -> generic
        1
    """
    rewritten = 0
    with module.context:
        for insert in ops_named(module, "tensor.insert_slice"):
            collapse = producer(insert.operands[0], "tensor.collapse_shape")
            if collapse is not None and _collapse_into_generic(collapse):
                rewritten += 1
    return rewritten

"""Sums over an image's rows in parallel: a global pooling's loop nest runs on every thread.

parallel.py shares a loop nest out along its outermost loop when that loop is parallel.
A global average pooling (a squeeze-excitation's, after each depthwise layer of MobileNetV3
and EfficientNet) sums a [1, H, W, C] tensor over H and W into [1, 1, 1, C]: past its
loops of extent 1 the outermost loop is the reduction over H, so the nest ran on the
calling thread alone, reading the rows the other thread's part of the layer before had
written (and leaving its lines shared, so that the next call's writes to them waited on
the other core). `split_reductions` rewrites such a sum, after bufferization, as two:

    linalg.generic (d0 .. d5) [1, 1, 1, H, W, C] reductions d3, d4
        ins(%x) outs(%out : [1, 1, 1, C]) { out + x }
  ==>
    %rows = memref.alloc() : [H, 1, 1, 1, C]      filled with 0
    linalg.generic (d0, d1, d2) [H, W, C] d0 parallel, d1 reduction
        ins(%x) outs(%rows[d0, 0, 0, 0, d2]) { rows + x }    (rows of H: parallel.py splits it)
    linalg.generic (d0 .. d4) [H, 1, 1, 1, C] d0 reduction
        ins(%rows) outs(%out) { out + rows }                  (H x C additions, serial)

Only a plain sum (the body adds the first input's element to the output's, reassociation
allowed: the order of the additions changes) of one output, static extents, the loops
before the split one of extent 1, a nest large enough to share (parallel.py's
MIN_ITERATIONS), and partial sums of KEPT_SUMS terms at least are rewritten (a sum over the
rows alone, [512, 1024] -> [1, 1024], stays serial: its partials would be its input).
"""
import math
from typing import List, Optional

from torch_mlir import ir
from torch_mlir.dialects import arith, memref

from blade.codegen import linalg_ops as linalg
from blade.codegen.ir_queries import loop_bounds, ops_named, output_count
from blade.codegen.loops.parallel import MIN_ITERATIONS

KEPT_SUMS = 8


def _summed_input(op) -> bool:
    """Whether `op`'s body is `yield addf(output, input 0)` (either order), reassociable,
    reading no other argument and not its position."""
    block = op.regions[0].blocks[0]
    operations = list(block.operations)
    if len(operations) != 2 or operations[0].name != "arith.addf" or \
            operations[1].name != "linalg.yield" or ops_named(op, "linalg.index"):
        return False
    add, done = operations
    args = list(block.arguments)
    if {add.operands[0], add.operands[1]} != {args[0], args[-1]} or \
            list(done.operands) != [add.result]:
        return False
    flags = str(add.attributes["fastmath"]) if "fastmath" in add.attributes else ""
    return "reassoc" in flags


def _renumbered(map_attr, units: List[int], kept: List[int]):
    """`map_attr`'s map over the `kept` loops alone (renumbered from 0), the `units` loops
    (extent 1) replaced by 0."""
    value = ir.AffineMapAttr(map_attr).value
    old = value.n_dims
    total = old + len(kept)
    for loop in units:
        value = value.replace(ir.AffineDimExpr.get(loop), ir.AffineConstantExpr.get(0),
                              total, 0)
    for new, loop in enumerate(kept):   # via dims past the old ones: no clash
        value = value.replace(ir.AffineDimExpr.get(loop), ir.AffineDimExpr.get(old + new),
                              total, 0)
    for new in range(len(kept)):
        value = value.replace(ir.AffineDimExpr.get(old + new), ir.AffineDimExpr.get(new),
                              total, 0)
    return ir.AffineMap.get(len(kept), 0, list(value.results))


def _plan(op) -> Optional[tuple]:
    """(the split loop, the unit loops, the kept loops, their extents) where `op` is a sum
    split_reductions rewrites."""
    if op.name != "linalg.generic" or output_count(op) != 1 or len(op.operands) < 2:
        return None
    maps = list(ir.ArrayAttr(op.attributes["indexing_maps"]))
    if len(maps) != len(op.operands) or \
            any(not isinstance(v.type, ir.MemRefType) for v in op.operands):
        return None
    out_type = ir.MemRefType(op.operands[-1].type)
    if not isinstance(out_type.element_type, ir.F32Type) or not _summed_input(op):
        return None
    out_results = list(ir.AffineMapAttr(maps[-1]).value.results)
    if not all(isinstance(e, ir.AffineDimExpr) or isinstance(e, ir.AffineConstantExpr)
               for e in out_results):
        return None
    iterators = [str(i) for i in ir.ArrayAttr(op.attributes["iterator_types"])]
    bounds = loop_bounds(op, maps)
    dynamic = ir.ShapedType.get_dynamic_size()
    if any(b is None or b[2] == dynamic for b in bounds):
        return None
    sizes = [b[2] for b in bounds]
    # The first loop longer than 1: a reduction, with every loop before it of extent 1.
    first = next((i for i, size in enumerate(sizes) if size != 1), None)
    if first is None or "reduction" not in iterators[first]:
        return None
    total = math.prod(sizes)
    out_elements = math.prod(ir.MemRefType(op.operands[-1].type).shape)
    # Each partial sum adds KEPT_SUMS terms at least: a sum over the split loop alone would
    # copy its input into the partials, and the serial sum after would redo the work.
    if total < MIN_ITERATIONS or sizes[first] * out_elements * KEPT_SUMS > total:
        return None
    units = [i for i, size in enumerate(sizes) if size == 1]
    kept = [i for i, size in enumerate(sizes) if size != 1]
    return first, units, kept, sizes


def _sum_body(generic, types) -> None:
    """`generic`'s body of block arguments of `types`: yield output + input 0, reassociable."""
    block = generic.regions[0].blocks.append(*types)
    with ir.InsertionPoint(block):
        add = arith.AddFOp(block.arguments[-1], block.arguments[0])
        add.attributes["fastmath"] = ir.Attribute.parse("#arith.fastmath<reassoc,contract>")
        linalg.YieldOp([add.result])


def _rewrite(op) -> bool:
    plan = _plan(op)
    if plan is None:
        return False
    split, units, kept, sizes = plan
    maps = list(ir.ArrayAttr(op.attributes["indexing_maps"]))
    iterators = list(ir.ArrayAttr(op.attributes["iterator_types"]))
    out = op.operands[-1]
    out_type = ir.MemRefType(out.type)
    f32 = out_type.element_type
    context = op.context
    parallel = linalg.iterator_attribute(linalg.IteratorType.parallel, context)
    reduction = linalg.iterator_attribute(linalg.IteratorType.reduction, context)
    with ir.InsertionPoint(op), op.location:
        # A partial sum per row of the split loop: [rows] + the output's shape.
        rows_type = ir.MemRefType.get([sizes[split]] + list(out_type.shape), f32)
        rows = memref.AllocOp(rows_type, [], []).result
        linalg.fill(arith.ConstantOp(f32, 0.0).result, outs=[rows])
        # The sums of each row, the split loop (now first) parallel.
        out_map = _renumbered(maps[-1], units, kept)
        row_map = ir.AffineMap.get(len(kept), 0,
                                   [ir.AffineDimExpr.get(kept.index(split))] +
                                   list(out_map.results))
        in_maps = [ir.AffineMapAttr.get(_renumbered(m, units, kept)) for m in maps[:-1]]
        row_iterators = [parallel if i == split else iterators[i] for i in kept]
        partial = linalg.GenericOp([], list(op.operands[:-1]), [rows],
                                   ir.ArrayAttr.get(in_maps + [ir.AffineMapAttr.get(row_map)]),
                                   ir.ArrayAttr.get(row_iterators))
        _sum_body(partial, [a.type for a in op.regions[0].blocks[0].arguments])
        # The rows' sums added to the output, row by row.
        rank = out_type.rank
        identity = [ir.AffineDimExpr.get(i + 1) for i in range(rank)]
        combine = linalg.GenericOp(
            [], [rows], [out],
            ir.ArrayAttr.get([ir.AffineMapAttr.get(ir.AffineMap.get(rank + 1, 0,
                                                                     [ir.AffineDimExpr.get(0)]
                                                                     + identity)),
                              ir.AffineMapAttr.get(ir.AffineMap.get(rank + 1, 0, identity))]),
            ir.ArrayAttr.get([reduction] + [parallel] * rank))
        _sum_body(combine, [f32, f32])
    op.erase()
    return True


def split_reductions(main) -> int:
    """Rewrites each large sum of `main` whose outermost loop past those of extent 1 is a
    reduction as per-row sums in parallel and their serial sum (see the module
    docstring); returns how many were rewritten.

        >>> split_reductions(main)   # a squeeze-excitation's [1, 14, 14, 480] pooling
        1
    """
    rewritten = 0
    for op in list(main.regions[0].blocks[0].operations):
        if op.name == "linalg.generic" and _rewrite(op):
            rewritten += 1
    return rewritten

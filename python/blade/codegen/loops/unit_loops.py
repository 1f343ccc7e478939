"""Leading loops of extent 1 go, so that a batch of one still runs on every thread.

parallel.py splits a loop nest into tasks along its outermost loop. A model served one
input at a time has a batch dim of 1 there: a [1, 128, 768] LayerNorm, the [1, 56, 56, 64]
residual add of a convolution stack, every elementwise nest of a batch-1 engine ran on one
thread. `drop_unit_loops` rewrites each such loop nest (after bufferization) without its
leading loops of static extent 1, reading and writing its operands through collapsed views
that merge those size-1 dims into the next dim:

    linalg.generic (d0, d1, d2, d3) over [1, 56, 56, 64]
        ins(%x : memref<1x64x56x56xf32>) outs(%y : memref<1x56x56x64xf32>)
  ==>
    linalg.generic (d0, d1, d2) over [56, 56, 64]
        ins(collapse_shape %x [[0, 1], [2], [3]])  outs(collapse_shape %y [[0, 1], [2], [3]])

so that its outermost loop is the 56 rows parallel.py can share out. A size-1 dim is
collapsible whatever its stride, and a view costs nothing: the loops run exactly as before.
A view's type is the one memref.collapse_shape's verifier infers: size-1 dims merged into
a dim of dynamic size leave the merged dim's stride dynamic (q of a fused QKV product of
one sequence of dynamic length, [1, ?, 12, 64] with strides [?, 2304, 64, 1], is read
through a [?, 12, 64] view with strides [?, 64, 1]).
"""
from typing import List

from torch_mlir import ir
from torch_mlir.dialects import arith, memref

from blade.codegen import linalg_ops as linalg

from blade.codegen.ir_queries import (clone_ops, identity_layout, loop_bounds, ops_named,
                                      output_count, parallel_loops, strides_of)


def _unit_prefix(op, maps) -> int:
    """How many leading loops of `op` are parallel with extent 1, when the loop after them
    is parallel and longer (worth splitting), else 0."""
    parallel = parallel_loops(op)
    dynamic = ir.ShapedType.get_dynamic_size()
    sizes = [None if b is None or b[2] == dynamic else b[2] for b in loop_bounds(op, maps)]
    k = 0
    while k < len(sizes) - 1 and sizes[k] == 1 and parallel[k]:
        k += 1
    if k == 0 or not parallel[k] or sizes[k] == 1:
        return 0
    return k


def _collapse_plan(t, dropped: List[int]):
    """(reassociation groups, result type) of the view of memref type `t` with its size-1
    dims at positions `dropped` merged into the next kept dim (trailing ones into the last
    kept dim); None when that view of a strided memref would take its stride from a
    trailing size-1 dim."""
    kept = [d for d in range(t.rank) if d not in dropped]
    groups, pending = [], []
    for d in range(t.rank):
        pending.append(d)
        if d in kept:
            groups.append(pending)
            pending = []
    shape = [t.shape[d] for d in kept]
    if identity_layout(t):
        result = ir.MemRefType.get(shape, t.element_type)
    else:
        strides = strides_of(t)
        if strides is None or (pending and groups):
            return None
        offset = t.get_strides_and_offset()[1]
        layout = ir.StridedLayoutAttr.get(offset, [_collapsed_stride(t, strides, group)
                                                   for group in groups])
        result = ir.MemRefType.get(shape, t.element_type, layout)
    if pending and groups:
        groups[-1] += pending     # trailing size-1 dims (none left when all are dropped)
    return groups, result


def _collapsed_stride(t, strides, group: List[int]) -> int:
    """The stride of the dim that `group` of memref type `t` collapses into, as
    memref.collapse_shape's verifier infers it (MLIR's computeCollapsedLayoutMap): the
    stride of the group's last dim not of static size 1, but dynamic when that dim's size
    is dynamic and dims before it are merged into it, since a dynamic size may be 1 at run
    time, and MLIR skips the strides of size-1 dims. (At run time the view still gets the
    kept dim's stride.) A [1, ?, 12, 64] head view of a fused QKV product, strides
    [?, 2304, 64, 1], collapses to a [?, 12, 64] view of strides [?, 64, 1]."""
    ref = list(group)
    while len(ref) > 1 and t.shape[ref[-1]] == 1:
        ref.pop()
    if len(ref) > 1 and t.shape[ref[-1]] == ir.ShapedType.get_dynamic_size():
        return ir.ShapedType.get_dynamic_stride_or_offset()
    return strides[ref[-1]]


def _collapse(value, plan):
    """The memref.collapse_shape of `value` that `plan` (from _collapse_plan) describes."""
    groups, result = plan
    i64 = ir.IntegerType.get_signless(64)
    reassociation = ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, d)
                                                        for d in group]) for group in groups])
    return memref.CollapseShapeOp(result, value, reassociation).result


def _rewrite(op) -> bool:
    maps = list(ir.ArrayAttr(op.attributes["indexing_maps"]))
    if len(maps) != len(op.operands) or \
            any(not isinstance(v.type, ir.MemRefType) for v in op.operands):
        return False
    k = _unit_prefix(op, maps)
    if k == 0:
        return False
    loops = len(ir.ArrayAttr(op.attributes["iterator_types"]))
    plans = []
    for value, map_attr in zip(op.operands, maps):
        results = list(ir.AffineMapAttr(map_attr).value.results)
        shape = ir.MemRefType(value.type).shape
        dropped, kept_exprs = [], []
        for position, expr in enumerate(results):
            if isinstance(expr, ir.AffineDimExpr):
                if expr.position < k and shape[position] != 1:
                    return False   # a dynamic dim that only a unit loop indexes: 1 at run time
                if expr.position < k:
                    dropped.append(position)      # a unit loop indexes a size-1 dim
                else:
                    kept_exprs.append(ir.AffineDimExpr.get(expr.position - k))
            elif isinstance(expr, ir.AffineConstantExpr) and shape[position] == 1:
                dropped.append(position)
            elif isinstance(expr, ir.AffineConstantExpr):
                kept_exprs.append(expr)
            else:
                return False   # an expression over several loops: left as it is
        plans.append((value, dropped, kept_exprs))
    collapse_plans = [_collapse_plan(ir.MemRefType(value.type), dropped) if dropped else None
                      for value, dropped, _ in plans]
    if any(plan is None for plan, (_, dropped, _) in zip(collapse_plans, plans) if dropped):
        return False
    with ir.InsertionPoint(op), op.location:
        views, made = [], []   # made: (value, dropped, view) for the views created
        for (value, dropped, _), plan in zip(plans, collapse_plans):
            # An operand named twice (updated in place) keeps one view, as parallel.py
            # expects of a buffer its task takes once.
            same = [v for u, d, v in made if u == value and d == dropped]
            view = value if not dropped else same[0] if same else _collapse(value, plan)
            if dropped and not same:
                made.append((value, dropped, view))
            views.append(view)
        new_maps = [ir.AffineMapAttr.get(ir.AffineMap.get(loops - k, 0, kept_exprs))
                    for _, _, kept_exprs in plans]
        outputs = output_count(op)
        iterators = list(ir.ArrayAttr(op.attributes["iterator_types"]))[k:]
        replacement = linalg.GenericOp([], views[:len(views) - outputs],
                                       views[len(views) - outputs:],
                                       ir.ArrayAttr.get(new_maps), ir.ArrayAttr.get(iterators))
        body = op.regions[0].blocks[0]
        block = replacement.regions[0].blocks.append(*[a.type for a in body.arguments])
        with ir.InsertionPoint(block):
            clone_ops(list(body.operations), dict(zip(body.arguments, block.arguments)))
    index_type = ir.IndexType.get()
    for index in ops_named(replacement, "linalg.index"):
        dim = ir.IntegerAttr(index.attributes["dim"]).value
        if dim >= k:
            index.attributes["dim"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64),
                                                         dim - k)
            continue
        with ir.InsertionPoint(index), index.location:
            zero = arith.ConstantOp(index_type, 0).result
        index.results[0].replace_all_uses_with(zero)
        index.erase()
    op.erase()
    return True


def drop_unit_loops(main) -> int:
    """Rewrites each `linalg.generic` of `main` on memrefs whose leading loops have extent
    1 without those loops (see the module docstring); returns how many were rewritten.

        >>> drop_unit_loops(main)   # a [1, 56, 56, 64] add -> a [56, 56, 64] one
        1
    """
    rewritten = 0
    block = main.regions[0].blocks[0]
    for op in list(block.operations):
        if op.name == "linalg.generic" and _rewrite(op):
            rewritten += 1
        elif op.name == "linalg.fill" and _refill(op):
            rewritten += 1
    return rewritten


def _refill(op) -> bool:
    """Points a fill of a memref with leading size-1 dims at the collapsed view of it, so
    that it takes part in parallel.py's row groups with the loop nests around it."""
    if len(op.operands) != 2 or not isinstance(op.operands[1].type, ir.MemRefType):
        return False
    shape = list(ir.MemRefType(op.operands[1].type).shape)
    k = 0
    while k < len(shape) - 1 and shape[k] == 1:
        k += 1
    if k == 0 or shape[k] == 1:
        return False
    plan = _collapse_plan(ir.MemRefType(op.operands[1].type), list(range(k)))
    if plan is None:
        return False
    with ir.InsertionPoint(op), op.location:
        op.operands[1] = _collapse(op.operands[1], plan)
    return True

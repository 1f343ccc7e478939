"""Loop order of transposing loop nests: the dims both sides are contiguous along go
innermost, so a transpose works through a small 2-d block that stays in L1.

A `linalg.generic` runs its loops in the order of its dims, the output's. When an input
is laid out differently (NHWC data added and written back as NCHW, at the end of a
channels-last convolution stack), its contiguous dim (C) is then the outermost but one
loop: every element read comes from another cache line, and the lines come back for the
next channel only after a whole H x W plane has gone through, from L2 at best. Measured on
the benchmark's convnet, that one loop took 5.6% of the model's time. `order_loops` moves
the loop an input is contiguous along just inside the output's innermost one (N, H, C, W
for the example): the lines an H row of the input spans (56 x 64 floats) stay in L1 while
the loop walks across them. The output keeps its innermost loop (contiguous stores). Only
all-parallel nests whose operands are indexed by plain dims (broadcast dims allowed) and
whose body does not read its position are reordered, and the outermost loop stays first:
parallel.py splits tasks along it.
"""
from typing import List, Optional

from torch_mlir import ir

from blade.codegen.ir_queries import (all_parallel, contiguous_loop, map_dims, ops_named,
                                      output_count)


def _new_order(op) -> Optional[List[int]]:
    loops = len(ir.ArrayAttr(op.attributes["iterator_types"]))
    if loops < 3 or not all_parallel(op) or ops_named(op, "linalg.index"):
        return None
    maps = list(ir.ArrayAttr(op.attributes["indexing_maps"]))
    if len(maps) != len(op.operands):
        return None
    outputs = output_count(op)
    votes = {}   # loop -> how many inputs are contiguous along it
    for index, (value, map_attr) in enumerate(zip(op.operands, maps)):
        if not isinstance(value.type, ir.MemRefType):
            return None
        results = map_dims(map_attr)
        if results is None:
            return None
        loop = contiguous_loop(value, results)
        if index < len(maps) - outputs and loop is not None:
            votes[loop] = votes.get(loop, 0) + 1
    candidates = [d for d in votes if 0 < d < loops - 1]
    if not candidates:
        return None
    inner = max(candidates, key=lambda d: votes[d])
    if inner == loops - 2:
        return None
    return [d for d in range(loops - 1) if d != inner] + [inner, loops - 1]


def order_loops(main) -> int:
    """Reorders the loops of the transposing nests of `main` (after bufferization) as the
    module docstring says; returns how many nests changed.

    Example:
        >>> order_loops(main)   # out[n,c,h,w] = a[n,h,w,c] + b[n,h,w,c]: loops n, h, c, w
        1
    """
    count = 0
    for op in main.regions[0].blocks[0].operations:
        if op.name != "linalg.generic":
            continue
        order = _new_order(op)
        if order is None:
            continue
        position = {old: new for new, old in enumerate(order)}
        loops = len(order)
        new_maps = []
        for map_attr in ir.ArrayAttr(op.attributes["indexing_maps"]):
            # a constant result (0, a size-1 dim of a broadcast) stays as it is
            exprs = [expr if d is None else ir.AffineDimExpr.get(position[d])
                     for d, expr in zip(map_dims(map_attr),
                                        ir.AffineMapAttr(map_attr).value.results)]
            new_maps.append(ir.AffineMapAttr.get(ir.AffineMap.get(loops, 0, exprs)))
        op.attributes["indexing_maps"] = ir.ArrayAttr.get(new_maps)
        count += 1
    return count

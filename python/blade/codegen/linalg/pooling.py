"""Window reductions (max and sum pooling) as linalg loops Blade writes itself.

Torch-MLIR lowers max_pool2d and avg_pool2d to `stablehlo.reduce_window`. StableHLO's
linalg lowering converts it only when every size is static (in a dynamic engine the op
was left unconverted and the whole cluster failed to compile), and a window over an NHWC
tensor (what layouts.py makes of pooling between channels_last convolutions) becomes a
named pooling op, which elementwise fusion does not merge with its producer and
parallel.py does not run on threads. `lower_reduce_windows` rewrites each one, before that
lowering, as

    padded = stablehlo.pad(x, init)                    (when the window has padding)
    out    = linalg.fill(init) of the result's size (computed from the padded input's
             when it is dynamic)
    out    = linalg.generic over (result dims..., window dims...):
                 out[o] = combine(out[o], padded[o * stride + k * dilation])
             (the window dims before the innermost result dim when that one is not
             windowed: C of NHWC data, contiguous, so the innermost loop vectorizes)

with a static-size `tensor.empty` standing for the window (its shape gives the window
loops their bounds, as in linalg's pooling ops).
"""
from typing import List, Optional

from torch_mlir import ir
from torch_mlir.dialects import arith, tensor

from blade.codegen import linalg_ops as linalg

from blade.codegen.ir_queries import ops_named

# The combiners a window body may apply, as the arith op that applies them to floats.
_COMBINERS = {"stablehlo.maximum": "arith.maximumf", "stablehlo.minimum": "arith.minimumf",
              "stablehlo.add": "arith.addf"}


def _i64s(op, name: str, rank: int, default: int) -> List[int]:
    if name not in op.attributes:
        return [default] * rank
    return list(ir.DenseI64ArrayAttr(op.attributes[name]))


def _padding(op, rank: int) -> List[List[int]]:
    if "padding" not in op.attributes:
        return [[0, 0] for _ in range(rank)]
    flat = ir.DenseIntElementsAttr(op.attributes["padding"])
    return [[flat[2 * d], flat[2 * d + 1]] for d in range(rank)]


def _sizes(t) -> List[Optional[int]]:
    return [None if t.is_dynamic_dim(d) else t.shape[d] for d in range(t.rank)]


def _combiner(op) -> Optional[str]:
    body = op.regions[0].blocks[0]
    names = [o.name for o in body.operations]
    if len(names) != 2 or names[1] != "stablehlo.return" or names[0] not in _COMBINERS:
        return None
    return _COMBINERS[names[0]]


def _lower(op) -> bool:
    """Builds the loops computing `op` before it and replaces it (see the module docstring);
    False, leaving it, when `op` is not a single float window reduction this rewrite takes."""
    if len(op.operands) != 2 or len(op.results) != 1:
        return False
    source = ir.RankedTensorType(op.operands[0].type)
    result = ir.RankedTensorType(op.results[0].type)
    element = source.element_type
    combiner = _combiner(op)
    if combiner is None or not isinstance(element, ir.FloatType):
        return False
    rank = source.rank
    window = _i64s(op, "window_dimensions", rank, 1)
    strides = _i64s(op, "window_strides", rank, 1)
    dilations = _i64s(op, "window_dilations", rank, 1)
    if _i64s(op, "base_dilations", rank, 1) != [1] * rank:
        return False
    padding = _padding(op, rank)
    if min(min(p) for p in padding) < 0:
        return False
    x, init = op.operands[0], op.operands[1]
    with ir.InsertionPoint(op), op.location:
        padded = x
        if any(lo or hi for lo, hi in padding):
            sizes = [ir.ShapedType.get_dynamic_size() if s is None else s + lo + hi
                     for s, (lo, hi) in zip(_sizes(source), padding)]
            padded = ir.Operation.create(
                "stablehlo.pad", results=[ir.RankedTensorType.get(sizes, element)],
                operands=[x, init], attributes={
                    "edge_padding_low": ir.DenseI64ArrayAttr.get([lo for lo, _ in padding]),
                    "edge_padding_high": ir.DenseI64ArrayAttr.get([hi for _, hi in padding]),
                    "interior_padding": ir.DenseI64ArrayAttr.get([0] * rank)}).result
        index = ir.IndexType.get()
        dynamic_sizes = []
        for d in range(rank):
            if not result.is_dynamic_dim(d):
                continue
            reach = (window[d] - 1) * dilations[d] + 1     # (size - reach) / stride + 1
            size = tensor.DimOp(padded, arith.ConstantOp(index, d).result).result
            span = arith.SubIOp(size, arith.ConstantOp(index, reach).result).result
            steps = arith.DivSIOp(span, arith.ConstantOp(index, strides[d]).result).result
            dynamic_sizes.append(arith.AddIOp(steps, arith.ConstantOp(index, 1).result).result)
        windowed = [d for d in range(rank) if window[d] > 1]
        # Loop positions: the window loops go innermost, except when the innermost dim is
        # not windowed (C of an NHWC window): it stays the innermost loop, so the nest reads
        # and writes contiguous channels (vectorized) instead of striding through the
        # window for each channel. Each output still combines its window in the same order.
        inner = [] if not windowed or windowed[-1] == rank - 1 else [rank - 1]
        outer = [d for d in range(rank) if d not in inner]
        output_loop = {d: i for i, d in enumerate(outer)}
        window_loops = [len(outer) + i for i in range(len(windowed))]
        output_loop.update({d: len(outer) + len(windowed) + i for i, d in enumerate(inner)})
        loops = rank + len(windowed)
        reads = []
        for d in range(rank):
            read = ir.AffineExpr.get_mul(ir.AffineDimExpr.get(output_loop[d]),
                                         ir.AffineConstantExpr.get(strides[d]))
            if d in windowed:
                read = ir.AffineExpr.get_add(read, ir.AffineExpr.get_mul(
                    ir.AffineDimExpr.get(window_loops[windowed.index(d)]),
                    ir.AffineConstantExpr.get(dilations[d])))
            reads.append(read)
        maps = [ir.AffineMap.get(loops, 0, reads),
                ir.AffineMap.get(loops, 0, [ir.AffineDimExpr.get(w) for w in window_loops]),
                ir.AffineMap.get(loops, 0, [ir.AffineDimExpr.get(output_loop[d])
                                            for d in range(rank)])]
        empty = tensor.EmptyOp(_static_or(result, dynamic_sizes), element).result
        start = tensor.ExtractOp(init, []).result
        filled = linalg.fill(start, outs=[empty])
        window_tensor = tensor.EmptyOp([window[d] for d in windowed], element).result
        parallel = linalg.IteratorType.parallel
        reduction = linalg.IteratorType.reduction
        iterators = [parallel] * len(outer) + [reduction] * len(windowed) + \
            [parallel] * len(inner)
        generic = linalg.GenericOp(
            [result], [padded, window_tensor], [filled],
            ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]),
            ir.ArrayAttr.get([linalg.iterator_attribute(i, op.context) for i in iterators]))
        block = generic.regions[0].blocks.append(element, element, element)
        with ir.InsertionPoint(block):
            combined = ir.Operation.create(combiner, results=[element],
                                           operands=[block.arguments[2], block.arguments[0]])
            linalg.YieldOp([combined.result])
    op.results[0].replace_all_uses_with(generic.result)
    op.erase()
    return True


def _static_or(result, dynamic_sizes) -> List:
    """The result's sizes for tensor.empty: static ones as ints, dynamic ones the values."""
    values = iter(dynamic_sizes)
    return [next(values) if result.is_dynamic_dim(d) else result.shape[d]
            for d in range(result.rank)]


def lower_reduce_windows(module) -> int:
    """Rewrites each `stablehlo.reduce_window` this module takes (see its docstring) in
    place; returns how many were rewritten."""
    rewritten = 0
    with module.context, ir.Location.unknown():
        for op in ops_named(module, "stablehlo.reduce_window"):
            rewritten += _lower(op)
    return rewritten

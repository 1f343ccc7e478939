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

from blade.codegen.ir_queries import generic_text, rewrite_each

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


def _tensor_type(sizes: List[Optional[int]], element) -> str:
    return "tensor<" + "".join("?x" if s is None else f"{s}x" for s in sizes) + f"{element}>"


def _sizes(t) -> List[Optional[int]]:
    return [None if t.is_dynamic_dim(d) else t.shape[d] for d in range(t.rank)]


def _combiner(op) -> Optional[str]:
    body = op.regions[0].blocks[0]
    names = [o.name for o in body.operations]
    if len(names) != 2 or names[1] != "stablehlo.return" or names[0] not in _COMBINERS:
        return None
    return _COMBINERS[names[0]]


def _replacement(op) -> Optional[str]:
    """The text of a function computing `op` with loops (see the module docstring), or None
    when `op` is not a single float window reduction this rewrite takes."""
    if len(op.operands) != 2 or len(op.results) != 1:
        return None
    source = ir.RankedTensorType(op.operands[0].type)
    result = ir.RankedTensorType(op.results[0].type)
    element = source.element_type
    combiner = _combiner(op)
    if combiner is None or not isinstance(element, ir.FloatType):
        return None
    rank = source.rank
    window = _i64s(op, "window_dimensions", rank, 1)
    strides = _i64s(op, "window_strides", rank, 1)
    dilations = _i64s(op, "window_dilations", rank, 1)
    if _i64s(op, "base_dilations", rank, 1) != [1] * rank:
        return None
    padding = _padding(op, rank)
    if min(min(p) for p in padding) < 0:
        return None
    padded_sizes = [None if s is None else s + lo + hi
                    for s, (lo, hi) in zip(_sizes(source), padding)]
    source_text, result_text = _tensor_type(_sizes(source), element), str(result)
    padded_text = _tensor_type(padded_sizes, element)
    lines = [f"func.func private @window(%x: {source_text}, %init: tensor<{element}>) -> "
             f"{result_text} {{"]
    padded = "%x"
    if any(lo or hi for lo, hi in padding):
        low = ", ".join(str(lo) for lo, _ in padding)
        high = ", ".join(str(hi) for _, hi in padding)
        interior = ", ".join("0" for _ in padding)
        lines.append(f"  %padded = stablehlo.pad %x, %init, low = [{low}], high = [{high}], "
                     f"interior = [{interior}] : ({source_text}, tensor<{element}>) -> "
                     f"{padded_text}")
        padded = "%padded"
    dynamic_sizes = []
    for d in range(rank):
        if not result.is_dynamic_dim(d):
            continue
        reach = (window[d] - 1) * dilations[d] + 1     # (size - reach) / stride + 1
        lines += [f"  %c{d} = arith.constant {d} : index",
                  f"  %size{d} = tensor.dim {padded}, %c{d} : {padded_text}",
                  f"  %reach{d} = arith.constant {reach} : index",
                  f"  %span{d} = arith.subi %size{d}, %reach{d} : index",
                  f"  %stride{d} = arith.constant {strides[d]} : index",
                  f"  %steps{d} = arith.divsi %span{d}, %stride{d} : index",
                  f"  %one{d} = arith.constant 1 : index",
                  f"  %out{d} = arith.addi %steps{d}, %one{d} : index"]
        dynamic_sizes.append(f"%out{d}")
    windowed = [d for d in range(rank) if window[d] > 1]
    window_text = _tensor_type([window[d] for d in windowed], element)
    # Loop positions: the window loops go innermost, except when the innermost dim is not
    # windowed (C of an NHWC window): it stays the innermost loop, so the nest reads and
    # writes contiguous channels (vectorized) instead of striding through the window for
    # each channel. Each output still combines its window in the same order.
    inner = [] if not windowed or windowed[-1] == rank - 1 else [rank - 1]
    outer = [d for d in range(rank) if d not in inner]
    output_loop = {d: f"d{i}" for i, d in enumerate(outer)}
    window_loops = [f"d{len(outer) + i}" for i in range(len(windowed))]
    output_loop.update({d: f"d{len(outer) + len(windowed) + i}" for i, d in enumerate(inner)})
    loops = [f"d{i}" for i in range(rank + len(windowed))]
    reads = []
    for d in range(rank):
        index = f"{output_loop[d]} * {strides[d]}"
        if d in windowed:
            index += f" + {window_loops[windowed.index(d)]} * {dilations[d]}"
        reads.append(index)
    domain = "(" + ", ".join(loops) + ")"
    maps = [f"affine_map<{domain} -> ({', '.join(reads)})>",
            f"affine_map<{domain} -> ({', '.join(window_loops)})>",
            f"affine_map<{domain} -> ({', '.join(output_loop[d] for d in range(rank))})>"]
    iterators = (['"parallel"'] * len(outer) + ['"reduction"'] * len(windowed) +
                 ['"parallel"'] * len(inner))
    lines += [f"  %empty = tensor.empty({', '.join(dynamic_sizes)}) : {result_text}",
              f"  %start = tensor.extract %init[] : tensor<{element}>",
              f"  %filled = linalg.fill ins(%start : {element}) outs(%empty : {result_text}) "
              f"-> {result_text}",
              f"  %window = tensor.empty() : {window_text}"]
    lines += generic_text("reduced", maps, iterators,
                          [(padded, padded_text), ("%window", window_text)],
                          [("%filled", result_text)],
                          [("%in", element), ("%unused", element), ("%acc", element)],
                          [f"    %next = {combiner} %acc, %in : {element}"], "%next", element)
    lines += [f"  return %reduced : {result_text}", "}"]
    return "\n".join(lines)


def lower_reduce_windows(module) -> int:
    """Rewrites each `stablehlo.reduce_window` this module takes (see its docstring) in
    place; returns how many were rewritten."""
    return rewrite_each(module, "stablehlo.reduce_window", _replacement)

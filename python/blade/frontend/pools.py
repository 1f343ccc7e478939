"""Pooling windows made explicit, so that poolings Torch-MLIR lowers wrongly or not at all
become ones it lowers right.

`ceil_mode=True` adds a last window that hangs over the input's end; Torch-MLIR pads it on
both sides (wrong values, or a wrong output size when the size varies), and
`divisor_override` is not lowered. For static spatial sizes, this pass writes the padding
the last windows need as an explicit `constant_pad_nd` (-inf for a max, 0 for an average)
and pools with `ceil_mode=False`. An average then divides by the full window; PyTorch
divides partial windows by what they cover (count_include_pad, ceil_mode) or by the
override, so the result is multiplied by a constant map of per-window factors, computed
here by PyTorch itself on ones: factor = PyTorch's result on ones / the rewritten pool's
result on ones.
"""
import math
from typing import List, Optional

import torch

from blade.graph_queries import constant_arguments, schema_name

# Spatial dims per op.
_MAX_POOLS = {"aten::max_pool1d": 1, "aten::max_pool2d": 2, "aten::max_pool3d": 3}
_AVG_POOLS = {"aten::avg_pool1d": 1, "aten::avg_pool2d": 2, "aten::avg_pool3d": 3}
POOLING_OVERLOADS = tuple(_MAX_POOLS) + tuple(_AVG_POOLS)  # what explicit_pool_windows rewrites


def _per_dim(value, dims: int, default: Optional[int]) -> List[Optional[int]]:
    values = list(value) if isinstance(value, (list, tuple)) else \
        ([value] if value is not None else [])
    if not values:
        values = [default]
    return values * dims if len(values) == 1 else values


def _extra_padding(sizes, kernel, stride, padding, dilation) -> List[int]:
    """Per spatial dim, the padding at the end that ceil mode's last window needs: PyTorch's
    output size rounded up, less a last window that would start in the right padding."""
    extra = []
    for size, k, s, p, d in zip(sizes, kernel, stride, padding, dilation):
        span = d * (k - 1) + 1
        out = math.ceil((size + 2 * p - span) / s) + 1
        if (out - 1) * s >= size + p:
            out -= 1
        extra.append(max((out - 1) * s + span - (size + 2 * p), 0))
    return extra


def explicit_pool_windows(graph: torch._C.Graph, nodes: List[torch._C.Node]) -> int:
    """Rewrites the poolings above among `nodes` (the graph's, every block's; static
    spatial sizes); returns how many."""
    count = 0
    for node in nodes:
        kind = schema_name(node)
        dims = _MAX_POOLS.get(kind) or _AVG_POOLS.get(kind)
        if dims is None:
            continue
        image = node.inputsAt(0)
        image_type = image.type()
        if not isinstance(image_type, torch._C.TensorType) or image_type.dim() is None:
            continue
        dtype = image_type.dtype()
        sizes = image_type.varyingSizes()
        if dtype is None or not dtype.is_floating_point or sizes is None or \
                None in sizes[-dims:]:
            continue
        arguments = constant_arguments(node)
        ceil_mode = arguments.get("ceil_mode")
        override = arguments.get("divisor_override")
        if not ceil_mode and override is None:
            continue
        kernel = _per_dim(arguments["kernel_size"], dims, None)
        stride = [k if s is None else s for s, k in
                  zip(_per_dim(arguments.get("stride"), dims, None), kernel)]
        padding = _per_dim(arguments.get("padding"), dims, 0)
        dilation = _per_dim(arguments.get("dilation", 1), dims, 1)
        if None in kernel + stride + padding + dilation:
            continue   # a window argument computed at run time
        extra = _extra_padding(sizes[-dims:], kernel, stride, padding, dilation) \
            if ceil_mode else [0] * dims
        names = [a.name for a in torch._C.parse_schema(node.schema()).arguments]
        is_max = kind in _MAX_POOLS
        factor = None
        if not is_max:
            factor = _average_factors(kind, dims, sizes[-dims:], extra, arguments, names)
            if factor is None:
                continue
        _rewrite(graph, node, names, image, extra, is_max, factor, dtype)
        count += 1
    return count


def _average_factors(kind: str, dims: int, spatial, extra, arguments, names):
    """The map PyTorch's average is the rewritten one times, or None where a window of the
    rewritten pool covers no input (nothing to scale)."""
    op = getattr(torch.nn.functional, kind.split("::")[1])
    ones = torch.ones([1, 1] + list(spatial), dtype=torch.float64)
    original = op(ones, **{n: arguments[n] for n in names[1:] if n in arguments})
    padded = torch.nn.functional.pad(ones, [p for e in reversed(extra) for p in (0, e)])
    rewritten_args = dict(arguments, ceil_mode=False, count_include_pad=True)
    if "divisor_override" in rewritten_args:
        rewritten_args["divisor_override"] = None
    rewritten = op(padded, **{n: rewritten_args[n] for n in names[1:] if n in rewritten_args})
    if original.shape != rewritten.shape or bool((rewritten == 0).any()):
        return None
    return (original / rewritten)[0, 0]


def _rewrite(graph, node, names, image, extra, is_max, factor, dtype) -> None:
    with graph.insert_point_guard(node):
        if any(extra):
            pads = [p for e in reversed(extra) for p in (0, e)]
            pad = graph.create("aten::constant_pad_nd", [
                image, graph.insertConstant(pads),
                graph.insertConstant(float("-inf") if is_max else 0.0)])
            graph.insertNode(pad)
            sizes = image.type().varyingSizes()
            padded_sizes = sizes[:len(sizes) - len(extra)] + \
                [s + e for s, e in zip(sizes[len(sizes) - len(extra):], extra)]
            pad.output().setType(image.type().with_sizes(padded_sizes))
            pad.copyMetadata(node)
            node.replaceInput(0, pad.output())
        node.replaceInput(names.index("ceil_mode"), graph.insertConstant(False))
        if not is_max:
            node.replaceInput(names.index("count_include_pad"), graph.insertConstant(True))
            if "divisor_override" in names:
                node.replaceInput(names.index("divisor_override"), graph.insertConstant(None))
    if factor is None or bool((factor == 1).all()):
        return
    result = node.output()
    with graph.insert_point_guard(node):
        scale = graph.insertConstant(factor.to(dtype))
    scaled = graph.create("aten::mul", [result, scale])
    scaled.insertAfter(node)
    scaled.output().setType(result.type())
    scaled.copyMetadata(node)
    result.replaceAllUsesWith(scaled.output())
    scaled.replaceInput(0, result)

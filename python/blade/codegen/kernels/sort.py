"""Sorts that the RAL runs as PyTorch's own sort or topk (`blade_ral_sort_<type>`), which
nothing else in the pipeline lowers: the `stablehlo.sort` form in which Torch-MLIR lowers
aten::sort, argsort and topk.
"""
from typing import Optional

from torch_mlir import ir

from blade.codegen.ir_queries import as_operation, i64_array, producer
from blade.codegen.kernels.library_calls import SORT_ELEMENT_TYPES


def sort_form(op) -> Optional[dict]:
    """The kernel's attributes when `op` is a stablehlo.sort as Torch-MLIR lowers
    aten::sort (argsort and topk too): the values and an iota along the sorted dim, the
    comparator one `compare LT` (ascending) or `GT` (descending) of the values; else None.
    The kernel is PyTorch's own sort, so ties and NaN come out as eager orders them.

    Example:
        >>> sort_form(op)   # torch.sort(x, dim=1, descending=True, stable=True)
        {'kind': 'sort', 'dimension': 1, 'descending': 1, 'stable': 1, 'k': 0}
    """
    if len(op.operands) != 2 or len(op.results) != 2:
        return None
    dimension = ir.IntegerAttr(op.attributes["dimension"]).value
    iota = producer(op.operands[1], "stablehlo.iota") or \
        producer(op.operands[1], "stablehlo.dynamic_iota")
    values = ir.ShapedType(op.operands[0].type)
    indices = ir.ShapedType(op.operands[1].type)
    if iota is None or ir.IntegerAttr(iota.attributes["iota_dimension"]).value != dimension \
            or str(values.element_type) not in SORT_ELEMENT_TYPES \
            or str(indices.element_type) != "i64":
        return None
    block = op.regions[0].blocks[0]
    body = list(block.operations)
    if len(body) != 2 or body[0].name != "stablehlo.compare" or \
            body[1].name != "stablehlo.return" or \
            list(body[0].operands) != list(block.arguments)[:2] or \
            list(body[1].operands) != [body[0].result]:
        return None
    direction = str(body[0].attributes["comparison_direction"])
    if direction.endswith("LT>"):
        descending = 0
    elif direction.endswith("GT>"):
        descending = 1
    else:
        return None
    stable = "is_stable" in op.attributes and ir.BoolAttr(op.attributes["is_stable"]).value
    return {"kind": "sort", "dimension": dimension, "descending": descending,
            "stable": int(stable), "k": _top_k(op, dimension) if not stable else 0}


def _top_k(sort, dimension: int) -> int:
    """k when every use of the sort's results is a slice of its first k along the sorted
    dim (aten::topk, as Torch-MLIR lowers it), else 0. The kernel then runs PyTorch's
    topk, which picks among equal values as eager's topk does (an unstable sort may order
    them any way)."""
    shape = ir.RankedTensorType(sort.operands[0].type)
    if not shape.has_static_shape:
        return 0
    found = set()
    for result in sort.results:
        for use in result.uses:
            user = as_operation(use.owner)
            if user.name != "stablehlo.slice":
                return 0
            start = i64_array(user.attributes["start_indices"])
            limit = i64_array(user.attributes["limit_indices"])
            strides = i64_array(user.attributes["strides"])
            if any(start) or any(s != 1 for s in strides) or \
                    any(limit[d] != shape.shape[d] for d in range(shape.rank) if d != dimension):
                return 0
            found.add(limit[dimension])
    if len(found) != 1:
        return 0
    k = found.pop()
    return k if 0 < k < shape.shape[dimension] else 0

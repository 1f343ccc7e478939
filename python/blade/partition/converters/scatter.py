"""Scatters that reduce (`scatter_reduce.two`, `scatter.reduce`, `scatter.value_reduce`),
lowered by Blade: Torch-MLIR lowers `scatter` and `scatter_add` to `stablehlo.scatter`,
but none of these.

Each builds the `stablehlo.scatter` Torch-MLIR builds for scatter_add: every element of
`index` is one update, at the operand position whose coordinates are the element's own
except along `dim`, where it is the index's value (a full index vector per update: iotas
and the index, concatenated), with the update computation of the reduction. The scatter
is then written as a loop nest by codegen/linalg/scatters.py, which also reports an index
out of range (the engine call runs its fallback, whose op raises as PyTorch does).

include_self=False first writes the reduction's identity at every indexed position (a
replacing scatter), so those positions reduce the sources alone. "mean" is a sum divided
by a count scattered alongside it (1 for self where it is included), with PyTorch's floor
division for integers.
"""
from typing import List, Optional

import torch

from blade.dtypes import INDICES, NUMERIC, DtypeRule, define
from blade.partition.registry import BUILTIN_PRIORITY, REGISTRY, Converter
from blade.graph_queries import constant_arguments

# Update computations by reduction name (scatter_reduce's and scatter's).
_COMBINERS = {"sum": "stablehlo.add", "add": "stablehlo.add", "prod": "stablehlo.multiply",
              "multiply": "stablehlo.multiply", "amax": "stablehlo.maximum",
              "amin": "stablehlo.minimum", "mean": "stablehlo.add"}


def _static_shapes(node) -> Optional[str]:
    for value in node.inputs():
        t = value.type()
        if isinstance(t, torch._C.TensorType) and (t.varyingSizes() is None or
                                                   None in t.varyingSizes()):
            return "a scatter of dynamic sizes is not compiled"
    return None


def _known_reduction(node) -> Optional[str]:

    reduce = constant_arguments(node).get("reduce")
    if reduce not in _COMBINERS:
        return f"reduce={reduce!r} is not one of {sorted(_COMBINERS)}"
    return _static_shapes(node)


def _identity(reduce: str, element) -> float:
    # MLIR loads only when a cluster is compiled (a cached model never loads it).
    from torch_mlir import ir

    if reduce in ("sum", "add", "mean"):
        return 0
    if reduce in ("prod", "multiply"):
        return 1
    if isinstance(element, ir.IntegerType):
        bits = element.width
        return -(1 << (bits - 1)) if reduce == "amax" else (1 << (bits - 1)) - 1
    return float("-inf") if reduce == "amax" else float("inf")


def _index_vectors(ctx, index, dim: int):
    """[*index.shape, rank] int64: each update's operand coordinates."""
    # MLIR loads only when a cluster is compiled (a cached model never loads it).
    from torch_mlir import ir

    index_type = ir.RankedTensorType(index.type)
    shape = list(index_type.shape)
    i64 = ir.IntegerType.get_signless(64)
    column = ir.RankedTensorType.get(shape + [1], i64)
    if index_type.element_type != i64:
        index = ctx.op("stablehlo.convert", [index], ir.RankedTensorType.get(shape, i64))
    columns = []
    for d in range(len(shape)):
        if d == dim:
            coordinate = index
        else:
            coordinate = ctx.op("stablehlo.iota", [], ir.RankedTensorType.get(shape, i64),
                                {"iota_dimension": ir.IntegerAttr.get(i64, d)})
        columns.append(ctx.op("stablehlo.reshape", [coordinate], column))
    return ctx.op("stablehlo.concatenate", columns,
                  ir.RankedTensorType.get(shape + [len(shape)], i64),
                  {"dimension": ir.IntegerAttr.get(i64, len(shape))})


def _scatter(ctx, operand, vectors, updates, combiner: Optional[str]):
    """stablehlo.scatter of `updates` (one per index vector) into `operand`; `combiner`
    None replaces."""
    # MLIR loads only when a cluster is compiled (a cached model never loads it).
    from torch_mlir import ir

    operand_type = ir.RankedTensorType(operand.type)
    rank = operand_type.rank
    dims = ", ".join(str(d) for d in range(rank))
    numbers = ir.Attribute.parse(
        f"#stablehlo.scatter<inserted_window_dims = [{dims}], "
        f"scatter_dims_to_operand_dims = [{dims}], index_vector_dim = {rank}>")
    with ir.InsertionPoint(ctx._block):
        op = ir.Operation.create("stablehlo.scatter", results=[operand_type],
                                 operands=[operand, vectors, updates],
                                 attributes={"scatter_dimension_numbers": numbers},
                                 regions=1)
    scalar = ir.RankedTensorType.get([], operand_type.element_type)
    block = op.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(block):
        current, update = block.arguments
        if combiner is None:
            result = update
        else:
            result = ir.Operation.create(combiner, results=[scalar],
                                         operands=[current, update]).result
        ir.Operation.create("stablehlo.return", results=[], operands=[result])
    return op.result


def _updates(ctx, source, index):
    """The source's elements at the index's positions (its leading corner)."""
    # MLIR loads only when a cluster is compiled (a cached model never loads it).
    from torch_mlir import ir

    source_type = ir.RankedTensorType(source.type)
    shape = list(ir.RankedTensorType(index.type).shape)
    if list(source_type.shape) == shape:
        return source
    def dense(values: List[int]):
        return ir.DenseI64ArrayAttr.get(values)
    return ctx.op("stablehlo.slice", [source],
                  ir.RankedTensorType.get(shape, source_type.element_type),
                  {"start_indices": dense([0] * len(shape)), "limit_indices": dense(shape),
                   "strides": dense([1] * len(shape))})


def _reduce_scatter(ctx, operand, dim: int, index, updates, reduce: str,
                    include_self: bool):
    # MLIR loads only when a cluster is compiled (a cached model never loads it).
    from torch_mlir import ir

    operand_type = ir.RankedTensorType(operand.type)
    element = operand_type.element_type
    update_type = ir.RankedTensorType(updates.type)
    dim = dim % operand_type.rank
    vectors = _index_vectors(ctx, index, dim)
    base = operand
    if not include_self:
        base = _scatter(ctx, operand, vectors,
                        ctx.splat(_identity(reduce, element), update_type), None)
    total = _scatter(ctx, base, vectors, updates, _COMBINERS[reduce])
    if reduce != "mean":
        return total
    count_base = ctx.splat(1, operand_type)
    if not include_self:
        count_base = _scatter(ctx, count_base, vectors, ctx.splat(0, update_type), None)
    count = _scatter(ctx, count_base, vectors, ctx.splat(1, update_type), "stablehlo.add")
    quotient = ctx.op("stablehlo.divide", [total, count])
    if not isinstance(element, ir.IntegerType):
        return quotient
    # Floor division: one less where the remainder is nonzero and the sum negative (the
    # counts are positive).
    i1 = ir.RankedTensorType.get(operand_type.shape, ir.IntegerType.get_signless(1))
    zero = ctx.splat(0, operand_type)

    def compare(a, b, direction):
        return ctx.op("stablehlo.compare", [a, b], i1, {
            "comparison_direction": f"#stablehlo<comparison_direction {direction}>"})
    remainder = ctx.op("stablehlo.remainder", [total, count])
    inexact = ctx.op("stablehlo.and", [compare(remainder, zero, "NE"),
                                       compare(total, zero, "LT")])
    lowered = ctx.op("stablehlo.subtract", [quotient, ctx.splat(1, operand_type)])
    return ctx.op("stablehlo.select", [inexact, lowered, quotient], operand_type)


def _lower_scatter_reduce(ctx):
    self, index, source = ctx.operands
    return _reduce_scatter(ctx, self, ctx.arguments["dim"], index,
                           _updates(ctx, source, index), ctx.arguments["reduce"],
                           bool(ctx.arguments.get("include_self", True)))


def _lower_scatter_value_reduce(ctx):
    # MLIR loads only when a cluster is compiled (a cached model never loads it).
    from torch_mlir import ir

    self, index = ctx.operands
    element = ir.RankedTensorType(self.type).element_type
    updates = ctx.splat(ctx.arguments["value"],
                        ir.RankedTensorType.get(ir.RankedTensorType(index.type).shape,
                                                element))
    return _reduce_scatter(ctx, self, ctx.arguments["dim"], index, updates,
                           ctx.arguments["reduce"], True)


_RULE = DtypeRule(args={"self": NUMERIC, "src": NUMERIC, "index": INDICES})
define(["aten::scatter_reduce.two", "aten::scatter.reduce", "aten::scatter.value_reduce"],
       _RULE)
for _schema, _lower, _validator in (
        ("aten::scatter_reduce.two", _lower_scatter_reduce, _known_reduction),
        ("aten::scatter.reduce", _lower_scatter_reduce, _known_reduction),
        ("aten::scatter.value_reduce", _lower_scatter_value_reduce, _known_reduction)):
    REGISTRY.register(Converter(_schema, lower=_lower, validator=_validator,
                                priority=BUILTIN_PRIORITY))

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
removed by `remove-shape-constraints` in mlir/stablehlo_to_linalg.pipeline), and an
operand dim is stretched exactly when it is a static 1 in a result dim that is not.
"""
from torch_mlir import ir


def _ops_named(module, name: str):
    found = []

    def visit(op):
        if op.name == name:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def annotate_broadcasts(module) -> int:
    """Marks each dynamic_broadcast_in_dim's expanding and non-expanding operand dims;
    returns how many ops were marked."""
    targets = _ops_named(module, "stablehlo.dynamic_broadcast_in_dim")
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


def lower_dynamic_reshapes(module) -> int:
    """Rewrites each `stablehlo.dynamic_reshape` (a view of dynamic size) as a collapse of
    its operand to one dimension and an expansion to the result's sizes, read from the
    shape operand: StableHLO's linalg lowering leaves most dynamic reshapes unconverted.
    Row-major reshapes are exactly this, and both halves are free views after
    bufferization. Returns how many were rewritten."""
    from torch_mlir.dialects import arith, tensor

    targets = _ops_named(module, "stablehlo.dynamic_reshape")
    with module.context:
        index = ir.IndexType.get()
        i64 = ir.IntegerType.get_signless(64)
        for op in targets:
            source, shape = op.operands[0], op.operands[1]
            source_type = ir.RankedTensorType(source.type)
            result_type = ir.RankedTensorType(op.results[0].type)
            with ir.InsertionPoint(op), op.location:
                flat = source
                if source_type.rank != 1:
                    flat_type = ir.RankedTensorType.get([ir.ShapedType.get_dynamic_size()],
                                                        source_type.element_type)
                    groups = ir.ArrayAttr.get([ir.ArrayAttr.get(
                        [ir.IntegerAttr.get(i64, d) for d in range(source_type.rank)])])
                    flat = tensor.CollapseShapeOp(flat_type, source, groups).result
                sizes = []
                for d in range(result_type.rank):
                    if not result_type.is_dynamic_dim(d):
                        continue
                    position = arith.ConstantOp(index, ir.IntegerAttr.get(index, d)).result
                    size = tensor.ExtractOp(shape, [position]).result
                    if not isinstance(size.type, ir.IndexType):
                        size = arith.IndexCastOp(index, size).result
                    sizes.append(size)
                groups = ir.ArrayAttr.get([ir.ArrayAttr.get(
                    [ir.IntegerAttr.get(i64, d) for d in range(result_type.rank)])])
                static = [ir.ShapedType.get_dynamic_size() if result_type.is_dynamic_dim(d)
                          else result_type.shape[d] for d in range(result_type.rank)]
                if result_type.rank == 0:
                    continue  # a scalar has no dynamic size; left to StableHLO
                expanded = tensor.ExpandShapeOp(result_type, flat, groups, sizes, static).result
            op.results[0].replace_all_uses_with(expanded)
            op.erase()
    return len(targets)

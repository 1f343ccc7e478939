"""Questions about MLIR values that several code generation steps ask (library calls,
attention, layouts, shape assumptions, pooling): which op produced a value, which ops use
it, and which ops have a name; and the cloning of ops those steps rebuild."""
from torch_mlir import ir


def as_operation(op):
    """The generic Operation of an op view (ops compare equal only in that form)."""
    return op.operation if hasattr(op, "operation") else op


def defining_op(value):
    """The op that defines `value` (as an Operation), or None for a block argument."""
    owner = value.owner
    return None if isinstance(owner, ir.Block) else as_operation(owner)


# Ops that read only the shape of their operand, not its data.
SHAPE_QUERIES = ("shape.shape_of", "tensor.dim")


def only_data_user(value):
    """The one op that reads the data of `value` (shape queries aside), or None when no op
    or several do."""
    users = [as_operation(use.owner) for use in value.uses
             if as_operation(use.owner).name not in SHAPE_QUERIES]
    return users[0] if len(users) == 1 else None


def producer(value, name: str):
    """The op named `name` that defines `value`, or None (a block argument, another op).

    Example:
        >>> transpose = producer(operand, "stablehlo.transpose")
    """
    op = defining_op(value)
    return op if op is not None and op.name == name else None


def ops_named(module, name: str) -> list:
    """Every op named `name` in `module`, in walk order.

    Example:
        >>> reshapes = ops_named(module, "stablehlo.dynamic_reshape")
    """
    found = []

    def visit(op):
        if op.name == name:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def clone_ops(operations, mapping: dict) -> dict:
    """Clones `operations` in order at the current insertion point, each reading the clone
    of a value `mapping` maps (block arguments of the source, say, or earlier clones);
    returns `mapping` with the results of every clone added."""
    for original in operations:
        copy = as_operation(original).clone()
        for i, operand in enumerate(copy.operands):
            if operand in mapping:
                copy.operands[i] = mapping[operand]
        mapping.update(zip(original.results, copy.results))
    return mapping

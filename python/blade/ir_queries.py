"""Questions about MLIR values that several code generation steps ask (library calls,
layouts, shape assumptions): which op produced a value, and which ops have a name."""
from torch_mlir import ir


def producer(value, name: str):
    """The op named `name` that defines `value`, or None (a block argument, another op).

    Example:
        >>> transpose = producer(operand, "stablehlo.transpose")
    """
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    op = owner.operation if hasattr(owner, "operation") else owner
    return op if op.name == name else None


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
